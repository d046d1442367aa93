"""Session 17 run 1: eager's gradients under the tuning cache LFCE_CACHE_DIR holds (CTA pair tiles
forced by run01.sh) against torch's fp32 linear + cross_entropy: loss difference, rel. L2 and the
worst row's rel. L2 of grad_hidden and grad_weight. Usage: python3 forced_check.py MODEL (N = 8192)."""
import sys

import torch

import lfce
from lfce import presets

model = sys.argv[1]
h, v = presets.table()[model]
n = 8192
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(torch.bfloat16).requires_grad_()
y = torch.randint(0, v, (n,), device="cuda", generator=g)
y[::17] = -100
loss = lfce.linear_cross_entropy(x, w, y, mode="eager")
loss.backward()
gx, gw = x.grad.double(), w.grad.double()
xr = x.detach().float().requires_grad_()
wr = w.detach().float().requires_grad_()
ref = torch.nn.functional.cross_entropy(xr @ wr.T, y, ignore_index=-100)
ref.backward()


def rel(a, b):
    b = b.double()
    rows = (a - b).norm(dim=1) / b.norm(dim=1).clamp_min(1e-30)
    return f"{((a - b).norm() / b.norm()).item():.2e} (worst row {rows.max().item():.2e})"


print(f"{model} check: loss {loss.item():.6f} vs {ref.item():.6f}; grad_hidden {rel(gx, xr.grad)}; "
      f"grad_weight {rel(gw, wr.grad)}")

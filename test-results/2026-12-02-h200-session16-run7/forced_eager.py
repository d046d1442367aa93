"""Session 16 run 7: eager's kernels, power-settled (lfce.bench.gemm_profile's traces, median of 3
rounds), under the tuning cache LFCE_CACHE_DIR holds (run07.sh forces one kernel's tile into it with
session 14's force_tile.py). Usage: python3 forced_eager.py MODEL (N = 8192, bf16, mean)."""
import sys

import torch

import lfce
from lfce import presets
from lfce.bench import gemm_profile as gp

model = sys.argv[1]
h, v = presets.table()[model]
n = 8192
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(torch.bfloat16).requires_grad_()
y = torch.randint(0, v, (n,), device="cuda", generator=g)
y[::17] = -100


def eager():
    loss = lfce.linear_cross_entropy(x, w, y, mode="eager")
    loss.backward()
    x.grad = w.grad = None


rows = gp.median_activity([gp._trace(eager, 3) for _ in range(gp.ROUNDS)])
total = sum(us for _, us in rows.values()) / 3 / 1e3
print(f"{model} total {total:.2f} ms: " + ", ".join(
    f"{name} {us / 3 / 1e3:.2f}" for name, (_, us) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:4]))

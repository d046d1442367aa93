"""Session 15 run 1 (session 14 run 6's script, profiled between cudaProfilerStart/Stop): one eager forward of MODEL at N = 8192 (eager_logits,
eager_dz, grad_weight, grad_input), then cuBLAS's three GEMMs of the same shapes and output layouts
(x·Wᵀ [N, V]; dz·W [N, H]; dzᵀ·x [V, H]), for ncu to profile side by side.
Usage: ncu ... python3 ncu_eager.py MODEL"""
import sys

import torch

import lfce
from lfce import presets

model = sys.argv[1] if len(sys.argv) > 1 else "gemma2-2b"
h, v = presets.table()[model]
n = 8192
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(torch.bfloat16).requires_grad_()
y = torch.randint(0, v, (n,), device="cuda", generator=g)
y[::17] = -100
loss = lfce.linear_cross_entropy(x, w, y, mode="eager")  # compiles and loads outside the profiled kernels' count
loss.backward()
torch.cuda.synchronize()
torch.cuda.profiler.start()
loss = lfce.linear_cross_entropy(x, w, y, mode="eager")
torch.cuda.synchronize()
with torch.no_grad():
    z = x @ w.t()            # [N, V], the logits GEMM
    dz = z                   # (values do not matter to the GEMMs' speed)
    gx = dz @ w              # [N, H] over K = V
    gw = dz.t() @ x          # [V, H] over K = N
torch.cuda.synchronize()
torch.cuda.profiler.stop()
print(model, "done", float(loss))

"""Session 19 run 7: one eager step of MODEL (N = 8192, bf16) under LFCE_CACHE_DIR's tuning; prints the
tiles of the GEMM kernels it loaded (a forced tile that fails validation falls back to the default)."""
import sys

import torch

import lfce
from lfce import presets

h, v = presets.table()[sys.argv[1]]
x = torch.randn(8192, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
w = torch.randn(v, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
y = torch.randint(0, v, (8192,), device="cuda")
lfce.linear_cross_entropy(x, w, y, mode="eager").backward()
for k in lfce.kernel_load_stats():
    kind = k["spec"].split(";")[0]
    if kind in ("eager_logits", "grad_weight", "grad_input"):
        print(" ", kind, [f for f in k["spec"].split(";") if f.startswith("tile=")][0])

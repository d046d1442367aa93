"""Session 16 run 5: eager mode's kernels against the cuBLAS GEMMs of the same shapes, in the
power-settled state of a training step (lfce.bench.gemm_profile's traces: 1 s of back-to-back calls
before each trace, lfce and cuBLAS traced in turn, each kernel's median over 3 rounds).
Usage: python3 eager_vs_cublas.py MODEL... (N = 8192, bf16, mean, every 17th target ignored)."""
import statistics
import sys

import torch

import lfce
from lfce import presets
from lfce.bench import gemm_profile as gp

STEPS = 3
for model in sys.argv[1:] or ["llama3-8b"]:
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

    xd, wd = x.detach(), w.detach()
    dz = torch.empty(n, v, dtype=x.dtype, device="cuda").normal_()
    products = {"x·Wᵀ [N,V]": lambda: xd @ wd.t(), "W·xᵀ [V,N]": lambda: wd @ xd.t(),
                "dz·W [N,H]": lambda: dz @ wd, "dzᵀ·x [V,H]": lambda: dz.t() @ xd}
    rounds = {"eager": []}
    rounds.update({name: [] for name in products})
    for _ in range(gp.ROUNDS):
        rounds["eager"].append(gp._trace(eager, STEPS))
        for name, call in products.items():
            rounds[name].append(gp._trace(call, STEPS))
    print(f"{model} N={n} (ms a step, median of {gp.ROUNDS} power-settled rounds):")
    for name, row in sorted(gp.median_activity(rounds["eager"]).items(), key=lambda kv: -kv[1][1]):
        print(f"  eager {name[:40]:40s} {row[1] / STEPS / 1e3:8.3f}")
    for name in products:
        total = sum(us for _, us in gp.median_activity(rounds[name]).values())
        print(f"  cuBLAS {name:39s} {total / STEPS / 1e3:8.3f}")
    del dz
    torch.cuda.empty_cache()

# Per-kernel time of lfce's backward GEMMs against the vocabulary chunk, gemma2-2b and llama3-8b N=8192, steady state.
import json, sys, torch
sys.path.insert(0, 'python')
from lfce.functional import linear_cross_entropy
from lfce.bench import gemm_profile as gp
out = {}
for name, h, v, chunks in (("gemma2-2b", 2304, 256000, (8192, 12672, 16384, 25344, 32768, 65536)),
                           ("llama3-8b", 4096, 128256, (12672, 16384, 32768))):
    n = 8192
    x = torch.randn(n, h, device='cuda', dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(v, h, device='cuda') / h ** 0.5).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, v, (n,), device='cuda')
    flops = gp.gemm_flops(n, h, v)
    products, dzt = gp._cublas_products(x, w)
    cub = {k: sum(us for _, us in gp._trace(p, 2).values()) / 2 / 1e3 for k, p in products.items()}
    del dzt, products
    print(name, "cuBLAS", {k: round(ms, 2) for k, ms in cub.items()}, flush=True)
    for c in chunks:
        def step():
            torch.autograd.grad(linear_cross_entropy(x, w, y, mode="recompute", chunk_size=c), (x, w))
        act = gp._trace(step, 2)
        row = {}
        for k in gp.GEMM_KERNELS:
            cnt, us = act.get(k, (0, 0.0))
            row[k] = (cnt / 2, us / 2 / 1e3, cub[k] / (us / 2 / 1e3) if us else None)
        total = sum(us for _, us in act.values()) / 2 / 1e3
        print(f"{name} chunk {c:6d} total {total:7.2f} ms  " + "  ".join(f"{k[:8]} {r[1]:6.2f}ms x{r[0]:.0f} {r[2]:.3f}" for k, r in row.items()), flush=True)
        out[f"{name}/{c}"] = {"total_ms": total, **{k: {"launches": r[0], "ms": r[1], "vs_cublas": r[2]} for k, r in row.items()}}
    out[f"{name}/cublas"] = cub
    del x, w
json.dump(out, open(sys.argv[1], 'w'), indent=1)

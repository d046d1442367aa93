# Per-kernel ms of one recompute fwd+bwd (steady state: 3 s warm, 3 traced steps) with the cache's tuning.
# usage: python3 .device/pp.py MODEL [TILE]   (TILE: a dlogits_backward config written as the tuning winner)
import json, os, sys, tempfile, torch
sys.path.insert(0, 'python')
model, tile = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
h, v = {"gemma2-2b": (2304, 256000), "llama3-8b": (4096, 128256)}[model]
cache = tempfile.mkdtemp(prefix="lfce-pp-")
os.environ["LFCE_CACHE_DIR"] = cache
if tile:
    os.makedirs(f"{cache}/tuning")
    key = {"kind": "dlogits_backward", "vocab": v, "hidden": h, "dtype": "bf16", "mode": "recompute", "bias": False,
           "reduction": "mean", "targets": "i64", "arch": "sm_90a", "smem_per_block": 232448, "sm_count": 132, "n_bucket": 8192}
    entry = {"format": 2, "key": key, "tokens": 8192, "device": "NVIDIA H200", "default": "128x256x64/wg2/s4;chunk=16384",
             "measured_with": {}, "candidates": [{"config": tile + ";chunk=16384", "ms": 1.0}],
             "winner": {"config": tile + ";chunk=16384", "ms": 1.0, "speedup_vs_default": 1.0}}
    name = f"dlogits_backward-sm_90a-smem232448-sms132-bf16-V{v}-H{h}-N8192-recompute-mean-i64-nobias.json"
    json.dump(entry, open(f"{cache}/tuning/{name}", "w"))
from lfce.functional import linear_cross_entropy
from lfce.bench import gemm_profile as gp
n = 8192
x = torch.randn(n, h, device='cuda', dtype=torch.bfloat16, requires_grad=True)
w = (torch.randn(v, h, device='cuda') / h ** 0.5).to(torch.bfloat16).requires_grad_()
y = torch.randint(0, v, (n,), device='cuda')
def step():
    torch.autograd.grad(linear_cross_entropy(x, w, y, mode="recompute"), (x, w))
act = gp._trace(step, 3, warm_seconds=3.0)
ms = {k: round(act[k][1] / 3 / 1e3, 3) for k in gp.GEMM_KERNELS if k in act}
print(model, tile or "default", "total", round(sum(us for _, us in act.values()) / 3 / 1e3, 2), ms, flush=True)

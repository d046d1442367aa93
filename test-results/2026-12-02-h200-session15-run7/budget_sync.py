"""Session 15 run 7: does eager's default budget check (torch.cuda.mem_get_info each call) cost GPU
time? Eager fwd+bwd steps enqueued back to back (no synchronisation between steps, as the bench's
interleaving), default against chunk_size = N (the same plan, no budget check), alternating in
rounds; CUDA-event ms per step (median, min, max) and host ms per forward call."""
import statistics
import sys
import time

import torch

import lfce
from lfce import presets

for model in sys.argv[1:] or ["llama3-70b", "gemma2-2b"]:
    h, v = presets.table()[model]
    n = 8192
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, v, (n,), device="cuda", generator=g)
    y[::17] = -100
    variants = {"default": {}, "chunk_size=N": {"chunk_size": n}}
    times = {k: [] for k in variants}
    host = {k: [] for k in variants}
    for name, kw in variants.items():  # compile and warm
        lfce.linear_cross_entropy(x, w, y, mode="eager", **kw).backward()
    torch.cuda.synchronize()
    for _ in range(4):
        for name, kw in variants.items():
            pending = []
            for _ in range(4):
                e = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
                e[0].record()
                t = time.perf_counter()
                loss = lfce.linear_cross_entropy(x, w, y, mode="eager", **kw)
                host[name].append((time.perf_counter() - t) * 1e3)
                loss.backward()
                x.grad = w.grad = None
                e[1].record()
                pending.append(e)
            torch.cuda.synchronize()
            times[name] += [a.elapsed_time(b) for a, b in pending]
    for name in variants:
        t = times[name]
        print(f"{model} {name:14s} step ms median {statistics.median(t):7.2f} min {min(t):7.2f} max {max(t):7.2f}"
              f"  host ms a forward median {statistics.median(host[name]):6.2f}")

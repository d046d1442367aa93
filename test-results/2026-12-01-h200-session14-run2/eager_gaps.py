"""Session 14 run 2: where eager mode's forward leaves the GPU idle (bench: forward 40.12 ms against
38.45 ms of kernels at llama3-8b, run 1). Host time of each call, the GPU timeline's gaps between
kernels over one bench-like step, and a cProfile of the host side of the forward."""
import cProfile
import json
import pstats
import sys
import tempfile
import time

import torch

import lfce
from lfce import presets

model = sys.argv[1] if len(sys.argv) > 1 else "llama3-8b"
h, v = presets.table()[model]
n = 8192
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(torch.bfloat16).requires_grad_()
y = torch.randint(0, v, (n,), device="cuda", generator=g)
y[::17] = -100


def forward():
    return lfce.linear_cross_entropy(x, w, y, mode="eager")


def step():
    loss = forward()
    gx, gw = torch.autograd.grad(loss, (x, w))
    return loss, gx, gw


for _ in range(3):
    step()
torch.cuda.synchronize()
for i in range(4):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = forward()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(f"forward host {1e3 * (t1 - t0):.3f} ms, to done {1e3 * (t2 - t0):.3f} ms")
    del loss
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(2):
        step()
    torch.cuda.synchronize()
with tempfile.NamedTemporaryFile(suffix=".json") as f:
    prof.export_chrome_trace(f.name)
    trace = json.load(open(f.name))
events = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X" and str(e.get("cat", "")).lower() in
                 ("kernel", "gpu_memset", "gpu_memcpy")), key=lambda e: e["ts"])
print(f"{model}: {len(events)} device activities in 2 steps")
for a, b in zip(events, events[1:]):
    gap = b["ts"] - (a["ts"] + a["dur"])
    if gap > 15:
        print(f"  gap {gap / 1e3:7.3f} ms after {a['name'][:40]:40s} before {b['name'][:40]}")
cpu = sorted((e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"),
             key=lambda e: -e["dur"])[:12]
for e in cpu:
    print(f"  cpu op {e['dur'] / 1e3:7.3f} ms {e['name'][:60]}")
torch.cuda.synchronize()
prof2 = cProfile.Profile()
prof2.enable()
for _ in range(5):
    loss = forward()
prof2.disable()
torch.cuda.synchronize()
pstats.Stats(prof2).sort_stats("cumulative").print_stats(18)

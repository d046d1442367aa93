"""Session 18 run 1 (copied from session 17 run 4): eager's fwd+bwd against cuBLAS's three GEMMs in one process, under whatever
tiles LFCE_CACHE_DIR's tuning forces (run04.sh alternates the new defaults with the old tiles):
ms a step (CUDA events, 30 back-to-back steps after 12 of settling, twice each, alternating),
mean power and SM clock (nvidia-smi every 50 ms), J a step, and eager / cuBLAS.
Usage: python3 ab.py MODEL LABEL [N] (N = 8192 by default, bf16, mean, every 17th target ignored)."""
import datetime
import statistics
import subprocess
import sys

import torch

import lfce
from lfce import presets

model, label = sys.argv[1], sys.argv[2]
h, v = presets.table()[model]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(torch.bfloat16).requires_grad_()
y = torch.randint(0, v, (n,), device="cuda", generator=g)
y[::17] = -100
xd, wd = x.detach(), w.detach()
dz = torch.empty(n, v, dtype=x.dtype, device="cuda").normal_()


def eager():
    loss = lfce.linear_cross_entropy(x, w, y, mode="eager")
    loss.backward()
    x.grad = w.grad = None


def three():
    xd @ wd.t()
    dz @ wd
    dz.t() @ xd


smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,power.draw.instant,clocks.sm", "--format=csv,noheader,nounits",
                        "-lms", "50"], stdout=subprocess.PIPE, text=True)
phases = []
for fn in (eager, three):
    fn()
torch.cuda.synchronize()
for name, fn in [("eager", eager), ("cublas", three)] * 2:
    for _ in range(12):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = datetime.datetime.now()
    a.record()
    steps = 30
    for _ in range(steps):
        fn()
    b.record()
    torch.cuda.synchronize()
    phases.append((name, t0, datetime.datetime.now(), a.elapsed_time(b) / steps))
smi.terminate()
samples = []
for line in smi.stdout.read().splitlines():
    p = [s.strip() for s in line.split(",")]
    try:
        samples.append((datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f"), float(p[1]), float(p[2])))
    except (ValueError, IndexError):
        pass
res = {}
for name, t0, t1, ms in phases:
    inside = [s for s in samples if t0 + datetime.timedelta(seconds=0.2) <= s[0] <= t1] or [(0, float("nan"), float("nan"))]
    watts = statistics.mean(s[1] for s in inside)
    res.setdefault(name, []).append((ms, watts, statistics.mean(s[2] for s in inside)))
line = f"{model} {label:8s}"
for name in ("eager", "cublas"):
    ms = statistics.mean(r[0] for r in res[name])
    watts = statistics.mean(r[1] for r in res[name])
    mhz = statistics.mean(r[2] for r in res[name])
    line += f" | {name} {ms:6.2f} ms {watts:5.0f} W {mhz:5.0f} MHz {watts * ms / 1e3:5.2f} J"
e, c = (statistics.mean(r[0] for r in res[k]) for k in ("eager", "cublas"))
print(line + f" | ratio {e / c:.3f}")

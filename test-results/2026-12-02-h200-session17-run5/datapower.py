"""Session 17 run 5: does the data change cuBLAS's gradient GEMMs under the power cap? dz·W and
dzᵀ·x with the bench floor's stand-in (dz = the bf16 logits z, lfce.bench.impls._floor) against
the real gradient (softmax(z) minus the one-hot target, over the valid tokens, in bf16: what eager
mode's GEMMs multiply), alternating, 30 back-to-back steps a phase after 12 of settling; ms a step,
mean power and SM clock (nvidia-smi every 50 ms). Usage: python3 datapower.py MODEL (N = 8192)."""
import datetime
import statistics
import subprocess
import sys

import torch

from lfce import presets

model = sys.argv[1]
h, v = presets.table()[model]
n = 8192
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16)
w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(torch.bfloat16)
y = torch.randint(0, v, (n,), device="cuda", generator=g)
y[::17] = -100
z = x @ w.t()
valid = y != -100
real = torch.softmax(z.float(), dim=1)
real[valid, y[valid]] -= 1
real[~valid] = 0
real = (real / valid.sum()).to(torch.bfloat16)
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,power.draw.instant,clocks.sm", "--format=csv,noheader,nounits",
                        "-lms", "50"], stdout=subprocess.PIPE, text=True)
phases = []
for name, dz in [("dz = logits", z), ("dz = real", real)] * 2:
    def step():
        dz @ w
        dz.t() @ x
    for _ in range(12):
        step()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    t0 = datetime.datetime.now()
    a.record()
    for _ in range(30):
        step()
    b.record()
    torch.cuda.synchronize()
    phases.append((name, t0, datetime.datetime.now(), a.elapsed_time(b) / 30))
smi.terminate()
samples = []
for line in smi.stdout.read().splitlines():
    p = [s.strip() for s in line.split(",")]
    try:
        samples.append((datetime.datetime.strptime(p[0], "%Y/%m/%d %H:%M:%S.%f"), float(p[1]), float(p[2])))
    except (ValueError, IndexError):
        pass
for name, t0, t1, ms in phases:
    inside = [s for s in samples if t0 + datetime.timedelta(seconds=0.2) <= s[0] <= t1] or [(0, float("nan"), float("nan"))]
    print(f"{model} {name:12s} dz·W + dzᵀ·x {ms:6.2f} ms  {statistics.mean(s[1] for s in inside):5.0f} W  "
          f"{statistics.mean(s[2] for s in inside):5.0f} MHz")

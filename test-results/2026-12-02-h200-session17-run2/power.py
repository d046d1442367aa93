"""Session 17 run 2: power and SM clock under back-to-back steps, eager mode's fwd+bwd against the
three cuBLAS GEMMs of the same shapes (x·Wᵀ, dz·W, dzᵀ·x) and each GEMM alone, sampled by
nvidia-smi every 50 ms: ms a step (CUDA events), mean power (W), mean SM clock (MHz), J a step.
Usage: python3 power.py MODEL... (N = 8192, bf16, mean, every 17th target ignored)."""
import datetime
import statistics
import subprocess
import sys
import time

import torch

import lfce
from lfce import presets

SECONDS = 3.0
field = "power.draw.instant"
if subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv"], capture_output=True).returncode != 0:
    field = "power.draw"
print("power field:", field)
smi = subprocess.Popen(["nvidia-smi", f"--query-gpu=timestamp,{field},clocks.sm,temperature.gpu",
                        "--format=csv,noheader,nounits", "-lms", "50"], stdout=subprocess.PIPE, text=True)
phases = []


def measure(name, fn):
    fn()
    torch.cuda.synchronize()
    t = time.time()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    per = (time.time() - t) / 3
    steps = max(int(SECONDS / per), 3)
    for _ in range(int(1.0 / per) + 1):  # settle
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = datetime.datetime.now()
    a.record()
    for _ in range(steps):
        fn()
    b.record()
    torch.cuda.synchronize()
    phases.append((name, t0, datetime.datetime.now(), a.elapsed_time(b) / steps))


for model in sys.argv[1:]:
    h, v = presets.table()[model]
    n = 8192
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

    for name, fn in [("eager", eager), ("cublas_3gemm", three), ("x·Wᵀ", lambda: xd @ wd.t()),
                     ("dz·W", lambda: dz @ wd), ("dzᵀ·x", lambda: dz.t() @ xd), ("eager", eager),
                     ("cublas_3gemm", three)]:
        measure(f"{model} {name}", fn)
    del dz
    torch.cuda.empty_cache()
time.sleep(0.2)
smi.terminate()
samples = []
for line in smi.stdout.read().splitlines():
    parts = [p.strip() for p in line.split(",")]
    try:
        samples.append((datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f"), float(parts[1]),
                        float(parts[2]), float(parts[3])))
    except (ValueError, IndexError):
        pass
print(f"{len(samples)} samples")
for name, t0, t1, ms in phases:
    inside = [s for s in samples if t0 + datetime.timedelta(seconds=0.3) <= s[0] <= t1]
    if not inside:
        print(f"{name:28s} {ms:8.3f} ms  (no samples)")
        continue
    p = statistics.mean(s[1] for s in inside)
    c = statistics.mean(s[2] for s in inside)
    print(f"{name:28s} {ms:8.3f} ms  {p:6.1f} W  {c:6.0f} MHz  {max(s[3] for s in inside):3.0f} C  "
          f"{p * ms / 1e3:6.2f} J/step  ({len(inside)} samples)")

"""Session 13 run 7: where eager mode's three-GEMM forward spends its time at llama3-8b and gemma2-2b,
N = 8192 (bf16, mean): torch.profiler over 3 steps after warm-up, each kernel's mean time a step."""
import sys
from collections import defaultdict

import torch

import lfce
from lfce import presets

for model in sys.argv[1:] or ["llama3-8b", "gemma2-2b"]:
    h, v = presets.table()[model]
    n = 8192
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, v, (n,), device="cuda", generator=g)
    y[::17] = -100

    def step(x, w, y):
        loss = lfce.linear_cross_entropy(x, w, y, mode="eager")
        loss.backward()
        x.grad = w.grad = None

    for _ in range(3):
        step(x, w, y)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step(x, w, y)
        torch.cuda.synchronize()
    times = defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name[:60]] += e.device_time / 1000 / 3
    total = sum(times.values())
    print(f"{model} N={n} eager fwd+bwd kernels, ms per step (total {total:.2f}):")
    for name, ms in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"  {name:60s} {ms:8.3f}")

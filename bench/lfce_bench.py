"""Side-by-side timing of lfce against the GEMM floor and PyTorch, in one run on one GPU.

For each shape (N tokens, H hidden, V vocab), bf16, mean reduction, 1 target in 17 ignored:

* cublas_3gemm / cublas_4gemm: the matrix products alone through torch.matmul (cuBLAS):
  logits x·Wᵀ, grad_x = dz·W, grad_W = dzᵀ·x (3), plus the backward's logits recompute (4).
  The floor a fused kernel is measured against.
* torch_naive: F.linear + F.cross_entropy, eager PyTorch (materialises the logits).
* torch_compile: the same under torch.compile (with --compile).
* lfce_recompute / lfce_eager: lfce.linear_cross_entropy.

Each method: forward + backward w.r.t. hidden and weight, warm-ups, then the median of
--iters CUDA-event timings; memory: allocated after the forward beyond the inputs (held)
and the peak during forward + backward beyond the inputs. Writes one JSON file per run:

    python3 bench/lfce_bench.py --out bench/results/
"""

import argparse
import datetime
import json
import os
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import lfce  # noqa: E402

SHAPES = {
    "llama3-8b": (8192, 4096, 128256),
    "gemma2-2b": (8192, 2304, 256000),
    "qwen2.5-7b": (8192, 3584, 152064),
    "llama3-70b": (4096, 8192, 128256),
}
MIB = 1 << 20


def make_inputs(n, h, v, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(v, h, device="cuda", generator=g) * (2.5 / h ** 0.5)).to(torch.bfloat16).requires_grad_()
    y = torch.randint(0, v, (n,), device="cuda", generator=g)
    y[torch.arange(n, device="cuda") % 17 == 16] = -100
    return x, w, y


def gemms(x, w, count):
    """The matrix products of a fused LFCE step, nothing else (dz stands in for dlogits)."""
    def step():
        z = x.detach() @ w.detach().t()
        if count == 4:
            z = x.detach() @ w.detach().t()
        gx = z @ w.detach()
        gw = z.t() @ x.detach()
        return gx, gw
    return step


def loss_step(fn, x, w, y):
    def step():
        loss = fn(x, w, y)
        return torch.autograd.grad(loss, (x, w))
    return step


def naive(x, w, y):
    return F.cross_entropy(F.linear(x, w).float(), y, ignore_index=-100)


def measure(step, warmup, iters):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    ms = [s.elapsed_time(e) for s, e in times]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms)}


def memory(fn, x, w, y):
    """(held, peak) MiB beyond the inputs for one forward + backward of a loss function."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = fn(x, w, y)
    held = torch.cuda.memory_allocated() - base - loss.numel() * loss.element_size()
    grads = torch.autograd.grad(loss, (x, w))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del loss, grads
    return held / MIB, peak / MIB


def bench_shape(name, n, h, v, args):
    x, w, y = make_inputs(n, h, v)
    flops = 2.0 * n * h * v
    rows = {}
    methods = [
        ("cublas_3gemm", gemms(x, w, 3), None),
        ("cublas_4gemm", gemms(x, w, 4), None),
        ("lfce_recompute", None, lambda a, b, c: lfce.linear_cross_entropy(a, b, c, mode="recompute")),
        ("lfce_eager", None, lambda a, b, c: lfce.linear_cross_entropy(a, b, c, mode="eager")),
        ("torch_naive", None, naive),
    ]
    if args.compile:
        methods.append(("torch_compile", None, torch.compile(naive)))
    for method, step, fn in methods:
        try:
            row = measure(step or loss_step(fn, x, w, y), args.warmup, args.iters)
            if fn is not None:
                row["held_mib"], row["peak_mib"] = memory(fn, x, w, y)
        except torch.cuda.OutOfMemoryError as error:  # noqa: PERF203
            row = {"error": "out of memory: %s" % str(error).splitlines()[0]}
        torch.cuda.empty_cache()
        rows[method] = row
    floor = rows["cublas_4gemm"]["median_ms"]
    for method, row in rows.items():
        if "median_ms" in row:
            row["vs_cublas_4gemm"] = row["median_ms"] / floor
            gemm_count = 3 if method in ("cublas_3gemm", "lfce_eager") else 4
            row["gemm_tflops"] = gemm_count * flops / row["median_ms"] / 1e9
    return {"shape": name, "tokens": n, "hidden": h, "vocab": v, "dtype": "bf16", "methods": rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="llama3-8b,gemma2-2b,qwen2.5-7b,llama3-70b")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (slow to compile)")
    parser.add_argument("--out", default="bench/results/", help="folder for the JSON result")
    args = parser.parse_args()
    unknown = [s for s in args.shapes.split(",") if s not in SHAPES]
    if unknown:
        parser.error("unknown shape(s) %s; known: %s" % (", ".join(unknown), ", ".join(SHAPES)))
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "lfce": lfce.__version__,
        "command": "python3 bench/lfce_bench.py " + " ".join(sys.argv[1:]),
        "results": [],
    }
    for name in args.shapes.split(","):
        entry = bench_shape(name, *SHAPES[name], args)
        result["results"].append(entry)
        print("%-11s" % name + "  ".join(
            "%s %.1f ms (%.2fx)" % (m, r["median_ms"], r["vs_cublas_4gemm"]) if "median_ms" in r else "%s %s" % (m, r["error"])
            for m, r in entry["methods"].items()), flush=True)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "bench-%s.json" % result["date"][:10])
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print("wrote", path)


if __name__ == "__main__":
    main()

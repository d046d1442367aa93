"""Where an lfce forward + backward spends its time, kernel by kernel, and each GEMM kernel against
the cuBLAS GEMM of the same shape.

Both come from torch.profiler traces (CUPTI): lfce's kernels are launched through the driver API and
appear there under their entry names (templates/*.cpp: lse_forward, dlogits_backward, grad_weight,
grad_input). Over one recompute forward + backward each of the four GEMM kernels does
2·N·H·V FLOPs in all (one lse_forward launch; one launch per vocabulary chunk of each of the others).
"""

import json
import os
import statistics
import tempfile
import time

# lfce GEMM kernel -> the cuBLAS product of the same shape and output layout, as "what it computes".
GEMM_KERNELS = {
    "lse_forward": "x·Wᵀ [N, V]",
    "dlogits_backward": "W·xᵀ [V, N] (dzᵀ)",
    "grad_weight": "dzᵀ·x [V, H]",
    "grad_input": "dz·W [N, H]",
}
TRACE_CATEGORIES = ("kernel", "gpu_memset", "gpu_memcpy")  # device activity in a chrome trace
# Seconds of back-to-back calls before each trace. A GEMM at full rate draws the H200 to its power
# cap within a fraction of a second, and the SM clock then settles near 1.45-1.5 GHz (at 645 W) from
# the 1.98 GHz an idle card starts at; a product traced after a pause runs its first calls at the
# higher clock. Both sides are traced in the settled state a training step runs in (sustained
# lse_forward and cuBLAS logits GEMM: the same clock and power, bench/power_clocks.py).
WARM_SECONDS = 1.0
# The two sides are traced in turn this many times (lfce, then each cuBLAS product, again), and each
# kernel's time is the median over the rounds: the settled clock still drifts by several percent
# over a minute as the card warms, and a side traced only first or only last would carry that drift.
ROUNDS = 3


def gemm_flops(tokens, hidden, vocab):
    """FLOPs of one of the four GEMMs of a fused step, all its launches together: 2·N·H·V."""
    return 2.0 * tokens * hidden * vocab


def expected_launches(vocab, chunk):
    """Launches of each GEMM kernel in one recompute forward + backward with a ``chunk``-wide
    backward: lse_forward once, the others once per vocabulary chunk."""
    chunks = -(-vocab // chunk)
    return {"lse_forward": 1, "dlogits_backward": chunks, "grad_weight": chunks, "grad_input": chunks}


def device_activity(trace):
    """{name: [launches, total µs]} of the device activity (kernels, memsets, copies) in a chrome
    trace (the dict torch.profiler's export_chrome_trace writes)."""
    totals = {}
    for event in trace.get("traceEvents", []):
        if str(event.get("cat", "")).lower() not in TRACE_CATEGORIES or event.get("ph") != "X":
            continue
        entry = totals.setdefault(event["name"], [0, 0.0])
        entry[0] += 1
        entry[1] += float(event.get("dur", 0.0))
    return totals


def median_activity(rounds):
    """device_activity() of several rounds of the same calls, each name's time the median over the
    rounds (its launches from the first round that has it)."""
    names = []
    for activity in rounds:
        names += [name for name in activity if name not in names]
    return {name: [next(a[name][0] for a in rounds if name in a),
                   statistics.median(a[name][1] for a in rounds if name in a)] for name in names}


def breakdown(activity, steps):
    """Per-step rows (name, count, total_ms, share), longest first, of device_activity() over ``steps``."""
    total = sum(us for _, us in activity.values())
    rows = [{"name": name, "count": count / steps, "total_ms": us / steps / 1e3,
             "share": us / total if total else 0.0}
            for name, (count, us) in activity.items()]
    return sorted(rows, key=lambda row: -row["total_ms"])


def gemm_rows(activity, cublas, tokens, hidden, vocab, steps, launches=None):
    """One row per lfce GEMM kernel: launches, FLOPs, ms and TFLOP/s per step, the same for the
    cuBLAS product (``cublas``: kernel -> (ms per product, cuBLAS kernel names)), and the ratio of
    TFLOP/s lfce / cuBLAS. ``launches``: the expected launch counts, recorded beside the observed."""
    flops = gemm_flops(tokens, hidden, vocab)
    rows = []
    for kernel, product in GEMM_KERNELS.items():
        row = {"kernel": kernel, "cublas_product": product, "flops": flops}
        count, us = activity.get(kernel, (0, 0.0))
        if count:
            row.update(launches=count / steps, ms=us / steps / 1e3)
            row["tflops"] = flops / (row["ms"] * 1e-3) / 1e12
        else:
            row["error"] = f"no {kernel!r} kernel in the profiler trace"
        if launches:
            row["launches_expected"] = launches[kernel]
        if kernel in cublas:
            ms, names = cublas[kernel]
            row.update(cublas_ms=ms, cublas_kernels=names, cublas_tflops=flops / (ms * 1e-3) / 1e12)
            if "tflops" in row:
                row["vs_cublas"] = row["tflops"] / row["cublas_tflops"]
        rows.append(row)
    return rows


def _trace(step, steps, warm_seconds=WARM_SECONDS):
    """Device activity of ``steps`` calls of ``step`` under torch.profiler, after one warm-up call and
    ``warm_seconds`` of back-to-back calls (WARM_SECONDS)."""
    import torch

    step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    while time.perf_counter() - start < warm_seconds:
        step()
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    handle, path = tempfile.mkstemp(suffix=".json", prefix="lfce-bench-trace-")
    os.close(handle)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            activity = device_activity(json.load(f))
    finally:
        os.remove(path)
    if not activity:
        raise RuntimeError("the profiler recorded no GPU activity (is CUPTI available?)")
    return activity


def _cublas_products(x, w):
    """kernel -> a no-argument call of the cuBLAS product of its shape (the operands made here)."""
    import torch

    x, w = x.detach(), w.detach()
    dzt = torch.empty(w.shape[0], x.shape[0], dtype=x.dtype, device=x.device).normal_()
    return {
        "lse_forward": lambda: x @ w.t(),
        "dlogits_backward": lambda: w @ x.t(),
        "grad_weight": lambda: dzt @ x,
        "grad_input": lambda: dzt.t() @ w,
    }, dzt


def profile(x, w, y, steps=2, warm_seconds=WARM_SECONDS, rounds=ROUNDS):
    """The per-kernel breakdown of an lfce recompute forward + backward and the GEMM-only
    comparison, for the inputs' shape: {"steps", "warm_seconds", "rounds", "chunk", "kernels": [...],
    "gemms": [...]}. Each side is traced after ``warm_seconds`` of back-to-back calls of itself, the
    sides in turn ``rounds`` times; every time is the median over the rounds."""
    import torch

    from lfce import _lib
    from lfce.functional import _DTYPES, linear_cross_entropy

    tokens, hidden = x.shape
    vocab = w.shape[0]
    chunk = _lib.backward_chunk_size(_lib.make_problem(tokens, hidden, vocab, _DTYPES[x.dtype]))

    def step():
        torch.autograd.grad(linear_cross_entropy(x, w, y, mode="recompute"), (x, w))
    products, dzt = _cublas_products(x, w)
    lfce_rounds, cublas_rounds = [], {kernel: [] for kernel in products}
    for _ in range(rounds):
        lfce_rounds.append(_trace(step, steps, warm_seconds))
        for kernel, product in products.items():
            cublas_rounds[kernel].append(_trace(product, steps, warm_seconds))
    del dzt, products
    activity = median_activity(lfce_rounds)
    cublas = {}
    for kernel, traces in cublas_rounds.items():
        times = median_activity(traces)
        cublas[kernel] = (sum(us for _, us in times.values()) / steps / 1e3, sorted(times))
    return {"steps": steps, "warm_seconds": warm_seconds, "rounds": rounds, "chunk": chunk,
            "kernels": breakdown(activity, steps),
            "gemms": gemm_rows(activity, cublas, tokens, hidden, vocab, steps, expected_launches(vocab, chunk))}


def format_profile(profile):
    """Human-readable lines for profile()'s result."""
    if "error" in profile:
        return [f"profile: {profile['error']}"]
    lines = [f"GEMM kernels against cuBLAS (per fwd+bwd, backward chunk {profile['chunk']}):",
             "{:<17} {:>8} {:>9} {:>9} {:>10} {:>12} {:>8}".format(
                 "", "launches", "ms", "TFLOP/s", "cuBLAS ms", "cuBLAS TF/s", "ratio")]
    for row in profile["gemms"]:
        if "error" in row:
            lines.append(f"{row['kernel']:<17} {row['error']}")
            continue
        lines.append(f"{row['kernel']:<17} {row['launches']:8g} {row['ms']:9.2f} {row['tflops']:9.1f} "
                     f"{row.get('cublas_ms', float('nan')):10.2f} {row.get('cublas_tflops', float('nan')):12.1f} "
                     f"{row.get('vs_cublas', float('nan')):8.3f}")
    lines.append("lfce recompute fwd+bwd by kernel:")
    for row in profile["kernels"]:
        lines.append(f"  {row['name'][:60]:<60} {row['count']:6g} {row['total_ms']:9.3f} ms {row['share']:7.1%}")
    return lines

"""Timing and memory of each implementation on one shape (needs a GPU), and their text form."""

import gc
import statistics
import sys
import time

from . import gemm_profile, impls

MIB = impls.MIB
TIME_LIMIT = "time limit reached"


def _timed(impl, x, w, y, warmup, iters):
    """CUDA events around the forward and the backward of ``warmup + iters`` steps; the median
    (and min, max) of the last ``iters``, and the wall time of the first step (compiles included)."""
    import torch

    torch.cuda.synchronize()
    runs, first_call_s = [], None
    for i in range(warmup + iters):
        start = time.perf_counter()
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        events[0].record()
        state = impl.forward(x, w, y)
        events[1].record()
        grads = impl.backward(state, x, w)
        events[2].record()
        del state, grads
        if i == 0:
            torch.cuda.synchronize()
            first_call_s = time.perf_counter() - start
        if i >= warmup:
            runs.append(events)
    torch.cuda.synchronize()
    forward = [s.elapsed_time(m) for s, m, _ in runs]
    backward = [m.elapsed_time(e) for _, m, e in runs]
    total = [s.elapsed_time(e) for s, _, e in runs]
    return {"forward_ms": statistics.median(forward), "backward_ms": statistics.median(backward),
            "total_ms": statistics.median(total), "min_ms": min(total), "max_ms": max(total),
            "first_call_s": first_call_s}


def _memory(impl, x, w, y):
    """Held (allocated between forward and backward, less the loss) and peak (during both, the
    gradients included) MiB beyond the inputs."""
    import torch

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    state = impl.forward(x, w, y)
    held = torch.cuda.memory_allocated() - base
    if impl.is_loss:
        held -= state.element_size() * state.numel()
    grads = impl.backward(state, x, w)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del state, grads
    return {"held_mib": held / MIB, "peak_mib": peak / MIB}


def _is_tuned(tokens, hidden, vocab, dtype, mode, device):
    from .. import _lib
    from ..functional import _DTYPES

    problem = _lib.make_problem(tokens, hidden, vocab, _DTYPES[dtype], mode=_lib.MODES[mode])
    return _lib.plan_is_tuned(problem, device)


def _free_bytes():
    import torch

    gc.collect()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info()[0]


def _too_big(name, tokens, hidden, vocab, element_size, free):
    need = impls.estimate_bytes(name, tokens, hidden, vocab, element_size)
    if impls.fits(need, free):
        return None
    return f"does not fit: needs about {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"


def _measure(name, tokens, hidden, vocab, dtype, x, w, y, warmup, iters):
    import torch

    try:
        impl = impls.load(name)
    except impls.Unavailable as error:
        return {"skipped": str(error)}
    row = _timed(impl, x, w, y, warmup, iters)
    row.update(_memory(impl, x, w, y))
    if impl.config:
        row["config"] = impl.config
    if name.startswith("lfce_"):
        # Asked after the run: the winners (if any) the run itself used.
        row["tuned"] = _is_tuned(tokens, hidden, vocab, dtype, name[len("lfce_"):], torch.cuda.current_device())
    return row


def _guarded(fn, *args):
    """fn(*args), or {"error": ...} for any failure of one measurement: the run goes on."""
    import torch

    try:
        return fn(*args)
    except torch.cuda.OutOfMemoryError as error:
        return {"error": "out of memory: " + str(error).splitlines()[0]}
    except Exception as error:  # noqa: BLE001 - an anchor's Triton failure must not end the run
        message = str(error).strip().splitlines()
        return {"error": f"{type(error).__name__}: {message[0] if message else ''}"}
    finally:
        gc.collect()
        torch.cuda.empty_cache()


def _say(progress, text):
    if progress:
        print(text, file=sys.stderr, flush=True)


def run(model, hidden, vocab, tokens, dtype=None, methods=("lfce_recompute", "lfce_eager", "torch"),
        warmup=3, iters=10, profile_steps=0, deadline=None, progress=False):
    """Measure ``methods`` (impls.IMPLEMENTATIONS) on one shape; return a dict of every figure.

    A method that is not importable, does not fit in memory (estimated up front), starts after
    ``deadline`` (time.monotonic()) or fails gets {"skipped": ...} or {"error": ...}; the others
    still run. profile_steps > 0 adds "profile" (gemm_profile.profile over that many steps).
    """
    import torch

    dtype = dtype or torch.bfloat16
    unknown = [m for m in methods if m not in impls.IMPLEMENTATIONS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {', '.join(impls.IMPLEMENTATIONS)}")
    element_size = torch.empty((), dtype=dtype).element_size()
    free = _free_bytes()
    x, w, y = impls.make_inputs(tokens, hidden, vocab, dtype)
    label = f"{model} N={tokens} H={hidden} V={vocab}"
    rows = {}
    for method in methods:
        skip = (TIME_LIMIT if deadline is not None and time.monotonic() > deadline
                else _too_big(method, tokens, hidden, vocab, element_size, free))
        if skip:
            rows[method] = {"skipped": skip}
            _say(progress, f"[bench] {label} {method}: skipped ({skip})")
            continue
        _say(progress, f"[bench] {label} {method} ...")
        rows[method] = _guarded(_measure, method, tokens, hidden, vocab, dtype, x, w, y, warmup, iters)
        row = rows[method]
        _say(progress, f"[bench] {label} {method}: " + (f"{row['total_ms']:.2f} ms" if "total_ms" in row
                                                         else row.get("skipped") or row.get("error")))
    useful_flops = 3 * 2.0 * tokens * hidden * vocab  # logits, grad_hidden, grad_weight: every method's work
    floor = rows.get("cublas_4gemm", {}).get("total_ms")
    for row in rows.values():
        if "total_ms" in row:
            row["useful_tflops"] = useful_flops / row["total_ms"] / 1e9
            if floor:
                row["vs_cublas_4gemm"] = row["total_ms"] / floor
    entry = {"model": model, "tokens": tokens, "hidden": hidden, "vocab": vocab,
             "dtype": str(dtype).replace("torch.", ""), "methods": rows}
    if profile_steps:
        skip = (TIME_LIMIT if deadline is not None and time.monotonic() > deadline
                else _too_big("profile", tokens, hidden, vocab, element_size, free))
        _say(progress, f"[bench] {label} profile" + (f": skipped ({skip})" if skip else " ..."))
        entry["profile"] = {"skipped": skip} if skip else _guarded(gemm_profile.profile, x, w, y,
                                                                     profile_steps)
    del x, w, y
    gc.collect()
    torch.cuda.empty_cache()
    return entry


def format_result(entry):
    """Human-readable lines for one run() result."""
    lines = [f"{entry['model']}: N={entry['tokens']} H={entry['hidden']} V={entry['vocab']} {entry['dtype']}"]
    if entry["methods"]:
        lines.extend(_method_lines(entry["methods"]))
    if "profile" in entry:
        profile = entry["profile"]
        if "skipped" in profile:
            lines.append(f"profile: skipped ({profile['skipped']})")
        else:
            lines.extend(gemm_profile.format_profile(profile))
    return lines


def _method_lines(methods):
    header = ("", "fwd ms", "bwd ms", "total ms", "held MiB", "peak MiB", "TFLOP/s", "vs 4gemm", "tuned")
    lines = ["{:<15} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>8} {:>6}".format(*header)]

    def cell(row, key, spec):
        return format(row[key], spec) if key in row else "-"
    for name, row in methods.items():
        if "total_ms" not in row:
            reason = row.get("error") or "skipped: " + row.get("skipped", "?")
            lines.append(f"{name:<15} {reason}")
            continue
        tuned = "-" if "tuned" not in row else ("yes" if row["tuned"] else "no")
        lines.append(f"{name:<15} {cell(row, 'forward_ms', '.2f'):>8} {cell(row, 'backward_ms', '.2f'):>8} "
                     f"{row['total_ms']:9.2f} {cell(row, 'held_mib', '.1f'):>9} {cell(row, 'peak_mib', '.1f'):>9} "
                     f"{cell(row, 'useful_tflops', '.1f'):>8} {cell(row, 'vs_cublas_4gemm', '.2f'):>8} {tuned:>6}")
    return lines

"""Timing and memory of each implementation on one shape (needs a GPU), and their text form."""

import gc
import sys
import time

from . import gemm_profile, impls

MIB = impls.MIB
TIME_LIMIT = "time limit reached"


def _first_step(impl, x, w, y):
    """The wall time of one forward + backward from an idle GPU to its end (compiles included)."""
    import torch

    torch.cuda.synchronize()
    start = time.perf_counter()
    state = impl.forward(x, w, y)
    grads = impl.backward(state, x, w)
    del state, grads
    torch.cuda.synchronize()
    return time.perf_counter() - start


def _step_timer(loaded, x, w, y):
    """options.interleave's time_step over the loaded implementations: CUDA events around one
    forward and one backward, read after the last round."""
    import torch

    def time_step(name):
        impl = loaded[name]
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        events[0].record()
        state = impl.forward(x, w, y)
        events[1].record()
        grads = impl.backward(state, x, w)
        events[2].record()
        del state, grads

        def read():
            events[2].synchronize()
            return events[0].elapsed_time(events[1]), events[0].elapsed_time(events[2])
        return read
    return time_step


def _interleaved(loaded, x, w, y, warmup, iters):
    """{name: timing row} for the loaded implementations, timed in turn: each one's first step alone
    (first_call_s), then ``warmup - 1 + iters`` rounds of one step each, in orders where each
    follows every other equally often, with no synchronisation between steps (options.interleave),
    so that the clock's drift as the card warms up, and a neighbour's effect on it, falls on every
    implementation alike.
    Forward and total are the medians of the last ``iters`` rounds; backward is their difference."""
    from .options import interleave

    rows, first = {}, {}
    for name, impl in loaded.items():
        try:
            first[name] = _first_step(impl, x, w, y)
        except Exception as error:  # noqa: BLE001 - one implementation's failure must not end the run
            rows[name] = _error_row(error)
    running = [name for name in loaded if name not in rows]
    if running:
        timed = interleave(running, warmup - 1, iters, _step_timer(loaded, x, w, y))
        for name, row in timed.items():
            if "total_ms" in row:
                row = {"forward_ms": row["forward_ms"], "backward_ms": row["total_ms"] - row["forward_ms"],
                       "total_ms": row["total_ms"], "min_ms": row["min_ms"], "max_ms": row["max_ms"],
                       "first_call_s": first[name]}
            rows[name] = row
    return rows


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
    from lfce import _lib
    from lfce.functional import _DTYPES

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


def _details(name, impl, tokens, hidden, vocab, dtype, x, w, y):
    """Held and peak memory of one implementation (one more step, alone), its configuration and, for
    lfce, whether the run used tuned winners."""
    import torch

    row = _memory(impl, x, w, y)
    if impl.config:
        row["config"] = impl.config
    if name.startswith("lfce_"):
        # Asked after the run: the winners (if any) the run itself used.
        row["tuned"] = _is_tuned(tokens, hidden, vocab, dtype, name[len("lfce_"):], torch.cuda.current_device())
    return row


def _error_row(error):
    """{"error": ...} of one failed measurement: the run goes on."""
    import torch

    from .options import _error

    if isinstance(error, torch.cuda.OutOfMemoryError):
        return {"error": "out of memory: " + str(error).splitlines()[0]}
    return {"error": _error(error)}


def _guarded(fn, *args):
    """fn(*args), or {"error": ...} for any failure of one measurement: the run goes on."""
    import torch

    try:
        return fn(*args)
    except Exception as error:  # noqa: BLE001 - an anchor's Triton failure must not end the run
        return _error_row(error)
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
    rows, loaded = {}, {}
    for method in methods:
        skip = (TIME_LIMIT if deadline is not None and time.monotonic() > deadline
                else _too_big(method, tokens, hidden, vocab, element_size, free))
        if not skip:
            try:
                loaded[method] = impls.load(method)
            except impls.Unavailable as error:
                skip = str(error)
        if skip:
            rows[method] = {"skipped": skip}
            _say(progress, f"[bench] {label} {method}: skipped ({skip})")
    if loaded:
        _say(progress, f"[bench] {label} {', '.join(loaded)}: interleaved ...")
        timed = _guarded(_interleaved, loaded, x, w, y, warmup, iters)
        for method, impl in loaded.items():
            row = dict(timed) if "error" in timed else timed[method]
            if "total_ms" in row:
                details = _guarded(_details, method, impl, tokens, hidden, vocab, dtype, x, w, y)
                row.update({"memory_error": details["error"]} if "error" in details else details)
            rows[method] = row
            _say(progress, f"[bench] {label} {method}: " + (f"{row['total_ms']:.2f} ms" if "total_ms" in row
                                                             else row.get("error")))
    rows = {method: rows[method] for method in methods}
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

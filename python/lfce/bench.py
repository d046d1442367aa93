"""Forward + backward timing and memory of one model's output layer, lfce against PyTorch.

Used by ``python -m lfce`` on a machine with a CUDA GPU. Timings come from CUDA
events around each phase; memory from the caching allocator's counters:

* held: allocated after the forward beyond the inputs, less the loss itself
  (what a training step keeps alive between forward and backward);
* peak: the highest allocation during forward + backward beyond the inputs
  (includes the gradients, which every method must produce).
"""

import statistics

import torch
import torch.nn.functional as F

from .functional import linear_cross_entropy

__all__ = ["make_inputs", "run"]

MIB = 1 << 20
IGNORE_EVERY = 17  # one target in 17 is ignore_index, like padding in a packed batch


def make_inputs(tokens, hidden, vocab, dtype, device="cuda", seed=0):
    """Random hidden ~ N(0, 1), weight ~ N(0, 2.5/sqrt(H)) (logits with std about 2.5), targets."""
    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, device=device, generator=generator).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, device=device, generator=generator) * (2.5 / hidden ** 0.5)).to(dtype)
    w.requires_grad_()
    y = torch.randint(0, vocab, (tokens,), device=device, generator=generator)
    y[torch.arange(tokens, device=device) % IGNORE_EVERY == IGNORE_EVERY - 1] = -100
    return x, w, y


def _reference(x, w, y):
    return F.cross_entropy(F.linear(x, w), y, ignore_index=-100)


def _is_oom(error):
    return isinstance(error, RuntimeError) and "out of memory" in str(error)


def _time(loss_fn, x, w, warmup, iters):
    """Median forward, backward and total milliseconds over ``iters`` runs."""
    events = []
    for i in range(warmup + iters):
        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        loss = loss_fn()
        mid.record()
        grads = torch.autograd.grad(loss, (x, w))
        end.record()
        del loss, grads
        if i >= warmup:
            events.append((start, mid, end))
    torch.cuda.synchronize()
    forward = [s.elapsed_time(m) for s, m, _ in events]
    backward = [m.elapsed_time(e) for _, m, e in events]
    total = [s.elapsed_time(e) for s, _, e in events]
    return {"forward_ms": statistics.median(forward), "backward_ms": statistics.median(backward),
            "total_ms": statistics.median(total)}


def _memory(loss_fn, x, w):
    """Held (between forward and backward) and peak (during both) MiB beyond the inputs."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = loss_fn()
    held = torch.cuda.memory_allocated() - base - loss.element_size() * loss.numel()
    grads = torch.autograd.grad(loss, (x, w))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del loss, grads
    return {"held_mib": held / MIB, "peak_mib": peak / MIB}


def _measure(loss_fn, x, w, warmup, iters):
    figures = _time(loss_fn, x, w, warmup, iters)
    figures.update(_memory(loss_fn, x, w))
    return figures


def run(model, hidden, vocab, tokens, dtype=torch.bfloat16, mode="recompute", warmup=3, iters=10):
    """Measure lfce and the PyTorch reference on one shape; return a dict of all figures."""
    x, w, y = make_inputs(tokens, hidden, vocab, dtype)
    gemm_flops = 2.0 * tokens * hidden * vocab
    result = {"model": model, "tokens": tokens, "hidden": hidden, "vocab": vocab,
              "dtype": str(dtype).replace("torch.", ""), "mode": mode,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__}

    lfce = _measure(lambda: linear_cross_entropy(x, w, y, mode=mode), x, w, warmup, iters)
    # Both modes run lfce_forward (1 GEMM) and lfce_backward (3 GEMMs); eager only moves the
    # backward into the forward.
    lfce["tflops"] = 4 * gemm_flops / (lfce["total_ms"] * 1e-3) / 1e12
    result["lfce"] = lfce

    try:
        result["torch"] = _measure(lambda: _reference(x, w, y), x, w, warmup, iters)
    except RuntimeError as error:
        if not _is_oom(error):
            raise
        torch.cuda.empty_cache()
        result["torch"] = {"error": "out of memory"}
    return result


def format_result(result):
    """Human-readable lines for one run() result."""
    r = result
    lines = [(f"{r['model']}: N={r['tokens']} H={r['hidden']} V={r['vocab']} {r['dtype']}, mode {r['mode']}, "
              f"on {r['device']}")]
    header = ("", "fwd ms", "bwd ms", "total ms", "held MiB", "peak MiB", "TFLOP/s")
    lines.append("{:<8} {:>10} {:>10} {:>10} {:>10} {:>10} {:>8}".format(*header))
    for name in ("lfce", "torch"):
        f = result[name]
        if "error" in f:
            lines.append(f"{name:<8} {f['error']}")
            continue
        tflops = f"{f['tflops']:8.1f}" if "tflops" in f else f"{'-':>8}"
        lines.append(f"{name:<8} {f['forward_ms']:10.2f} {f['backward_ms']:10.2f} {f['total_ms']:10.2f} "
                     f"{f['held_mib']:10.1f} {f['peak_mib']:10.1f} {tflops}")
    return lines

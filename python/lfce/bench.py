"""lfce's one benchmark harness: lfce against PyTorch and the GEMM floor, on one GPU.

    python3 -m lfce.bench --out bench/results/          # every default model, one JSON file
    python3 -m lfce --model llama3-8b                   # one model and mode (uses run() below)

Methods, each forward + backward w.r.t. hidden and weight (mean reduction, one target in 17
ignored, like padding in a packed batch):

* ``torch``: the PyTorch baseline, ``F.linear`` + ``F.cross_entropy`` with the logits in the
  input dtype (bf16 logits for bf16), as users run it; it materialises the [N, V] logits.
* ``torch_compile``: the same under torch.compile (``--compile``).
* ``lfce_recompute`` / ``lfce_eager``: ``lfce.linear_cross_entropy`` in each mode.
* ``cublas_3gemm`` / ``cublas_4gemm``: the matrix products alone through torch.matmul (cuBLAS):
  logits x·Wᵀ, grad_x = dz·W, grad_W = dzᵀ·x (3), plus the backward's logits recompute (4).
  The floor a fused kernel is measured against.

Timings: warm-ups, then the median (and min, max) of CUDA-event timings of each phase;
useful_tflops counts the three GEMMs every method must do (3 · 2·N·H·V FLOPs) over the total
time, whatever it actually ran (the recompute backward and cublas_4gemm run a fourth).
Memory, from the caching allocator's counters: held = allocated after the forward beyond the
inputs, less the loss (what a training step keeps alive between forward and backward); peak =
the highest allocation during forward + backward beyond the inputs (gradients included).

The JSON records what the figures depend on (metadata()): date, GPU, driver, torch, the git
commit ($LFCE_COMMIT where set, else git's), lfce's generator version, whether each lfce
problem ran with tuned winners, and the baseline in words.
"""

import argparse
import ctypes
import datetime
import json
import os
import statistics
import subprocess
import sys

__all__ = ["BASELINE", "format_result", "git_commit", "main", "make_inputs", "metadata", "run", "write_json"]

BASELINE = "F.linear + F.cross_entropy with the logits in the input dtype (bf16 logits for bf16), as users run it"
DEFAULT_RUNS = "llama3-8b,gemma2-2b,qwen2.5-7b,llama3-70b:4096"  # model[:tokens]
DEFAULT_TOKENS = 8192
MIB = 1 << 20
IGNORE_EVERY = 17
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOSS_METHODS = ("lfce_recompute", "lfce_eager", "torch", "torch_compile")
FLOOR_METHODS = ("cublas_3gemm", "cublas_4gemm")


# ---- what a result depends on (no GPU needed) -----------------------------------------------

def git_commit(root=REPO):
    """(commit, dirty): ($LFCE_COMMIT, None) when set (a copy whose .git is absent or stale, as on
    a device machine), else git's for the checkout at ``root``, else (None, None)."""
    if os.environ.get("LFCE_COMMIT"):
        return os.environ["LFCE_COMMIT"], None
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], check=False, capture_output=True, text=True,
                              timeout=10)
        if head.returncode == 0:
            status = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                                    check=False, capture_output=True, text=True, timeout=10)
            return head.stdout.strip(), (bool(status.stdout.strip()) if status.returncode == 0 else None)
    except (OSError, subprocess.SubprocessError):
        pass
    return None, None


def _driver_versions():
    """(NVIDIA driver release from nvidia-smi, CUDA version the driver supports), None where unknown."""
    release = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             check=False, capture_output=True, text=True, timeout=30)
        if smi.returncode == 0 and smi.stdout.strip():
            release = smi.stdout.splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    cuda = None
    try:
        version = ctypes.c_int(0)
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
            cuda = f"{version.value // 1000}.{version.value % 1000 // 10}"
    except OSError:
        pass
    return release, cuda


def _gpu_info(device=0):
    import torch

    release, cuda = _driver_versions()
    return {"gpu": torch.cuda.get_device_name(device), "driver_version": release, "driver_cuda_version": cuda,
            "torch": torch.__version__, "torch_cuda": torch.version.cuda}


def metadata(command, gpu_info=None, root=REPO):
    """Everything a result depends on besides its shape: a dict for the JSON's top level.

    gpu_info: the GPU, driver and torch fields (default: read from device 0 and the driver).
    """
    from . import __version__, _lib

    commit, dirty = git_commit(root)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command, "lfce": __version__, "generator_version": _lib.generator_version(),
            "git_commit": commit, "git_dirty": dirty, "baseline": BASELINE}
    meta.update(_gpu_info() if gpu_info is None else gpu_info)
    return meta


def write_json(result, out_dir):
    """Write ``result`` (metadata() plus "results") to out_dir/bench-<date>-<commit>.json; return the path."""
    os.makedirs(out_dir, exist_ok=True)
    commit = (result.get("git_commit") or "nocommit")[:12]
    path = os.path.join(out_dir, f"bench-{result['date'][:10]}-{commit}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    return path


# ---- measuring (needs a GPU) ------------------------------------------------------------------

def make_inputs(tokens, hidden, vocab, dtype, device="cuda", seed=0):
    """Random hidden ~ N(0, 1), weight ~ N(0, 2.5/sqrt(H)) (logits with std about 2.5), targets."""
    import torch

    generator = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, device=device, generator=generator).to(dtype).requires_grad_()
    w = (torch.randn(vocab, hidden, device=device, generator=generator) * (2.5 / hidden ** 0.5)).to(dtype)
    w.requires_grad_()
    y = torch.randint(0, vocab, (tokens,), device=device, generator=generator)
    y[torch.arange(tokens, device=device) % IGNORE_EVERY == IGNORE_EVERY - 1] = -100
    return x, w, y


def _torch_loss(x, w, y):
    import torch.nn.functional as F

    return F.cross_entropy(F.linear(x, w), y, ignore_index=-100)  # logits in x's dtype: BASELINE


def _loss_fns():
    import torch

    from .functional import linear_cross_entropy

    return {
        "lfce_recompute": lambda x, w, y: linear_cross_entropy(x, w, y, mode="recompute"),
        "lfce_eager": lambda x, w, y: linear_cross_entropy(x, w, y, mode="eager"),
        "torch": _torch_loss,
        "torch_compile": torch.compile(_torch_loss),  # compiled on its first call
    }


def _gemms(x, w, count):
    """The matrix products of a fused step and nothing else (the logits stand in for dlogits)."""
    x, w = x.detach(), w.detach()

    def step():
        z = x @ w.t()
        if count == 4:
            z = x @ w.t()
        return z @ w, z.t() @ x
    return step


def _timed(phases, warmup, iters):
    """CUDA events of ``iters`` steps after ``warmup``: phases(mark) runs one step, calling mark()
    at each phase boundary; returns each timed step's list of events."""
    import torch

    runs = []
    for i in range(warmup + iters):
        marks = []

        def mark(marks=marks):
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
        phases(mark)
        if i >= warmup:
            runs.append(marks)
    torch.cuda.synchronize()
    return runs


def _time_loss(loss_fn, x, w, y, warmup, iters):
    import torch

    def phases(mark):
        mark()
        loss = loss_fn(x, w, y)
        mark()
        grads = torch.autograd.grad(loss, (x, w))
        mark()
        del loss, grads
    runs = _timed(phases, warmup, iters)
    forward = [s.elapsed_time(m) for s, m, _ in runs]
    backward = [m.elapsed_time(e) for _, m, e in runs]
    total = [s.elapsed_time(e) for s, _, e in runs]
    return {"forward_ms": statistics.median(forward), "backward_ms": statistics.median(backward),
            "total_ms": statistics.median(total), "min_ms": min(total), "max_ms": max(total)}


def _time_floor(step, warmup, iters):
    def phases(mark):
        mark()
        step()
        mark()
    total = [s.elapsed_time(e) for s, e in _timed(phases, warmup, iters)]
    return {"total_ms": statistics.median(total), "min_ms": min(total), "max_ms": max(total)}


def _memory(loss_fn, x, w, y):
    """Held (between forward and backward) and peak (during both) MiB beyond the inputs."""
    import torch

    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    loss = loss_fn(x, w, y)
    held = torch.cuda.memory_allocated() - base - loss.element_size() * loss.numel()
    grads = torch.autograd.grad(loss, (x, w))
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del loss, grads
    return {"held_mib": held / MIB, "peak_mib": peak / MIB}


def _is_tuned(tokens, hidden, vocab, dtype, mode, device):
    from . import _lib
    from .functional import _DTYPES

    problem = _lib.make_problem(tokens, hidden, vocab, _DTYPES[dtype], mode=_lib.MODES[mode])
    return _lib.plan_is_tuned(problem, device)


def run(model, hidden, vocab, tokens, dtype=None, methods=("lfce_recompute", "lfce_eager", "torch"),
        warmup=3, iters=10):
    """Measure ``methods`` (names from the module docstring) on one shape; return a dict of all figures.

    A method that runs out of memory gets {"error": ...} and the others still run.
    """
    import torch

    dtype = dtype or torch.bfloat16
    unknown = [m for m in methods if m not in LOSS_METHODS + FLOOR_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known: {', '.join(LOSS_METHODS + FLOOR_METHODS)}")
    x, w, y = make_inputs(tokens, hidden, vocab, dtype)
    device = torch.cuda.current_device()
    loss_fns = _loss_fns()
    rows = {}
    for method in methods:
        try:
            if method in FLOOR_METHODS:
                row = _time_floor(_gemms(x, w, int(method[7])), warmup, iters)
            else:
                row = _time_loss(loss_fns[method], x, w, y, warmup, iters)
                row.update(_memory(loss_fns[method], x, w, y))
            if method.startswith("lfce_"):
                # Asked after the run: the winners (if any) the run itself used.
                row["tuned"] = _is_tuned(tokens, hidden, vocab, dtype, method[len("lfce_"):], device)
        except torch.cuda.OutOfMemoryError as error:
            row = {"error": "out of memory: " + str(error).splitlines()[0]}
        torch.cuda.empty_cache()
        rows[method] = row
    useful_flops = 3 * 2.0 * tokens * hidden * vocab  # logits, grad_hidden, grad_weight: every method's work
    floor = rows.get("cublas_4gemm", {}).get("total_ms")
    for row in rows.values():
        if "total_ms" not in row:
            continue
        row["useful_tflops"] = useful_flops / row["total_ms"] / 1e9
        if floor:
            row["vs_cublas_4gemm"] = row["total_ms"] / floor
    return {"model": model, "tokens": tokens, "hidden": hidden, "vocab": vocab,
            "dtype": str(dtype).replace("torch.", ""), "methods": rows}


def format_result(entry):
    """Human-readable lines for one run() result."""
    lines = [f"{entry['model']}: N={entry['tokens']} H={entry['hidden']} V={entry['vocab']} {entry['dtype']}"]
    header = ("", "fwd ms", "bwd ms", "total ms", "held MiB", "peak MiB", "TFLOP/s", "tuned")
    lines.append("{:<15} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>6}".format(*header))

    def cell(row, key, spec):
        return format(row[key], spec) if key in row else "-"
    for name, row in entry["methods"].items():
        if "error" in row:
            lines.append(f"{name:<15} {row['error']}")
            continue
        tuned = "-" if "tuned" not in row else ("yes" if row["tuned"] else "no")
        lines.append(f"{name:<15} {cell(row, 'forward_ms', '.2f'):>8} {cell(row, 'backward_ms', '.2f'):>8} "
                     f"{row['total_ms']:9.2f} {cell(row, 'held_mib', '.1f'):>9} {cell(row, 'peak_mib', '.1f'):>9} "
                     f"{row['useful_tflops']:8.1f} {tuned:>6}")
    return lines


def _parse_runs(text, known):
    """'model[:tokens],...' -> [(model, tokens)], naming an unknown model or a bad token count."""
    runs = []
    for item in text.split(","):
        model, _, tokens = item.strip().partition(":")
        if model not in known:
            raise ValueError(f"unknown model {model!r}; known: {', '.join(sorted(known))}")
        try:
            count = int(tokens) if tokens else DEFAULT_TOKENS
        except ValueError:
            raise ValueError(f"bad token count {tokens!r} in {item!r} (expected model[:tokens])") from None
        if count < 1:
            raise ValueError(f"token count must be >= 1, got {count} in {item!r}")
        runs.append((model, count))
    return runs


def main(argv=None):
    from . import presets

    parser = argparse.ArgumentParser(prog="python -m lfce.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=DEFAULT_RUNS,
                        help=f"model[:tokens] list from the library's presets (default: {DEFAULT_RUNS}; "
                             f"tokens default {DEFAULT_TOKENS})")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile (slow to compile)")
    parser.add_argument("--out", default=os.path.join("bench", "results"), help="folder for the JSON result")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0:
        parser.error(f"--iters must be >= 1 and --warmup >= 0, got {args.iters} and {args.warmup}")
    try:
        runs = _parse_runs(args.models, presets.table())
    except ValueError as error:
        parser.error(f"--models: {error}")
    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    methods = FLOOR_METHODS + ("lfce_recompute", "lfce_eager", "torch") + (("torch_compile",) if args.compile else ())
    argv = sys.argv[1:] if argv is None else argv
    result = metadata("python3 -m lfce.bench " + " ".join(argv))
    result["results"] = []
    for model, tokens in runs:
        hidden, vocab = presets.table()[model]
        entry = run(model, hidden, vocab, tokens, dtype, methods, args.warmup, args.iters)
        result["results"].append(entry)
        print("\n".join(format_result(entry)), flush=True)
    print("wrote", write_json(result, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

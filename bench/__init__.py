"""lfce's benchmark harness: lfce against the other fused losses and the cuBLAS GEMM floor, on one GPU.

Run from a checkout (it is not part of the installed package):

    python3 -m bench --models llama3-8b --tokens 8192 --wheels DIR      # appends to bench/data/benchmark_data.csv
    python3 -m bench --gemm-only --models llama3-8b,gemma2-2b --tokens 8192   # per-kernel profile only
    python3 -m bench.report --table --plot docs/benchmark.png          # the current table and plot, no GPU
    python3 -m bench options --model llama3-8b --tokens 8192           # each loss option's cost (options.py)
    python3 -m bench ab --model llama3-70b --force grad_weight=128x256x64/wg2/s4/c2   # eager vs cuBLAS
                                                        # power-settled, tiles pinned (ab.py)
    python3 -m lfce --model llama3-8b                   # one model and mode (uses run())

Implementations (impls.py), each forward + backward w.r.t. hidden and weight, bf16 by default, mean
reduction, one target in 17 ignored (5.9%, like padding in a packed batch):

* ``cublas_4gemm`` / ``cublas_3gemm``: the matrix products alone through torch.matmul (cuBLAS):
  logits x·Wᵀ twice, dz·W and dzᵀ·x (the floor a recompute kernel is measured against), or
  without the recompute (the eager floor). Every ratio ``vs_cublas_4gemm`` is to the first.
* ``lfce_recompute`` / ``lfce_eager``: ``lfce.linear_cross_entropy`` in each mode.
* ``torch``: ``F.linear`` + ``F.cross_entropy`` with bf16 logits, as users run it; ``torch_compile``:
  the same under torch.compile, recompiled for each shape.
* ``liger``: Liger-Kernel's fused linear cross entropy; ``cce`` / ``cce_exact``: Cut Cross-Entropy
  with and without gradient filtering. Imported when run: ``--wheels DIR`` unpacks the pure-Python
  wheels in DIR (``pip download --no-deps liger-kernel cut-cross-entropy -d DIR``) so that a machine
  without network needs no pip install. One that cannot be imported (no Triton, no wheel) is
  reported as skipped, with the reason.

Shapes: each preset of ``--models`` at each N of ``--tokens`` (``model:N`` pins one N). A
combination whose estimated memory (impls.estimate_bytes) exceeds 90% of the free memory is skipped
up front; one that still fails gets its error and the benchmark goes on.

Timings (measure.py): the implementations of a shape run interleaved, one step each per round
and no synchronisation between steps, so that the clock's drift as the card heats up falls on all of
them alike. The rounds' orders let every implementation follow every other equally often within the
rounds over a cycle of them (options.balanced_orders: n rounds for n implementations, 2n for an odd
n, two alternate), and none follow itself across rounds: at the power cap the predecessor's power
moves a step's time (docs/benchmarking.md). --iters a whole number of cycles balances the timed
rounds exactly (7 implementations: 14). Each one's first step runs alone first: first_call_s is its
wall time (compiles included). Then ``--warmup - 1`` untimed rounds and ``--iters`` timed ones: the
median (and min, max) of CUDA-event timings of the forward and of forward + backward; backward_ms is
the difference of those medians.
useful_tflops counts the three GEMMs every method must do (3 · 2·N·H·V FLOPs) over the total time.
Memory, from the caching allocator's counters: held = allocated after the forward beyond the
inputs, less the loss (what a training step keeps alive between forward and backward); peak =
the highest allocation during forward + backward beyond the inputs (gradients included).

Profile (gemm_profile.py; on by default, alone with ``--gemm-only``): from torch.profiler traces,
each lfce GEMM kernel's time, launches and TFLOP/s over one recompute forward + backward against the
cuBLAS GEMM of the same shape, and the time of every kernel of that forward + backward. Each side is
traced after a second of back-to-back calls of itself (gemm_profile.WARM_SECONDS), so that both run at
the clock the card's power cap settles to, not the boost clock of a card that was idle a moment; the
sides are traced in turn three times (gemm_profile.ROUNDS) and each time is the median of the rounds.

Output: when the benchmark ends, one row per implementation and shape is appended to the data file
(data.py: ``--csv``, by default the checkout's bench/data/benchmark_data.csv; ``--no-csv`` for none)
with what the figures depend on (meta.metadata(): date, GPU, driver, torch, Liger and CCE versions,
the git commit, $LFCE_COMMIT where set, and lfce's generator version). ``--json PATH`` also writes
everything, the profile included, rewritten after each shape so that an interrupted benchmark keeps
what it measured.
"""

import argparse
import importlib.util
import os
import sys
import time

if importlib.util.find_spec("lfce") is None:  # not installed: the checkout's package (python/lfce)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

from . import data, impls
from .gemm_profile import format_profile, gemm_flops
from .impls import DESCRIPTIONS, IMPLEMENTATIONS, estimate_bytes, make_inputs
from .measure import TIME_LIMIT, format_result, run
from .meta import BASELINE, git_commit, metadata, save_json, write_json

__all__ = ["BASELINE", "DESCRIPTIONS", "IMPLEMENTATIONS", "estimate_bytes", "format_profile", "format_result",
           "gemm_flops", "git_commit", "main", "make_inputs", "metadata", "parse_args", "run", "save_json",
           "write_json"]

DEFAULT_MODELS = "llama3-8b,gemma2-2b,qwen2.5-7b,llama3-70b"
DEFAULT_TOKENS = "2048,8192,16384,32768"
DTYPES = ("bf16", "fp16", "fp32")


def _parse_runs(text, known, tokens):
    """'model[:N],...' -> [(model, N)]: a model without ':N' at each of ``tokens``; names an
    unknown model or a bad token count."""
    runs = []
    for item in text.split(","):
        model, _, count = item.strip().partition(":")
        if model not in known:
            raise ValueError(f"unknown model {model!r}; known: {', '.join(sorted(known))}")
        runs.extend((model, n) for n in (_parse_counts(count, item) if count else tokens))
    return runs


def _parse_counts(text, where=None):
    """'2048,8192' -> [2048, 8192], naming a bad or non-positive count."""
    counts = []
    for item in text.split(","):
        try:
            count = int(item)
        except ValueError:
            raise ValueError(f"bad token count {item!r} in {where or text!r}") from None
        if count < 1:
            raise ValueError(f"token count must be >= 1, got {count} in {where or text!r}")
        counts.append(count)
    return counts


def _parse_impls(text):
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in IMPLEMENTATIONS]
    if unknown or not names:
        raise ValueError(f"unknown implementation(s) {unknown or [text]}; known: {', '.join(IMPLEMENTATIONS)}")
    return tuple(names)


def parse_args(argv=None):
    """The command line, checked; needs neither the library nor torch (--models is checked in main)."""
    parser = argparse.ArgumentParser(prog="python3 -m bench", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help=f"model[:N] list from the library's presets (default: {DEFAULT_MODELS}); "
                             "a model without :N runs at each of --tokens")
    parser.add_argument("--tokens", default=DEFAULT_TOKENS, help=f"token counts N (default: {DEFAULT_TOKENS})")
    parser.add_argument("--impls", default=",".join(IMPLEMENTATIONS),
                        help=f"implementations to time (default: all of {', '.join(IMPLEMENTATIONS)})")
    parser.add_argument("--dtype", default="bf16", choices=DTYPES)
    parser.add_argument("--iters", type=int, default=10, help="timed steps (median); default 10")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (>= 1 compiles); default 3")
    parser.add_argument("--profile-steps", type=int, default=2,
                        help="steps of the per-kernel profile and the GEMM-only comparison (0: none); default 2")
    parser.add_argument("--gemm-only", action="store_true",
                        help="only the profile: each lfce GEMM kernel against cuBLAS, and the kernel breakdown")
    parser.add_argument("--wheels", metavar="DIR",
                        help="folder of pure-Python wheels (liger-kernel, cut-cross-entropy) to import unpacked")
    parser.add_argument("--time-limit", type=float, metavar="S",
                        help="start nothing new after S seconds (the rest is reported skipped)")
    parser.add_argument("--csv", default=data.DEFAULT_CSV,
                        help="append a row per implementation and shape to this CSV (default: the checkout's "
                             "bench/data/benchmark_data.csv)")
    parser.add_argument("--no-csv", action="store_true", help="append nothing to the CSV")
    parser.add_argument("--json", metavar="PATH", help="also write every figure (the profile too) as JSON to PATH")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 1 or args.profile_steps < 0:
        parser.error(f"--iters and --warmup must be >= 1 and --profile-steps >= 0, "
                     f"got {args.iters}, {args.warmup} and {args.profile_steps}")
    if args.gemm_only and args.profile_steps < 1:
        parser.error(f"--gemm-only needs --profile-steps >= 1, got {args.profile_steps}")
    if args.time_limit is not None and args.time_limit <= 0:
        parser.error(f"--time-limit must be > 0 seconds, got {args.time_limit}")
    try:
        args.tokens = _parse_counts(args.tokens)
        args.impls = () if args.gemm_only else _parse_impls(args.impls)
    except ValueError as error:
        parser.error(str(error))
    return parser, args


def _timed_out(entry):
    rows = list(entry["methods"].values()) + [entry.get("profile", {})]
    return any(row.get("skipped") == TIME_LIMIT for row in rows)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["options"]:
        from . import options

        return options.main(argv[1:])
    if argv[:1] == ["ab"]:
        from . import ab

        return ab.main(argv[1:])
    parser, args = parse_args(argv)
    from lfce import presets

    try:
        runs = _parse_runs(args.models, presets.table(), args.tokens)
    except ValueError as error:
        parser.error(f"--models: {error}")
    wheels = None
    if args.wheels:
        try:
            wheels = impls.add_wheels(args.wheels)
        except ValueError as error:
            parser.error(f"--wheels: {error}")
    import torch

    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    deadline = None if args.time_limit is None else time.monotonic() + args.time_limit
    result = metadata("python3 -m bench " + " ".join(argv))
    result.update(wheels=wheels, complete=False, implementations={name: DESCRIPTIONS[name] for name in args.impls},
                  settings={"dtype": args.dtype, "reduction": "mean", "ignore_index": impls.IGNORE_INDEX,
                            "ignored_fraction": 1 / impls.IGNORE_EVERY, "warmup": args.warmup,
                            "iters": args.iters, "profile_steps": args.profile_steps,
                            "gemm_only": args.gemm_only},
                  results=[])
    for index, (model, tokens) in enumerate(runs):
        hidden, vocab = presets.table()[model]
        print(f"[bench] shape {index + 1}/{len(runs)}: {model} N={tokens}", file=sys.stderr, flush=True)
        entry = run(model, hidden, vocab, tokens, dtype, args.impls, args.warmup, args.iters,
                    profile_steps=args.profile_steps, deadline=deadline, progress=True)
        result["results"].append(entry)
        print("\n".join(format_result(entry)), flush=True)
        if args.json:
            save_json(result, args.json)
    result["complete"] = not any(_timed_out(entry) for entry in result["results"])
    if args.json:
        print("wrote", save_json(result, args.json))
    if not args.no_csv:
        count = data.append(args.csv, data.rows(result))
        print(f"appended {count} rows to {args.csv}")
    return 0

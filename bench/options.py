"""What each loss option of lfce.linear_cross_entropy costs: the plain call against each option alone.

    python3 -m bench options --model llama3-8b --tokens 8192
    python3 -m bench options --options softcap,z_loss --iters 20

One shape, the main harness's inputs (impls.make_inputs: bf16 by default, mean, one target in 17
ignored), weight requiring grad. Each variant is the plain call plus one option (OPTIONS); the
variants run interleaved, one step each per repetition, in orders where each variant follows every
other equally often (interleave), so that clock and thermal drift, and a neighbour's power, reach all
of them alike. A step is the forward and autograd's backward
w.r.t. hidden and weight, timed by CUDA events; each variant gets the median (and min, max) of its
forward and of forward + backward over --iters repetitions after --warmup, and the ratio of each
to the plain call's of the same run. A variant that raises (class_weight with fp16 inputs, an
accumulator in eager mode) is reported with its error; the others go on.

Prints the table and appends a row per variant to the benchmark data file (``--csv``, as the main
harness; ``variant`` names the option, ``plain`` the call without one); ``--json PATH`` also writes
the whole result with the harness's metadata (meta.metadata()).
"""

import argparse
import statistics
import sys

from . import data
from .meta import metadata, save_json

PLAIN = "plain"
# name -> (what is passed besides the plain call's arguments, in words for the JSON)
OPTIONS = {
    PLAIN: "linear_cross_entropy(hidden, weight, targets, mode=MODE)",
    "softcap": "softcap=30.0",
    "temperature": "temperature=0.7",
    "z_loss": "z_loss_scale=1e-4",
    "label_smoothing": "label_smoothing=0.1",
    "class_weight": "class_weight=random fp32 [V] in [0.5, 1.5)",
    "smoothing_and_weights": "label_smoothing=0.1, class_weight=random fp32 [V] in [0.5, 1.5)",
    "weight_grad_accumulator": "weight_grad_accumulator=fp32 [V, H] zeros (recompute mode only)",
    "token_scaling": "token_scaling=True",
    "shift": "shift=True (hidden as [1, N, H], targets [1, N])",
    "outputs": "return_lse, return_entropy, return_logprob, return_accuracy, return_predicted (loss differentiated)",
    "outputs_with_grads": "the five outputs, differentiated: loss + 1e-3 * (lse + entropy + logprob).sum()",
}
# Their objective goes through the lse rows too (a second dlogits_backward kernel).
ROW_GRADIENTS = ("outputs_with_grads",)
_OUTPUT_FLAGS = {"return_lse": True, "return_entropy": True, "return_logprob": True, "return_accuracy": True,
                 "return_predicted": True}
RECOMPUTE_ONLY = ("weight_grad_accumulator",)
MODES = ("recompute", "eager")
DTYPES = ("bf16", "fp16", "fp32")


def option_kwargs(name, weight, seed=0):
    """The keyword arguments variant ``name`` adds to the plain call, its tensors made like ``weight``'s."""
    import torch

    def class_weight():
        generator = torch.Generator(device=weight.device).manual_seed(seed)
        return torch.rand(weight.shape[0], device=weight.device, generator=generator) + 0.5

    def accumulator():
        return torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
    makers = {
        PLAIN: dict,
        "softcap": lambda: {"softcap": 30.0},
        "temperature": lambda: {"temperature": 0.7},
        "z_loss": lambda: {"z_loss_scale": 1e-4},
        "label_smoothing": lambda: {"label_smoothing": 0.1},
        "class_weight": lambda: {"class_weight": class_weight()},
        "smoothing_and_weights": lambda: {"label_smoothing": 0.1, "class_weight": class_weight()},
        "weight_grad_accumulator": lambda: {"weight_grad_accumulator": accumulator()},
        "token_scaling": lambda: {"token_scaling": True},
        "shift": lambda: {"shift": True},
        "outputs": lambda: dict(_OUTPUT_FLAGS),
        "outputs_with_grads": lambda: dict(_OUTPUT_FLAGS),
    }
    assert set(makers) == set(OPTIONS), "every option needs its arguments"
    return makers[name]()


def _parse_options(text, mode):
    """'softcap,z_loss' -> ("plain", "softcap", "z_loss"): plain first (the ratios' denominator) and
    each name once; names an unknown option, or one the mode refuses."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in OPTIONS]
    if unknown or not names:
        raise ValueError(f"unknown option(s) {unknown or [text]}; known: {', '.join(OPTIONS)}")
    refused = [name for name in names if name in RECOMPUTE_ONLY and mode != "recompute"]
    if refused:
        raise ValueError(f"option(s) {refused} need --mode recompute, got --mode {mode}")
    return tuple(dict.fromkeys([PLAIN] + names))


def parse_args(argv=None):
    """The command line, checked; needs neither the library nor torch (--model is checked in main)."""
    parser = argparse.ArgumentParser(prog="python3 -m bench options", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama3-8b", help="a preset of the library (default llama3-8b)")
    parser.add_argument("--tokens", type=int, default=8192, help="N (default 8192)")
    parser.add_argument("--dtype", default="bf16", choices=DTYPES)
    parser.add_argument("--options", default=None,
                        help=f"variants to time, from {', '.join(OPTIONS)} (default: all the mode allows); "
                             "plain is always timed")
    parser.add_argument("--mode", default="recompute", choices=MODES)
    parser.add_argument("--iters", type=int, default=10, help="timed repetitions (median); default 10")
    parser.add_argument("--warmup", type=int, default=3, help="untimed repetitions first (>= 1 compiles); default 3")
    parser.add_argument("--csv", default=data.DEFAULT_CSV,
                        help="append a row per variant to this CSV (default: the checkout's bench/data/benchmark_data.csv)")
    parser.add_argument("--no-csv", action="store_true", help="append nothing to the CSV")
    parser.add_argument("--json", metavar="PATH", help="also write the result as JSON to PATH")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 1 or args.tokens < 1:
        parser.error(f"--iters, --warmup and --tokens must be >= 1, got {args.iters}, {args.warmup} and "
                     f"{args.tokens}")
    if args.options is None:
        args.options = tuple(name for name in OPTIONS if args.mode == "recompute" or name not in RECOMPUTE_ONLY)
    else:
        try:
            args.options = _parse_options(args.options, args.mode)
        except ValueError as error:
            parser.error(f"--options: {error}")
    return parser, args


def _error(error):
    message = str(error).strip().splitlines()
    return f"{type(error).__name__}: {message[0] if message else ''}"


def balanced_orders(count):
    """Orders of range(count), one a round, in which every index follows every other equally often
    within the rounds (a Williams design: count orders for an even count, 2 * count for an odd one),
    sequenced so that across the rounds' boundaries (a round's first step follows the previous
    round's last: there is no sync between them) no index follows itself and, over the cycle's
    whole stream, each ordered pair of indices occurs k or k + 1 times. Two indices simply alternate.
    A rotated order keeps each step's predecessor nearly fixed, and on a card at its power cap the
    predecessor moves a step's time (docs/measurements.md#neighbour-power)."""
    if count < 1:
        return []
    if count == 2:
        return [[0, 1]]
    first, low, high = [0], 1, count - 1
    while len(first) < count:  # 0, 1, n-1, 2, n-2, ...
        first.append(low if len(first) % 2 else high)
        low, high = (low + 1, high) if len(first) % 2 == 0 else (low, high - 1)
    rows = [[(index + shift) % count for index in first] for shift in range(count)]
    if count % 2:
        rows += [row[::-1] for row in rows]
    # Sequence the rows: next, one that does not open with the last index (nor, as the cycle's last,
    # end with the first row's first), of the boundary pairs used least so far.
    orders, left, used = [rows[0]], rows[1:], {}
    while left:
        last = orders[-1][-1]
        fits = [row for row in left if row[0] != last and (len(left) > 1 or row[-1] != orders[0][0])] or left
        row = min(fits, key=lambda r: used.get((last, r[0]), 0))
        used[(last, row[0])] = used.get((last, row[0]), 0) + 1
        orders.append(row)
        left.remove(row)
    return orders


def interleave(names, warmup, iters, time_step):
    """Run ``time_step(name)`` for every name, ``warmup + iters`` rounds, each round in the next of
    balanced_orders() (over a whole cycle of them every name follows every other equally often
    within the rounds, and no name follows itself);
    return {name: row} with the median, min and max of the last ``iters`` rounds.

    time_step(name) runs one step and returns a function that, called after the last round, gives
    (forward_ms, total_ms) (so that CUDA events are read once, with no sync between steps). A name
    whose step raises gets {"error": ...} and leaves the rounds (the orders are then those of the
    names left, whose cycle has another length).
    """
    running, rows, reads = list(names), {}, {name: [] for name in names}
    orders = balanced_orders(len(running))
    for index in range(warmup + iters):
        for name in [running[i] for i in orders[index % len(orders)]] if running else []:
            try:
                read = time_step(name)
            except Exception as error:  # noqa: BLE001 - one option's failure must not end the run
                rows[name] = {"error": _error(error)}
                continue
            if index >= warmup:
                reads[name].append(read)
        left = [name for name in running if name not in rows]
        if len(left) != len(running):
            running, orders = left, balanced_orders(len(left))
    for name in running:
        forward, total = zip(*(read() for read in reads[name]))
        rows[name] = {"forward_ms": statistics.median(forward), "total_ms": statistics.median(total),
                      "min_ms": min(total), "max_ms": max(total)}
    plain = rows.get(PLAIN, {})
    for row in rows.values():
        for key, ratio in (("forward_ms", "forward_vs_plain"), ("total_ms", "vs_plain")):
            if key in row and plain.get(key):
                row[ratio] = row[key] / plain[key]
    return {name: rows[name] for name in names}


def cuda_step(x, w, y, mode, kwargs):
    """time_step for interleave(): one lfce forward + backward per call of the variant's ``kwargs``."""
    import torch

    from lfce.functional import linear_cross_entropy

    def time_step(name):
        events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        shift = kwargs[name].get("shift", False)
        events[0].record()
        out = linear_cross_entropy(x[None] if shift else x, w, y[None] if shift else y, mode=mode, **kwargs[name])
        loss = out if isinstance(out, torch.Tensor) else out.loss
        if name in ROW_GRADIENTS:
            loss = loss + 1e-3 * (out.lse.sum() + out.entropy.sum() + out.logprob.sum())
        events[1].record()
        # allow_unused: weight has no gradient when it is added into weight_grad_accumulator
        torch.autograd.grad(loss, (x, w), allow_unused=True)
        events[2].record()

        def read():
            events[2].synchronize()
            return events[0].elapsed_time(events[1]), events[0].elapsed_time(events[2])
        return read
    return time_step


def format_table(result):
    """Human-readable lines for a result of main()."""
    shape = f"N={result['tokens']} H={result['hidden']} V={result['vocab']} {result['dtype']}"
    lines = [f"{result['model']}: {shape} mode={result['mode']}, median of {result['iters']}",
             "{:<24} {:>8} {:>8} {:>9} {:>8}".format("", "fwd ms", "vs plain", "total ms", "vs plain")]
    for name, row in result["results"].items():
        if "total_ms" not in row:
            lines.append(f"{name:<24} {row.get('error', '?')}")
            continue
        ratios = [format(row[key], ".3f") if key in row else "-" for key in ("forward_vs_plain", "vs_plain")]
        lines.append(f"{name:<24} {row['forward_ms']:8.2f} {ratios[0]:>8} {row['total_ms']:9.2f} {ratios[1]:>8}")
    return lines


def main(argv=None, time_step=None, gpu_info=None):
    """The sub-command; ``time_step`` and ``gpu_info`` replace the GPU's (tests)."""
    parser, args = parse_args(argv)
    from lfce import presets

    known = presets.table()
    if args.model not in known:
        parser.error(f"--model {args.model!r} is not a preset; known models: {', '.join(sorted(known))}")
    hidden, vocab = known[args.model]
    if time_step is None:
        import torch

        if not torch.cuda.is_available():
            parser.error("needs a CUDA GPU")
        from .impls import make_inputs

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
        x, w, y = make_inputs(args.tokens, hidden, vocab, dtype)
        time_step = cuda_step(x, w, y, args.mode, {name: option_kwargs(name, w) for name in args.options})
    from .impls import IGNORE_EVERY, IGNORE_INDEX

    argv = sys.argv[1:] if argv is None else argv
    result = metadata("python3 -m bench options " + " ".join(argv), gpu_info=gpu_info)
    result.update(model=args.model, tokens=args.tokens, hidden=hidden, vocab=vocab, dtype=args.dtype, mode=args.mode,
                  reduction="mean", ignore_index=IGNORE_INDEX, ignored_fraction=1 / IGNORE_EVERY,
                  warmup=args.warmup, iters=args.iters, options={name: OPTIONS[name] for name in args.options})
    print(f"[options] {args.model} N={args.tokens}: {', '.join(args.options)}", file=sys.stderr, flush=True)
    result["results"] = interleave(args.options, args.warmup, args.iters, time_step)
    print("\n".join(format_table(result)), flush=True)
    if args.json:
        print("wrote", save_json(result, args.json))
    if not args.no_csv:
        print(f"appended {data.append(args.csv, data.rows(result))} rows to {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

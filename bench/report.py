"""The current benchmark table (markdown) and plot, drawn from the benchmark data file.

    python3 -m bench.report --table                                # the README's table
    python3 -m bench.report --plot docs/benchmark.png             # the plot (matplotlib)
    python3 -m bench.report --options                             # what each loss option costs
    python3 -m bench.report --date 2026-12-02T17:59 --table       # an older benchmark

"Current" is the newest complete benchmark of the main harness in the file (its rows share a date
and a commit); --date picks another by the start of its date. --options takes the newest run of
``python3 -m bench options``. Needs no GPU and no torch; the plot needs matplotlib.
"""

import argparse
import os
import sys

if __package__ in (None, ""):  # run as a file: python3 bench/report.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import data

# Display order and names; an implementation not listed here comes last under its own name.
NAMES = {"cublas_4gemm": "4 cuBLAS GEMMs", "lfce_recompute": "lfce recompute", "lfce_eager": "lfce eager",
         "cublas_3gemm": "3 cuBLAS GEMMs", "torch_compile": "torch.compile", "torch": "PyTorch",
         "liger": "Liger FLCE", "cce": "CCE", "cce_exact": "CCE exact"}
# Each lfce mode's ratio is to the GEMMs it must do at least: four with recompute, three in eager mode.
FLOORS = {"lfce_recompute": "cublas_4gemm", "lfce_eager": "cublas_3gemm"}


def benchmarks(rows, options=False):
    """{(date, commit): [rows]} of the main harness (or, with options, of the options sub-command),
    oldest first."""
    groups = {}
    for row in rows:
        if bool(row["variant"]) == options:
            groups.setdefault((row["date"], row["commit"]), []).append(row)
    return dict(sorted(groups.items()))


def current(rows, date=None, options=False):
    """The rows of the newest complete benchmark (or of the newest whose date starts with ``date``)."""
    groups = benchmarks(rows, options)
    keys = [key for key, group in groups.items()
            if (key[0].startswith(date) if date else all(row["complete"] for row in group))]
    if not keys:
        what = f"dated {date}*" if date else "complete"
        raise ValueError(f"no {'options' if options else 'main-harness'} benchmark {what} in the data file")
    return groups[keys[-1]]


def _shapes(rows):
    return list(dict.fromkeys((r["model"], r["tokens"], r["hidden"], r["vocab"]) for r in rows))


def _impls(rows):
    present = list(dict.fromkeys(r["impl"] for r in rows))
    return [name for name in NAMES if name in present] + [name for name in present if name not in NAMES]


def _fmt(value, spec):
    return "–" if value is None else format(value, spec)


def _held(mib):
    if mib is None:
        return "–"
    return "0" if mib == 0 else format(mib, ".0f" if mib >= 1 else ".2f")


def table(rows):
    """Markdown lines: fwd+bwd ms per shape and implementation (each lfce mode with its ratio to its
    cuBLAS floor), then held / peak MiB at the first shape."""
    impls = _impls(rows)
    cell = {(r["model"], r["tokens"], r["impl"]): r for r in rows}
    first = rows[0]
    lines = [(f"{first['gpu']}, {first['dtype']}, fwd+bwd ms (median of {first['iters']}); benchmark of "
              f"{first['date'][:10]}, commit {(first['commit'] or '?')[:12]}, driver {first['driver']}, "
              f"torch {first['torch']}"),
             "",
             "| shape (N, H, V) | " + " | ".join(NAMES.get(i, i) for i in impls) + " |",
             "|---" * (len(impls) + 1) + "|"]
    for model, tokens, hidden, vocab in _shapes(rows):
        cells = []
        for impl in impls:
            row = cell.get((model, tokens, impl))
            text = _fmt(row and row["total_ms"], ".1f")
            floor = cell.get((model, tokens, FLOORS.get(impl)))
            if row and floor and row["total_ms"] and floor["total_ms"]:
                text += f" ({row['total_ms'] / floor['total_ms']:.2f}×)"
            cells.append(text)
        lines.append(f"| {model} ({tokens}, {hidden}, {vocab}) | " + " | ".join(cells) + " |")
    model, tokens = first["model"], first["tokens"]
    memory = []
    for impl in impls:
        row = cell.get((model, tokens, impl))
        memory.append("–" if row is None else f"{_held(row['held_mib'])} / {_fmt(row['peak_mib'], '.0f')}")
    lines.append(f"| held / peak MiB, {model} N = {tokens} | " + " | ".join(memory) + " |")
    return lines


def options_table(rows):
    """Markdown lines: each loss option's forward and fwd+bwd time against the plain call's."""
    plain = next((r for r in rows if r["variant"] == "plain"), None)
    first = rows[0]
    lines = [(f"{first['gpu']}, {first['model']} N = {first['tokens']} {first['dtype']}, {first['impl']}, median of "
              f"{first['iters']}; benchmark of {first['date'][:10]}, commit {(first['commit'] or '?')[:12]}"),
             "", "| option | fwd ms | vs plain | fwd+bwd ms | vs plain |", "|---|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: r["variant"] != "plain"):
        ratios = [("–" if not plain or not plain[key] else f"{row[key] / plain[key]:.3f}")
                  for key in ("forward_ms", "total_ms")]
        lines.append(f"| {row['variant']} | {_fmt(row['forward_ms'], '.2f')} | {ratios[0]} | "
                     f"{_fmt(row['total_ms'], '.2f')} | {ratios[1]} |")
    return lines


def plot(rows, path):
    """Write a PNG of ``rows`` to ``path``: fwd+bwd time and held memory per shape, a bar an
    implementation. Raises ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    impls, shapes = _impls(rows), _shapes(rows)
    cell = {(r["model"], r["tokens"], r["impl"]): r for r in rows}
    palette = plt.get_cmap("tab10").colors
    figure, axes = plt.subplots(2, 1, figsize=(max(8, 1.9 * len(shapes)), 8))
    width = 0.8 / len(impls)
    for panel, key, label in ((axes[0], "total_ms", "fwd+bwd ms (median)"),
                              (axes[1], "held_mib", "held between fwd and bwd, MiB (log)")):
        for i, impl in enumerate(impls):
            values = [(cell.get((m, n, impl)) or {}).get(key) for m, n, _, _ in shapes]
            xs = [s + (i - (len(impls) - 1) / 2) * width for s in range(len(shapes))]
            points = [(x, v) for x, v in zip(xs, values) if v is not None and (key != "held_mib" or v > 0)]
            if points:
                panel.bar(*zip(*points), width=width, label=NAMES.get(impl, impl), color=palette[i % len(palette)])
        panel.set_xticks(range(len(shapes)))
        panel.set_xticklabels([f"{m}\nN={n}" for m, n, _, _ in shapes])
        panel.set_ylabel(label)
        panel.grid(True, axis="y", alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8, ncol=3)
    first = rows[0]
    figure.suptitle(f"{first['gpu']}, {first['dtype']}, {first['date'][:10]}, lfce {(first['commit'] or '?')[:12]}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m bench.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", default=data.DEFAULT_CSV, help="the data file (default: the checkout's)")
    parser.add_argument("--date", help="the benchmark whose date starts with this (default: the newest complete)")
    parser.add_argument("--table", action="store_true", help="print the markdown table")
    parser.add_argument("--plot", metavar="PNG", help="write the plot there")
    parser.add_argument("--options", action="store_true", help="print the loss options' cost table")
    args = parser.parse_args(argv)
    if not (args.table or args.plot or args.options):
        args.table = True
    try:
        rows = data.read(args.csv)
        if args.table or args.plot:
            chosen = current(rows, args.date)
            if args.table:
                print("\n".join(table(chosen)))
            if args.plot:
                plot(chosen, args.plot)
                print("wrote", args.plot, file=sys.stderr)
        if args.options:
            print("\n".join(options_table(current(rows, args.date, options=True))))
    except (OSError, ValueError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

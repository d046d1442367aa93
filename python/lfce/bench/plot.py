"""The benchmark's plot: fwd+bwd time and held memory against N, one line per implementation,
one row of two panels per model. Needs matplotlib only (no GPU, no torch): ``--plot-from`` makes
it from a result JSON anywhere."""

import json


def series(result):
    """{model: {implementation: {"tokens": [...], "total_ms": [...], "held_mib": [...]}}} from a result,
    tokens ascending; a skipped or failed measurement leaves its point out (None)."""
    table = {}
    for entry in sorted(result.get("results", []), key=lambda e: (e["model"], e["tokens"])):
        for name, row in entry.get("methods", {}).items():
            line = table.setdefault(entry["model"], {}).setdefault(name, {"tokens": [], "total_ms": [],
                                                                            "held_mib": []})
            line["tokens"].append(entry["tokens"])
            line["total_ms"].append(row.get("total_ms"))
            line["held_mib"].append(row.get("held_mib"))
    return table


def _panel(axis, lines, key, ylabel, colors):
    for name, line in lines.items():
        # Log scale: a zero (the 4-GEMM floor holds nothing) or missing value has no point.
        points = [(n, v) for n, v in zip(line["tokens"], line[key]) if v is not None and v > 0]
        if points:
            axis.plot(*zip(*points), marker="o", label=name, color=colors[name])
    axis.set_xscale("log", base=2)
    axis.set_yscale("log")
    axis.set_xlabel("tokens N")
    axis.set_ylabel(ylabel)
    axis.grid(True, which="both", alpha=0.3)


def plot(result, path):
    """Write the PNG for ``result`` (the harness's JSON dict) to ``path``; raises ImportError
    without matplotlib and ValueError for a result with no measurements."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = series(result)
    if not table:
        raise ValueError("the result holds no measurements to plot")
    names = list(dict.fromkeys(name for lines in table.values() for name in lines))
    palette = plt.get_cmap("tab10").colors
    colors = {name: palette[i % len(palette)] for i, name in enumerate(names)}  # one colour a name, every panel
    figure, axes = plt.subplots(len(table), 2, figsize=(13, 4.2 * len(table)), squeeze=False)
    for row, (model, lines) in zip(axes, table.items()):
        _panel(row[0], lines, "total_ms", "fwd+bwd ms (median)", colors)
        _panel(row[1], lines, "held_mib", "held between fwd and bwd, MiB", colors)
        entry = next(e for e in result["results"] if e["model"] == model)
        row[0].set_title(f"{model} (H={entry['hidden']}, V={entry['vocab']}): time")
        row[1].set_title(f"{model}: memory held (0 not shown)")
        row[0].legend(fontsize=8, loc="best")
    figure.suptitle(f"{result.get('gpu', '?')}, {result.get('date', '?')[:10]}, lfce {(result.get('git_commit') or '?')[:12]}")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_file(json_path, png_path):
    """plot() of the result stored at ``json_path``."""
    with open(json_path) as f:
        return plot(json.load(f), png_path)

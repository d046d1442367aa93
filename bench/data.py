"""The benchmark data file: one CSV row per implementation x shape x benchmark, appended to.

bench/data/benchmark_data.csv holds every measurement the harness has made (the main harness and
its ``options`` sub-command append their rows when they finish); report.py draws the current plot
and table from it. A benchmark is identified by its date and commit: every row of one invocation
carries the same two. Needs neither torch nor a GPU.
"""

import csv
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CSV = os.path.join(REPO, "bench", "data", "benchmark_data.csv")

# The columns, in file order. variant: empty for the main harness; the loss option for the options
# sub-command (``plain`` for the call without one). complete: 0 where --time-limit cut the benchmark.
COLUMNS = ("date", "commit", "gpu", "driver", "torch", "generator", "liger_kernel", "cut_cross_entropy",
           "model", "tokens", "hidden", "vocab", "dtype", "impl", "variant", "iters",
           "total_ms", "forward_ms", "backward_ms", "min_ms", "max_ms", "held_mib", "peak_mib",
           "vs_cublas_4gemm", "tuned", "complete")
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_FLOATS = {"total_ms": 3, "forward_ms": 3, "backward_ms": 3, "min_ms": 3, "max_ms": 3, "held_mib": 2,
           "peak_mib": 2, "vs_cublas_4gemm": 4}


def _cell(key, value):
    if value is None:
        return ""
    if isinstance(value, bool):
        return "1" if value else "0"
    if key in _FLOATS:
        return f"{value:.{_FLOATS[key]}f}"
    return str(value)


def _common(result):
    return {"date": result.get("date"), "commit": result.get("git_commit"), "gpu": result.get("gpu"),
            "driver": result.get("driver_version"), "torch": result.get("torch"),
            "generator": result.get("generator_version"), "liger_kernel": result.get("liger_kernel"),
            "cut_cross_entropy": result.get("cut_cross_entropy")}


def _measured(row):
    return {key: row.get(key) for key in ("total_ms", "forward_ms", "backward_ms", "min_ms", "max_ms",
                                          "held_mib", "peak_mib", "vs_cublas_4gemm", "tuned")}


def rows(result):
    """The CSV rows (dicts of COLUMNS, as text) of one result of the main harness (``results`` a list
    of shapes, each with ``methods``) or of its options sub-command (``results`` a dict of variants).
    Skipped and failed measurements have no row."""
    common = _common(result)
    out = []
    if isinstance(result.get("results"), dict):  # options: one shape, a variant a row
        shape = {"model": result["model"], "tokens": result["tokens"], "hidden": result["hidden"],
                 "vocab": result["vocab"], "dtype": _DTYPES.get(result["dtype"], result["dtype"]),
                 "impl": f"lfce_{result['mode']}", "iters": result.get("iters"), "complete": True}
        for variant, row in result["results"].items():
            if "total_ms" in row:
                out.append({**common, **shape, "variant": variant, **_measured(row)})
    else:
        iters = (result.get("settings") or {}).get("iters")
        complete = result.get("complete", True)
        for entry in result.get("results", []):
            shape = {"model": entry["model"], "tokens": entry["tokens"], "hidden": entry["hidden"],
                     "vocab": entry["vocab"], "dtype": _DTYPES.get(entry["dtype"], entry["dtype"]),
                     "iters": iters, "complete": complete}
            for impl, row in entry.get("methods", {}).items():
                if "total_ms" in row:
                    out.append({**common, **shape, "impl": impl, "variant": "", **_measured(row)})
    return [{key: _cell(key, row.get(key)) for key in COLUMNS} for row in out]


def append(path, new_rows):
    """Append ``new_rows`` to the CSV at ``path`` (made, with its header, if absent); return the count."""
    if not new_rows:
        return 0
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    fresh = not os.path.exists(path) or os.path.getsize(path) == 0
    if not fresh:
        with open(path, newline="") as f:
            header = next(csv.reader(f), None)
        if tuple(header or ()) != COLUMNS:
            raise ValueError(f"{path}: its header is not bench.data.COLUMNS; refusing to append")
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
        if fresh:
            writer.writeheader()
        writer.writerows(new_rows)
    return len(new_rows)


def read(path):
    """Every row of the CSV at ``path``: dicts of text, numbers converted where the column has one."""
    with open(path, newline="") as f:
        table = list(csv.DictReader(f))
    for row in table:
        for key in ("tokens", "hidden", "vocab", "iters"):
            row[key] = int(row[key]) if row.get(key) else None
        for key in _FLOATS:
            row[key] = float(row[key]) if row.get(key) else None
        row["complete"] = row.get("complete") != "0"
    return table

"""``python -m lfce --model llama3-8b``: lfce on one model's output layer.

With a CUDA GPU: times forward and backward and measures memory against the PyTorch
baseline, through the benchmark harness (bench/ at the root of a checkout, not installed with the
package). Without one (or with --ptxas): generates the kernels for sm_90a and sm_80, assembles each
with ptxas and prints their resources; exits non-zero if ptxas rejects any. Either way it prints a
table; --json PATH also writes every figure as JSON (with a GPU: the commit, the generator version
and whether tuned winners ran).
"""

import argparse
import json
import sys

from . import presets
from . import ptxas as _ptxas
from .errors import CompileError, CudaError
from .kernels import generate

OFFLINE_ARCHS = ("sm_90a", "sm_80")


def _gpu_available():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m lfce", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="llama3-8b",
                        help="output-layer shape preset from the library's table, e.g. llama3-8b, "
                             "qwen2.5-7b, gemma2-2b (default: llama3-8b)")
    parser.add_argument("--tokens", type=int, default=8192, help="tokens N (default: 8192)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--mode", default="recompute", choices=("recompute", "eager"))
    parser.add_argument("--ptxas", action="store_true",
                        help="report the generated kernels through ptxas even when a GPU is present")
    parser.add_argument("--json", metavar="PATH", help="also write every figure as JSON to PATH")
    args = parser.parse_args(argv)
    if not 1 <= args.tokens <= 2**63 - 1:
        parser.error(f"--tokens must be in [1, 2**63 - 1], got {args.tokens}")
    known = presets.table()  # after parsing, so --help needs no library; fails here if it is missing
    if args.model not in known:
        parser.error(f"--model {args.model!r} is not a preset; known models: {', '.join(sorted(known))}")
    return args


def _offline_report(args, hidden, vocab):
    """Generate + ptxas every kernel; return (exit status, rows)."""
    ptxas = _ptxas.find_ptxas()
    if ptxas is None:
        print("ptxas not found (set LFCE_PTXAS, put it on PATH, or install CUDA in /usr/local/cuda): "
              "registers and spills are not reported")
    print(f"{args.model}: N={args.tokens} H={hidden} V={vocab} {args.dtype}, mode {args.mode} "
          "(no GPU: kernels generated and assembled only)")
    header = ("arch", "kernel", "PTX KB", "LLVM ms", "registers", "spill B", "smem B", "threads")
    print("{:<7} {:<24} {:>8} {:>8} {:>9} {:>8} {:>8} {:>7}".format(*header))
    rows, rejected = [], []
    for arch in OFFLINE_ARCHS:
        kernels = generate(vocab, hidden, arch=arch, dtype=args.dtype, mode=args.mode, tokens=args.tokens)
        for kernel in kernels:
            row = {"arch": arch, "kernel": kernel["name"], "spec": kernel["spec"],
                   "ptx_kb": kernel["ptx_size"] / 1024.0, "llvm_ms": kernel["compile_ms"],
                   "smem_bytes": kernel["smem_bytes"], "threads": kernel["threads"]}
            registers = spills = "-"
            if ptxas is not None:
                report = _ptxas.assemble(kernel["ptx"], arch, ptxas)
                row["ptxas_ok"] = report["ok"]
                entries = report["entries"].values()
                if not report["ok"]:
                    rejected.append((arch, kernel["name"], report["log"]))
                    registers = spills = "REJECTED"
                elif entries:
                    row["registers"] = max(e.get("registers", 0) for e in entries)
                    row["spill_bytes"] = sum(e.get("spill_stores", 0) + e.get("spill_loads", 0) for e in entries)
                    row["static_smem"] = sum(e.get("static_smem", 0) for e in entries)
                    registers, spills = row["registers"], row["spill_bytes"]
            rows.append(row)
            smem = row["smem_bytes"] + row.get("static_smem", 0)
            print(f"{arch:<7} {kernel['name']:<24} {row['ptx_kb']:8.1f} {row['llvm_ms']:8.1f} {registers!s:>9} "
                  f"{spills!s:>8} {smem:8d} {row['threads']:7d}")
    for arch, name, log in rejected:
        head = "\n".join(log.splitlines()[:40])
        print(f"\nptxas rejected {name} for {arch}:\n{head}", file=sys.stderr)
    spilled = [r for r in rows if r.get("spill_bytes")]
    if spilled:
        print(f"note: {len(spilled)} kernel(s) spill registers to local memory")
    return (1 if rejected else 0), rows


def main(argv=None):
    args = _parse_args(argv)  # loads the library: fails before printing anything if it is missing
    hidden, vocab = presets.table()[args.model]
    if args.ptxas or not _gpu_available():
        status, rows = _offline_report(args, hidden, vocab)
        result = {"model": args.model, "tokens": args.tokens, "hidden": hidden, "vocab": vocab,
                  "dtype": args.dtype, "mode": args.mode, "kernels": rows}
    else:
        import torch

        bench = _import_bench()
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
        entry = bench.run(args.model, hidden, vocab, args.tokens, dtype=dtype, methods=(f"lfce_{args.mode}", "torch"))
        print("\n".join(bench.format_result(entry)))
        result = bench.metadata("python3 -m lfce " + " ".join(sys.argv[1:] if argv is None else argv))
        result["results"] = [entry]
        status = 0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
            f.write("\n")
        print("wrote", args.json)
    return status


def _import_bench():
    """The benchmark harness, bench/ at the root of a checkout (scripts/run.sh puts it on the path)."""
    try:
        import bench
    except ModuleNotFoundError as error:
        if error.name != "bench":
            raise
        raise ImportError(
            "the GPU main job needs the benchmark harness (bench/ at the root of lfce's repository), which "
            "is not part of the installed package: run it from a checkout (bash scripts/run.sh, or "
            f"PYTHONPATH=<checkout> python3 -m lfce); ({error})") from None
    return bench


def _entry():
    try:
        return main()
    except (OSError, ImportError, CompileError, CudaError, ValueError) as error:
        print(f"lfce: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(_entry())

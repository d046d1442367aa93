"""Assemble generated PTX with NVIDIA's ptxas and read its resource report (no GPU needed)."""

import os
import re
import shutil
import subprocess
import tempfile

__all__ = ["assemble", "find_ptxas", "parse_report"]

_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_SPILLS = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")


def find_ptxas():
    """Path of ptxas from $LFCE_PTXAS, $PATH or /usr/local/cuda/bin; None if there is none."""
    for candidate in (os.environ.get("LFCE_PTXAS"), shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_report(text):
    """Per-entry resources from ``ptxas -v`` output.

    Returns {entry name: {"registers", "stack_bytes", "spill_stores", "spill_loads",
    "static_smem"}}; fields ptxas did not print are absent.
    """
    entries = {}
    current = None
    for line in text.splitlines():
        match = _ENTRY.search(line)
        if match:
            current = entries.setdefault(match.group(1), {})
            continue
        if current is None:
            continue
        match = _SPILLS.search(line)
        if match:
            current["stack_bytes"], current["spill_stores"], current["spill_loads"] = map(int, match.groups())
        match = _USED.search(line)
        if match:
            current["registers"] = int(match.group(1))
            smem = _SMEM.search(line)
            current["static_smem"] = int(smem.group(1)) if smem else 0
    return entries


def assemble(ptx, arch, ptxas=None):
    """Run ``ptxas -arch=<arch> -v -o /dev/null`` on one PTX module.

    Returns {"ok": bool, "log": ptxas output, "entries": parse_report(log)}.
    """
    ptxas = ptxas or find_ptxas()
    if ptxas is None:
        raise FileNotFoundError("ptxas not found (set LFCE_PTXAS, or put it on PATH)")
    with tempfile.TemporaryDirectory(prefix="lfce-ptxas-") as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        result = subprocess.run([ptxas, "-arch=" + arch, "-v", "-o", os.devnull, path],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    return {"ok": result.returncode == 0, "log": result.stdout, "entries": parse_report(result.stdout)}

"""Run one pytest selection as several pytest processes at once, each on a share of its tests.

The GPU suite compiles a kernel for almost every test, and compiling is CPU work: on a GPU machine
with many cores, N processes sharing one GPU and one kernel cache (its file locks let each kernel
be compiled once) finish the suite several times sooner than one. The tests are collected once and
dealt out in turn, so each process gets some of every file.

Usage (from the repository root):
  python3 scripts/pytest_shards.py --jobs N --out DIR [--timeout S] -- <pytest arguments>
Writes DIR/shard<i>.xml and DIR/shard<i>.log, prints one line per shard and the totals, and exits
with 0 only if every shard collected, ran and passed. --timeout stops the shards after S seconds
(their partial logs stay; the run counts as failed).
"""
import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET


def collect(pytest_args):
    quiet = [a for a in pytest_args if a not in ("-q", "--quiet", "-qq", "-v", "--verbose", "-vv")]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *quiet],
                          capture_output=True, text=True, check=False)
    ids = [line for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]
    if done.returncode not in (0, 5) or not ids:
        sys.exit(f"error: collecting the tests failed (pytest exit {done.returncode}):\n"
                 f"{done.stdout[-4000:]}{done.stderr[-4000:]}")
    return ids


def counts(xml_path):
    """(tests, failures, errors, skipped) of one junit XML file, or None if it is absent or cut off."""
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return tuple(sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, required=True, help="pytest processes at once (1 to 64)")
    parser.add_argument("--out", required=True, help="folder for each shard's junit XML and log")
    parser.add_argument("--timeout", type=float, default=0, help="seconds before the shards are stopped; 0: none")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: the pytest selection")
    args = parser.parse_args()
    if not 1 <= args.jobs <= 64:
        parser.error(f"--jobs {args.jobs}: give 1 to 64 processes")
    if args.timeout < 0:
        parser.error(f"--timeout {args.timeout}: give 0 (no limit) or a number of seconds")
    pytest_args = [a for a in args.pytest_args if a != "--"] if args.pytest_args[:1] == ["--"] else args.pytest_args
    os.makedirs(args.out, exist_ok=True)
    ids = collect(pytest_args)
    # The selection's own options (-m, -k, -o, -r...) apply to every shard; the node ids replace its paths.
    options = [a for a in pytest_args if a.startswith("-") or "::" in a or not os.path.exists(a)]
    shards = [ids[i::args.jobs] for i in range(min(args.jobs, len(ids)))]
    print(f"{len(ids)} tests in {len(shards)} shards", flush=True)
    procs = []
    start = time.monotonic()
    for i, shard in enumerate(shards):
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "junit_family=xunit1",
               f"--junitxml={os.path.join(args.out, f'shard{i}.xml')}", *options, *shard]
        with open(os.path.join(args.out, f"shard{i}.log"), "w") as log:  # the child keeps its own copy
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
    status = 0
    for i, proc in enumerate(procs):
        left = None if args.timeout == 0 else max(1.0, args.timeout - (time.monotonic() - start))
        try:
            code = proc.wait(timeout=left)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
            print(f"shard {i}: stopped after --timeout {args.timeout:g} s", flush=True)
        status = status or code
        print(f"shard {i}: pytest exit {code}, (tests, failures, errors, skipped) = "
              f"{counts(os.path.join(args.out, f'shard{i}.xml'))}", flush=True)
    total = [counts(os.path.join(args.out, f"shard{i}.xml")) for i in range(len(shards))]
    whole = [sum(c[k] for c in total if c) for k in range(4)]
    print(f"total: {whole[0]} tests, {whole[1]} failures, {whole[2]} errors, {whole[3]} skipped "
          f"({sum(c is None for c in total)} shards without results) in {time.monotonic() - start:.0f} s")
    return 1 if status or any(c is None for c in total) else 0


if __name__ == "__main__":
    sys.exit(main())

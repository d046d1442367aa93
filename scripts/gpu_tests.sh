#!/usr/bin/env bash
# Run the Python GPU tests and save the results: <dir>/junit.xml (each numeric test's measured
# errors are <property> entries) and <dir>/run.json (date, GPU, driver, torch, commit).
# Usage: bash scripts/gpu_tests.sh <results dir> [extra pytest arguments]
# The commit is $LFCE_COMMIT if set (a copy of the tree whose .git is absent or stale), else git's.
# Exits with pytest's status; the results are written either way.
# LFCE_GPU_JOBS=N (default 1) runs the tests as N pytest processes sharing the GPU and the kernel
# cache (scripts/pytest_shards.py: <dir>/shard<i>.xml instead of junit.xml), N times sooner where
# compiling the kernels is the bottleneck and the machine has the cores.
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/gpu_tests.sh <results dir> [pytest arguments]" >&2
  exit 2
fi
out=$1
shift
cd "$(dirname "$0")/.."
mkdir -p "$out" || exit 2
export LFCE_LIBRARY=${LFCE_LIBRARY:-$PWD/build/liblfce.so} PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export LFCE_REQUIRE_GPU=1  # a GPU test that cannot see the GPU fails instead of skipping
PYTHON=${PYTHON:-python3}
"$PYTHON" -c "import torch" 2>/dev/null || PYTHON=/usr/bin/python3

"$PYTHON" scripts/run_info.py "$out/run.json"

if [ "${LFCE_GPU_JOBS:-1}" -gt 1 ]; then
  export LFCE_TEST_SHARED_GPU=1  # each GPU test gives its cached blocks back (tests/python/conftest.py)
  "$PYTHON" scripts/pytest_shards.py --jobs "$LFCE_GPU_JOBS" --out "$out" --timeout "${LFCE_GPU_TIMEOUT:-0}" -- \
    tests/python -m gpu -rs "$@"
  status=$?
  echo "results: $out/shard*.xml, $out/run.json"
else
  "$PYTHON" -m pytest tests/python -m gpu -rs -o junit_family=xunit1 --junitxml="$out/junit.xml" "$@"
  status=$?
  echo "results: $out/junit.xml, $out/run.json"
fi
exit $status

#!/usr/bin/env bash
# Run the multi-GPU tests (pytest marker `multigpu`: lfce.distributed over NCCL) under torchrun,
# one process a GPU, and save the results: <dir>/junit-rank<R>.xml (each rank's checks; measured
# errors are <property> entries), <dir>/rank<R>.log (each rank's pytest output) and <dir>/run.json.
# Usage: bash scripts/multigpu_tests.sh <results dir> [extra pytest arguments]
# LFCE_NPROC: processes (default 2). The environment is inherited as it is, by torchrun and each
# rank: the NCCL settings of the machine (NCCL_NVLS_ENABLE=0 ...) stay in force.
# LFCE_MULTIGPU_ONE_GPU=1: every process on GPU 0, over gloo (a machine with one GPU; no NCCL).
# Exits with torchrun's status (non-zero when a rank failed); the results are written either way.
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/multigpu_tests.sh <results dir> [pytest arguments]" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd) || exit 2
shift
cd "$(dirname "$0")/.."
export LFCE_LIBRARY=${LFCE_LIBRARY:-$PWD/build/liblfce.so} PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export LFCE_REQUIRE_MULTIGPU=1  # a multigpu test that cannot see two GPUs fails instead of skipping
PYTHON=${PYTHON:-python3}
"$PYTHON" -c "import torch" 2>/dev/null || PYTHON=/usr/bin/python3

"$PYTHON" scripts/run_info.py "$out/run.json"
env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)_' | sort || true

# Each rank: pytest with its own JUnit file and log ($RANK is set by torchrun).
timeout "${LFCE_MULTIGPU_TIMEOUT:-570}" "$PYTHON" -m torch.distributed.run --standalone \
  --nproc_per_node "${LFCE_NPROC:-2}" --no_python \
  bash -c 'exec "$0" -m pytest tests/python -m multigpu -rs -o junit_family=xunit1 \
             --junitxml="$1/junit-rank$RANK.xml" "${@:2}" >"$1/rank$RANK.log" 2>&1' "$PYTHON" "$out" "$@"
status=$?
for log in "$out"/rank*.log; do
  echo "--- $log (last lines) ---"
  tail -n 15 "$log"
done
echo "results: $out/junit-rank*.xml, $out/rank*.log, $out/run.json (status $status)"
exit $status

#!/usr/bin/env bash
# Every GPU check of a build in one command, for a GPU machine that holds a built tree (build/,
# carried from a machine with LLVM by scripts/pack_gpu_build.sh: the GPU machine needs only the
# driver and PyTorch):
#   1. the Python GPU suite (scripts/gpu_tests.sh: every test marked gpu, LFCE_REQUIRE_GPU=1, so a
#      test that cannot see the GPU fails instead of skipping; the patched transformers models
#      against the stock ones are part of it);
#   2. the C++ GPU tests (the binaries ctest labels gpu) with LFCE_REQUIRE_GPU=1;
#   3. the portable mma.sync kernels on the Hopper GPU: the Python GPU suite again under
#      LFCE_DEVICE_ARCH=sm_80 (-k selects a subset: $LFCE_SM80_SUBSET, default the numerics files);
#   4. compute-sanitizer memcheck on every kernel kind and option (scripts/sanitize_gpu.py) and
#      racecheck on a small shape;
#   and on request (not a default step) "distributed": lfce.distributed's multi-GPU tests with two
#      ranks sharing this GPU over gloo (LFCE_MULTIGPU_ONE_GPU=1; -k $LFCE_DISTRIBUTED_SUBSET where
#      set): the shard kernels of every rank, on a machine with one GPU (NCCL needs a GPU a rank).
# LFCE_GPU_JOBS=N runs the Python steps as N pytest processes (scripts/gpu_tests.sh): 4 fit an 80 GB
# GPU (the largest tests hold about 14 GB each), 8 a 141 GB one.
# Writes each step's log and junit XML under <results dir> and a summary line per step to
# <results dir>/summary.txt; exits non-zero if any step failed.
# Usage: bash scripts/gpu_verify.sh <results dir> [steps, default "python cpp sm80 sanitize"]
set -uo pipefail
if [ $# -lt 1 ]; then
  echo "usage: bash scripts/gpu_verify.sh <results dir> [python] [cpp] [sm80] [sanitize] [distributed]" >&2
  exit 2
fi
out=$(mkdir -p "$1" && cd "$1" && pwd) || exit 2
shift
steps=${*:-python cpp sm80 sanitize}
cd "$(dirname "$0")/.."
export LFCE_LIBRARY=${LFCE_LIBRARY:-$PWD/build/liblfce.so} PYTHONPATH="$PWD/python:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export LFCE_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}
"$PYTHON" -c "import torch" 2>/dev/null || PYTHON=/usr/bin/python3
SANITIZER=${SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
status=0
record() {  # record NAME STATUS: one line of the summary, and the overall status
  echo "$1: exit $2" | tee -a "$out/summary.txt"
  [ "$2" -eq 0 ] || status=1
}
"$PYTHON" scripts/run_info.py "$out/run.json"
for step in $steps; do
  case $step in
    python)
      bash scripts/gpu_tests.sh "$out/python" >"$out/python.log" 2>&1
      record "python GPU suite" $? ;;
    cpp)  # the GoogleTest binaries ctest labels gpu, run directly (the GPU machine has no CMake)
      export LFCE_DISK_CACHE_HELPER=${LFCE_DISK_CACHE_HELPER:-$PWD/build/tests/disk_cache_helper}
      for test in kernel_cache_gpu_tests autotune_gpu_tests; do
        build/tests/$test --gtest_output="xml:$out/$test.xml" >"$out/$test.log" 2>&1
        record "C++ GPU tests: $test" $?
      done ;;
    sm80)
      LFCE_DEVICE_ARCH=sm_80 bash scripts/gpu_tests.sh "$out/sm80" \
        -k "${LFCE_SM80_SUBSET:-numerics or extra_outputs or accumulate or grad_skip}" >"$out/sm80.log" 2>&1
      record "sm_80 kernels on the Hopper GPU" $? ;;
    sanitize)
      "$SANITIZER" --tool memcheck --error-exitcode 1 "$PYTHON" scripts/sanitize_gpu.py >"$out/memcheck.log" 2>&1
      record "compute-sanitizer memcheck" $?
      "$SANITIZER" --tool racecheck --error-exitcode 1 "$PYTHON" scripts/sanitize_gpu.py --small \
        >"$out/racecheck.log" 2>&1
      record "compute-sanitizer racecheck (small shape)" $? ;;
    distributed)
      LFCE_MULTIGPU_ONE_GPU=1 LFCE_NPROC=2 bash scripts/multigpu_tests.sh "$out/distributed" \
        ${LFCE_DISTRIBUTED_SUBSET:+-k "$LFCE_DISTRIBUTED_SUBSET"} >"$out/distributed.log" 2>&1
      record "lfce.distributed: 2 ranks sharing this GPU over gloo" $? ;;
    *)
      echo "unknown step '$step': the steps are python, cpp, sm80, sanitize and distributed" >&2
      exit 2 ;;
  esac
done
echo "summary: $out/summary.txt"
exit $status

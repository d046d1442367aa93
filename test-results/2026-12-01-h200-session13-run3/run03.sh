#!/usr/bin/env bash
# Session 13 run 3 (library of .device/commit: the wgmma producer's K loop opaque): the temperature
# diagnostic (eager against recompute on run 2's failing inputs), the autotuner's GPU test, then the
# Python GPU suite without run 2's files (group A: spills, options, extra outputs, cache, numerics).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
timeout 60 python3 test-results/2026-12-01-h200-session13-run3/diag_temperature.py > $R/diag.log 2>&1; echo "diag rc=$?"; cat $R/diag.log | tail -6
(cd build/tests && timeout 60 ./autotune_gpu_tests > $R/autotune_gpu_tests.log 2>&1); echo "autotune_gpu_tests rc=$? $((SECONDS-t0))s: $(grep -E 'PASSED|FAILED' $R/autotune_gpu_tests.log | tail -2 | tr '\n' ' ')"; pack
step() {  # step NAME SECONDS PYTEST-K [env...]
  local name=$1 limit=$2 k=$3; shift 3
  env "$@" timeout $limit bash scripts/gpu_tests.sh $R/$name -q -p no:cacheprovider -k "$k" > $R/$name.log 2>&1
  echo "$name rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/$name.log | tail -1)"
  grep -E "^FAILED|^ERROR" $R/$name.log | head -12 | cut -c1-300; pack
}
step suite_a $((560 - (SECONDS-t0))) "test_gpu_numerics or test_gpu_extra_outputs or test_cache or test_gpu_spills"

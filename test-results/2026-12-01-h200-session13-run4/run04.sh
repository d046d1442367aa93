#!/usr/bin/env bash
# Session 13 run 4 (library of run 3, tests of .device/commit): the eager options over token chunks,
# then the rest of the Python GPU suite (group B: everything runs 2 and 3 did not run).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
step() {  # step NAME SECONDS PYTEST-K [env...]
  local name=$1 limit=$2 k=$3; shift 3
  env "$@" timeout $limit bash scripts/gpu_tests.sh $R/$name -q -p no:cacheprovider -k "$k" > $R/$name.log 2>&1
  echo "$name rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/$name.log | tail -1)"
  grep -E "^FAILED|^ERROR" $R/$name.log | head -12 | cut -c1-300; pack
}
step eager 60 "test_eager_options_over_token_chunks"
step eager80 50 "test_eager_options_over_token_chunks" LFCE_DEVICE_ARCH=sm_80
step suite_b $((400 - (SECONDS-t0))) "not (test_gpu_numerics or test_gpu_extra_outputs or test_cache or test_gpu_spills or test_gpu_eager or test_gpu_memory)"

#!/usr/bin/env bash
# Session 10 run 7: C++ GPU tests and the rest of the Python GPU suite (sm_90a) at HEAD.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
for t in autotune_gpu_tests kernel_cache_gpu_tests; do LFCE_REQUIRE_GPU=1 timeout 60 /work/main/build/tests/$t >> $R/cpp.log 2>&1; echo "$t rc=$?"; done; grep -E "^\[  (PASSED|FAILED)" $R/cpp.log; pack
timeout 330 bash scripts/gpu_tests.sh $R/py-rest -q -p no:cacheprovider -k "not (test_gpu_extra_outputs or test_gpu_spills or test_gpu_numerics_options or test_gpu_numerics_softcap)" > $R/py-rest.log 2>&1; echo "pytest rest rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-rest.log | tail -1; grep -E "^FAILED|^ERROR" $R/py-rest.log | head -20; pack

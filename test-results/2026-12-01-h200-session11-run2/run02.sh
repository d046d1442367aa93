#!/usr/bin/env bash
# Session 11 run 2: the shift tests fixed to put a class at each sequence's last position, against the
# library broken on purpose (its end-of-sequence test removed) and the real one; then the options,
# outputs and spills GPU tests (sm_90a) with the new operator signature.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
LFCE_LIBRARY=$PWD/build/liblfce_broken.so timeout 120 bash scripts/gpu_tests.sh $R/py-broken -q -p no:cacheprovider -k "test_shift_matches or test_shift_is_bitwise" > $R/py-broken.log 2>&1; echo "broken rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-broken.log | tail -1; pack
timeout 60 bash scripts/gpu_tests.sh $R/py-shift -q -p no:cacheprovider -k "test_shift_matches or test_shift_is_bitwise" > $R/py-shift.log 2>&1; echo "shift rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-shift.log | tail -1; grep -E "^FAILED|^E  " $R/py-shift.log | head -8 | cut -c1-250; pack
timeout $((585 - (SECONDS-t0))) bash scripts/gpu_tests.sh $R/py-a -q -p no:cacheprovider -k "test_gpu_numerics_options or test_gpu_extra_outputs or test_gpu_spills" > $R/py-a.log 2>&1; echo "group a rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-a.log | tail -1; grep -E "^FAILED|^ERROR" $R/py-a.log | head -12 | cut -c1-250; pack

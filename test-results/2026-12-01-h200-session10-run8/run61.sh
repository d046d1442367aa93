#!/usr/bin/env bash
# Session 10 run 8: issue 9's combinations at V = 256000 in the whole matrix, and shift on its own (new tests).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
timeout 250 bash scripts/gpu_tests.sh $R/py-combos -q -p no:cacheprovider -k "test_option_combinations_at_a_large_vocabulary or test_shift_matches_the_shifted_problem or test_output_combinations_at_a_large_vocabulary" > $R/py-combos.log 2>&1; echo "combos rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-combos.log | tail -1; grep -E "^FAILED|^E  " $R/py-combos.log | head -16 | cut -c1-300; pack

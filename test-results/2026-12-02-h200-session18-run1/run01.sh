#!/usr/bin/env bash
# Session 18 run 1: eager's fix-up inside grad_weight (Plan::eager_fixup, LFCE_EAGER_FIXUP).
# test_gpu_eager (its new bitwise test against eager_dz's own pass included); A/B in alternating
# processes (ab.py: eager against cuBLAS's three GEMMs in each), LFCE_EAGER_FIXUP=1 against 0.
set -uo pipefail
D=test-results/2026-12-02-h200-session18-run1
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
timeout 150 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "test_gpu_eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager.log | head -8 | cut -c1-300
grep -E "Error|error:|assert" $R/eager.log | head -5 | cut -c1-300
for round in 1 2; do
  for model in gemma2-2b llama3-8b; do
    for fix in 1 0; do
      LFCE_EAGER_FIXUP=$fix timeout 30 python3 test-results/2026-12-02-h200-session17-run4/ab.py $model fixup=$fix 2>&1 | tail -1
    done
  done
done
echo "ab $((SECONDS-t0))s"

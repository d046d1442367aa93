#!/usr/bin/env bash
# Session 16 runs 1 and 2 (the same script on two builds): eager's dz formed in the consumers' registers (LFCE_EAGER_OPERAND=1: ldmatrix,
# coef · p̃ rounded to the dtype, targets replaced, wgmma with A from registers): test_gpu_eager
# with it, and the eager kernel breakdown with and without it.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
LFCE_EAGER_OPERAND=1 timeout 120 bash scripts/gpu_tests.sh $R/operand -q -p no:cacheprovider -x -k "test_gpu_eager" > $R/operand.log 2>&1
echo "operand rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/operand.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/operand.log | head -8 | cut -c1-300
B=test-results/2026-12-01-h200-session13-run7/eager_breakdown.py
for env in 0 1; do
  LFCE_EAGER_OPERAND=$env timeout 100 python3 $B llama3-8b gemma2-2b llama3-70b > $R/breakdown$env.txt 2>&1
  echo "breakdown operand=$env rc=$? $((SECONDS-t0))s"; grep -v -i warn $R/breakdown$env.txt | grep -E "total|grad_|eager_|lse" | head -24
done

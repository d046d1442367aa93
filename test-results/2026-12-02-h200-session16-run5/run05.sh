#!/usr/bin/env bash
# Session 16 run 5: the dz-in-registers transform after run 4 (target checks a slice after their
# loads): test_gpu_eager with it; eager's kernels against cuBLAS's GEMMs, power-settled, with and
# without it.
set -uo pipefail
D=test-results/2026-12-02-h200-session16-run5
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
LFCE_EAGER_OPERAND=1 timeout 120 bash scripts/gpu_tests.sh $R/operand -q -p no:cacheprovider -x -k "test_gpu_eager" > $R/operand.log 2>&1
echo "operand rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/operand.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/operand.log | head -8 | cut -c1-300
for env in 0 1; do
  LFCE_EAGER_OPERAND=$env timeout 150 python3 $D/eager_vs_cublas.py llama3-8b gemma2-2b llama3-70b > $R/kernels$env.txt 2>&1
  echo "kernels operand=$env rc=$? $((SECONDS-t0))s"; grep -v -i warn $R/kernels$env.txt | head -40
done

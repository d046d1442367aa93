#!/usr/bin/env bash
# Session 15 run 4: the operand rewrite with its next slice's constants loaded while the current
# slice is rewritten, target elements replaced once per slice (not selected per element) and
# pairs converted together; test_gpu_eager and the eager kernel breakdown.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
timeout 150 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager.log | head -8 | cut -c1-300
timeout 100 python3 test-results/2026-12-01-h200-session13-run7/eager_breakdown.py llama3-8b gemma2-2b llama3-70b > $R/breakdown.txt 2>&1; echo "breakdown rc=$? $((SECONDS-t0))s"; grep -v -i warn $R/breakdown.txt | grep -E "total|grad_|eager_|lse" | head -24

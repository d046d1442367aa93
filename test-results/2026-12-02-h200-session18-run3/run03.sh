#!/usr/bin/env bash
# Session 18 run 3: run 2's bench had llama3-8b at N = 16384 at 1.119 of cuBLAS (min 80.5, median
# 86.5, max 105.8 ms): A/B of the fix-up there (ab.py, alternating processes), and gemma2-2b again.
set -uo pipefail
D=test-results/2026-12-02-h200-session18-run3
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
t0=$SECONDS
for round in 1 2; do
  for fix in 1 0; do LFCE_EAGER_FIXUP=$fix timeout 45 python3 $D/ab.py llama3-8b fixup=$fix 16384 2>&1 | tail -1; done
done
for fix in 1 0; do LFCE_EAGER_FIXUP=$fix timeout 30 python3 $D/ab.py llama3-70b fixup=$fix 2>&1 | tail -1; done
echo "ab $((SECONDS-t0))s"

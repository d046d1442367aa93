#!/usr/bin/env bash
# Session 15 run 8: after the review's changes (ready barriers only in kernels with a rewrite, whose
# other kernels' PTX is then byte-identical to a758118's; eager_dz's constants from the targets its
# row constants read): test_gpu_eager with the operand rewrite (LFCE_EAGER_OPERAND=1).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
LFCE_EAGER_OPERAND=1 timeout 70 bash scripts/gpu_tests.sh $R/operand -q -p no:cacheprovider -x -k "test_gpu_eager" > $R/operand.log 2>&1
echo "operand rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/operand.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/operand.log | head -8 | cut -c1-300

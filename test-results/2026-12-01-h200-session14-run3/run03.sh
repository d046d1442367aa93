#!/usr/bin/env bash
# Session 14 run 3: the whole Python GPU suite (grad_input's 128x192 default where ping-pong waves
# end mostly empty reaches most test shapes; eager's in-place scaling; the interleaved bench), and
# the C++ GPU tests (autotune: the new default tile).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
timeout 120 build/tests/autotune_gpu_tests > $R/autotune_gpu_tests.log 2>&1; echo "autotune_gpu_tests rc=$? $((SECONDS-t0))s: $(grep -E 'PASSED|FAILED' $R/autotune_gpu_tests.log | tr '\n' ' ')"
timeout $((585 - (SECONDS-t0))) bash scripts/gpu_tests.sh $R/all -q -p no:cacheprovider > $R/all.log 2>&1
echo "python GPU suite rc=$? $((SECONDS-t0))s: $(grep -E ' passed| failed' $R/all.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/all.log | head -12 | cut -c1-300

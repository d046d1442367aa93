#!/usr/bin/env bash
# Session 16 run 9: CTA pairs with the consumers' slot releases at CTA scope (run 8: cluster scope
# stalled grad_weight's warps on MEMBAR). The tuner's GPU test (its small space has the pair tiles,
# each verified against the fp64 host reference), then eager's kernels power-settled with pair tiles
# forced (run 7's forced_eager.py).
set -uo pipefail
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
E=test-results/2026-12-02-h200-session16-run7/forced_eager.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
LFCE_REQUIRE_GPU=1 timeout 60 build/tests/autotune_gpu_tests > $R/autotune_gpu.log 2>&1
echo "autotune_gpu_tests rc=$? $((SECONDS-t0))s: $(grep -E 'PASSED|FAILED' $R/autotune_gpu.log | tr '\n' ' ')"
for spec in "llama3-8b 128256 4096 none -" "llama3-8b 128256 4096 grad_weight 128x256x64/wg2/s4/c2" \
            "llama3-8b 128256 4096 grad_input 128x256x64/wg2/s4/c2" "gemma2-2b 256000 2304 grad_weight 128x256x64/wg2/s4/c2"; do
  set -- $spec
  export LFCE_CACHE_DIR=$R/cache; rm -rf $LFCE_CACHE_DIR
  [ "$4" != none ] && python3 $F $LFCE_CACHE_DIR $4 $2 $3 8192 $5 > /dev/null
  echo "$1 $4 $5: $(timeout 40 python3 $E $1 2>&1 | grep total) ($((SECONDS-t0))s)"
done
rm -rf $R/cache

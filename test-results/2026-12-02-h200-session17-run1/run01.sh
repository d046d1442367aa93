#!/usr/bin/env bash
# Session 17 run 1: CTA pairs with the consumers' slot releases at CTA scope (session 16 run 8:
# cluster scope stalled the pairs' warps on MEMBAR). The tuner's GPU test (its small space has the
# pair tiles, each verified against the fp64 host reference); eager's kernels power-settled with
# pair tiles forced, one kernel at a time and all three (session 16 run 7's forced_eager.py); the
# all-pairs gradients against torch's fp32 path (forced_check.py).
set -uo pipefail
D=test-results/2026-12-02-h200-session17-run1
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
E=test-results/2026-12-02-h200-session16-run7/forced_eager.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
LFCE_REQUIRE_GPU=1 timeout 120 build/tests/autotune_gpu_tests > $R/autotune_gpu.log 2>&1
echo "autotune_gpu_tests rc=$? $((SECONDS-t0))s: $(grep -E '^\[ *(PASSED|FAILED)' $R/autotune_gpu.log | tr '\n' ' ')"
GW=grad_weight=128x256x64/wg2/s4/c2 GIP=grad_input=64x256x64/wg2/s4/c2/pp GIC=grad_input=128x256x64/wg2/s4/c2
DL=dlogits_backward=64x256x64/wg2/s5/c2/pp
for m in "gemma2-2b 256000 2304" "llama3-8b 128256 4096"; do
  set -- $m
  for forced in none "$GW,$GIP,$DL" $GW $GIP $DL $GIC; do
    export LFCE_CACHE_DIR=$R/cache; rm -rf $LFCE_CACHE_DIR
    if [ "$forced" != none ]; then
      for kv in ${forced//,/ }; do python3 $F $LFCE_CACHE_DIR ${kv%%=*} $2 $3 8192 ${kv#*=} > /dev/null; done
    fi
    echo "$1 $forced: $(timeout 60 python3 $E $1 2>&1 | grep total) ($((SECONDS-t0))s)"
    [ "$forced" = "$GW,$GIP,$DL" ] && timeout 60 python3 $D/forced_check.py $1 2>&1 | tail -1
  done
done
rm -rf $R/cache

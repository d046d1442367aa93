#!/usr/bin/env bash
# Session 11 run 4: the shift tests after moving the shifted reference into checks.py; then issue 7's one
# open cell (gemma2-2b dlogits_backward 0.886 of cuBLAS): the GEMM-only profile at gemma2-2b N = 8192
# with the default dlogits tile and with ping-pong 64 x 256 tiles forced by a tuning file (force_tile.py).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
timeout 90 bash scripts/gpu_tests.sh $R/py-shift -q -p no:cacheprovider -k "shift" > $R/py-shift.log 2>&1; echo "shift rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-shift.log | tail -1; pack
for c in "default" "64x256x64/wg2/s4/pp;chunk=16384" "64x256x64/wg2/s5/pp;chunk=16384" "128x192x64/wg2/s4;chunk=16384"; do
  name=$(echo "$c" | tr '/;=' '___'); dir=/tmp/cache-$name; mkdir -p $dir
  [ "$c" = default ] || python3 .device/force_tile.py $dir dlogits_backward 256000 2304 8192 "$c"
  LFCE_CACHE_DIR=$dir timeout $((580 - (SECONDS-t0))) python3 -m lfce.bench --gemm-only --models gemma2-2b:8192 --out $R/$name > $R/$name.log 2>&1; echo "$c rc=$? $((SECONDS-t0))s"
  grep -E "^(lse_forward|dlogits_backward|grad_weight|grad_input) " $R/$name.log; grep -E "backward|total" $R/$name.log | grep -v "^\s*$" | tail -3 | cut -c1-140; pack
done

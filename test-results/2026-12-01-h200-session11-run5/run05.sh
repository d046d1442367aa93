#!/usr/bin/env bash
# Session 11 run 5: run 4 again, the three dlogits_backward tiles interleaved twice at gemma2-2b (run-to-run
# noise: lse_forward, unchanged, read 0.884-0.912 in run 4), then once each at llama3-8b N = 8192.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
one() {  # one MODEL V H CONFIG TAG
  local name=$(echo "$1-$4-$5" | tr '/;=' '___') dir=/tmp/cache-$(echo "$1-$4" | tr '/;=' '___'); mkdir -p $dir
  [ "$4" = default ] || python3 .device/force_tile.py $dir dlogits_backward $2 $3 8192 "$4" > /dev/null
  LFCE_CACHE_DIR=$dir timeout $((585 - (SECONDS-t0))) python3 -m lfce.bench --gemm-only --models $1:8192 --out $R/$name > $R/$name.log 2>&1
  echo "$1 $4 $5 rc=$? $((SECONDS-t0))s: $(grep -E '^(lse_forward|dlogits_backward|grad_weight|grad_input) ' $R/$name.log | head -4 | awk '{printf "%s %s %s | ", $1, $3, $7}')"; pack
}
for rep in a b; do for c in "default" "128x192x64/wg2/s4;chunk=16384" "64x256x64/wg2/s5/pp;chunk=16384"; do one gemma2-2b 256000 2304 "$c" $rep; done; done
for c in "default" "128x192x64/wg2/s4;chunk=16384" "64x256x64/wg2/s5/pp;chunk=16384"; do one llama3-8b 128256 4096 "$c" a; done

#!/usr/bin/env bash
# Session 12 run 5 (library of d621337): lse_forward is the one GEMM left under 0.90 of cuBLAS (gemma2-2b,
# run 4: 0.896). With setmaxnreg honoured (run 3) the consumers have 232 registers, so wider tiles may pay
# now: the GEMM-only profile at gemma2-2b N = 8192 with lse_forward's tile forced by a tuning file.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
for c in default "128x256x64/wg2/s4;ctas=132" "128x192x64/wg2/s4;ctas=132" "128x128x64/wg2/s5;ctas=132"; do
  name=$(echo "$c" | tr '/;=' '___'); dir=/tmp/cache-$name; mkdir -p $dir
  [ "$c" = default ] || python3 .device/force_tile.py $dir lse_forward 256000 2304 8192 "$c" > /dev/null
  LFCE_CACHE_DIR=$dir timeout $((230 - (SECONDS-t0))) python3 -m lfce.bench --gemm-only --models gemma2-2b:8192 --out $R/$name > $R/$name.log 2>&1
  echo "$c rc=$? $((SECONDS-t0))s: $(grep -hE '^(lse_forward|dlogits_backward|grad_weight|grad_input) ' $R/$name.log | head -4 | awk '{printf "%s %s %s | ", $1, $3, $7}')"; pack
done

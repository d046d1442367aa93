#!/usr/bin/env bash
# Session 19 run 8: run 7 showed that force_tile.py's dlogits_backward tunings never applied (a
# dlogits_backward candidate needs its ";chunk=N": the entry was ignored, eager_logits stayed
# 64 x 256 ping-pong; so did session 17 run 4's and run 1's). Again with the chunk (16384, the
# plan's own at llama3-70b): eager_logits 128 x 256 cooperative and 128 x 256 on a CTA pair along M.
set -uo pipefail
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
AB=test-results/2026-12-02-h200-session18-run3/ab.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
export LFCE_CACHE_DIR=$R/cache
for spec in new "dlogits_backward=128x256x64/wg2/s4;chunk=16384" "dlogits_backward=128x256x64/wg2/s4/c2;chunk=16384"; do
  rm -rf $LFCE_CACHE_DIR
  [ "$spec" = new ] || python3 $F $LFCE_CACHE_DIR ${spec%%=*} 128256 8192 8192 "${spec#*=}" > /dev/null
  timeout 20 python3 test-results/2026-12-02-h200-session19-run7/tiles.py llama3-70b 2>&1 | grep eager_logits
  timeout 35 python3 $AB llama3-70b "${spec//x64\/wg2/}" > $R/ab.log 2>&1; echo "rc=$? $(tail -1 $R/ab.log)"
done
echo "ab $((SECONDS-t0))s"

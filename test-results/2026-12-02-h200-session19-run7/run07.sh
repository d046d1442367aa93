#!/usr/bin/env bash
# Session 19 run 7: llama3-70b with run 4's defaults (gradient GEMMs on pairs along M): A/B (ab.py)
# of eager_logits' tile (dlogits_backward's tuning): 128 x 256 cooperative (run 1: -0.2 ms) and
# 64 x 256 ping-pong on a CTA pair along M (sharing W's tile); tiles.py shows what ran.
set -uo pipefail
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
AB=test-results/2026-12-02-h200-session18-run3/ab.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
export LFCE_CACHE_DIR=$R/cache
for spec in new dlogits_backward=128x256x64/wg2/s4 dlogits_backward=64x256x64/wg2/s5/c2/pp new; do
  rm -rf $LFCE_CACHE_DIR
  [ $spec = new ] || python3 $F $LFCE_CACHE_DIR ${spec%%=*} 128256 8192 8192 ${spec#*=} > /dev/null
  timeout 20 python3 test-results/2026-12-02-h200-session19-run7/tiles.py llama3-70b 2>&1 | grep -v -i warn
  timeout 50 python3 $AB llama3-70b ${spec//x64\/wg2/} > $R/ab.log 2>&1; echo "rc=$? $(tail -1 $R/ab.log)"
done
echo "ab $((SECONDS-t0))s"

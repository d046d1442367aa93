#!/usr/bin/env bash
# Session 10 run 5: dlogits_backward ping-pong 128 x 128 (block-at-a-time epilogue) against the default, A/B/A/B.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
for m in gemma2-2b llama3-8b; do for rep in 1 2; do for tile in "" 128x128x64/wg2/s4/pp 128x128x64/wg2/s5/pp 128x192x64/wg2/s4/pp; do
timeout 60 python3 .device/pp.py $m $tile >> $R/pp.log 2>&1
done; done; done; echo "pp rc=$? $((SECONDS-t0))s"
grep -v Warn $R/pp.log | grep -iE "gemma|llama|spill|error" | cut -c1-300; pack

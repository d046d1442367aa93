#!/usr/bin/env bash
# Session 15 run 2: why grad_input at llama3-70b (eager) keeps its SMs active 90% of the time
# (run 1): per-SM active cycles (min / avg / max) under ncu, and grad_input tiles forced at
# llama3-70b and llama3-8b (eager breakdown, torch.profiler).
set -uo pipefail
D=test-results/2026-12-02-h200-session15-run2
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
M=sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,gpu__time_duration.sum,sm__cycles_elapsed.max
LFCE_CACHE_DIR=/tmp/lfce-ncu timeout 150 ncu --profile-from-start off --metrics $M -k regex:"grad_input|grad_weight|eager_logits|nvjet" python3 test-results/2026-12-02-h200-session15-run1/ncu_eager.py llama3-70b > $R/ncu-70b.txt 2>&1
echo "ncu rc=$? $((SECONDS-t0))s"; grep -E "^  [a-z_]+|sm__cycles|gpu__time" $R/ncu-70b.txt | cut -c1-110
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
B=test-results/2026-12-01-h200-session13-run7/eager_breakdown.py
export LFCE_CACHE_DIR=$R/cache-forced
for spec in "llama3-70b 128256 8192 128x256x64/wg2/s4" "llama3-70b 128256 8192 128x256x64/wg2/s4/c2" "llama3-70b 128256 8192 64x256x64/wg2/s4/c2/pp" "llama3-70b 128256 8192 128x192x64/wg2/s4" "llama3-8b 128256 4096 128x256x64/wg2/s4" "llama3-8b 128256 4096 128x256x64/wg2/s4/c2"; do
  set -- $spec; rm -rf $LFCE_CACHE_DIR; python3 $F $LFCE_CACHE_DIR grad_input $2 $3 8192 $4 > /dev/null
  o=$R/forced-$1-${4//\//_}.txt
  timeout 60 python3 $B $1 > $o 2>&1; echo "$1 $4 rc=$?: $(grep -E 'total|grad_input' $o | tr -s ' ' | tr '\n' ' ' | cut -c1-200)"
done

#!/usr/bin/env bash
# Session 19 run 2: run 1 had llama3-70b's grad_weight 27.15 ms against cuBLAS's dzᵀ·x 23.69 (K =
# 8192 tokens: a 128 x 256 tile's epilogue, 64 pair stores a thread with the tensor cores idle, is
# a few % of its ~100 µs mainloop). A/B (ab.py, alternating processes) of ping-pong and split tiles
# for grad_weight and grad_input, and run 1's three small wins together.
set -uo pipefail
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
AB=test-results/2026-12-02-h200-session18-run3/ab.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
force() {  # CACHE kind=tile,...
  rm -rf $1; [ "$2" = new ] && return
  for kv in ${2//,/ }; do python3 $F $1 ${kv%%=*} 128256 8192 8192 ${kv#*=} > /dev/null; done
}
export LFCE_CACHE_DIR=$R/cache
for spec in new grad_weight=128x128x64/wg2/s6/pp grad_weight=128x128x64/wg2/s5/pp grad_weight=64x256x64/wg2/s5/pp \
    grad_weight=64x256x64/wg2/s5/c2/pp grad_weight=128x256x64/wg2/s4/sn grad_input=128x256x64/wg2/s4/sn \
    grad_input=128x128x64/wg2/s6/pp grad_weight=128x256x64/wg2/s4/c2,grad_input=128x256x64/wg2/s4/c2,dlogits_backward=128x256x64/wg2/s4 new; do
  force $LFCE_CACHE_DIR $spec
  timeout 50 python3 $AB llama3-70b ${spec//x64\/wg2/} > $R/ab.log 2>&1; echo "rc=$? $(tail -1 $R/ab.log)"
done
echo "ab $((SECONDS-t0))s"

#!/usr/bin/env bash
# Session 19 run 3: runs 1-2 had llama3-70b faster with eager's gradient GEMMs on CTA pairs along M
# (/c2, sharing B: 7.8 KB of L2 reads per MFLOP at 128 x 256, cuBLAS's 192 x 192 pairs' figure)
# than along N (/c2n, sharing dz: 9.8). A/B (ab.py, alternating processes) of /c2 against the
# defaults at every bar shape.
set -uo pipefail
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
AB=test-results/2026-12-02-h200-session18-run3/ab.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
nvidia-smi --query-gpu=name,temperature.gpu --format=csv,noheader
export LFCE_CACHE_DIR=$R/cache
ab() {  # MODEL V H N tiles|new
  rm -rf $LFCE_CACHE_DIR
  [ "$5" = new ] || for kv in ${5//,/ }; do python3 $F $LFCE_CACHE_DIR ${kv%%=*} $2 $3 $4 ${kv#*=} > /dev/null; done
  timeout 50 python3 $AB $1 ${5//x64\/wg2/} $4 > $R/ab.log 2>&1; echo "rc=$? $(tail -1 $R/ab.log)"
}
P256=grad_weight=128x256x64/wg2/s4/c2,grad_input=128x256x64/wg2/s4/c2
P192=grad_weight=128x192x64/wg2/s4/c2,grad_input=128x192x64/wg2/s4/c2
for round in 1 2; do
  for t in new $P256; do ab llama3-70b 128256 8192 8192 $t; done
  for t in new $P256 $P192; do ab gemma2-2b 256000 2304 8192 $t; done
  [ $round = 2 ] && break
  for t in new $P256; do ab llama3-8b 128256 4096 8192 $t; done
  for t in new $P256; do ab qwen2.5-7b 152064 3584 8192 $t; done
  for t in new $P256; do ab llama3-8b 128256 4096 16384 $t; done
done
echo "ab $((SECONDS-t0))s"

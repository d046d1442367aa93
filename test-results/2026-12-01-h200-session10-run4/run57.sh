#!/usr/bin/env bash
# Session 10 run 4: backward GEMM kernels against the vocabulary chunk (steady state).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
timeout 280 python3 .device/chunks.py $R/chunks.json > $R/chunks.log 2>&1; echo "chunks rc=$? $((SECONDS-t0))s"; cat $R/chunks.log | cut -c1-250; pack

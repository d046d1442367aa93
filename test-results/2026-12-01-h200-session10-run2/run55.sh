#!/usr/bin/env bash
# Session 10 run 2: SM clock and power during lse_forward vs cuBLAS (power-throttling hypothesis); the options' cost at HEAD.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
nvidia-smi -q -d POWER,CLOCK > $R/smi-q.txt 2>&1
timeout 120 python3 .device/clocks.py $R/clocks.json > $R/clocks.log 2>&1; echo "clocks rc=$? $((SECONDS-t0))s"; cat $R/clocks.log | cut -c1-400; pack
timeout 200 python3 -m lfce.bench options --model llama3-8b --tokens 8192 --out $R > $R/bench-options.log 2>&1; echo "bench options rc=$? $((SECONDS-t0))s"; tail -22 $R/bench-options.log; pack

#!/usr/bin/env bash
# Session 10 run 3: GEMM-only profile in the settled power state (5 shapes), power/clock sampling.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
timeout 300 python3 -m lfce.bench --gemm-only --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --out $R > $R/gemm-only.log 2>&1; echo "gemm-only rc=$? $((SECONDS-t0))s"; grep -vE "^\s*$" $R/gemm-only.log | tail -60 | cut -c1-160; pack
timeout 120 python3 bench/power_clocks.py --out $R > $R/power.log 2>&1; echo "power rc=$? $((SECONDS-t0))s"; cat $R/power.log; pack

#!/usr/bin/env bash
# Session 14 run 5: recompute's grad_input back on ping-pong (the 128x192 rule in eager only); gemma2-2b
# and llama3-8b interleaved, N = 8192.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
timeout 200 python3 -m lfce.bench --models gemma2-2b:8192,llama3-8b:8192 --impls cublas_4gemm,cublas_3gemm,lfce_recompute,lfce_eager,torch_compile --iters 10 --warmup 2 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas|lfce|torch|[a-z0-9.-]+: N)" $R/bench.log

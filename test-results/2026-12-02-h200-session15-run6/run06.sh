#!/usr/bin/env bash
# Session 15 run 6: the five-shape interleaved bench (eager next to the 3- and 4-GEMM cuBLAS floors,
# recompute, torch.compile and Liger) at commit 5925248 (eager grad_input's 128-row tiles; the
# operand rewrite off).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
timeout 280 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_4gemm,cublas_3gemm,lfce_recompute,lfce_eager,torch_compile,liger --iters 7 --warmup 2 --profile-steps 0 --wheels .device/wheels --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|cublas_4gemm|lfce_eager|lfce_recompute|torch_compile|liger|[a-z0-9.-]+: N)" $R/bench.log | cut -c1-150

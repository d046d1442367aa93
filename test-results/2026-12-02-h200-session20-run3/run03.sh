#!/usr/bin/env bash
# Session 20 run 3 (two device calls, a and b, one after the other on the warm machine; build 60072f7,
# tree 9bd6b3e): the five-shape bench of run 2 again, then llama3-70b with 40 iterations.
bash .device/run.sh >/dev/null 2>&1; export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so; R=$OUT/r; mkdir -p $R
timeout 230 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_3gemm,lfce_eager,torch_compile --iters 15 --warmup 3 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
timeout 120 python3 -m lfce.bench --models llama3-70b:8192 --impls cublas_3gemm,lfce_eager,torch_compile --iters 40 --warmup 5 --profile-steps 0 --out $R/bench70 > $R/bench70.log 2>&1

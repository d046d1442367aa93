#!/usr/bin/env bash
# Session 20 run 5 (build 60072f7, tree 3cabb64: the harness's rounds in carryover-balanced orders):
# every implementation at the five shapes, 14 timed rounds (two whole cycles of seven's orders).
bash .device/run.sh >/dev/null 2>&1; export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so; R=$OUT/r; mkdir -p $R
timeout 230 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_4gemm,cublas_3gemm,lfce_recompute,lfce_eager,torch_compile,torch,liger --iters 14 --warmup 3 --profile-steps 0 --wheels .device/wheels --out $R/bench > $R/bench.log 2>&1

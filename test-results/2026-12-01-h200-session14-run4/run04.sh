#!/usr/bin/env bash
# Session 14 run 4 (library of 1dbd72a): the in-place scaling tests, then the five-shape bench with
# the implementations interleaved (eager against the three-GEMM floor, torch.compile, Liger).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
timeout 60 bash scripts/gpu_tests.sh $R/scaling -q -p no:cacheprovider -k "test_gpu_eager and (scal or second_backward)" > $R/scaling.log 2>&1
echo "scaling rc=$? $((SECONDS-t0))s: $(grep -E ' passed| failed' $R/scaling.log | tail -1)"; grep -E "^FAILED|^E " $R/scaling.log | head -6 | cut -c1-300
timeout $((470 - (SECONDS-t0))) python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_4gemm,cublas_3gemm,lfce_recompute,lfce_eager,torch_compile,torch,liger --iters 7 --warmup 2 --profile-steps 0 --wheels .device/wheels --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas|lfce|torch|liger|[a-z0-9.-]+: N)" $R/bench.log

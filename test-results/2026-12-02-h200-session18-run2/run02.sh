#!/usr/bin/env bash
# Session 18 run 2: test_gpu_eager with the fixed bitwise test; the five-shape bench on the fix-up
# default (Plan::eager_fixup); every other GPU test that selects eager.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
timeout 60 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "test_gpu_eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR|^E " $R/eager.log | head -8 | cut -c1-300
timeout 280 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_3gemm,lfce_eager,torch_compile --iters 15 --warmup 3 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench.log | cut -c1-150
left=$((575 - SECONDS + t0)); echo "eager rest timeout ${left}s"
timeout $left bash scripts/gpu_tests.sh $R/rest -q -p no:cacheprovider -k "eager and not test_gpu_eager" > $R/rest.log 2>&1
echo "eager rest rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/rest.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/rest.log | head -8 | cut -c1-300

#!/usr/bin/env bash
# Session 19 run 4: eager's 128 x 256 gradient tiles on CTA pairs along M (the new default):
# test_gpu_eager (with the new test at a shape taking them), the five-shape bench, llama3-70b
# with 40 iterations, every other eager GPU test.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
nvidia-smi --query-gpu=name,temperature.gpu,driver_version --format=csv,noheader
timeout 100 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "test_gpu_eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager.log | head -8 | cut -c1-300
timeout 230 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_3gemm,lfce_eager,torch_compile --iters 15 --warmup 3 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench.log | cut -c1-150
timeout 90 python3 -m lfce.bench --models llama3-70b:8192 --impls cublas_3gemm,lfce_eager,torch_compile --iters 40 --warmup 5 --profile-steps 0 --out $R/bench70 > $R/bench70.log 2>&1
echo "bench70 rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench70.log | cut -c1-150
left=$((580 - (SECONDS - t0))); [ $left -gt 60 ] || left=60
timeout $left bash scripts/gpu_tests.sh $R/rest -q -p no:cacheprovider -k "eager and not test_gpu_eager" > $R/rest.log 2>&1
echo "eager rest rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/rest.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/rest.log | head -8 | cut -c1-300

#!/usr/bin/env bash
# Session 15 run 3: eager mode's dz formed in grad_weight's and grad_input's operand (eager_operand:
# the producer warpgroup's warps 1-3 rewrite each slice of p̃ in shared memory; eager_dz stores only
# its constants). test_gpu_eager; the same tests against a library whose rewrite drops the target
# term (must fail); the eager kernel breakdown; the five-shape interleaved bench.
set -uo pipefail
D=test-results/2026-12-02-h200-session15-run3
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
xz -dc .device/liblfce-broken.so.xz > build/liblfce-broken.so
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
timeout 150 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager.log | head -8 | cut -c1-300
LFCE_LIBRARY=$PWD/build/liblfce-broken.so LFCE_CACHE_DIR=/tmp/lfce-broken timeout 100 bash scripts/gpu_tests.sh $R/broken -q -p no:cacheprovider -x -k "test_gpu_eager" > $R/broken.log 2>&1
echo "broken rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/broken.log | tail -1)"; grep -E "^FAILED|^E  " $R/broken.log | head -6 | cut -c1-300
timeout 100 python3 test-results/2026-12-01-h200-session13-run7/eager_breakdown.py llama3-8b gemma2-2b llama3-70b > $R/breakdown.txt 2>&1; echo "breakdown rc=$? $((SECONDS-t0))s"; grep -v -i warn $R/breakdown.txt | grep -E "total|grad_|eager_|lse" | head -24
timeout $((570 - (SECONDS-t0))) python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_4gemm,cublas_3gemm,lfce_recompute,lfce_eager,torch_compile,liger --iters 7 --warmup 2 --profile-steps 0 --wheels .device/wheels --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|cublas_4gemm|lfce_eager|lfce_recompute|torch_compile|liger|[a-z0-9.-]+: N)" $R/bench.log | cut -c1-150

#!/usr/bin/env bash
# Session 14 run 2: eager_dz one CTA per (256 tokens, vocabulary tile), grad_input 128x192 where
# ping-pong waves end mostly empty, the scaling test against PyTorch's fp32 product; test_gpu_eager
# on sm_90a and sm_80, the eager forward's GPU gaps, the kernel breakdown, the 5-shape bench.
set -uo pipefail
D=test-results/2026-12-01-h200-session14-run2
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
timeout 110 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager.log | head -8 | cut -c1-300
LFCE_DEVICE_ARCH=sm_80 timeout 110 bash scripts/gpu_tests.sh $R/eager80 -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager80.log 2>&1
echo "eager sm_80 rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager80.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager80.log | head -8 | cut -c1-300
timeout 60 python3 $D/eager_gaps.py llama3-8b > $R/gaps.txt 2>&1; echo "gaps rc=$? $((SECONDS-t0))s"; grep -E "forward host|gap|cpu op|device activities" $R/gaps.txt | head -40
timeout 70 python3 test-results/2026-12-01-h200-session13-run7/eager_breakdown.py llama3-8b gemma2-2b > $R/breakdown.txt 2>&1; echo "breakdown rc=$? $((SECONDS-t0))s"; grep -v -i warn $R/breakdown.txt | head -24
timeout $((575 - (SECONDS-t0))) python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_4gemm,cublas_3gemm,lfce_recompute,lfce_eager,torch_compile --iters 5 --warmup 2 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas|lfce|torch_compile|[a-z0-9.-]+: N)" $R/bench.log

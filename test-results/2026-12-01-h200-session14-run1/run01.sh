#!/usr/bin/env bash
# Session 14 run 1: grad_scale (lfce_scale_gradient) + eager_dz with every row's load before its
# stores; test_gpu_eager, the 5-shape eager bench against the 3-GEMM floor and torch.compile, the
# eager kernel breakdown, and grad_input tiles forced at gemma2-2b (eager).
set -uo pipefail
D=test-results/2026-12-01-h200-session14-run1
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
timeout 120 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager.log | head -8 | cut -c1-300
timeout 90 python3 test-results/2026-12-01-h200-session13-run7/eager_breakdown.py llama3-8b gemma2-2b > $R/breakdown.txt 2>&1; echo "breakdown rc=$? $((SECONDS-t0))s"; grep -v warn $R/breakdown.txt | head -24
export LFCE_CACHE_DIR=$R/cache-forced
for cfg in 64x192x64/wg2/s5/pp 128x192x64/wg2/s4 64x128x64/wg2/s6/pp 128x128x64/wg2/s5/pp; do
  rm -rf $LFCE_CACHE_DIR; python3 $D/force_tile.py $LFCE_CACHE_DIR grad_input 256000 2304 8192 $cfg > /dev/null
  timeout 40 python3 test-results/2026-12-01-h200-session13-run7/eager_breakdown.py gemma2-2b > $R/forced-${cfg//\//_}.txt 2>&1; echo "$cfg rc=$?: $(grep -E 'total|grad_input' $R/forced-${cfg//\//_}.txt | tr -s ' ' | tr '\n' ' ')"
done
unset LFCE_CACHE_DIR
timeout $((560 - (SECONDS-t0))) python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_3gemm,lfce_eager,torch_compile --iters 5 --warmup 2 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench.log

#!/usr/bin/env bash
# Session 15 run 5: the operand rewrite off by default (LFCE_EAGER_OPERAND=1 asks for it):
# test_gpu_eager both ways, the GPU numerics tests (the pipeline's extra ready barriers in every
# wgmma kernel), and the three-shape interleaved bench of eager against the 3-GEMM floor and
# torch.compile (grad_input's 128-row eager tiles).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
timeout 120 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager.log | head -8 | cut -c1-300
LFCE_EAGER_OPERAND=1 LFCE_CACHE_DIR=/tmp/lfce-operand timeout 100 bash scripts/gpu_tests.sh $R/operand -q -p no:cacheprovider -k "test_gpu_eager" > $R/operand.log 2>&1
echo "operand rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/operand.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/operand.log | head -8 | cut -c1-300
timeout 150 bash scripts/gpu_tests.sh $R/numerics -q -p no:cacheprovider -k "test_gpu_numerics and not options" > $R/numerics.log 2>&1
echo "numerics rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/numerics.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/numerics.log | head -8 | cut -c1-300
timeout $((440 - (SECONDS-t0))) python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,llama3-70b:8192 --impls cublas_3gemm,lfce_eager,torch_compile --iters 7 --warmup 2 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench.log | cut -c1-150

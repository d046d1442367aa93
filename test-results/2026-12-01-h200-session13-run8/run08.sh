#!/usr/bin/env bash
# Session 13 run 8 (NOT RUN: no device lent) for grad_scale.patch (lfce_scale_gradient in eager mode's
# backward): test_gpu_eager (with the scaling's bit-for-bit test against torch.mul), then eager against
# the three-GEMM floor and torch.compile at llama3-8b and gemma2-2b, N = 8192.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R
t0=$SECONDS
timeout 100 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager.log | head -8 | cut -c1-300
timeout $((200 - (SECONDS-t0))) python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192 --impls cublas_3gemm,lfce_eager,torch_compile --iters 5 --warmup 2 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench.log

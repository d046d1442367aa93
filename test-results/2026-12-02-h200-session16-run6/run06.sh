#!/usr/bin/env bash
# Session 16 run 6, commit 0f93a8d: test_gpu_eager with the operand transform after the mainloop's
# refactor (LFCE_EAGER_OPERAND=1; every default kernel's PTX is byte-identical to 05e0b48's), and
# eager's step time against the three cuBLAS GEMMs and torch.compile at the five shapes with 15
# iterations (its run-to-run spread, session 15's open question at llama3-70b).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
LFCE_EAGER_OPERAND=1 timeout 120 bash scripts/gpu_tests.sh $R/operand -q -p no:cacheprovider -k "test_gpu_eager" > $R/operand.log 2>&1
echo "operand rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/operand.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/operand.log | head -8 | cut -c1-300
timeout 300 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_3gemm,lfce_eager,torch_compile --iters 15 --warmup 3 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench.log | cut -c1-150

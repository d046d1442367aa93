#!/usr/bin/env bash
# Session 18 run 5: break on purpose — a build whose fix-up drops the targets' dz (.device/broken.so,
# own cache dir): the fix-up's bitwise test and the fp64 tests must fail; then the five-shape bench on
# the final default (fix-up for token chunks up to 8192, eager_dz's pass above).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
xz -dc .device/broken.so.xz > build/broken.so
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R; t0=$SECONDS
LFCE_CACHE_DIR=$R/broken-cache LFCE_LIBRARY=$PWD/build/broken.so timeout 70 bash scripts/gpu_tests.sh $R/broken -q -p no:cacheprovider \
  -k "test_eager_fixup_in_grad_weight or (test_eager_three_gemms_match_fp64 and bfloat16)" > $R/broken.log 2>&1
echo "broken build rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/broken.log | tail -1)"; grep -E "^FAILED" $R/broken.log | head -12 | cut -c1-200
export LFCE_LIBRARY=$PWD/build/liblfce.so
timeout 280 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_3gemm,lfce_eager,torch_compile --iters 15 --warmup 3 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench.log | cut -c1-150

#!/usr/bin/env bash
# Session 20 run 2: eager_logits on two cooperative consumers from H = 2048 (the new default):
# test_gpu_eager; the cooperative test against a library broken on purpose (the rule's threshold
# raised 8x, so H = 8200 runs ping-pong: the tile check must fail); the five-shape bench; every
# other eager GPU test in the time left.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R; t0=$SECONDS
nvidia-smi --query-gpu=name,temperature.gpu,driver_version --format=csv,noheader
xz -dc .device/liblfce-broken.so.xz > /tmp/broken.so
LFCE_LIBRARY=/tmp/broken.so timeout 60 bash scripts/gpu_tests.sh $R/broken -q -p no:cacheprovider -k "cooperative" > $R/broken.log 2>&1
echo "broken rc=$? (expect 1) $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/broken.log | tail -1)"; grep -E "^E  .*assert|^FAILED" $R/broken.log | head -4 | cut -c1-250
export LFCE_LIBRARY=$PWD/build/liblfce.so
timeout 100 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "test_gpu_eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager.log | head -8 | cut -c1-300
timeout 230 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_3gemm,lfce_eager,torch_compile --iters 15 --warmup 3 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench.log | cut -c1-150
left=$((585 - (SECONDS - t0))); [ $left -gt 60 ] || left=60
timeout $left bash scripts/gpu_tests.sh $R/rest -q -p no:cacheprovider -k "eager and not test_gpu_eager" > $R/rest.log 2>&1
echo "eager rest rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/rest.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/rest.log | head -8 | cut -c1-300
cd $R && tar czf $OUT/run02.tgz . && echo packed

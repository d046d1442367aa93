#!/usr/bin/env bash
# Session 17 run 5, the commit of run 4 (eager's gradient GEMMs on CTA pairs along N by default):
# the GPU tests that run eager mode beyond test_gpu_eager (run 4: 61 passed), then the bench again
# at the two shapes nearest the bars (gemma2-2b against 1.10 x cuBLAS, llama3-70b against
# torch.compile) for its run-to-run spread; whether the data moves cuBLAS's gradient GEMMs' power
# (datapower.py: the bench floor's stand-in dz against the real one).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
timeout 240 bash scripts/gpu_tests.sh $R/eager_rest -q -p no:cacheprovider -k "eager and not test_gpu_eager" > $R/eager_rest.log 2>&1
echo "eager GPU tests rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager_rest.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager_rest.log | head -8 | cut -c1-300
timeout 40 python3 test-results/2026-12-02-h200-session17-run5/datapower.py gemma2-2b 2>&1 | tail -4
timeout 150 python3 -m lfce.bench --models gemma2-2b:8192,llama3-70b:8192 --impls cublas_3gemm,lfce_eager,torch_compile --iters 15 --warmup 3 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench.log | cut -c1-150

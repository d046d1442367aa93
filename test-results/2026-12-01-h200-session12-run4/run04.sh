#!/usr/bin/env bash
# Session 12 run 4 (library of d621337, the same build as run 3): the fixed JIT-report test, the rest
# of the Python GPU suite (group B; group A passed in run 3), then the five-shape side-by-side benchmark
# (cuBLAS floors, lfce recompute and eager, torch.compile) in the time left.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
timeout 120 bash scripts/gpu_tests.sh $R/py-jit -q -p no:cacheprovider -k "performance_loss" > $R/py-jit.log 2>&1; echo "jit test rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-jit.log | tail -1; pack
timeout 320 bash scripts/gpu_tests.sh $R/py-b -q -p no:cacheprovider -k "not (test_gpu_numerics_options or test_gpu_extra_outputs or test_gpu_spills or test_cache)" > $R/py-b.log 2>&1; echo "group b rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-b.log | tail -1; grep -E "^FAILED|^ERROR|Performance Loss" $R/py-b.log | head -8 | cut -c1-250; pack
left=$((555 - (SECONDS-t0)))
timeout $((left + 20)) python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_4gemm,cublas_3gemm,lfce_recompute,lfce_eager,torch_compile --iters 5 --warmup 2 --time-limit $left --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s (limit $left)"; grep -E "^\|" $R/bench.log | head -30 | cut -c1-200; pack

#!/usr/bin/env bash
# Session 18 run 4: the fix-up's loads and stores cache-streaming (evict-first), after run 3 found
# it 2.8% slower than eager_dz's pass at llama3-8b N = 16384. test_gpu_eager; A/B (ab.py,
# alternating processes) at llama3-8b 16384 and 8192 and gemma2-2b; the five-shape bench.
set -uo pipefail
D=test-results/2026-12-02-h200-session18-run4
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
timeout 60 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "test_gpu_eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR|^E " $R/eager.log | head -8 | cut -c1-300
for spec in "llama3-8b 16384" "llama3-8b 8192" "gemma2-2b 8192"; do
  set -- $spec
  for fix in 1 0; do LFCE_EAGER_FIXUP=$fix timeout 45 python3 test-results/2026-12-02-h200-session18-run3/ab.py $1 fixup=$fix $2 2>&1 | tail -1; done
done
echo "ab $((SECONDS-t0))s"
timeout 280 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_3gemm,lfce_eager,torch_compile --iters 15 --warmup 3 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench.log | cut -c1-150

#!/usr/bin/env bash
# Session 17 run 4: eager's new default gradient tiles (CTA pairs along N, /c2n). test_gpu_eager on
# them; A/B in alternating processes (ab.py: eager against cuBLAS's three GEMMs in each): the new
# defaults, the old tiles forced (session 16's defaults), the new ones with eager_logits on a CTA
# pair along M (dlogits_backward's 128x256/c2); the five-shape bench.
set -uo pipefail
D=test-results/2026-12-02-h200-session17-run4
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
timeout 130 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager" > $R/eager.log 2>&1
echo "test_gpu_eager rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager.log | head -8 | cut -c1-300
force() {  # CACHE V H kind=tile,...
  rm -rf $1; [ "$4" = new ] && return
  for kv in ${4//,/ }; do python3 $F $1 ${kv%%=*} $2 $3 8192 ${kv#*=} > /dev/null; done
}
L=dlogits_backward=128x256x64/wg2/s4/c2
GO="gemma2-2b 256000 2304 grad_weight=128x256x64/wg2/s4,grad_input=128x192x64/wg2/s4"
for round in 1 2; do
  specs=("gemma2-2b 256000 2304 new" "$GO")
  [ $round = 1 ] && specs+=("gemma2-2b 256000 2304 grad_weight=128x192x64/wg2/s4/c2n,grad_input=128x192x64/wg2/s4/c2n,$L" \
              "llama3-8b 128256 4096 new" "llama3-8b 128256 4096 grad_weight=128x256x64/wg2/s4,grad_input=128x256x64/wg2/s4" \
              "llama3-8b 128256 4096 grad_weight=128x256x64/wg2/s4/c2n,grad_input=128x256x64/wg2/s4/c2n,$L")
  for spec in "${specs[@]}"; do
    set -- $spec
    label=$(case $4 in new) echo new;; *c2n*) echo new+lc2;; *) echo old;; esac)
    export LFCE_CACHE_DIR=$R/cache; force $LFCE_CACHE_DIR $2 $3 $4
    timeout 25 python3 $D/ab.py $1 $label 2>&1 | tail -1
  done
done
echo "ab $((SECONDS-t0))s"; unset LFCE_CACHE_DIR; rm -rf $R/cache
timeout 290 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_3gemm,lfce_eager,torch_compile --iters 15 --warmup 3 --profile-steps 0 --out $R/bench > $R/bench.log 2>&1
echo "bench rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile|[a-z0-9.-]+: N)" $R/bench.log | cut -c1-150

#!/usr/bin/env bash
# Session 19 run 5: llama3-70b (the bar with the thinnest margin) with 40 iterations, twice more,
# on run 4's build.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
for i in a b; do
  timeout 100 python3 -m lfce.bench --models llama3-70b:8192 --impls cublas_3gemm,lfce_eager,torch_compile --iters 40 --warmup 5 --profile-steps 0 --out $R/bench70$i > $R/bench70$i.log 2>&1
  echo "bench70$i rc=$? $((SECONDS-t0))s"; grep -E "^(cublas_3gemm|lfce_eager|torch_compile)" $R/bench70$i.log | cut -c1-150
done

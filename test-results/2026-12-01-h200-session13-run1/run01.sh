#!/usr/bin/env bash
# Session 13 run 1 (library of 3d24750): eager mode's three-GEMM schedule (test_gpu_eager, sm_90a and
# sm_80), the spill and memory tests (new eager kernels; lse_forward's 128x256 default), and the C++ GPU
# tests (kernel_cache_gpu_tests, autotune_gpu_tests: not run since session 11).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw --format=csv > $R/gpu.txt 2>&1
step() {  # step NAME SECONDS PYTEST-K [env...]
  local name=$1 limit=$2 k=$3; shift 3
  env "$@" timeout $limit bash scripts/gpu_tests.sh $R/$name -q -p no:cacheprovider -k "$k" > $R/$name.log 2>&1
  echo "$name rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/$name.log | tail -1)"
  grep -E "^FAILED|^ERROR" $R/$name.log | head -12 | cut -c1-400; pack
}
step eager 210 "test_gpu_eager"
step eager80 130 "test_gpu_eager and not peaked" LFCE_DEVICE_ARCH=sm_80
step spills_memory 140 "test_gpu_spills or test_gpu_memory"
for t in kernel_cache_gpu_tests autotune_gpu_tests; do
  (cd build/tests && timeout 60 ./$t > $R/$t.log 2>&1); echo "$t rc=$? $((SECONDS-t0))s: $(grep -E 'PASSED|FAILED' $R/$t.log | tail -2 | tr '\n' ' ')"; pack
done

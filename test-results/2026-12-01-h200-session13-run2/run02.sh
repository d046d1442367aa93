#!/usr/bin/env bash
# Session 13 run 2 (library of the commit in .device/commit): run 1's failures fixed; eager tests
# (sm_90a, sm_80), spills + memory, the autotuner's GPU test, then the GEMM-only profile at
# gemma2-2b and llama3-8b N = 8192 (lse_forward's 128x256 default) in the time left.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
step() {  # step NAME SECONDS PYTEST-K [env...]
  local name=$1 limit=$2 k=$3; shift 3
  env "$@" timeout $limit bash scripts/gpu_tests.sh $R/$name -q -p no:cacheprovider -k "$k" > $R/$name.log 2>&1
  echo "$name rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/$name.log | tail -1)"
  grep -E "^FAILED|^ERROR" $R/$name.log | head -12 | cut -c1-400; pack
}
step eager 120 "test_gpu_eager"
step eager80 90 "test_gpu_eager and not peaked" LFCE_DEVICE_ARCH=sm_80
step spills_memory 120 "test_gpu_spills or test_gpu_memory"
(cd build/tests && timeout 60 ./autotune_gpu_tests > $R/autotune_gpu_tests.log 2>&1); echo "autotune_gpu_tests rc=$? $((SECONDS-t0))s: $(grep -E 'PASSED|FAILED' $R/autotune_gpu_tests.log | tail -2 | tr '\n' ' ')"; pack
for m in gemma2-2b llama3-8b; do
  left=$((570 - (SECONDS-t0))); [ $left -lt 60 ] && break
  timeout $left python3 -m lfce.bench --gemm-only --models $m:8192 --out $R/gemm-$m > $R/gemm-$m.log 2>&1
  echo "gemm $m rc=$? $((SECONDS-t0))s: $(grep -hE '^(lse_forward|dlogits_backward|grad_weight|grad_input) ' $R/gemm-$m.log | head -4 | awk '{printf "%s %s %s | ", $1, $3, $7}')"; pack
done

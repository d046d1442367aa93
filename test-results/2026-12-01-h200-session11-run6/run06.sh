#!/usr/bin/env bash
# Session 11 run 6: dlogits_backward's sm_90a default now 64x256x64/wg2/s5/pp: the whole Python GPU suite
# (sm_90a; the spills test first: the driver's JIT on the option epilogues), then the GEMM-only profile at
# gemma2-2b N = 8192 with it.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
timeout 250 bash scripts/gpu_tests.sh $R/py-a -q -p no:cacheprovider -k "test_gpu_spills or test_gpu_numerics_options or test_gpu_extra_outputs" > $R/py-a.log 2>&1; echo "group a rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-a.log | tail -1; grep -E "^FAILED|^ERROR" $R/py-a.log | head -12 | cut -c1-250; pack
timeout $((520 - (SECONDS-t0))) bash scripts/gpu_tests.sh $R/py-b -q -p no:cacheprovider -k "not (test_gpu_numerics_options or test_gpu_extra_outputs or test_gpu_spills)" > $R/py-b.log 2>&1; echo "group b rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-b.log | tail -1; grep -E "^FAILED|^ERROR" $R/py-b.log | head -12 | cut -c1-250; pack
timeout $((585 - (SECONDS-t0))) python3 -m lfce.bench --gemm-only --models gemma2-2b:8192 --out $R/gemm > $R/gemm.log 2>&1; echo "gemm-only rc=$? $((SECONDS-t0))s"
grep -E "^(lse_forward|dlogits_backward|grad_weight|grad_input) " $R/gemm.log | head -4; pack

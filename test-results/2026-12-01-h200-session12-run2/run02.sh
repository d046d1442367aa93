#!/usr/bin/env bash
# Session 12 run 2: the warp-specialised kernels declare .minnctapersm (the driver's JIT ignored their
# setmaxnreg without it) and dlogits_backward's sm_90a default is 64x256x64/wg2/s5/pp. First the new
# test_the_drivers_jit_reports_no_performance_loss against the library before the change (liblfce-old:
# it should fail, naming C7508), then group A of the Python GPU suite (spills, options, extra outputs)
# with the new one, then the GEMM-only profile at gemma2-2b (twice) and llama3-8b, N = 8192.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
LFCE_LIBRARY=$PWD/build/liblfce-old.so timeout 120 python3 -m pytest tests/python/test_gpu_spills.py -q -p no:cacheprovider -k performance_loss > $R/old-lib-jit.log 2>&1
echo "old lib rc=$? $((SECONDS-t0))s"; grep -m6 -E "Performance Loss|passed|failed" $R/old-lib-jit.log | cut -c1-250; pack
export LFCE_LIBRARY=$PWD/build/liblfce.so
timeout 300 bash scripts/gpu_tests.sh $R/py-a -q -p no:cacheprovider -k "test_gpu_spills or test_gpu_numerics_options or test_gpu_extra_outputs" > $R/py-a.log 2>&1; echo "group a rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-a.log | tail -1; grep -E "^FAILED|^ERROR|Performance Loss" $R/py-a.log | head -12 | cut -c1-250; pack
for m in gemma2-2b gemma2-2b llama3-8b; do
  timeout $((585 - (SECONDS-t0))) python3 -m lfce.bench --gemm-only --models $m:8192 --out $R/gemm-$m-$SECONDS > $R/gemm-$m-$SECONDS.log 2>&1
  echo "$m rc=$? $((SECONDS-t0))s: $(grep -hE '^(lse_forward|dlogits_backward|grad_weight|grad_input) ' $(ls -t $R/gemm-$m-*.log | head -1) | head -4 | awk '{printf "%s %s %s | ", $1, $3, $7}')"; pack
done

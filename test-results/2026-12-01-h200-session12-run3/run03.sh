#!/usr/bin/env bash
# Session 12 run 3: the warp-specialised wgmma kernels compiled whole (cuModuleLoadDataEx of their PTX,
# no cubin kept; run 2 showed the link path's relocatable code made the driver ignore their setmaxnreg,
# C7504). Group A of the Python GPU suite (spills, the new JIT-report test, options, extra outputs) and
# test_cache's GPU tests with it; then the GEMM-only profile at gemma2-2b N = 8192 with the library of
# run 2 (liblfce-reloc: the same kernels, linked) and with this one, and llama3-8b with this one.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
export LFCE_LIBRARY=$PWD/build/liblfce.so
timeout 300 bash scripts/gpu_tests.sh $R/py-a -q -p no:cacheprovider -k "test_gpu_spills or test_gpu_numerics_options or test_gpu_extra_outputs or test_cache" > $R/py-a.log 2>&1; echo "group a rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-a.log | tail -1; grep -E "^FAILED|^ERROR|Performance Loss" $R/py-a.log | head -8 | cut -c1-250; pack
one() {  # one LIB MODEL TAG
  timeout $((585 - (SECONDS-t0))) env LFCE_LIBRARY=$PWD/build/$1.so python3 -m lfce.bench --gemm-only --models $2:8192 --out $R/gemm-$1-$2-$3 > $R/gemm-$1-$2-$3.log 2>&1
  echo "$1 $2 $3 rc=$? $((SECONDS-t0))s: $(grep -hE '^(lse_forward|dlogits_backward|grad_weight|grad_input) ' $R/gemm-$1-$2-$3.log | head -4 | awk '{printf "%s %s %s | ", $1, $3, $7}')"; pack
}
one liblfce-reloc gemma2-2b a; one liblfce gemma2-2b a; one liblfce gemma2-2b b; one liblfce llama3-8b a

#!/usr/bin/env bash
# Session 11 run 3: the rest of the Python GPU suite (sm_90a) with the new operator signature, the
# shift tests on sm_80, and what each option costs now that shift reads targets in place.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
timeout 380 bash scripts/gpu_tests.sh $R/py-b -q -p no:cacheprovider -k "not (test_gpu_numerics_options or test_gpu_extra_outputs or test_gpu_spills)" > $R/py-b.log 2>&1; echo "group b rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-b.log | tail -1; grep -E "^FAILED|^ERROR" $R/py-b.log | head -12 | cut -c1-250; pack
LFCE_DEVICE_ARCH=sm_80 timeout 60 bash scripts/gpu_tests.sh $R/py-shift-sm80 -q -p no:cacheprovider -k "test_shift_matches or test_shift_is_bitwise" > $R/py-shift-sm80.log 2>&1; echo "shift sm80 rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-shift-sm80.log | tail -1; pack
mkdir -p $R/bench; timeout $((590 - (SECONDS-t0))) python3 -m lfce.bench options --model llama3-8b --tokens 8192 --out $R/bench > $R/bench/options.log 2>&1; echo "bench rc=$? $((SECONDS-t0))s"; tail -20 $R/bench/options.log; pack

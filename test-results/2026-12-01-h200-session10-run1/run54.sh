#!/usr/bin/env bash
# Session 10 run 1 (HEAD 97408be): softcap slope fix (options + outputs + spills, sm_90a and sm_80), then ncu of gemma2-2b lse_forward vs cuBLAS.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
timeout 260 bash scripts/gpu_tests.sh $R/py-sm90 -q -p no:cacheprovider -k "test_gpu_extra_outputs or test_gpu_spills or test_gpu_numerics_options or test_gpu_numerics_softcap" > $R/py-sm90.log 2>&1; echo "sm90 rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-sm90.log | tail -1; grep -E "^FAILED|^ERROR|^E  " $R/py-sm90.log | head -12 | cut -c1-250; pack
LFCE_DEVICE_ARCH=sm_80 timeout 150 bash scripts/gpu_tests.sh $R/py-sm80 -q -p no:cacheprovider -k "(test_gpu_extra_outputs or test_gpu_numerics_options or test_gpu_numerics_softcap) and not large_vocabulary" > $R/py-sm80.log 2>&1; echo "sm80 rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-sm80.log | tail -1; grep -E "^FAILED|^ERROR|^E  " $R/py-sm80.log | head -12 | cut -c1-250; pack
mkdir -p $R/prof
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy --section SourceCounters"
LFCE_CACHE_DIR=/tmp/lfce-ncu timeout $((590 - (SECONDS-t0))) ncu $S -k regex:"lse_forward|nvjet|gemm|xmma" -c 2 -o $R/prof/gemma python3 .device/ncu_gemma.py > $R/prof/ncu_run.txt 2>&1; echo "ncu rc=$? $((SECONDS-t0))s"
ncu -i $R/prof/gemma.ncu-rep --page details > $R/prof/details.txt 2>&1
ncu -i $R/prof/gemma.ncu-rep --page raw --csv > $R/prof/raw.csv 2>&1
rm -f $R/prof/gemma.ncu-rep.keep
grep -E "^  [a-z_0-9]+.*\(|Duration|Compute \(SM\) Throughput|Registers|Stall|Issue Slot|Eligible|No Eligible|Warp Cycles|Achieved Occ" $R/prof/details.txt | head -60; pack

#!/usr/bin/env bash
# Session 15 run 1: ncu of eager mode's kernels (eager_logits, eager_dz, grad_input, grad_weight) beside
# cuBLAS's GEMMs of the same shapes at gemma2-2b and llama3-70b (session 14 run 6, with the profiled
# range limited to the second eager forward and the cuBLAS GEMMs).
set -uo pipefail
D=test-results/2026-12-02-h200-session15-run1
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R/prof; t0=$SECONDS
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis_Tables"
for m in gemma2-2b llama3-70b; do
  LFCE_CACHE_DIR=/tmp/lfce-ncu timeout 250 ncu --profile-from-start off $S -o $R/prof/$m python3 $D/ncu_eager.py $m > $R/prof/ncu-$m.txt 2>&1
  echo "ncu $m rc=$? $((SECONDS-t0))s"
  ncu -i $R/prof/$m.ncu-rep --page details > $R/prof/details-$m.txt 2>&1
  ncu -i $R/prof/$m.ncu-rep --page raw --csv --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread,dram__throughput.avg.pct_of_peak_sustained_elapsed > $R/prof/raw-$m.csv 2>&1
  cut -c1-400 $R/prof/raw-$m.csv | head -30
done

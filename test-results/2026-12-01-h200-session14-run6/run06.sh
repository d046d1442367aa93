#!/usr/bin/env bash
# Session 14 run 6 (prepared for the next session, NOT RUN): ncu of eager mode's GEMM kernels against
# cuBLAS's at gemma2-2b (eager 1.11x the three-GEMM floor: eager_logits 14.7, grad_weight 14.3,
# grad_input 14.1 ms against ~13.9) and llama3-70b (grad_weight 0.878 of cuBLAS in session 13).
set -uo pipefail
D=test-results/2026-12-01-h200-session14-run6
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R/prof; t0=$SECONDS
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy"
for m in gemma2-2b llama3-70b; do
  LFCE_CACHE_DIR=/tmp/lfce-ncu timeout $((280 - (SECONDS-t0) / 2)) ncu $S -k regex:"eager_logits|eager_dz|grad_weight|grad_input|nvjet|gemm|xmma" -c 8 -o $R/prof/$m python3 $D/ncu_eager.py $m > $R/prof/ncu-$m.txt 2>&1
  echo "ncu $m rc=$? $((SECONDS-t0))s"
  ncu -i $R/prof/$m.ncu-rep --page details > $R/prof/details-$m.txt 2>&1
  grep -E "^  [a-zA-Z_0-9]+.*\(|Duration|DRAM Throughput|L2 Hit|Compute \(SM\) Throughput|Registers Per|No Eligible|Achieved Occ" $R/prof/details-$m.txt | head -70
done

#!/usr/bin/env bash
# Session 16 run 3: ncu of eager's grad_input and grad_weight at llama3-8b and gemma2-2b with the
# dz-in-registers transform (LFCE_EAGER_OPERAND=1) and without it: where the transform's extra
# time goes (issue slots, stalls, tensor-pipe activity). Uses session 15 run 1's ncu_eager.py.
set -uo pipefail
P=test-results/2026-12-02-h200-session15-run1/ncu_eager.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
S="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section InstructionStats"
for m in llama3-8b gemma2-2b; do
  for env in 0 1; do
    LFCE_EAGER_OPERAND=$env LFCE_CACHE_DIR=/tmp/lfce-ncu$env timeout 200 ncu --profile-from-start off --kernel-name regex:grad_ $S -o $R/$m-$env python3 $P $m > $R/ncu-$m-$env.txt 2>&1
    echo "ncu $m operand=$env rc=$? $((SECONDS-t0))s"
    ncu -i $R/$m-$env.ncu-rep --page details > $R/details-$m-$env.txt 2>&1
    grep -E "^  grad_|Duration|Issue Slots Busy|Executed Ipc Active|No Eligible|Active Warps Per Scheduler|Eligible Warps|Warp Cycles Per Issued|Executed Instructions  " $R/details-$m-$env.txt | head -40
  done
done

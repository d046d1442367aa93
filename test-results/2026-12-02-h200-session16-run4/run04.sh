#!/usr/bin/env bash
# Session 16 run 4: warp stall reasons (ncu SourceCounters / pc sampling) of eager's grad_input and
# grad_weight at llama3-8b with the dz-in-registers transform (LFCE_EAGER_OPERAND=1), per SASS
# instruction, to see what the transformed mainloop waits on.
set -uo pipefail
P=test-results/2026-12-02-h200-session15-run1/ncu_eager.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
LFCE_EAGER_OPERAND=1 LFCE_CACHE_DIR=/tmp/lfce-ncu1 timeout 300 ncu --profile-from-start off --kernel-name regex:grad_ \
  --section WarpStateStats --section SourceCounters -o $R/stalls python3 $P llama3-8b > $R/ncu.txt 2>&1
echo "ncu rc=$? $((SECONDS-t0))s"
ncu -i $R/stalls.ncu-rep --page raw --csv > $R/raw.csv 2>&1
ncu -i $R/stalls.ncu-rep --page details --print-details all > $R/details.txt 2>&1
for k in grad_weight grad_input; do
  ncu -i $R/stalls.ncu-rep --kernel-name $k --page source --csv --print-source sass > $R/source-$k.csv 2>&1
  echo "$k source rc=$? $(wc -l < $R/source-$k.csv) lines"
done
grep -iE "stall|^  grad" $R/details.txt | head -60 | cut -c1-160

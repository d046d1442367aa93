#!/usr/bin/env bash
# Session 16 run 8: why eager's grad_weight on CTA pairs (128x256x64/wg2/s4/c2) runs 1.6x slower than
# unpaired (run 7): ncu of that kernel at llama3-8b, forced and default (memory, warp stalls).
set -uo pipefail
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
P=test-results/2026-12-02-h200-session15-run1/ncu_eager.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section LaunchStats"
for tile in default 128x256x64/wg2/s4/c2; do
  export LFCE_CACHE_DIR=$R/cache; rm -rf $LFCE_CACHE_DIR; name=${tile//\//_}
  [ $tile != default ] && python3 $F $LFCE_CACHE_DIR grad_weight 128256 4096 8192 $tile > /dev/null
  timeout 120 ncu --profile-from-start off --kernel-name grad_weight $S -o $R/$name python3 $P llama3-8b > $R/ncu-$name.txt 2>&1
  echo "ncu $tile rc=$? $((SECONDS-t0))s"
  ncu -i $R/$name.ncu-rep --page details --print-details all > $R/details-$name.txt 2>&1
  grep -E "Duration|DRAM Throughput|L2 Hit Rate|L1/TEX Hit|Mem Busy|Max Bandwidth|Cluster|Stall (Long|Wait|Barrier|GMMA|Sleeping|Membar)|Compute \(SM\)" $R/details-$name.txt | head -24
done
rm -rf $R/cache

#!/usr/bin/env bash
# Session 19 run 1: llama3-70b N = 8192, the one shape whose bar (faster than torch.compile) is
# inside the noise. Eager's kernels against cuBLAS's GEMMs power-settled (session 16 run 5's
# eager_vs_cublas.py) on the current defaults, then A/B in alternating processes (session 18 run
# 3's ab.py: eager and cuBLAS's three GEMMs interleaved in each) of other tiles forced per kind.
set -uo pipefail
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
AB=test-results/2026-12-02-h200-session18-run3/ab.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit,temperature.gpu --format=csv
timeout 100 python3 test-results/2026-12-02-h200-session16-run5/eager_vs_cublas.py llama3-70b > $R/kernels.txt 2>&1
echo "kernels rc=$? $((SECONDS-t0))s"; grep -v -i warn $R/kernels.txt | head -20
force() {  # CACHE kind=tile,...
  rm -rf $1; [ "$2" = new ] && return
  for kv in ${2//,/ }; do python3 $F $1 ${kv%%=*} 128256 8192 8192 ${kv#*=} > /dev/null; done
}
export LFCE_CACHE_DIR=$R/cache
for spec in new dlogits_backward=128x256x64/wg2/s4 dlogits_backward=128x256x64/wg2/s4/c2 \
    dlogits_backward=128x256x64/wg2/s4/c2n grad_weight=128x256x64/wg2/s4/c2 grad_weight=128x256x64/wg2/s4 \
    grad_input=128x256x64/wg2/s4/c2 grad_weight=128x192x64/wg2/s4/c2n new; do
  force $LFCE_CACHE_DIR $spec
  timeout 50 python3 $AB llama3-70b ${spec//x64\/wg2/} 2>&1 | tail -1
done
echo "ab $((SECONDS-t0))s"

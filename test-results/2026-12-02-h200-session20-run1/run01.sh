#!/usr/bin/env bash
# Session 20 run 1: the GPU tests written after session 19's device budget was spent (test_gpu_eager
# with the review's tightening, lfce.bench ab's own GPU test), the new cooperative eager_logits test
# (H = 8200), then eager_logits ping-pong (64 x 256) against cooperative (128 x 256) at the five bar
# shapes, power-settled (`lfce.bench ab`, eager / cuBLAS's three GEMMs), alternating, twice.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
nvidia-smi --query-gpu=name,temperature.gpu,driver_version --format=csv,noheader
timeout 120 bash scripts/gpu_tests.sh $R/eager -q -p no:cacheprovider -k "test_gpu_eager or test_ab_runs" > $R/eager.log 2>&1
echo "tests rc=$? $((SECONDS-t0))s: $(grep -E 'passed|failed' $R/eager.log | tail -1)"; grep -E "^FAILED|^ERROR" $R/eager.log | head -8 | cut -c1-300
PP="dlogits_backward=64x256x64/wg2/s5/pp"; CO="dlogits_backward=128x256x64/wg2/s4"
for rep in 1 2; do
  for shape in llama3-70b:8192 llama3-8b:8192 qwen2.5-7b:8192 llama3-8b:16384 gemma2-2b:8192; do
    for v in pp coop; do
      f=$PP; [ $v = coop ] && f=$CO
      timeout 60 python3 -m lfce.bench ab --model ${shape%%:*} --tokens ${shape##*:} --force "$f" --label $v --out $R/ab > $R/ab1.log 2>&1
      echo "$shape $v rc=$? $(tail -1 $R/ab1.log | cut -c1-200)"; cat $R/ab1.log >> $R/ab.log
    done
  done
  echo "rep $rep $((SECONDS-t0))s"
done
cd $R && tar czf $OUT/run01.tgz . && echo packed

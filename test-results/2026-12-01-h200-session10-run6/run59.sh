#!/usr/bin/env bash
# Session 10 run 6: side-by-side bench (5 shapes) with the interleaved, settled-clock GEMM-only profile.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
timeout 360 python3 -m lfce.bench --models llama3-8b:8192,gemma2-2b:8192,qwen2.5-7b:8192,llama3-70b:8192,llama3-8b:16384 --impls cublas_4gemm,cublas_3gemm,lfce_recompute,lfce_eager,torch_compile --iters 5 --warmup 2 --time-limit 290 --out $R > $R/bench.log 2>&1; echo "bench rc=$? $((SECONDS-t0))s"; grep -E "ratio|lse_forward  |dlogits_backward  |grad_weight  |grad_input  |cublas_4gemm|lfce_recompute|lfce_eager|torch_compile|^\S+: N=" $R/bench.log | cut -c1-170 | tail -70; pack
mkdir -p $R/prof
S="--clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section InstructionStats"
for k in dlogits nvjet; do
LFCE_CACHE_DIR=/tmp/lfce-ncu timeout 100 ncu $S -k regex:$k -c 1 -o $R/prof/$k python3 .device/ncu_dlogits.py > $R/prof/ncu_$k.txt 2>&1; echo "ncu $k rc=$? $((SECONDS-t0))s"
ncu -i $R/prof/$k.ncu-rep --page details > $R/prof/details_$k.txt 2>&1
ncu -i $R/prof/$k.ncu-rep --page raw --csv > $R/prof/raw_$k.csv 2>&1
done
grep -E "^  [a-z_]|Duration|SM Frequency|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Registers Per|Warp Cycles Per Issued|L1/TEX Cache Throughput|L2 Cache Throughput|DRAM Throughput" $R/prof/details_*.txt | cut -c1-150; pack

#!/usr/bin/env bash
# Session 12 run 1: where the 16 B of local memory of dlogits_backward's ping-pong tile (64x256x64/wg2/s5/pp)
# sit under the driver's JIT, and whether the producer's register count moves them: libraries with
# kProducerRegisters = 32 (main), 40 and 24 (consumers 232, 232, 240); the spill probe at test_gpu_spills'
# shape with the tile forced, SASS local-memory accesses of the cached cubins; then the GEMM-only profile
# at gemma2-2b N = 8192 with the tile forced, per library.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS; PP="64x256x64/wg2/s5/pp;chunk=16384"; T=test-results/2026-12-01-h200-session12-run1
for lib in liblfce liblfce-p40 liblfce-p24; do
  dir=/tmp/spill-$lib; mkdir -p $dir; python3 .device/force_tile.py $dir dlogits_backward 128256 4096 256 "$PP" > /dev/null
  LFCE_LIBRARY=$PWD/build/$lib.so LFCE_CACHE_DIR=$dir timeout 120 python3 $T/spill_probe.py > $R/spill-$lib.log 2>&1
  echo "== $lib rc=$? $((SECONDS-t0))s"; grep -v "^0 " $R/spill-$lib.log | cut -c1-200 | head -8
  for c in $(find $dir -name '*.cubin'); do
    n=$(cuobjdump -sass $c | grep -cE "STL|LDL"); [ "$n" = 0 ] && continue
    echo "$c: $n local accesses" >> $R/sass-$lib.txt; cuobjdump -sass $c | grep -nE -B4 -A2 "STL|LDL" >> $R/sass-$lib.txt
    cuobjdump -sass $c > $R/$(basename $c).sass
  done; pack
done
for rep in a b; do for lib in liblfce liblfce-p40 liblfce-p24; do
  dir=/tmp/gemma-$lib; mkdir -p $dir; python3 .device/force_tile.py $dir dlogits_backward 256000 2304 8192 "$PP" > /dev/null
  LFCE_LIBRARY=$PWD/build/$lib.so LFCE_CACHE_DIR=$dir timeout $((585 - (SECONDS-t0))) python3 -m lfce.bench --gemm-only --models gemma2-2b:8192 --out $R/gemma-$lib-$rep > $R/gemma-$lib-$rep.log 2>&1
  echo "$lib $rep rc=$? $((SECONDS-t0))s: $(grep -E '^(lse_forward|dlogits_backward|grad_weight|grad_input) ' $R/gemma-$lib-$rep.log | head -4 | awk '{printf "%s %s %s | ", $1, $3, $7}')"; pack
done; done

#!/usr/bin/env bash
# Session 17 run 3: CTA pairs along N (/c2n: the pair shares and multicasts A, the dz that
# grad_weight and grad_input stream, as cuBLAS's 1x2 clusters do). The tuner's GPU test (its small
# space has 128x128/c2n for both, each verified against the fp64 host reference); eager's kernels
# power-settled with pairs along N forced (session 16 run 7's forced_eager.py); the gradients with
# both forced against torch's fp32 path (run 1's forced_check.py); ncu DRAM bytes and L2 hit rate,
# default against both forced (run 2's parser); power and SM clock (run 2's power.py).
set -uo pipefail
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
E=test-results/2026-12-02-h200-session16-run7/forced_eager.py
C=test-results/2026-12-02-h200-session17-run1/forced_check.py
P=test-results/2026-12-02-h200-session15-run1/ncu_eager.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
LFCE_REQUIRE_GPU=1 timeout 120 build/tests/autotune_gpu_tests > $R/autotune_gpu.log 2>&1
echo "autotune_gpu_tests rc=$? $((SECONDS-t0))s: $(grep -E '^\[ *(PASSED|FAILED)' $R/autotune_gpu.log | tr '\n' ' ')"
force() {  # CACHE V H kind=tile,...
  rm -rf $1; [ "$4" = none ] && return
  for kv in ${4//,/ }; do python3 $F $1 ${kv%%=*} $2 $3 8192 ${kv#*=} > /dev/null; done
}
G2=grad_weight=128x192x64/wg2/s4/c2n I2=grad_input=128x192x64/wg2/s4/c2n
G8=grad_weight=128x256x64/wg2/s4/c2n I8=grad_input=128x256x64/wg2/s4/c2n
for spec in "gemma2-2b 256000 2304 none" "gemma2-2b 256000 2304 $G2,$I2" "gemma2-2b 256000 2304 $G2" \
            "gemma2-2b 256000 2304 $I2" "gemma2-2b 256000 2304 $G8" \
            "llama3-8b 128256 4096 none" "llama3-8b 128256 4096 $G8,$I8" "llama3-8b 128256 4096 $G8" \
            "llama3-8b 128256 4096 $I8"; do
  set -- $spec
  export LFCE_CACHE_DIR=$R/cache; force $LFCE_CACHE_DIR $2 $3 $4
  echo "$1 $4: $(timeout 60 python3 $E $1 2>&1 | grep total) ($((SECONDS-t0))s)"
  case $4 in *,*) timeout 60 python3 $C $1 2>&1 | tail -1;; esac
done
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_bytes.sum,sm__cycles_elapsed.avg.per_second
for forced in none "$G2,$I2"; do
  export LFCE_CACHE_DIR=$R/cache; force $LFCE_CACHE_DIR 256000 2304 $forced
  name=$([ $forced = none ] && echo default || echo c2n)
  timeout 120 ncu --profile-from-start off --metrics $M --csv --print-units base python3 $P gemma2-2b > $R/ncu-$name.csv 2> $R/ncu-$name.err
  echo "ncu $name rc=$? $((SECONDS-t0))s"
  python3 - $R/ncu-$name.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; ki, mi, vi, ii = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value"), head.index("ID")
out = collections.OrderedDict()
for r in rows[1:]:
    out.setdefault((r[ii], r[ki][:46]), {})[r[mi]] = r[vi]
for (i, k), m in out.items():
    f = lambda key: float(m.get(key, "0").replace(",", ""))
    print(f"  {k:46s} {f('gpu__time_duration.sum')/1e6:7.2f} ms  DRAM read {f('dram__bytes_read.sum')/1e9:6.2f} GB "
          f"write {f('dram__bytes_write.sum')/1e9:5.2f} GB  L2 {f('lts__t_bytes.sum')/1e9:7.1f} GB hit {f('lts__t_sector_hit_rate.pct'):5.1f}%  "
          f"{f('sm__cycles_elapsed.avg.per_second')/1e6:5.0f} MHz")
PY
done
export LFCE_CACHE_DIR=$R/cache; force $LFCE_CACHE_DIR 256000 2304 none
timeout 100 python3 test-results/2026-12-02-h200-session17-run2/power.py gemma2-2b 2>&1 | tee $R/power.txt | grep -v "^$"
echo "power rc=$? $((SECONDS-t0))s"
rm -rf $R/cache

#!/usr/bin/env bash
# Session 17 run 2: is eager's gap to cuBLAS energy (power cap) and DRAM traffic? power.py (power
# and SM clock, back-to-back steps) at gemma2-2b and llama3-8b; ncu DRAM bytes and L2 hit rate of
# eager's kernels beside cuBLAS's (session 15 run 1's ncu_eager.py), default tiles and grad_weight's
# CTA pair along M (shares B) forced.
set -uo pipefail
D=test-results/2026-12-02-h200-session17-run2
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
P=test-results/2026-12-02-h200-session15-run1/ncu_eager.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
timeout 150 python3 $D/power.py gemma2-2b llama3-8b 2>&1 | tee $R/power.txt | grep -v "^$"
echo "power rc=$? $((SECONDS-t0))s"
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,lts__t_bytes.sum,sm__cycles_elapsed.avg.per_second
for tile in default 128x256x64/wg2/s4/c2; do
  export LFCE_CACHE_DIR=$R/cache; rm -rf $LFCE_CACHE_DIR; name=${tile//\//_}
  [ $tile != default ] && python3 $F $LFCE_CACHE_DIR grad_weight 256000 2304 8192 $tile > /dev/null
  timeout 120 ncu --profile-from-start off --metrics $M --csv --print-units base python3 $P gemma2-2b > $R/ncu-$name.csv 2> $R/ncu-$name.err
  echo "ncu $tile rc=$? $((SECONDS-t0))s"
  python3 - $R/ncu-$name.csv <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]; ki, mi, vi = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
ii = head.index("ID")
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
rm -rf $R/cache

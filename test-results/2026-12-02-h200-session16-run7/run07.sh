#!/usr/bin/env bash
# Session 16 run 7: do CTA pairs (/c2, B multicast: fewer operand bytes a FLOP, less energy under
# the power cap) help eager's GEMMs power-settled? One kernel's tile forced at a time (eager_logits
# through dlogits_backward's tuning, grad_weight, grad_input) at gemma2-2b and llama3-8b.
set -uo pipefail
D=test-results/2026-12-02-h200-session16-run7
F=test-results/2026-12-01-h200-session14-run1/force_tile.py
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; t0=$SECONDS
for spec in "gemma2-2b 256000 2304 none -" \
            "gemma2-2b 256000 2304 grad_weight 128x256x64/wg2/s4/c2" \
            "gemma2-2b 256000 2304 dlogits_backward 128x256x64/wg2/s4/c2" \
            "gemma2-2b 256000 2304 dlogits_backward 64x256x64/wg2/s5/c2/pp" \
            "gemma2-2b 256000 2304 grad_input 128x192x64/wg2/s4/c2" \
            "llama3-8b 128256 4096 none -" \
            "llama3-8b 128256 4096 grad_weight 128x256x64/wg2/s4/c2" \
            "llama3-8b 128256 4096 dlogits_backward 128x256x64/wg2/s4/c2"; do
  set -- $spec
  export LFCE_CACHE_DIR=$R/cache; rm -rf $LFCE_CACHE_DIR
  [ "$4" != none ] && python3 $F $LFCE_CACHE_DIR $4 $2 $3 8192 $5 > /dev/null
  echo "$1 $4 $5: $(timeout 60 python3 $D/forced_eager.py $1 2>&1 | grep total) ($((SECONDS-t0))s)"
done

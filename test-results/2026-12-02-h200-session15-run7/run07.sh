#!/usr/bin/env bash
# Session 15 run 7: eager's per-call budget check (mem_get_info) against chunk_size = N (budget_sync.py).
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1 || { echo "unpack failed"; exit 1; }
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R
timeout 150 python3 test-results/2026-12-02-h200-session15-run7/budget_sync.py llama3-70b gemma2-2b > $R/budget_sync.txt 2>&1; echo "rc=$?"; grep -v -i warn $R/budget_sync.txt | tail -8

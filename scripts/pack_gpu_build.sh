#!/usr/bin/env bash
# Packs what a GPU machine without LLVM or CMake needs from build/ into one compressed file
# (default .device/build.tar.xz, ignored by git): liblfce.so, the `lfce` command line and the
# C++ GPU test binaries that scripts/gpu_verify.sh runs (and the cache helper process they start). On the GPU machine, from the checkout:
#   python3 -m tarfile -e .device/build.tar.xz . && bash scripts/gpu_verify.sh <results dir>
# (xz, unpacked by Python's tarfile: the GPU machine's image has no zstd.)
# Usage: bash scripts/pack_gpu_build.sh [output file]   (after scripts/build.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.device/build.tar.xz}
mkdir -p "$(dirname "$out")"
files=(build/liblfce.so build/lfce build/tests/kernel_cache_gpu_tests build/tests/autotune_gpu_tests
       build/tests/disk_cache_helper)
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "error: $f is missing; run bash scripts/build.sh first" >&2; exit 1; }
done
tar -I "xz -9 -T0" -cf "$out" "${files[@]}"
echo "$out: $(du -h "$out" | cut -f1) (the device tool carries at most 64 MiB with the working tree)"

#!/usr/bin/env bash
# Unpacks the carried build on the device machine (.device is ignored by git and carried).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
xz -dc .device/liblfce.so.xz > build/liblfce.so
cp .device/lfce build/lfce
chmod +x build/lfce
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi

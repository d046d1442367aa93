#!/usr/bin/env bash
# Configures and builds lfce into build/ (liblfce.so, the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"

#!/usr/bin/env bash
# README command 2: install, build, run every test. GPU tests skip (visibly) without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
# Show the python GPU tests' skip reasons in the log (ctest hides passing tests' output).
if ! nvidia-smi >/dev/null 2>&1; then
  echo "--- GPU tests without a GPU (expected: skipped) ---"
  ctest -R python.gpu -V 2>&1 | grep -E "SKIPPED|skipped|passed|failed" | tail -5 || true
fi

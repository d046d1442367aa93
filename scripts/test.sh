#!/usr/bin/env bash
# README command 2: install, build, run every test. GPU tests skip (visibly) without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
# Lint step: ruff's default rules (config: ruff.toml) on the Python package and its tests. The
# version is pinned because ruff's default rule set changes between releases. Only CI (CI=true)
# fails when ruff cannot be installed (e.g. on a machine without PyPI); elsewhere the step is skipped.
RUFF_VERSION=0.17.6
echo "--- lint: ruff $RUFF_VERSION check python tests/python ---"
if python3 -m ruff --version 2>/dev/null | grep -qx "ruff $RUFF_VERSION" \
    || python3 -m pip install -q "ruff==$RUFF_VERSION" \
    || python3 -m pip install -q --break-system-packages "ruff==$RUFF_VERSION"; then
  python3 -m ruff check python tests/python
elif [ "${CI:-}" = true ]; then
  echo "error: could not install ruff $RUFF_VERSION" >&2
  exit 1
else
  echo "warning: could not install ruff $RUFF_VERSION; lint step skipped" >&2
fi
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
# Show the python GPU tests' skip reasons in the log (ctest hides passing tests' output).
if ! nvidia-smi >/dev/null 2>&1; then
  echo "--- GPU tests without a GPU (expected: skipped) ---"
  ctest -R python.gpu -V 2>&1 | grep -E "SKIPPED|skipped|passed|failed" | tail -5 || true
fi

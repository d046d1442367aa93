#!/usr/bin/env bash
# README command 2: install, build, run every test. GPU tests skip (visibly) without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
# PyTorch 2.4+ for the CPU tests of the custom ops (fake implementations, opcheck, torch.compile) and
# transformers for lfce.transformers: where /usr/bin/python3's torch is older (Debian 12: 1.13), a
# virtual environment build/venv-torch gets them from PyPI (kept between runs), and ctest runs the
# Python CPU tests a second time in it (python.cpu.torch), where those tests fail instead of skipping.
# CI (CI=true) fails when it cannot be made; elsewhere the tests skip, as the log then says.
if /usr/bin/python3 -c 'import torch.library as l; assert hasattr(l, "custom_op")' 2>/dev/null; then
  echo "--- /usr/bin/python3 has torch 2.4+: python.cpu runs the custom-op tests ---"
elif ! bash scripts/torch_venv.sh; then
  if [ "${CI:-}" = true ]; then
    echo "error: could not make build/venv-torch (torch 2.4+); the custom-op CPU tests cannot run" >&2
    exit 1
  fi
  echo "warning: no torch 2.4+ (build/venv-torch could not be made): the custom-op CPU tests skip" >&2
fi
# CI also builds the wheel (`pip wheel .`), tags it manylinux with auditwheel and installs it into a
# fresh virtual environment (tests/python/test_install.py; the C++ build reuses build/'s objects
# through ccache); elsewhere LFCE_TEST_PIP_INSTALL=1 asks for it.
if [ "${CI:-}" = true ]; then export LFCE_TEST_PIP_INSTALL="${LFCE_TEST_PIP_INSTALL:-1}"; fi
start=$SECONDS
bash scripts/build.sh
echo "--- build: $((SECONDS - start)) s ---"
# Lint step: ruff's default rules (config: ruff.toml) on the Python package, its tests and the
# benchmark harness. The version is pinned because ruff's default rule set changes between releases.
# Only CI (CI=true) fails when ruff cannot be installed (e.g. on a machine without PyPI); elsewhere the
# step is skipped.
RUFF_VERSION=0.17.6
echo "--- lint: ruff $RUFF_VERSION check python tests/python bench ---"
if python3 -m ruff --version 2>/dev/null | grep -qx "ruff $RUFF_VERSION" \
    || python3 -m pip install -q "ruff==$RUFF_VERSION" \
    || python3 -m pip install -q --break-system-packages "ruff==$RUFF_VERSION"; then
  python3 -m ruff check python tests/python bench
elif [ "${CI:-}" = true ]; then
  echo "error: could not install ruff $RUFF_VERSION" >&2
  exit 1
else
  echo "warning: could not install ruff $RUFF_VERSION; lint step skipped" >&2
fi
# Type step: mypy over the package (config: pyproject.toml [tool.mypy]), the version pinned in
# tests/python/requirements-torch.txt, run by the Python that has it and torch 2.4+ (whose annotations
# the package's use): build/venv-torch, or /usr/bin/python3 where it has both. Only CI (CI=true)
# fails when it cannot run; elsewhere the step is skipped.
MYPY_VERSION=$(sed -n 's/^mypy==//p' tests/python/requirements-torch.txt)
typing_python=/usr/bin/python3
if [ -x build/venv-torch/bin/python ]; then typing_python=build/venv-torch/bin/python; fi
echo "--- types: mypy $MYPY_VERSION (python/lfce) with $typing_python ---"
if "$typing_python" -m mypy --version 2>/dev/null | grep -q "^mypy $MYPY_VERSION "; then
  "$typing_python" -m mypy
elif [ "${CI:-}" = true ]; then
  echo "error: mypy $MYPY_VERSION is not installed for $typing_python (scripts/torch_venv.sh installs it)" >&2
  exit 1
else
  echo "warning: no mypy $MYPY_VERSION for $typing_python; type step skipped" >&2
fi
# Format step: the C/C++ lines the newest commit changed, as .clang-format writes them.
bash scripts/format_check.sh
cd build
status=0
start=$SECONDS
ctest --output-on-failure -j"$(nproc)" "$@" || status=$?
echo "--- ctest: $((SECONDS - start)) s ---"
# ctest shows only failing tests' output: print each pytest run's skips and closing line from its log.
echo "--- Python test runs: skips and results (GPU tests skip without a GPU) ---"
awk '/^[0-9]+\/[0-9]+ Test: python\./ { name = $3 }
     /^[0-9]+\/[0-9]+ Test: / && $3 !~ /^python\./ { name = "" }
     name != "" && /^SKIPPED|(passed|failed|error|skipped|deselected).* in [0-9.]+s/ { print name ": " $0 }' \
    Testing/Temporary/LastTest.log || true
exit $status

#!/usr/bin/env bash
# Configures and builds lfce into build/ (liblfce.so, the tests).
# With ccache installed (scripts/install_deps.sh installs it) the compiler runs through it, with
# CCACHE_BASEDIR at the repository root unless set: paths become relative to the build folder, so a
# build in another folder beside build/ (the `pip wheel .` of tests/python/test_install.py) reuses
# these objects.
set -euo pipefail
cd "$(dirname "$0")/.."
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" >/dev/null
cmake --build build -j"$(nproc)"

#!/usr/bin/env bash
# The CPU tests and the `lfce` command line built with AddressSanitizer + UBSan (build-asan/),
# any finding fatal. Python is left out: a sanitized liblfce.so inside an unsanitized python3
# would need the runtime preloaded, and the C API it calls is covered by c_api_tests and the CLI.
# GPU-labelled tests skip without a GPU. Usage: bash scripts/sanitize.sh [ctest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLFCE_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$(nproc)"
cd build-asan
# detect_leaks: LLVM's global option registry and the driver's dlopen'ed state are process-lifetime.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --output-on-failure -j"$(nproc)" -L cpu -LE python "$@"

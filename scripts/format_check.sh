#!/usr/bin/env bash
# Format check of the C and C++ lines a change touches (.clang-format; clang-format pinned, from
# PyPI): the lines of *.h, *.c and *.cpp that differ between <base> and the working tree must be
# as clang-format writes them. The base is $LFCE_FORMAT_BASE, default HEAD~1 (the newest commit, as
# CI checks it); the whole tree is not reformatted, so older lines keep their layout until touched.
# Prints the changes clang-format would make and exits 1 where it would make any.
# Usage: bash scripts/format_check.sh        (CI=true: fails when clang-format cannot be installed)
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT_VERSION=19.1.7
base=${LFCE_FORMAT_BASE:-HEAD~1}
tools=build/clang-format-$CLANG_FORMAT_VERSION
if [ ! -x "$tools/clang_format/data/bin/clang-format" ]; then
  if ! python3 -m pip install -q --target "$tools" "clang-format==$CLANG_FORMAT_VERSION" 2>/dev/null &&
     ! python3 -m pip install -q --break-system-packages --target "$tools" "clang-format==$CLANG_FORMAT_VERSION"; then
    if [ "${CI:-}" = true ]; then echo "error: could not install clang-format $CLANG_FORMAT_VERSION" >&2; exit 1; fi
    echo "warning: could not install clang-format $CLANG_FORMAT_VERSION; format check skipped" >&2
    exit 0
  fi
fi
if ! git rev-parse -q --verify "$base^{commit}" >/dev/null; then
  echo "format check: no commit $base to compare with (a shallow clone?); skipped"
  exit 0
fi
echo "--- format: clang-format $CLANG_FORMAT_VERSION over the C/C++ lines changed since $base ---"
# (git-clang-format exits 1 where it has changes to show, and names other failures on stderr.)
out=$(PYTHONPATH="$tools" python3 "$tools/clang_format/git_clang_format.py" \
        --binary "$tools/clang_format/data/bin/clang-format" --diff --extensions c,h,cpp "$base" -- \
        api autotune cli compiler include runtime templates tests) || [ -n "$out" ] || exit 1
case "$out" in
  "" | "no modified files to format" | "clang-format did not modify any files") echo "format: clean"; exit 0 ;;
esac
echo "$out"
echo "format: the lines above are not as .clang-format writes them; run:" \
     "PYTHONPATH=$tools python3 $tools/clang_format/git_clang_format.py --binary $tools/clang_format/data/bin/clang-format $base" >&2
exit 1

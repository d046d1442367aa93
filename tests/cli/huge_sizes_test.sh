#!/usr/bin/env bash
# The `lfce` command line with sizes beyond the library's limits (huge token counts among them):
# each must end promptly with an error that names the value, never loop, crash on a signal or
# succeed. No GPU needed. Usage: huge_sizes_test.sh LFCE TEST
set -uo pipefail
lfce=$1 test=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LFCE_CACHE_DIR="$work/cache"

fail() { echo "FAIL: $*" >&2; exit 1; }
expect_named() {  # expect_named VALUE CMD...: CMD fails within 60 s, not by a signal, naming VALUE
  local value=$1; shift
  timeout 60 "$@" >"$work/out" 2>"$work/err"
  local status=$?
  [ "$status" -eq 0 ] && fail "'$*' succeeded"
  [ "$status" -eq 124 ] && fail "'$*' still ran after 60 s"
  [ "$status" -gt 128 ] && fail "'$*' was killed by signal $((status - 128)): $(cat "$work/err")"
  grep -q -- "$value" "$work/err" || fail "'$*' did not name $value: $(cat "$work/err")"
}

case $test in
  compile_names_huge_tokens)  # once looped forever rounding N up to a power of two
    expect_named 4611686018427387905 "$lfce" compile --vocab 1000 --hidden 64 --tokens 4611686018427387905 -o "$work/x" ;;
  compile_names_fp32_tokens_whose_workspace_wraps)  # once SIGFPE: 2^62 rows x 4 bytes = 0
    expect_named 2305843009213693953 "$lfce" compile --vocab 1000 --hidden 64 --dtype fp32 \
      --tokens 2305843009213693953 -o "$work/x" ;;
  precompile_names_huge_tokens)  # once looped forever in the tuning lookup's N bucket
    expect_named 4611686018427387905 "$lfce" precompile --model llama2-7b --arch sm_80 --tokens 4611686018427387905 ;;
  compile_names_huge_hidden)
    expect_named 1099511627776 "$lfce" compile --vocab 1000 --hidden 1099511627776 -o "$work/x" ;;
  *) fail "unknown test $test" ;;
esac

#!/usr/bin/env bash
# End-to-end tests of the `lfce` command line (no GPU needed). Usage: cli_test.sh LFCE PTXAS TEST
# Each TEST is one behaviour; it exits non-zero with a message when the behaviour is missing.
set -uo pipefail
lfce=$1 ptxas=$2 test=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LFCE_CACHE_DIR="$work/cache"

fail() { echo "FAIL: $*" >&2; exit 1; }
expect_error() {  # expect_error PATTERN CMD...: CMD must fail and print PATTERN on stderr
  local pattern=$1; shift
  "$@" >"$work/out" 2>"$work/err" && fail "'$*' succeeded"
  grep -q -- "$pattern" "$work/err" || fail "'$*' did not say '$pattern': $(cat "$work/err")"
}
assemble_all() {  # assemble_all DIR ARCH: every .ptx in DIR assembles, without spills
  local n=0
  for f in "$1"/*.ptx; do
    "$ptxas" -arch="$2" -v -o /dev/null "$f" >"$work/ptxas" 2>&1 || fail "ptxas rejected $f: $(cat "$work/ptxas")"
    grep -E "[1-9][0-9]* bytes spill (stores|loads)" "$work/ptxas" && fail "$f spills"
    n=$((n + 1))
  done
  [ "$n" -gt 0 ] || fail "no PTX in $1"
}

case $test in
  compile_writes_ptx_that_assembles)
    for arch in sm_90a sm_80; do
      "$lfce" compile --vocab 50257 --hidden 2304 --arch $arch --bias -o "$work/$arch" >/dev/null || fail "compile $arch"
      [ "$(ls "$work/$arch"/*.ptx | wc -l)" -eq 7 ] || fail "expected 7 kernels with --bias, got $(ls "$work/$arch")"
      grep -q '"spec": "lse_forward;V=50257;H=2304;' "$work/$arch/lse_forward.json" || fail "metadata lacks the spec"
      assemble_all "$work/$arch" $arch
    done ;;
  compile_names_bad_hidden)
    expect_error "hidden = 12 must be a multiple of 8" "$lfce" compile --vocab 100 --hidden 12 -o "$work/x" ;;
  compile_names_bad_vocab)
    expect_error "vocab.*got '0'" "$lfce" compile --vocab 0 --hidden 16 ;;
  compile_names_bad_arch)
    expect_error "sm_70" "$lfce" compile --vocab 100 --hidden 16 --arch sm_70 -o "$work/x" ;;
  compile_names_bad_dtype)
    expect_error "fp8" "$lfce" compile --vocab 100 --hidden 16 --dtype fp8 ;;
  every_command_has_help)
    for cmd in "" compile precompile tune cache "cache ls" "cache info" "cache verify" "cache clear"; do
      # shellcheck disable=SC2086
      "$lfce" $cmd --help >"$work/out" 2>&1 || fail "'lfce $cmd --help' failed"
      grep -q "Usage" "$work/out" || fail "'lfce $cmd --help' printed no usage"
    done ;;
  precompile_fills_cache_then_hits)
    "$lfce" precompile --model llama2-7b --arch sm_90a,sm_80 --tokens 512 >"$work/first" || fail "precompile"
    grep -q "12 kernels: 0 already cached, 12 compiled" "$work/first" || fail "first run: $(tail -1 "$work/first")"
    "$lfce" precompile --model llama2-7b --arch sm_90a,sm_80 --tokens 512 >"$work/second" || fail "precompile again"
    grep -q "12 kernels: 12 already cached, 0 compiled" "$work/second" || fail "second run: $(tail -1 "$work/second")"
    "$lfce" cache ls >"$work/ls" || fail "cache ls"
    grep -q "^12 entries" "$work/ls" || fail "cache ls: $(cat "$work/ls")"
    mkdir -p "$work/ptx90" "$work/ptx80"
    for meta in "$LFCE_CACHE_DIR"/kernels/*.json; do
      arch=$(grep -o '"arch": "sm_[0-9a]*"' "$meta" | grep -o 'sm_[0-9a]*')
      cp "${meta%.json}.ptx" "$work/ptx${arch//[^0-9]/}/"
    done
    assemble_all "$work/ptx90" sm_90a
    assemble_all "$work/ptx80" sm_80 ;;
  precompile_names_unknown_model)
    expect_error "unknown model 'gpt-9'" "$lfce" precompile --model gpt-9 ;;
  cache_verify_finds_and_removes_a_corrupt_entry)
    "$lfce" precompile --model llama2-7b --arch sm_80 --tokens 64 >/dev/null || fail "precompile"
    victim=$(ls "$LFCE_CACHE_DIR"/kernels/*.ptx | head -1)
    key=$(basename "$victim" .ptx)
    head -c 100 "$victim" >"$victim.tmp" && mv "$victim.tmp" "$victim"
    "$lfce" cache verify >"$work/out" 2>&1 && fail "verify passed a truncated entry"
    grep -q "$key" "$work/out" || fail "verify did not name $key: $(cat "$work/out")"
    "$lfce" cache verify --remove >/dev/null 2>&1 || fail "verify --remove"
    "$lfce" cache verify >/dev/null 2>&1 || fail "verify still fails after --remove"
    "$lfce" precompile --model llama2-7b --arch sm_80 --tokens 64 >"$work/out" || fail "precompile after repair"
    grep -q "5 already cached, 1 compiled" "$work/out" || fail "expected one recompile: $(tail -1 "$work/out")" ;;
  cache_info_and_clear)
    "$lfce" precompile --model mistral-7b --arch sm_80 --tokens 64 >/dev/null || fail "precompile"
    key=$(ls "$LFCE_CACHE_DIR"/kernels/*.ptx | head -1 | xargs basename | cut -c1-12)
    "$lfce" cache info "$key" | grep -q '"spec": ' || fail "cache info $key printed no spec"
    expect_error "ffffffffffff" "$lfce" cache info ffffffffffff
    "$lfce" cache clear --older-than 1 | grep -q "removed 0 entries" || fail "clear --older-than 1 removed fresh entries"
    "$lfce" cache clear | grep -q "removed 6 entries" || fail "clear did not remove the 6 entries"
    "$lfce" cache ls | grep -q "^0 entries" || fail "entries left after clear" ;;
  unknown_command_fails)
    expect_error "frobnicate" "$lfce" frobnicate ;;
  *)
    fail "unknown test $test" ;;
esac
echo "PASS: $test"

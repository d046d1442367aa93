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
expect_status() {  # expect_status CODE PATTERN CMD...: CMD must exit CODE and print PATTERN on stderr
  local code=$1 pattern=$2; shift 2
  "$@" >"$work/out" 2>"$work/err"
  local got=$?
  [ "$got" -eq "$code" ] || fail "'$*' exited $got, expected $code: $(cat "$work/err")"
  grep -q -- "$pattern" "$work/err" || fail "'$*' did not say '$pattern': $(cat "$work/err")"
}
as_nobody() {  # as_nobody CMD...: runs CMD as a user without write access (root ignores permissions)
  if [ "$(id -u)" -eq 0 ]; then setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; else "$@"; fi
}
fill_cache() {  # fill_cache: six PTX entries of one preset in $LFCE_CACHE_DIR
  "$lfce" precompile --model llama2-7b --arch sm_80 --tokens 64 >/dev/null || fail "precompile"
}
first_key() { ls "$LFCE_CACHE_DIR"/kernels/*.ptx | head -1 | xargs basename | sed 's/\.ptx$//'; }
set_metadata() {  # set_metadata KEY PYTHON-EXPR-ON-j: edits kernels/KEY.json
  python3 -c "import json,sys; p=sys.argv[1]; j=json.load(open(p)); $2; json.dump(j, open(p, 'w'))" \
    "$LFCE_CACHE_DIR/kernels/$1.json" || fail "cannot edit $1.json"
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
compile_plain() {  # compile_plain: the kernels of one configuration without loss options, in $work/plain
  "$lfce" compile --vocab 50257 --hidden 2304 -o "$work/plain" >/dev/null || fail "compile"
}
changes_only() {  # changes_only "OPTIONS" TEXT "KERNELS": with OPTIONS, exactly KERNELS differ from
  # $work/plain (and name TEXT in their metadata); every other kernel is byte-identical
  local out="$work/options" f k
  rm -rf "$out"
  # shellcheck disable=SC2086
  "$lfce" compile --vocab 50257 --hidden 2304 $1 -o "$out" >/dev/null || fail "compile $1"
  for f in "$work/plain"/*.ptx; do
    k=$(basename "$f" .ptx)
    if [[ " $3 " == *" $k "* ]]; then
      cmp -s "$f" "$out/$k.ptx" && fail "$k.ptx is the same with $1"
      grep -q -- "$2" "$out/$k.json" || fail "$k.json does not name $2"
    else
      cmp -s "$f" "$out/$k.ptx" || fail "$k.ptx changed with $1"
    fi
  done
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
    expect_error "hidden.*got '0'" "$lfce" compile --vocab 100 --hidden 0 -o "$work/x" ;;
  compile_odd_hidden_assembles)  # H = 12 and 7 (bf16 rows of 24 and 14 bytes): no TMA, narrower copies
    for hidden in 12 7; do
      "$lfce" compile --vocab 1000 --hidden $hidden --arch sm_90a -o "$work/h$hidden" >/dev/null || fail "compile H=$hidden"
      grep -q '/wg' "$work/h$hidden"/*.json && fail "a TMA (wgmma) tile for H=$hidden"
      assemble_all "$work/h$hidden" sm_90a
    done ;;
  compile_names_bad_vocab)
    expect_error "vocab.*got '0'" "$lfce" compile --vocab 0 --hidden 16 ;;
  compile_names_bad_arch)
    expect_error "sm_70" "$lfce" compile --vocab 100 --hidden 16 --arch sm_70 -o "$work/x" ;;
  compile_names_bad_dtype)
    expect_error "fp8" "$lfce" compile --vocab 100 --hidden 16 --dtype fp8 ;;
  compile_softcap_changes_only_the_logit_kernels)
    compile_plain
    changes_only "--softcap 30" "softcap=30" "lse_forward dlogits_backward"
    expect_status 2 "softcap.*-1" "$lfce" compile --vocab 100 --hidden 16 --softcap -1 -o "$work/x"
    expect_status 2 "softcap.*nan" "$lfce" compile --vocab 100 --hidden 16 --softcap nan -o "$work/x" ;;
  compile_temperature_and_z_loss_change_only_their_kernels)
    compile_plain
    changes_only "--temperature 0.7" "temperature=0.7" "lse_forward dlogits_backward"
    changes_only "--z-loss-scale 0.0001" "z_loss_scale=1e-04" "lse_combine dlogits_backward"
    changes_only "--temperature 0.7 --z-loss-scale 0.0001 --softcap 30" "softcap=30;temperature=0.7\|z_loss_scale" \
      "lse_forward lse_combine dlogits_backward"
    expect_status 2 "temperature.*-1" "$lfce" compile --vocab 100 --hidden 16 --temperature -1 -o "$work/x"
    expect_status 2 "temperature.*inf" "$lfce" compile --vocab 100 --hidden 16 --temperature inf -o "$work/x"
    expect_status 2 "z_loss_scale.*-0.5" "$lfce" compile --vocab 100 --hidden 16 --z-loss-scale -0.5 -o "$work/x"
    expect_status 2 "z_loss_scale.*nan" "$lfce" compile --vocab 100 --hidden 16 --z-loss-scale nan -o "$work/x" ;;
  compile_label_smoothing_and_class_weights_change_only_their_kernels)
    compile_plain
    changes_only "--label-smoothing 0.1" "label_smoothing=0.1" "lse_forward lse_combine dlogits_backward"
    changes_only "--class-weight" "class_weight=1" "lse_combine loss_reduce dlogits_backward"
    changes_only "--class-weight --label-smoothing 0.1" "label_smoothing=0.1\|class_weight=1" \
      "lse_forward lse_combine loss_reduce dlogits_backward"
    expect_status 2 "label_smoothing.*1.5" "$lfce" compile --vocab 100 --hidden 16 --label-smoothing 1.5 -o "$work/x"
    expect_status 2 "label_smoothing.*nan" "$lfce" compile --vocab 100 --hidden 16 --label-smoothing nan -o "$work/x"
    expect_status 2 "has_class_weight = 1 with fp16" "$lfce" compile --vocab 100 --hidden 16 --class-weight --dtype fp16 \
      -o "$work/x" ;;
  compile_accumulation_and_token_scaling_change_only_their_kernels)
    compile_plain
    changes_only "--token-scaling" "token_scaling=1" "lse_combine dlogits_backward"
    changes_only "--accumulate-grad-weight" "accumulate=1" "grad_weight"
    expect_status 2 "accumulate_grad_weight = 1 needs mode LFCE_MODE_RECOMPUTE" "$lfce" compile --vocab 100 --hidden 16 \
      --accumulate-grad-weight --mode eager -o "$work/x"
    expect_status 2 "accumulate_grad_bias = 1 needs has_bias = 1" "$lfce" compile --vocab 100 --hidden 16 \
      --accumulate-grad-bias -o "$work/x" ;;
  compile_causal_shift_changes_only_the_kernels_that_read_targets)
    compile_plain
    changes_only "--sequence-length 4096" "shift=1" "lse_forward lse_combine loss_reduce dlogits_backward grad_input"
    expect_status 2 "sequence_length = 3 must be 0 (no shift) or a length T >= 1 of which tokens = 8192" "$lfce" \
      compile --vocab 100 --hidden 16 --sequence-length 3 -o "$work/x" ;;
  compile_extra_outputs_change_only_their_kernels)
    compile_plain
    changes_only "--outputs entropy" "entropy=1" "lse_forward lse_combine"
    changes_only "--outputs predicted" "argmax=1" "lse_forward lse_combine"
    changes_only "--outputs logprob" "logprob=1" "lse_combine"
    expect_status 2 "outputs" "$lfce" compile --vocab 100 --hidden 16 --outputs accuracy -o "$work/x" ;;
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
  precompile_for_a_99_kib_gpu_compiles_other_kernels)
    "$lfce" precompile --model llama3-8b --arch sm_80 >"$work/first" || fail "precompile"
    "$lfce" precompile --model llama3-8b --arch sm_80 --sm-count 108 --smem-per-block 101376 >"$work/second" ||
      fail "precompile for 99 KiB"
    grep -q "6 kernels: 0 already cached, 6 compiled" "$work/first" || fail "first run: $(tail -1 "$work/first")"
    # The forward kernels and lse_combine / loss_reduce are the same; the backward tiles differ.
    grep -q "6 kernels: 3 already cached, 3 compiled" "$work/second" || fail "99 KiB run: $(tail -1 "$work/second")"
    expect_error "sm-count" "$lfce" precompile --model llama3-8b --sm-count 0
    expect_error "smem-per-block" "$lfce" precompile --model llama3-8b --smem-per-block -1 ;;
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
  cache_unknown_subcommand_is_named)
    expect_status 2 "frob" "$lfce" cache frob
    expect_status 2 "ls, info, verify, clear" "$lfce" cache ;;
  cache_clear_keeps_files_that_are_not_entries)
    fill_cache
    mkdir -p "$work/mine"
    for name in notes.txt model.json weights.ptx 0000.cubin; do
      echo mine >"$LFCE_CACHE_DIR/kernels/$name"
      touch -d '2 hours ago' "$LFCE_CACHE_DIR/kernels/$name"
    done
    "$lfce" cache verify --remove >/dev/null 2>&1 || fail "verify --remove"
    "$lfce" cache clear >"$work/out" || fail "cache clear"
    grep -q "removed 6 entries" "$work/out" || fail "clear: $(cat "$work/out")"
    for name in notes.txt model.json weights.ptx 0000.cubin; do
      [ -f "$LFCE_CACHE_DIR/kernels/$name" ] || fail "clear or verify removed the user's file $name"
    done ;;
  cache_clear_does_not_follow_a_symlinked_kernels_dir)
    LFCE_CACHE_DIR="$work/elsewhere" fill_cache
    echo mine >"$work/elsewhere/kernels/notes.txt"
    mkdir -p "$LFCE_CACHE_DIR"
    ln -s "$work/elsewhere/kernels" "$LFCE_CACHE_DIR/kernels"
    expect_status 3 "kernels.*symbolic link" "$lfce" cache clear
    expect_status 3 "kernels.*symbolic link" "$lfce" cache verify --remove
    [ "$(ls "$work/elsewhere/kernels" | wc -l)" -eq 13 ] || fail "files behind the link were removed: $(ls "$work/elsewhere/kernels")" ;;
  cache_clear_on_a_read_only_cache_names_what_stays)
    fill_cache
    chmod -R a+rX "$work" && chmod a-w "$LFCE_CACHE_DIR/kernels" "$LFCE_CACHE_DIR/locks"
    expect_status 3 "cannot remove.*kernels/.*json" as_nobody "$lfce" cache clear
    key=$(first_key)
    head -c 10 "$LFCE_CACHE_DIR/kernels/$key.ptx" >"$work/short" && cat "$work/short" >"$LFCE_CACHE_DIR/kernels/$key.ptx"
    expect_status 3 "cannot remove.*$key" as_nobody "$lfce" cache verify --remove ;;
  cache_ls_and_verify_survive_a_huge_creation_time)
    fill_cache
    key=$(first_key)
    for created in 100000000000000000 1e300; do
      set_metadata "$key" "j['created_unix'] = $created"
      "$lfce" cache ls >"$work/out" 2>&1 || fail "cache ls with created_unix = $created: $(cat "$work/out")"
      "$lfce" cache verify >"$work/out" 2>&1
      [ $? -eq 1 ] || fail "verify did not flag created_unix = $created: $(cat "$work/out")"
      grep -q "$key.*created_unix" "$work/out" || fail "verify did not name $key's created_unix: $(cat "$work/out")"
    done ;;
  cache_verify_flags_a_changed_launch_shape)
    fill_cache
    key=$(first_key)
    set_metadata "$key" "j['threads'] //= 2"
    "$lfce" cache verify >"$work/out" 2>&1 && fail "verify passed an entry whose threads were halved"
    grep -q "$key.*checksum" "$work/out" || fail "verify did not name $key's checksum: $(cat "$work/out")" ;;
  cache_verify_does_not_hang_on_a_fifo)
    fill_cache
    key=$(first_key)
    rm "$LFCE_CACHE_DIR/kernels/$key.ptx" && mkfifo "$LFCE_CACHE_DIR/kernels/$key.ptx"
    timeout 20 "$lfce" cache verify >"$work/out" 2>&1
    status=$?
    [ "$status" -ne 124 ] || fail "verify hangs on a FIFO in place of a payload"
    [ "$status" -eq 1 ] || fail "verify exited $status: $(cat "$work/out")"
    grep -q "$key.ptx.*not a regular file" "$work/out" || fail "verify did not name the FIFO: $(cat "$work/out")"
    timeout 60 "$lfce" precompile --model llama2-7b --arch sm_80 --tokens 64 >"$work/out" 2>&1
    status=$?
    [ "$status" -ne 124 ] || fail "precompile hangs on a FIFO in place of a payload"
    [ "$status" -eq 0 ] || fail "precompile exited $status: $(cat "$work/out")" ;;
  cache_verify_escapes_control_characters)
    fill_cache
    key=$(first_key)
    set_metadata "$key" "j['generator_version'] = '\x1b]0;pwned\x07\x1b[31m'"
    "$lfce" cache verify >"$work/out" 2>&1 && fail "verify passed a foreign entry"
    grep -q "$(printf '\033')" "$work/out" && fail "verify printed a raw escape sequence: $(cat -v "$work/out")"
    grep -qF '\x1b' "$work/out" || fail "verify did not show the escape as text: $(cat -v "$work/out")" ;;
  cache_clear_rejects_a_nan_or_negative_age)
    fill_cache
    expect_status 2 "older-than.*nan" "$lfce" cache clear --older-than nan
    expect_status 2 "older-than.*-1" "$lfce" cache clear --older-than -1
    expect_status 2 "older-than.*inf" "$lfce" cache clear --older-than inf
    [ "$(ls "$LFCE_CACHE_DIR"/kernels/*.json | wc -l)" -eq 6 ] || fail "entries were removed" ;;
  cache_dir_must_not_be_empty)
    expect_status 2 "cache-dir" "$lfce" cache ls --cache-dir ""
    expect_status 2 "cache-dir" "$lfce" precompile --model llama2-7b --cache-dir ""
    expect_status 2 "cache-dir" "$lfce" tune --model llama2-7b --cache-dir "" ;;
  precompile_rejects_an_empty_arch_list)
    expect_status 2 "arch.*',,,'" "$lfce" precompile --model llama2-7b --arch ,,,
    expect_status 2 "arch" "$lfce" precompile --model llama2-7b --arch ""
    expect_status 2 "arch.*sm_90a,,sm_80" "$lfce" precompile --model llama2-7b --arch sm_90a,,sm_80 ;;
  options_reject_nan_and_overflowing_numbers)
    expect_status 2 "budget-minutes.*nan" "$lfce" tune --model llama2-7b --budget-minutes nan
    expect_status 2 "budget-mib.*17592186044416" "$lfce" compile --vocab 100 --hidden 16 --budget-mib 17592186044416 -o "$work/x" ;;
  compile_fails_on_a_full_disk)
    mkdir -p "$work/full"
    ln -s /dev/full "$work/full/lse_forward.ptx"
    expect_status 3 "$work/full/lse_forward.ptx.*No space left" "$lfce" compile --vocab 100 --hidden 16 -o "$work/full" ;;
  compile_fails_on_a_read_only_folder)
    mkdir -p "$work/ro" && chmod -R a+rX "$work" && chmod a-w "$work/ro"
    expect_status 3 "$work/ro/.*Permission denied" as_nobody "$lfce" compile --vocab 100 --hidden 16 -o "$work/ro" ;;
  exit_status_tells_usage_errors_from_failures)
    "$lfce" --help | grep -q "Exit status" || fail "lfce --help does not document the exit status"
    expect_status 2 "vocab" "$lfce" compile --vocab 0 --hidden 16
    expect_status 2 "gpt-9" "$lfce" precompile --model gpt-9
    mkdir -p "$work/full" && ln -s /dev/full "$work/full/lse_forward.ptx"
    expect_status 3 "No space left" "$lfce" compile --vocab 100 --hidden 16 -o "$work/full"
    grep -q -- "--output\|--vocab\|--arch" "$work/err" && fail "a write failure was blamed on an option: $(cat "$work/err")"
    true ;;
  float_options_reject_text_that_is_not_a_float)
    expect_status 2 "temperature.*'1e-50'.*below a float's smallest normal number, 1.18e-38" \
      "$lfce" compile --vocab 100 --hidden 16 --temperature 1e-50 -o "$work/x"
    expect_status 2 "softcap.*'1e-40'.*below a float's smallest normal number" \
      "$lfce" compile --vocab 100 --hidden 16 --softcap 1e-40 -o "$work/x"
    expect_status 2 "softcap.*got ''" "$lfce" compile --vocab 100 --hidden 16 --softcap "" -o "$work/x"
    expect_status 2 "softcap.*'1e39'.*lfce_problem.softcap: 0 (none) or a positive cap in \[1.1754944e-38, 1e6\]" "$lfce" compile --vocab 100 --hidden 16 --softcap 1e39 -o "$work/x"
    grep -q "got inf" "$work/err" && fail "--softcap 1e39 was reported as inf: $(cat "$work/err")"
    expect_status 2 "z-loss-scale.*'0x1p-3'" "$lfce" compile --vocab 100 --hidden 16 --z-loss-scale 0x1p-3 -o "$work/x"
    expect_status 2 "label-smoothing.*'nan'" "$lfce" compile --vocab 100 --hidden 16 --label-smoothing nan -o "$work/x"
    [ -e "$work/x" ] && fail "a rejected option still wrote kernels"
    "$lfce" compile --vocab 100 --hidden 16 --softcap 30 --temperature 0.7 --z-loss-scale 1e-4 -o "$work/ok" >/dev/null ||
      fail "valid float options were rejected" ;;
  outputs_reject_an_empty_item)
    expect_status 2 "outputs.*'entropy,,predicted' has an empty item" \
      "$lfce" compile --vocab 100 --hidden 16 --outputs entropy,,predicted -o "$work/x"
    expect_status 2 "outputs.*'entropy,' has an empty item" "$lfce" compile --vocab 100 --hidden 16 --outputs entropy, -o "$work/x"
    expect_status 2 "outputs.*'' has an empty item" "$lfce" compile --vocab 100 --hidden 16 --outputs "" -o "$work/x"
    expect_status 2 "outputs.*'accuracy' is not one of entropy, logprob, predicted" \
      "$lfce" compile --vocab 100 --hidden 16 --outputs entropy,accuracy -o "$work/x"
    "$lfce" compile --vocab 100 --hidden 16 --outputs entropy,predicted -o "$work/ok" >/dev/null || fail "entropy,predicted"
    grep -q "entropy=1" "$work/ok/lse_combine.json" && grep -q "argmax=1" "$work/ok/lse_combine.json" ||
      fail "--outputs entropy,predicted did not ask for both: $(cat "$work/ok/lse_combine.json")" ;;
  flags_reject_a_value)
    expect_status 2 "--bias: a flag takes no value, got '--bias=2'" \
      "$lfce" compile --vocab 100 --hidden 16 --bias=2 -o "$work/x"
    expect_status 2 "--remove: a flag takes no value, got '--remove=0'" "$lfce" cache verify --remove=0 ;;
  version_rejects_extra_arguments)
    expect_status 2 "version.*takes no other argument" "$lfce" --version extra
    "$lfce" --version | grep -q "^lfce [0-9]" || fail "lfce --version does not print the version" ;;
  tune_names_a_huge_budget_as_given)
    expect_status 2 "budget-minutes.*in \[0, 1000000000\], got '1e308'" "$lfce" tune --model llama2-7b --budget-minutes 1e308
    grep -qE "[0-9]{20}" "$work/err" && fail "the budget was printed digit by digit: $(cat "$work/err")"
    true ;;
  cache_clear_reads_only_decimal_days)
    fill_cache
    expect_status 2 "older-than.*'0x10'" "$lfce" cache clear --older-than 0x10
    expect_status 2 "older-than.*' 7'" "$lfce" cache clear --older-than " 7"
    [ "$(ls "$LFCE_CACHE_DIR"/kernels/*.json | wc -l)" -eq 6 ] || fail "entries were removed"
    "$lfce" cache clear --older-than 1.5 >/dev/null || fail "--older-than 1.5 was rejected"
    [ "$(ls "$LFCE_CACHE_DIR"/kernels/*.json | wc -l)" -eq 6 ] || fail "fresh entries were removed by --older-than 1.5" ;;
  precompile_for_a_99_kib_gpu_fits_every_kernel_with_per_row_options)
    # The entropy's gradient, smoothing, entropy and argmax add shared memory per row: every kernel
    # precompiled for a 101376-byte GPU asks for at most that.
    for options in "--outputs entropy" "--label-smoothing 0.1 --outputs entropy,predicted"; do
      # shellcheck disable=SC2086
      "$lfce" precompile --model llama3-8b --arch sm_80,sm_90a --smem-per-block 101376 $options >"$work/out" 2>"$work/err" ||
        fail "precompile for 99 KiB with $options: $(cat "$work/err")"
    done
    python3 - "$LFCE_CACHE_DIR/kernels" <<'PY' || fail "a cached kernel needs more than 101376 bytes"
import glob, json, sys
files = glob.glob(sys.argv[1] + "/*.json")
assert files, "nothing was cached"
over = [(j["spec"], j["dynamic_smem_bytes"]) for j in map(lambda f: json.load(open(f)), files)
        if j["dynamic_smem_bytes"] > 101376]
if over:
    sys.exit("over 101376 bytes: %s" % over)
PY
    ;;
  precompile_names_a_shared_memory_limit_below_every_tile)
    expect_status 2 "shared memory per block = 1 bytes.*--smem-per-block.*at least [0-9]" \
      "$lfce" precompile --model llama3-8b --arch sm_80 --smem-per-block 1
    grep -q "internal error" "$work/err" && fail "a too small limit was called an internal error: $(cat "$work/err")"
    [ -z "$(ls "$LFCE_CACHE_DIR"/kernels/*.json 2>/dev/null)" ] || fail "kernels were cached for a limit nothing fits"
    true ;;
  precompile_refuses_fp16_entropy_before_caching_anything)
    expect_status 2 "outputs asks for the entropy with fp16.*use bf16 or fp32" \
      "$lfce" precompile --model llama3-8b --arch sm_80 --dtype fp16 --outputs entropy
    [ -z "$(ls "$LFCE_CACHE_DIR"/kernels/*.json 2>/dev/null)" ] || fail "kernels were cached before the refusal"
    true ;;
  *)
    fail "unknown test $test" ;;
esac
echo "PASS: $test"

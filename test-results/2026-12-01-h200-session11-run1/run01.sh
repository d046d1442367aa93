#!/usr/bin/env bash
# Session 11 run 1: causal shift read in place (sequence_length): the shift tests on sm_90a and sm_80,
# SASS of the shifted kernels, then a library broken on purpose (shift end test, z-loss gradient,
# logprob) against the new and session-10 tests.
set -uo pipefail
bash .device/run.sh > /dev/null 2>&1
export PYTHONUNBUFFERED=1 LFCE_COMMIT=$(head -1 .device/commit) PYTHONPATH=$PWD/python LFCE_LIBRARY=$PWD/build/liblfce.so
R=$OUT/r; mkdir -p $R; pack() { tar -czf $OUT/results.tgz -C $OUT r; }
t0=$SECONDS
timeout 200 bash scripts/gpu_tests.sh $R/py-shift-sm90 -q -p no:cacheprovider -k "shift" > $R/py-shift-sm90.log 2>&1; echo "shift sm90 rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-shift-sm90.log | tail -1; grep -E "^FAILED|^ERROR|^E  " $R/py-shift-sm90.log | head -12 | cut -c1-250; pack
LFCE_DEVICE_ARCH=sm_80 timeout 150 bash scripts/gpu_tests.sh $R/py-shift-sm80 -q -p no:cacheprovider -k "shift" > $R/py-shift-sm80.log 2>&1; echo "shift sm80 rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-shift-sm80.log | tail -1; grep -E "^FAILED|^ERROR|^E  " $R/py-shift-sm80.log | head -12 | cut -c1-250; pack
export PATH=$PATH:/usr/local/cuda/bin; mkdir -p $R/sass; build/lfce compile --vocab 128256 --hidden 4096 --tokens 8192 --sequence-length 4096 -o $R/sass/k > /dev/null
for k in lse_forward dlogits_backward grad_input lse_combine loss_reduce; do ptxas -arch=sm_90a -o $R/sass/$k.cubin $R/sass/k/$k.ptx && echo "$k: CALL $(cuobjdump -sass $R/sass/$k.cubin | grep -c CALL) HGMMA $(cuobjdump -sass $R/sass/$k.cubin | grep -c HGMMA) LDL $(cuobjdump -sass $R/sass/$k.cubin | grep -c 'LDL\|STL')"; done | tee $R/sass/summary.txt; rm -rf $R/sass/k $R/sass/*.cubin
LFCE_LIBRARY=$PWD/build/liblfce_broken.so timeout 200 bash scripts/gpu_tests.sh $R/py-broken -q -p no:cacheprovider -k "shift or (test_option_combinations_at_a_large_vocabulary and softcap_z_loss) or (test_output_combinations_at_a_large_vocabulary and together)" > $R/py-broken.log 2>&1; echo "broken rc=$? $((SECONDS-t0))s"
grep -E "passed|failed" $R/py-broken.log | tail -1; grep -E "^FAILED" $R/py-broken.log | sed 's/ - .*//' | awk '{print $2}' | sed 's/\[.*//' | sort | uniq -c; pack

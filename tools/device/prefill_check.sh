#!/usr/bin/env bash
# One device call for the pending prefill work (issue 12; docs/pending/README.md).
# Usage (device call, carry ["gpu"]): BUDGET=seconds bash tools/device/prefill_check.sh, with the
# bundle gpu/bin.tar.xz of tools/device/pack.sh. In order: the tests (kept weight copies, attention
# prefill incl. v5b, prefill logits incl. head_dim 256, under v4 / v4b / v5b), one 27B attention layer
# under v4 / v4b / v5b, the GDN-beside-GEMM overlap experiment (qflash_gemm_bench --overlap), the 27B
# 32k and 8k prompts under v4 / v4b / v5b, one GDN layer, the 128k prompt (QFLASH_ATTN_PREFILL=$V128,
# default v4b) and, if time is left, Nsight Compute on the GDN kernels ($OUT/gdn_source.csv.gz).
# Every step is cut to what is left of BUDGET (default 570 s).
cd "$(dirname "$0")/../.."
source tools/device/call_lib.sh
mkdir -p $OUT/x; X=$OUT/x
QFLASH_TOL_REPORT=1 timeout $(to 150) $B/qflash_tests --gtest_filter='CudaGemm.Kept*:CudaAttentionPrefill.*:Backends/PrefillLogits.*/cuda' --gtest_color=no > $X/t_default.log 2>&1
echo "== default rc=$? t=$(( $(date +%s) - T0 ))"; grep -h '^\[tol\]\|\[ tol \]\|FAILED\|PASSED\|Failure' $X/t_default.log | head -40
for v in v4b v5b; do
  QFLASH_ATTN_PREFILL=$v QFLASH_TOL_REPORT=1 timeout $(to 60) $B/qflash_tests --gtest_filter='Backends/PrefillLogits.*/cuda' --gtest_color=no > $X/pl_$v.log 2>&1
  echo "== $v rc=$? t=$(( $(date +%s) - T0 ))"; grep -h '^\[tol\]\|\[ tol \]\|FAILED\|PASSED' $X/pl_$v.log | head -12
done
for v in v4 v4b v5b; do echo "attn $v:"; QFLASH_ATTN_PREFILL=$v timeout $(to 60) $B/qflash_gdn_bench --attn-only --attn-rows 8192,32768 --reps 3 2>&1 | tail -3; done
timeout $(to 60) $B/qflash_gemm_bench --overlap 4096,8192 --reps 5 2>&1 | tail -8
echo "t=$(( $(date +%s) - T0 ))"
for L in 32768 8192; do for v in v4 v4b v5b; do
  (( $(left) < 40 )) && break
  QFLASH_ATTN_PREFILL=$v timeout $(to 100) $B/qflash bench --device cuda --synthetic tests/fixtures/configs/qwen38_27b/config.json \
    --prompt-len $L --max-context $((L + 256)) --prefill-chunk 8192 --ops-only --no-mtp --reps $(( L > 16384 ? 2 : 3 )) > $X/b${L}_$v.log 2>&1
  echo "$L $v: $(grep -h '^prefill\|^at context' $X/b${L}_$v.log | tr '\n' ' ' | cut -c1-300)"
done; done
echo "t=$(( $(date +%s) - T0 ))"
timeout $(to 40) $B/qflash_gdn_bench --rows 8192,32768 --no-rows --reps 3 2>&1 | tail -4
(( $(left) > 90 )) && QFLASH_ATTN_PREFILL=${V128:-v4b} timeout $(to 200) $B/qflash bench --device cuda --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --prompt-len 131072 --max-context 131328 --ops-only --no-mtp --reps 1 > $X/b128k.log 2>&1
grep -h '^prefill\|^at context\|peak' $X/b128k.log 2>/dev/null | cut -c1-300
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [[ -n "$NCU" ]] && (( $(left) > 50 )); then
  timeout $(to 100) $NCU --clock-control none --kernel-name regex:"gdn_chunk_(prep|recur)" --launch-count 2 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section Occupancy --section LaunchStats \
    --import-source yes -f -o $X/gdn_src $B/qflash_gdn_bench --rows 8192 --no-rows --reps 1 > $X/ncu_collect.log 2>&1
  timeout $(to 60) $NCU -i $X/gdn_src.ncu-rep --page details --print-details all > $X/gdn_details.txt 2>&1
  timeout $(to 60) $NCU -i $X/gdn_src.ncu-rep --page source --csv --print-source cuda,sass 2>/dev/null | gzip -c > $OUT/gdn_source.csv.gz
  rm -f $X/gdn_src.ncu-rep; grep -h 'Duration\|Registers Per\|Achieved Occupancy\|Issue Slots Busy\|Warp Cycles Per Issued' $X/gdn_details.txt | head -20
fi
echo "end t=$(( $(date +%s) - T0 ))"

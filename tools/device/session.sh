#!/usr/bin/env bash
# One H200 call that checks and times everything, inside the device tool's limits
# (10 minutes a call, at most 8 files back, 64 MiB carried).
#
# Here (build machine):
#   cmake -S . -B build-cuda -DQFLASH_CUDA=ON -DCMAKE_BUILD_TYPE=Release && cmake --build build-cuda -j2
#   bash tools/device/pack.sh                    # -> gpu/bin.tar.xz (stripped, ~4 MB)
# Device call (carry ["gpu"], timeout 600):
#   bash tools/device/session.sh gpu/bin.tar.xz
#   STEPS="ops model" bash tools/device/session.sh gpu/bin.tar.xz     # a subset
# Steps (default all, in this order):
#   facts     nvidia-smi
#   ops       qflash_tests Cuda*:Op/*_cuda        (the op table on cuda: every op vs float64,
#             row-invariance; CUDA-only checks)
#   model     qflash_tests model-level *_cuda     (identity, rollback, HF/PyTorch parity on cuda;
#             again with QFLASH_CUDA_GRAPHS=0: graphs replayed vs ops run directly)
#   e2e       qflash_e2e_tests *cuda*             (demo pair identity + acceptance on cuda)
#   gemv      qflash_gemv_bench --quick           (copy ceiling, GEMV GB/s for M = 1..16)
#   bench27   qflash bench, synthetic Qwen3.8-27B + DFlash2, forced acceptance
#   benchdemo qflash bench, demo pair, real acceptance (and 16 prompts with QFLASH_CUDA_GRAPHS=0)
#   sanitize  compute-sanitizer memcheck on the small ops' table cases (if time is left)
#   bench27s  a short 27B bench (plain + DFlash2 at forced 4 of 7) for A/B under an env switch
#   prof27    kernel profile of the 27B decode step, 8-row verify and draft pass (not default)
#   sweep     qflash_gemv_bench --sweep, then qflash_lab_gemv_tc --sweep: GEMV fixed cost per launch
#             vs a streaming read, production layouts, then the lab's schedules (not default)
#   lab       the kernel lab, --quick: every version of the tensor-core and CUDA-core GEMV checked
#             against the CPU and for row-invariance, then timed (not default)
#   labq4     the int4 GEMV lab (bench/lab_gemv_q4.cu): versions checked (CPU, row-invariance, bits vs
#             production), then timed on the 27B int4 shapes at M = 1, 2, 8, 16 (not default);
#             LABQ4_ARGS passes the lab its versions and options (e.g. "1 10 11 12 13 14 --M 1,4,8,16")
#   int4, bench27q4, bench27q4s, bench27q4l, prof27q4 (not default): int4 GEMV/op-table/identity
#             tests on cuda, 27B int4 benches (bench27q4l: an 8k prompt through the int4 prefill)
#   q4pre     (not default) the int4 8k prompt under the default prefill route and QFLASH_GEMM_Q4=gemv
#   bench27fma, ncu (not in the default list): the 27B bench with QFLASH_GEMV=fma; Nsight Compute
#             counters for four tensor-core GEMV launches
#   prefill   (not default) prefill GEMM and model tests on cuda (CudaGemm.*, Prefill*/cuda),
#             qflash_gemm_bench (TFLOP/s per 27B shape), 27B prefill at 8k and 32k tokens with the
#             decode step and verify ratios at that context
#   prefill128 (not default) the 27B prefill at 128k tokens (needs the chunked attention/GDN ops)
#   gdnbench  (not default) qflash_gdn_bench: one 27B GDN layer, chunked, at 4k/8k/32k rows
#   attnab    (not default) attention prefill v3 (QFLASH_ATTN_PREFILL=v3, issue 12): the prefill and
#             attention tests with v3 selected and QFLASH_TOL_REPORT=1 (CudaAttentionPrefill.* incl.
#             v3 == v1 bit for bit, CudaKvBf16.*, Op/AttentionPrefill*, Backends/Prefill* and
#             PrefillLogits* on cuda: split invariance, the 4,100-token identity, prefill vs decode
#             logits; the HF long-prompt parity's prefill cases with bf16 K/V: fp32 K/V never reach
#             the kernel), then one 27B attention layer alone
#             at 8k and 32k rows (qflash_gdn_bench --attn-only) and the 27B 8k and 32k prompts, each
#             under v1 and v3 (same call, same card: compare with each other only); ATTN_TEST (default v3)
#             lists the switch values the tests run under, ATTN_AB (default "v1 v3") those timed
#   ncuattnsrc (not default) Nsight Compute source counters + stalls of the attention prefill kernel
#             (one 27B layer, 8,192 rows) -> attn_source.csv.gz
#   p2ab      (not default) the pending prefill work (fused inputs, kept copies, attention v4b):
#             tests, then 27B 32k/8k prompts under base / keep / fuse / v4b, same call
#   prefkeep  (not default) 8k/32k prompts under QFLASH_PREFILL_WEIGHTS=untile / auto (kept weight copies)
#   warmab    (not default) bench generation with / without Generator::warm_up (issue 15), 64 and 8k context
#   prefuse   (not default) the fused norm / gate + projection inputs (QFLASH_PREFILL_FUSE=0/1): op
#             table, prefill tests and HF parity on cuda, 27B 8k and 32k prompts A/B, same call
#   parity    (not default) HF parity of the prefill on 2,100-token prompts, on cuda
#   prefix    (not default) prefix-cache identity on cuda; turn-2 time to first token at 16k
#   adaptive  (not default) --draft-k auto (issue 15): the controller's tests on cuda, then the 27B
#             bench at context 64 and 8k with forced 0 and forced 4 accepted, each fixed-k run followed
#             by the same with the depth controller (targets: forced 0: auto >= 0.97x plain; forced 4
#             of 7: auto within 3% of k = 7, column 'vs fixed'), then the demo pair at real acceptance
#   adaptivedemo (not default) the demo pair only (~4 min): code prompts (greedy and T = 0.8),
#             prose prompts, MTP k 2/3/4
# SKIP="name ..." leaves out single sub-steps by name (e.g. SKIP="gemm27 prefill32k" keeps the rest of prefill).
# Every step gets a timeout cut to the time left under BUDGET (s, default 540); TAG=name suffixes
# the files it brings back. All logs go
# into $OUT/logs.tgz, the summary table into $OUT/summary.txt and to stdout (last).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUNDLE="${1:?usage: session.sh BUNDLE.tar.xz}"
case "$BUNDLE" in /*) ;; *) BUNDLE="$ROOT/$BUNDLE" ;; esac
STEPS=" ${STEPS:-facts ops model e2e gemv bench27 benchdemo sanitize} "
BUDGET="${BUDGET:-540}"
OUTDIR="${OUT:-$(mktemp -d)}"
T0=$(date +%s)
LOG=/tmp/qflash_session_logs
BIN=/tmp/qflash_session_bin
rm -rf "$LOG" "$BIN"; mkdir -p "$LOG" "$BIN"
tar -C "$BIN" --strip-components=1 -xJf "$BUNDLE" || { echo "cannot unpack $BUNDLE"; exit 2; }
cd "$ROOT"

# The test binaries find fixtures under the source path compiled into them (the build machine's
# checkout, recorded by pack.sh): point that path at this copy.
SRC_LINK=$(cat "$BIN/SOURCE_DIR" 2>/dev/null)
if [[ -n "$SRC_LINK" && ! -e "$SRC_LINK" && "$SRC_LINK" != "$ROOT" ]]; then
  mkdir -p "$(dirname "$SRC_LINK")" && ln -s "$ROOT" "$SRC_LINK" && echo "linked $SRC_LINK -> $ROOT"
fi

NAMES=(); STATUS=(); SECS=(); DETAIL=()
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
want() { [[ "$STEPS" == *" $1 "* ]]; }

gtest_detail() {
  local log="$1" p f s names
  p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  f=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | tail -1)
  s=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | tail -1)
  names=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sed -E 's/^\[  FAILED  \] //; s/ \(.*//' | sort -u | head -6 | tr '\n' ' ')
  echo "${p:-0} passed, ${f:-0} failed, ${s:-0} skipped${names:+; failed: $names}"
}

# step NAME TIMEOUT KIND CMD...   (KIND: gtest | plain)
step() {
  local name="$1" to="$2" kind="$3"; shift 3
  if [[ " ${SKIP:-} " == *" $name "* ]]; then NAMES+=("$name"); STATUS+=(SKIP); SECS+=(0); DETAIL+=("in SKIP"); return; fi
  local l; l=$(left)
  if (( l < 15 )); then NAMES+=("$name"); STATUS+=(NOTIME); SECS+=(0); DETAIL+=("budget spent"); return; fi
  (( to > l - 10 )) && to=$(( l - 10 ))
  echo "== $name (timeout ${to}s): $*"
  local t0=$(date +%s) rc st det
  timeout -k 5 "$to" "$@" >"$LOG/$name.log" 2>&1
  rc=$?
  st=$([[ $rc -eq 0 ]] && echo PASS || { [[ $rc -eq 124 || $rc -eq 137 ]] && echo TIMEOUT || echo "FAIL($rc)"; })
  if [[ $kind == gtest ]]; then det=$(gtest_detail "$LOG/$name.log"); else det=$(tail -1 "$LOG/$name.log" | cut -c1-120); fi
  NAMES+=("$name"); STATUS+=("$st"); SECS+=($(( $(date +%s) - t0 ))); DETAIL+=("$det")
  tail -4 "$LOG/$name.log"
}

if want facts; then
  { nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv; } \
    >"$LOG/facts.log" 2>&1
  NAMES+=(facts); STATUS+=(OK); SECS+=(0)
  DETAIL+=("$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)")
fi
want ops   && step ops 150 gtest "$BIN/qflash_tests" --gtest_filter='Cuda*:Op/*_cuda' --gtest_color=no
want model && step model 150 gtest "$BIN/qflash_tests" --gtest_filter='*_cuda:*/cuda-Op/*' --gtest_color=no
want model && QFLASH_CUDA_GRAPHS=0 step model_nograph 120 gtest "$BIN/qflash_tests" \
  --gtest_filter='Pairs/SpecIdentity*_cuda:*Rollback.*/cuda:CudaModel*' --gtest_color=no
want e2e   && step e2e 150 gtest "$BIN/qflash_e2e_tests" --gtest_filter='*cuda*' --gtest_color=no
want gemv  && step gemv 90 plain "$BIN/qflash_gemv_bench" --quick
want bench27 && step bench27 200 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --force-accept 0,2,4,7 --gen 64 --reps 10 --json "$LOG/bench_27b.json"
want benchdemo && step benchdemo 120 plain "$BIN/qflash" bench --device cuda \
  --prompts models/demo/validation_prompts.jsonl --gen 128 --json "$LOG/bench_demo.json"
want benchdemo && QFLASH_CUDA_GRAPHS=0 step benchdemo_nograph 60 plain "$BIN/qflash" bench --device cuda \
  --prompts models/demo/validation_prompts.jsonl --n-prompts 16 --gen 128
# A/B: the same bench with the CUDA-core GEMV everywhere (plain decode and verify ratios only matter)
want bench27fma && QFLASH_GEMV=fma step bench27fma 120 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json --force-accept 4 --gen 32 --reps 5 --no-mtp
# A short 27B bench (plain, DFlash2 at forced 4 of 7) for A/B runs under an environment switch
# set by the caller (QFLASH_GEMV=tc, QFLASH_PDL=0, QFLASH_TC_LAYOUT=row, ...), with TAG naming the run.
want bench27s && step bench27s 120 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --force-accept 4 --gen 32 --reps 5 --no-mtp --json "$LOG/bench_27b_short.json"
# int4 (not in the default list): the int4 tensor-core GEMV and int4 identity on cuda, then the
# 27B with int4 weights (quantized on the device) + int4 DFlash2 drafter at 8k context, which
# reports the peak device memory; bench27q4s is the short A/B form (QFLASH_TC_Q4_PIECES=3, ...).
want int4 && step int4 200 gtest "$BIN/qflash_tests" \
  --gtest_filter='CudaGemvQ4.*:CudaGemm.*:*Int4LoadIdentity*/cuda:Op/*int4*_cuda' --gtest_color=no
want bench27q4 && step bench27q4 200 plain "$BIN/qflash" bench --device cuda --weights int4 \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --force-accept 0,4,7 --gen 64 --reps 10 --no-mtp --max-context 8192 --json "$LOG/bench_27b_q4.json"
want bench27q4s && step bench27q4s 120 plain "$BIN/qflash" bench --device cuda --weights int4 \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --force-accept 4 --gen 32 --reps 5 --no-mtp --json "$LOG/bench_27b_q4_short.json"
# The 24 GB case end to end: an 8k prompt through the int4 prefill (chunks of 1024
# rows so the prefill buffers stay ~0.6 GB), then plain and DFlash2 at forced 4 of 7; the peak
# memory it prints includes the prefill buffers and the GEMM's scratch. QFLASH_PREFILL_WEIGHTS=untile:
# a 24 GB card has no room for the prefill GEMM's kept bf16 copies (the budget is ~0 there), while
# this card's spare memory would take them and the peak would say nothing about 24 GB.
want bench27q4l && QFLASH_PREFILL_WEIGHTS=untile step bench27q4l 240 plain "$BIN/qflash" bench --device cuda --weights int4 \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --prompt-len 8000 --max-context 8192 --prefill-chunk 1024 \
  --force-accept 4 --gen 32 --reps 3 --no-mtp --json "$LOG/bench_27b_q4_8k.json"
# int4 prefill A/B: the 27B int4 8k prompt (op timings only) through the default route (each
# matrix dequantized to bf16, then the pinned cuBLASLt GEMM) and through the int4 GEMV in
# 32-token passes (QFLASH_GEMM_Q4=gemv, the route before 2026-12-06 session 3), same call.
want q4pre && step q4pre_lt 150 plain "$BIN/qflash" bench --device cuda --weights int4 \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --prompt-len 8192 --max-context 8448 --ops-only --no-mtp --reps 3 --json "$LOG/q4pre_lt.json"
want q4pre && QFLASH_GEMM_Q4=gemv step q4pre_gemv 150 plain "$BIN/qflash" bench --device cuda --weights int4 \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --prompt-len 8192 --max-context 8448 --ops-only --no-mtp --reps 1 --json "$LOG/q4pre_gemv.json"
want prof27q4 && step prof27q4 150 plain "$BIN/qflash" bench --device cuda --weights int4 \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --reps 10 --no-mtp --ops-only --profile --json "$LOG/prof_27b_q4.json"
# Where a step's GPU time goes: every kernel of a decode step, an 8-row verify and a draft pass
# timed on its own (27B synthetic, graphs off for the profile), and the GEMV's fixed cost per
# launch against a plain streaming read over a range of sizes.
want prof27 && step prof27 150 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --reps 10 --no-mtp --ops-only --profile --json "$LOG/prof_27b.json"
want sweep && step sweep 90 plain "$BIN/qflash_gemv_bench" --sweep
want sweep && step sweep_lab 90 plain "$BIN/qflash_lab_gemv_tc" --sweep
want lab   && step lab_tc 150 plain "$BIN/qflash_lab_gemv_tc" --quick
want lab   && step lab_fma 120 plain "$BIN/qflash_lab_gemv_fma" --quick
# int4 GEMV lab (issue 14): production vs the cheaper-split / prepared-activation / deeper / other
# split recipes, and the two diagnostics (no ALU work, no MMA) that bound what each fix can give
want labq4 && step lab_q4 200 plain "$BIN/qflash_lab_gemv_q4" ${LABQ4_ARGS:-}
# Hardware counters for the tensor-core GEMV (one launch per shape class), for the next tuning round
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if want ncu && [[ -n "$NCU" ]]; then
  step ncu 150 plain "$NCU" --clock-control none --kernel-name regex:"gemv_(tc|skr)_kernel" --launch-skip 40 --launch-count 4 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats "$BIN/qflash_gemv_bench" --quick --reps 3
fi
# Prefill (issue 12): GEMM vs its CPU twin and row-invariance on the 27B shapes, split invariance,
# long-prompt identity and prefill-vs-decode logits on cuda; the GEMM alone; the 27B prefill.
want prefill && step prefill_tests 240 gtest "$BIN/qflash_tests" \
  --gtest_filter='CudaGemm.*:Backends/Prefill.*/cuda:Backends/PrefillLogits.*/cuda' --gtest_color=no
want prefill && QFLASH_GEMM_LOG=1 step gemm27 120 plain "$BIN/qflash_gemm_bench"
want prefill && QFLASH_GEMM_LOG=1 step prefill8k 150 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --prompt-len 8192 --max-context 8448 --ops-only --no-mtp --reps 5 --json "$LOG/prefill_8k.json"
want prefill && step prefill32k 180 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --prompt-len 32768 --max-context 33024 --ops-only --no-mtp --reps 3 --json "$LOG/prefill_32k.json"
want prefill128 && step prefill128k 300 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --prompt-len 131072 --max-context 131328 --ops-only --no-mtp --reps 1 --json "$LOG/prefill_128k.json"
# Adaptive draft depth (issue 15): identity and switching under the controller on cuda, then the
# bench runs the targets are stated for.
want adaptive && step adaptive_tests 150 gtest "$BIN/qflash_tests" \
  --gtest_filter='*AdaptiveDepth*/cuda:Pairs/SpecIdentity*_cuda' --gtest_color=no
want adaptive && step adaptive64 150 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --force-accept 0,4 --adaptive --gen 256 --reps 5 --json "$LOG/adaptive_64.json"
want adaptive && step adaptive8k 200 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --prompt-len 8192 --max-context 8704 --force-accept 0,4 --adaptive --gen 256 --reps 5 \
  --json "$LOG/adaptive_8k.json"
want adaptive && step adaptivedemo 120 plain "$BIN/qflash" bench --device cuda \
  --prompts models/demo/validation_prompts.jsonl --n-prompts 32 --gen 128 --adaptive \
  --json "$LOG/adaptive_demo.json"
# The demo pair on prose (tests/fixtures/prompts/prose.jsonl: low acceptance, auto must not lose
# to plain), and MTP at k = 2 and 4 beside the default 3 (the best fixed MTP depth on the demo
# pair is not known to be 3). Step adaptivedemo alone: STEPS="adaptivedemo" runs these three too.
want_demo() { want adaptive || want adaptivedemo; }
want_demo && ! want adaptive && step adaptivedemo 120 plain "$BIN/qflash" bench --device cuda \
  --prompts models/demo/validation_prompts.jsonl --n-prompts 32 --gen 128 --adaptive \
  --json "$LOG/adaptive_demo.json"
want_demo && step adaptiveprose 60 plain "$BIN/qflash" bench --device cuda \
  --prompts tests/fixtures/prompts/prose.jsonl --n-prompts 8 --gen 128 --adaptive \
  --json "$LOG/adaptive_prose.json"
# Sampled (issue 15's T = 0.8 case): the same code prompts, prompt i seeded 1 + i in every run.
want_demo && step adaptivet08 120 plain "$BIN/qflash" bench --device cuda \
  --prompts models/demo/validation_prompts.jsonl --n-prompts 32 --gen 128 --adaptive \
  --temperature 0.8 --seed 1 --json "$LOG/adaptive_demo_t08.json"
for mk in 2 4; do
  want_demo && step adaptivemtp$mk 60 plain "$BIN/qflash" bench --device cuda --mtp-k $mk \
    --prompts models/demo/validation_prompts.jsonl --n-prompts 32 --gen 128 --adaptive \
    --json "$LOG/adaptive_mtp$mk.json"
done
# Graph warm-up before timing (Generator::warm_up, issue 15): the controller's tests on cuda, then
# the 27B forced-acceptance benches at 64 and 8k context without and with the warm-up, same call.
if want warmab; then
  step warm_tests 150 gtest "$BIN/qflash_tests" \
    --gtest_filter='*AdaptiveDepth*/cuda:Pairs/SpecIdentity*_cuda' --gtest_color=no
  for wv in no-warmup warmup; do
    wf=$([[ $wv == no-warmup ]] && echo --no-warmup || true)
    step "warm64_$wv" 150 plain "$BIN/qflash" bench --device cuda $wf \
      --synthetic tests/fixtures/configs/qwen38_27b/config.json \
      --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
      --force-accept 0,4 --adaptive --gen 256 --reps 5 --json "$LOG/warm64_$wv.json"
  done
  for wv in ${WARM8K:-warmup}; do
    wf=$([[ $wv == no-warmup ]] && echo --no-warmup || true)
    step "warm8k_$wv" 200 plain "$BIN/qflash" bench --device cuda $wf \
      --synthetic tests/fixtures/configs/qwen38_27b/config.json \
      --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
      --prompt-len 8192 --max-context 8704 --force-accept 0,4 --adaptive --gen 256 --reps 5 \
      --json "$LOG/warm8k_$wv.json"
  done
fi
# Prefill kernels and long prompts (issue 12): one chunked GDN layer's time on the 27B shapes,
# HF parity of the prefill on 2,100-token prompts.
want gdnbench && step gdnbench 90 plain "$BIN/qflash_gdn_bench" --rows 4096,8192,32768 --no-rows
# Attention prefill v1 vs v3 (QFLASH_ATTN_PREFILL, issue 12): correctness under v3 first (the
# v3 == v1 comparison runs both kernels whatever the switch says), then the kernel alone and the
# 27B prompts under each. ~3-4 minutes in all.
if want attnab; then
  for tv in ${ATTN_TEST:-v3}; do
    QFLASH_ATTN_PREFILL=$tv QFLASH_TOL_REPORT=1 step "attnab_tests_$tv" 180 gtest "$BIN/qflash_tests" \
      --gtest_filter='CudaAttentionPrefill.*:CudaKvBf16.*:Op/AttentionPrefill*cuda*:Backends/Prefill.*/cuda:Backends/PrefillLogits.*/cuda:Fixtures/LongPromptParity.Prefill*kvbf16_cuda' \
      --gtest_color=no
    grep -h '\[ tol \].*prefill\|\[tol\]' "$LOG/attnab_tests_$tv.log" 2>/dev/null | head -40
  done
  for av in ${ATTN_AB:-v1 v3}; do
    QFLASH_ATTN_PREFILL=$av step "attnab_kernel_$av" 60 plain "$BIN/qflash_gdn_bench" --attn-only \
      --attn-rows 4096,8192,32768 --reps 3
  done
  for av in ${ATTN_AB:-v1 v3}; do
    QFLASH_ATTN_PREFILL=$av step "attnab_8k_$av" 90 plain "$BIN/qflash" bench --device cuda \
      --synthetic tests/fixtures/configs/qwen38_27b/config.json \
      --prompt-len 8192 --max-context 8448 --ops-only --no-mtp --reps 3 --json "$LOG/attnab_8k_$av.json"
  done
  for av in ${ATTN_AB:-v1 v3}; do
    QFLASH_ATTN_PREFILL=$av step "attnab_32k_$av" 120 plain "$BIN/qflash" bench --device cuda \
      --synthetic tests/fixtures/configs/qwen38_27b/config.json \
      --prompt-len 32768 --max-context 33024 --ops-only --no-mtp --reps 2 --json "$LOG/attnab_32k_$av.json"
  done
fi
# The prefill GEMM's kept row-major weight copies (QFLASH_PREFILL_WEIGHTS: untile | auto, the
# default, within the budget of fit.h | keep, no limit) against each other, 8k and 32k prompts in
# KEEP_CHUNK-row chunks (default 8192), same call; then the GEMM tests (CudaGemm.*, incl. the
# copies' bits and budget). KEEP_MODES (default "untile auto") lists the modes timed.
# The pending prefill work in one A/B (issue 12, docs/pending): the tests of the fused projection
# inputs, the kept weight copies and attention v4b (its model-level tests under
# QFLASH_ATTN_PREFILL=v4b with QFLASH_TOL_REPORT=1), one 27B attention layer under v4 and v4b, then
# the 27B 32k and 8k prompts (8,192-row chunks) under four settings, same call:
#   base = QFLASH_PREFILL_WEIGHTS=untile QFLASH_PREFILL_FUSE=0 (main before the series), keep = auto
#   + FUSE=0, fuse = auto + FUSE=1 (the series' default), v4b = fuse + QFLASH_ATTN_PREFILL=v4b.
# P2_CFGS (default "base keep fuse v4b") and P2_LENS (default "32768 8192") narrow it.
if want p2ab; then
  step p2_tests 240 gtest "$BIN/qflash_tests" \
    --gtest_filter='CudaGemm.*:Op/AddRmsnormGemmGroup*_cuda:Op/FusedGemm*_cuda:CudaAttentionPrefill.*:Backends/Prefill.*/cuda:Backends/PrefillLogits.*/cuda:Fixtures/LongPromptParity.*_cuda:CudaPrefixCache.*' \
    --gtest_color=no
  QFLASH_ATTN_PREFILL=v4b QFLASH_TOL_REPORT=1 step p2_tests_v4b 150 gtest "$BIN/qflash_tests" \
    --gtest_filter='Backends/Prefill.*/cuda:Backends/PrefillLogits.*/cuda:Fixtures/LongPromptParity.Prefill*kvbf16_cuda:CudaPrefixCache.*' \
    --gtest_color=no
  grep -h '\[ tol \]\|\[tol\]' "$LOG/p2_tests.log" "$LOG/p2_tests_v4b.log" 2>/dev/null | head -40
  for av in v4 v4b; do
    QFLASH_ATTN_PREFILL=$av step "p2_attn_$av" 60 plain "$BIN/qflash_gdn_bench" --attn-only \
      --attn-rows 8192,32768 --reps 3
  done
  for L in ${P2_LENS:-32768 8192}; do
    for cfg in ${P2_CFGS:-base keep fuse v4b}; do
      case $cfg in
        base) w=untile f=0 a=v4 ;; keep) w=auto f=0 a=v4 ;; fuse) w=auto f=1 a=v4 ;; *) w=auto f=1 a=v4b ;;
      esac
      QFLASH_PREFILL_WEIGHTS=$w QFLASH_PREFILL_FUSE=$f QFLASH_ATTN_PREFILL=$a step "p2_${cfg}_$L" 120 plain \
        "$BIN/qflash" bench --device cuda --synthetic tests/fixtures/configs/qwen38_27b/config.json \
        --prompt-len $L --max-context $((L + 256)) --prefill-chunk 8192 --ops-only --no-mtp \
        --reps $(( L > 16384 ? 2 : 3 )) --json "$LOG/p2_${cfg}_$L.json"
    done
  done
fi
if want prefkeep; then
  step keep_tests 90 gtest "$BIN/qflash_tests" --gtest_filter='CudaGemm.*' --gtest_color=no
  for kv in ${KEEP_MODES:-untile auto}; do
    for L in 8192 32768; do
      QFLASH_PREFILL_WEIGHTS=$kv step "keep_${kv}_$L" 150 plain "$BIN/qflash" bench --device cuda \
        --synthetic tests/fixtures/configs/qwen38_27b/config.json --prompt-len $L --max-context $((L + 256)) \
        --prefill-chunk ${KEEP_CHUNK:-8192} --ops-only --no-mtp --reps 2 --json "$LOG/keep_${kv}_$L.json"
    done
  done
fi
# The prefill fusions of the projection inputs' producers (QFLASH_PREFILL_FUSE, issue 12): the
# fused ops against the ops in sequence (op table), prefill split invariance, prefill vs decode
# logits, long-prompt identity and HF parity on cuda; then the 27B 8k and 32k prompts (8,192-row
# chunks) under QFLASH_PREFILL_FUSE=0 and 1, alternating, PREFUSE_REPS times each (default 2).
if want prefuse; then
  step prefuse_tests 200 gtest "$BIN/qflash_tests" \
    --gtest_filter='Op/AddRmsnormGemmGroup*_cuda:Op/FusedGemm*_cuda:Backends/Prefill.*/cuda:Backends/PrefillLogits.*/cuda:Fixtures/LongPromptParity.*_cuda:CudaPrefixCache.*' \
    --gtest_color=no
  for rep in $(seq "${PREFUSE_REPS:-2}"); do
    for fv in 0 1; do
      for L in 8192 32768; do
        QFLASH_PREFILL_FUSE=$fv step "prefuse${fv}_${L}_$rep" 120 plain "$BIN/qflash" bench --device cuda \
          --synthetic tests/fixtures/configs/qwen38_27b/config.json --prompt-len $L --max-context $((L + 256)) \
          --prefill-chunk 8192 --ops-only --no-mtp --reps 2 --json "$LOG/prefuse${fv}_${L}_$rep.json"
      done
    done
  done
fi
want parity && step parity 150 gtest "$BIN/qflash_tests" \
  --gtest_filter='Fixtures/LongPromptParity.*cuda*' --gtest_color=no
# Prefill diagnosis (issue 12): the long-prompt parity cases of the micro model on cpu and cuda
# with every comparison's error / tolerance printed, the last row layer by layer (QFLASH_TOL_REPORT);
# the kernel profile of one 8,192-row prefill chunk; 8k and 32k prompts at larger prefill chunks
# (PCHUNKS, default "8192 16384"); Nsight Compute on the chunked-GDN and attention-prefill kernels.
want prefdiag && QFLASH_TOL_REPORT=1 step prefdiag 150 gtest "$BIN/qflash_tests" \
  --gtest_filter='Fixtures/LongPromptParity.Prefill*/micro_*' --gtest_color=no
want prefprof && step prefprof 200 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --prompt-len 8192 --max-context 8448 --prefill-chunk 8192 --ops-only --no-mtp --reps 3 --profile \
  --json "$LOG/prefill_8k_profile.json"
if want prefchunk; then
  for pc in ${PCHUNKS:-8192 16384}; do
    step "prefill8k_c$pc" 120 plain "$BIN/qflash" bench --device cuda \
      --synthetic tests/fixtures/configs/qwen38_27b/config.json \
      --prompt-len 8192 --max-context 8448 --prefill-chunk "$pc" --ops-only --no-mtp --reps 3 \
      --json "$LOG/prefill_8k_c$pc.json"
    step "prefill32k_c$pc" 180 plain "$BIN/qflash" bench --device cuda \
      --synthetic tests/fixtures/configs/qwen38_27b/config.json \
      --prompt-len 32768 --max-context 33024 --prefill-chunk "$pc" --ops-only --no-mtp --reps 2 \
      --json "$LOG/prefill_32k_c$pc.json"
  done
fi
want gdnrows && step gdntests 90 gtest "$BIN/qflash_tests" --gtest_filter='CudaGdnChunked.*:Op/GdnChunked*_cuda' --gtest_color=no
want gdnrows && QFLASH_GDN_WARPS=4 step gdnbench_warps4 90 plain "$BIN/qflash_gdn_bench" --rows 4096,8192,32768 --no-rows
if want ncuprefill && [[ -n "$NCU" ]]; then
  step ncugdn 150 plain "$NCU" --clock-control none --kernel-name regex:"gdn_chunk_(prep|recur)" --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    "$BIN/qflash_gdn_bench" --rows 8192 --no-rows --reps 1
  step ncuattn 200 plain "$NCU" --clock-control none --kernel-name regex:"attn_prefill" --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    "$BIN/qflash" bench --device cuda --synthetic tests/fixtures/configs/qwen38_27b/config.json \
    --prompt-len 4096 --max-context 4352 --prefill-chunk 4096 --ops-only --no-mtp --reps 1
fi
# Source-level stall sampling of the chunked-GDN kernels (the build has -lineinfo): the report, then
# its per-line table (cuda source with SASS) as CSV into the logs.
if want ncusrc && [[ -n "$NCU" ]]; then
  step ncusrc_collect 200 plain "$NCU" --clock-control none --kernel-name regex:"gdn_chunk_(prep|recur)" --launch-count 2 \
    --section SourceCounters --section WarpStateStats --import-source yes -f -o "$LOG/gdn_src" \
    "$BIN/qflash_gdn_bench" --rows 8192 --no-rows --reps 1
  step ncusrc_page 120 plain "$NCU" -i "$LOG/gdn_src.ncu-rep" --page source --csv --print-source cuda,sass
  step ncusrc_details 60 plain "$NCU" -i "$LOG/gdn_src.ncu-rep" --page details --print-details all
  # the per-line table can be large: compressed beside logs.tgz, not inside it
  gzip -c "$LOG/ncusrc_page.log" >"$OUTDIR/gdn_source.csv.gz" 2>/dev/null
  rm -f "$LOG/ncusrc_page.log" "$LOG/gdn_src.ncu-rep"
fi
# The same for the attention prefill kernel (issue 12: v3's bound before a wgmma rewrite): one
# 27B attention layer at 8,192 rows, v3 (or QFLASH_ATTN_PREFILL's choice), source counters + stalls.
if want ncuattnsrc && [[ -n "$NCU" ]]; then
  step ncuattn_collect 200 plain "$NCU" --clock-control none --kernel-name regex:"attn_prefill" --launch-count 1 \
    --section SourceCounters --section WarpStateStats --section SpeedOfLight --section Occupancy \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --import-source yes -f -o "$LOG/attn_src" \
    "$BIN/qflash_gdn_bench" --attn-only --attn-rows 8192 --reps 1
  step ncuattn_page 120 plain "$NCU" -i "$LOG/attn_src.ncu-rep" --page source --csv --print-source cuda,sass
  step ncuattn_details 60 plain "$NCU" -i "$LOG/attn_src.ncu-rep" --page details --print-details all
  gzip -c "$LOG/ncuattn_page.log" >"$OUTDIR/attn_source.csv.gz" 2>/dev/null
  rm -f "$LOG/ncuattn_page.log" "$LOG/attn_src.ncu-rep"
fi
# Prefix reuse (issue 13): snapshot/restore identity on cuda, then the time to first token of a
# second turn on a 16k-token conversation, resumed from the cache vs prefilled cold.
want prefix && step prefix_tests 150 gtest "$BIN/qflash_tests" \
  --gtest_filter='*PrefixCache*' --gtest_color=no
want prefix && step prefix16k 200 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --no-mtp --prompt-len 16000 --gen 64 --prefix-turn2 200 --max-context 16640 --json "$LOG/prefix_16k.json"
if want sanitize && command -v compute-sanitizer >/dev/null; then
  step sanitize 90 gtest compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/qflash_tests" \
    --gtest_filter='Op/Embed.*_cuda:Op/Rmsnorm*_cuda:Op/Elementwise.*_cuda:Op/DataMovement.*_cuda:Op/Rope.*_cuda:Op/DynConv.*_cuda:Op/GdnRows.*_cuda:Op/Attention.*_cuda:CudaMatmul.TcSchedules*' --gtest_color=no
fi

{
  echo "device session $(date -u +%FT%TZ), bundle $(cat "$BIN/COMMIT" 2>/dev/null || echo '?')"
  printf '%-10s %-9s %5s  %s\n' step status secs detail
  for i in "${!NAMES[@]}"; do
    printf '%-10s %-9s %5s  %s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}" "${DETAIL[$i]}"
  done
} >"$LOG/summary.txt"
# TAG (optional) names this invocation's files, so that one device call can run the script twice
# (say with and without an environment switch) and bring both back.
SFX="${TAG:+-$TAG}"
cp "$LOG/summary.txt" "$OUTDIR/summary$SFX.txt"
for j in "$LOG"/*.json; do [[ -f "$j" ]] && cp "$j" "$OUTDIR/$(basename "$j" .json)$SFX.json"; done
tar -C "$LOG" -czf "$OUTDIR/logs$SFX.tgz" .
echo
for f in "$LOG"/bench27.log "$LOG"/bench27s.log "$LOG"/bench27q4.log "$LOG"/bench27q4s.log "$LOG"/bench27q4l.log \
         "$LOG"/benchdemo.log "$LOG"/gdnbench.log "$LOG"/prefix16k.log "$LOG"/adaptive64.log "$LOG"/adaptive8k.log "$LOG"/adaptivedemo.log "$LOG"/adaptiveprose.log "$LOG"/adaptivemtp2.log "$LOG"/adaptivemtp4.log "$LOG"/adaptivet08.log "$LOG"/gemv.log "$LOG"/sweep.log \
         "$LOG"/sweep_lab.log "$LOG"/lab_tc.log "$LOG"/lab_fma.log "$LOG"/lab_q4.log "$LOG"/gemm27.log "$LOG"/prefill8k.log \
         "$LOG"/prefill32k.log "$LOG"/prefill128k.log "$LOG"/attnab_kernel_v1.log "$LOG"/attnab_kernel_v3.log \
         "$LOG"/attnab_8k_v1.log "$LOG"/attnab_8k_v3.log "$LOG"/attnab_32k_v1.log "$LOG"/attnab_32k_v3.log \
         "$LOG"/attnab_kernel_v4.log "$LOG"/attnab_8k_v4.log "$LOG"/attnab_32k_v4.log \
         "$LOG"/keep_untile_8192.log "$LOG"/keep_untile_32768.log "$LOG"/keep_auto_8192.log "$LOG"/keep_auto_32768.log \
         "$LOG"/keep_keep_8192.log "$LOG"/keep_keep_32768.log; do
  [[ -f "$f" ]] && { echo "---- $(basename "$f")"; tail -25 "$f"; }
done
for f in "$LOG"/prof27.log "$LOG"/prof27q4.log; do
  [[ -f "$f" ]] && { echo "---- $(basename "$f") (head of each table)"; grep -A14 -E '^(---- kernel|decode step)' "$f" | cut -c1-150; }
done
echo
cat "$LOG/summary.txt"

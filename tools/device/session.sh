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
#   ops       qflash_tests Cuda*                  (every op vs its CPU twin, row-invariance)
#   model     qflash_tests model-level *_cuda     (identity, rollback, HF/PyTorch parity on cuda;
#             again with QFLASH_CUDA_GRAPHS=0: graphs replayed vs ops run directly)
#   e2e       qflash_e2e_tests *cuda*             (demo pair identity + acceptance on cuda)
#   gemv      qflash_gemv_bench --quick           (copy ceiling, GEMV GB/s for M = 1..16)
#   bench27   qflash bench, synthetic Qwen3.8-27B + DFlash2, forced acceptance
#   benchdemo qflash bench, demo pair, real acceptance (and 16 prompts with QFLASH_CUDA_GRAPHS=0)
#   sanitize  compute-sanitizer memcheck on CudaOps (if time is left)
#   bench27s  a short 27B bench (plain + DFlash2 at forced 4 of 7) for A/B under an env switch
#   prof27    kernel profile of the 27B decode step, 8-row verify and draft pass (not default)
#   sweep     qflash_gemv_bench --sweep: GEMV fixed cost per launch vs a streaming read (not default)
#   bench27fma, ncu (not in the default list): the 27B bench with QFLASH_GEMV=fma; Nsight Compute
#             counters for four tensor-core GEMV launches
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

# The test binaries find fixtures under the source path compiled into them (/work/main).
if [[ ! -e /work/main && "$ROOT" != /work/main ]]; then
  mkdir -p /work && ln -s "$ROOT" /work/main && echo "linked /work/main -> $ROOT"
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
want ops   && step ops 150 gtest "$BIN/qflash_tests" --gtest_filter='Cuda*' --gtest_color=no
want model && step model 150 gtest "$BIN/qflash_tests" --gtest_filter='*_cuda:*Rollback.*/1' --gtest_color=no
want model && QFLASH_CUDA_GRAPHS=0 step model_nograph 120 gtest "$BIN/qflash_tests" \
  --gtest_filter='Pairs/SpecIdentity*_cuda:*Rollback.*/1:CudaModel*' --gtest_color=no
want e2e   && step e2e 150 gtest "$BIN/qflash_e2e_tests" --gtest_filter='*cuda*:*/1' --gtest_color=no
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
# Where a step's GPU time goes: every kernel of a decode step, an 8-row verify and a draft pass
# timed on its own (27B synthetic, graphs off for the profile), and the GEMV's fixed cost per
# launch against a plain streaming read over a range of sizes.
want prof27 && step prof27 150 plain "$BIN/qflash" bench --device cuda \
  --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json \
  --reps 10 --no-mtp --ops-only --profile --json "$LOG/prof_27b.json"
want sweep && step sweep 90 plain "$BIN/qflash_gemv_bench" --sweep
# Hardware counters for the tensor-core GEMV (one launch per shape class), for the next tuning round
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if want ncu && [[ -n "$NCU" ]]; then
  step ncu 150 plain "$NCU" --clock-control none --kernel-name regex:"gemv_(tc|skr)_kernel" --launch-skip 40 --launch-count 4 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats --section SchedulerStats "$BIN/qflash_gemv_bench" --quick --reps 3
fi
if want sanitize && command -v compute-sanitizer >/dev/null; then
  step sanitize 90 gtest compute-sanitizer --tool memcheck --error-exitcode 3 "$BIN/qflash_tests" \
    --gtest_filter='CudaOps*:CudaGdn*:CudaAttention*:CudaMatmul.TcSchedules*' --gtest_color=no
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
for f in "$LOG"/bench27.log "$LOG"/bench27s.log "$LOG"/benchdemo.log "$LOG"/gemv.log "$LOG"/sweep.log; do
  [[ -f "$f" ]] && { echo "---- $(basename "$f")"; tail -25 "$f"; }
done
[[ -f "$LOG/prof27.log" ]] && { echo "---- prof27.log (head of each table)"; grep -A14 -E '^(---- kernel|decode step)' "$LOG/prof27.log" | cut -c1-150; }
echo
cat "$LOG/summary.txt"

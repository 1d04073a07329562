#!/usr/bin/env bash
# Runs the CUDA backend's checks on the GPU machine (no network, no installs: the binaries are
# built elsewhere and carried). Steps, each logged under $OUT/gpu_check (or a temp dir):
#   1. device facts (nvidia-smi)
#   2. qflash_tests --gtest_filter='Cuda*:Op/*_cuda'  (the op table on cuda, CUDA-only checks)
#   3. qflash_tests on the model-level CUDA cases     (identity, rollback, parity on cuda)
#   4. qflash_gemv_bench                               (copy ceiling, GEMV GB/s for M = 1..16)
#   5. qflash run --device cuda on models/demo         (if present; skipped otherwise)
# A failing step does not stop the later ones; the summary table comes last.
#
# Usage: tools/device/gpu_check.sh [BUILD_DIR] [--quick]
#   BUILD_DIR defaults to build-cuda (relative to the repository root).
#   --quick: shorter bench (no schedule variants, first three shapes).
# Environment: GPU_CHECK_TEST_TIMEOUT (s, default 300), GPU_CHECK_BENCH_TIMEOUT (s, default 240),
#   GPU_CHECK_SKIP="tests model bench run" (space-separated steps to skip),
#   GPU_CHECK_SOURCE_DIR (the source path compiled into qflash_tests; default: BUILD_DIR's CMakeCache).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="build-cuda"
QUICK=""
for a in "$@"; do
  case "$a" in
    --quick) QUICK="--quick" ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) BUILD="$a" ;;
  esac
done
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac

LOGDIR="${OUT:-$(mktemp -d /tmp/gpu_check.XXXXXX)}/gpu_check"
mkdir -p "$LOGDIR"
TEST_TIMEOUT="${GPU_CHECK_TEST_TIMEOUT:-300}"
BENCH_TIMEOUT="${GPU_CHECK_BENCH_TIMEOUT:-240}"
SKIP=" ${GPU_CHECK_SKIP:-} "

# The test binary finds its fixtures under the source path compiled into it (the build
# machine's checkout, as the build folder's CMakeCache.txt records it). When this copy lives
# elsewhere, point that path here (best effort; only the parity tests need fixtures).
SRC_LINK="${GPU_CHECK_SOURCE_DIR:-$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)}"
if [[ -n "$SRC_LINK" && ! -e "$SRC_LINK" && "$SRC_LINK" != "$ROOT" ]]; then
  mkdir -p "$(dirname "$SRC_LINK")" 2>/dev/null && ln -s "$ROOT" "$SRC_LINK" 2>/dev/null &&
    echo "linked $SRC_LINK -> $ROOT (fixtures for the parity tests)"
fi

NAMES=()
STATUS=()
SECS=()
DETAIL=()
record() { NAMES+=("$1"); STATUS+=("$2"); SECS+=("$3"); DETAIL+=("$4"); }

# gtest log -> "P passed, F failed, S skipped" (+ the first failed test names)
gtest_detail() {
  local log="$1" p f s names
  p=$(grep -oE '^\[  PASSED  \] [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  f=$(grep -oE '^\[  FAILED  \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | tail -1)
  s=$(grep -oE '^\[  SKIPPED \] [0-9]+ test' "$log" | grep -oE '[0-9]+' | tail -1)
  names=$(grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sed -E 's/^\[  FAILED  \] //; s/ \(.*//' | sort -u | head -4 | tr '\n' ' ')
  echo "${p:-0} passed, ${f:-0} failed, ${s:-0} skipped${names:+; failed: $names}"
}

run_gtest() {  # name filter
  local name="$1" filter="$2" log="$LOGDIR/$1.log" t0 rc st
  if [[ "$SKIP" == *" $name "* ]]; then record "$name" "SKIP" 0 "skipped by GPU_CHECK_SKIP"; return; fi
  if [[ ! -x "$BUILD/qflash_tests" ]]; then record "$name" "MISSING" 0 "$BUILD/qflash_tests not found"; return; fi
  echo "== $name: qflash_tests --gtest_filter='$filter'"
  t0=$(date +%s)
  (cd "$ROOT" && timeout "$TEST_TIMEOUT" "$BUILD/qflash_tests" --gtest_filter="$filter" --gtest_color=no) >"$log" 2>&1
  rc=$?
  st=$([[ $rc -eq 0 ]] && echo PASS || ([[ $rc -eq 124 ]] && echo TIMEOUT || echo FAIL))
  if [[ $st == PASS ]] && ! grep -qE '^\[  PASSED  \] [1-9]' "$log"; then st="SKIPPED"; fi  # no GPU: all skipped
  record "$name" "$st" $(( $(date +%s) - t0 )) "$(gtest_detail "$log")"
  tail -3 "$log"
}

# 1. device facts
{
  nvidia-smi 2>&1 || echo "nvidia-smi failed"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv 2>&1 || true
} >"$LOGDIR/device.txt"
DEV=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
record "device" "$([[ -n "$DEV" ]] && echo OK || echo FAIL)" 0 "${DEV:-nvidia-smi gave nothing}"

# 2-3. tests
run_gtest tests 'Cuda*:Op/*_cuda'
run_gtest model '*_cuda:*/cuda-Op/*'

# 4. GEMV bench
name=bench
if [[ "$SKIP" == *" $name "* ]]; then
  record bench SKIP 0 "skipped by GPU_CHECK_SKIP"
elif [[ ! -x "$BUILD/qflash_gemv_bench" ]]; then
  record bench MISSING 0 "$BUILD/qflash_gemv_bench not found"
else
  echo "== bench: qflash_gemv_bench $QUICK"
  t0=$(date +%s)
  timeout "$BENCH_TIMEOUT" "$BUILD/qflash_gemv_bench" $QUICK >"$LOGDIR/bench.log" 2>&1
  rc=$?
  ceil=$(grep -m1 '^ceilings:' "$LOGDIR/bench.log" | sed 's/^ceilings: //')
  record bench "$([[ $rc -eq 0 ]] && echo PASS || ([[ $rc -eq 124 ]] && echo TIMEOUT || echo FAIL))" \
    $(( $(date +%s) - t0 )) "${ceil:-no ceiling line (rc $rc)}"
fi

# 5. end-to-end on the demo model
name=run
if [[ "$SKIP" == *" $name "* ]]; then
  record run SKIP 0 "skipped by GPU_CHECK_SKIP"
elif [[ ! -x "$BUILD/qflash" ]]; then
  record run MISSING 0 "$BUILD/qflash not found"
elif [[ ! -f "$ROOT/models/demo/config.json" ]]; then
  record run SKIP 0 "no models/demo in the working tree"
else
  echo "== run: qflash run --device cuda (demo model)"
  t0=$(date +%s)
  args=(run --model "$ROOT/models/demo" --prompt "Once upon a time" --max-tokens 64)
  (cd "$ROOT" && timeout 180 "$BUILD/qflash" "${args[@]}" --device cuda --stats) \
    >"$LOGDIR/run_cuda.txt" 2>"$LOGDIR/run_cuda.log"
  rc=$?
  (cd "$ROOT" && timeout 180 "$BUILD/qflash" "${args[@]}" --device cpu) >"$LOGDIR/run_cpu.txt" 2>"$LOGDIR/run_cpu.log"
  if cmp -s "$LOGDIR/run_cuda.txt" "$LOGDIR/run_cpu.txt"; then
    same="text identical to the CPU's"
  else
    same="text differs from the CPU's (CPU and CUDA agree within tolerance only; see run_*.txt)"
  fi
  speed=$(grep -m1 -iE 'tok/s|tokens/s' "$LOGDIR/run_cuda.log" | tr -s ' ' | cut -c1-80)
  record run "$([[ $rc -eq 0 ]] && echo PASS || echo FAIL)" $(( $(date +%s) - t0 )) "$same${speed:+; $speed}"
fi

# ---- summary (last, so it ends the output) ---------------------------------------------------
echo
echo "logs: $LOGDIR"
if [[ -f "$LOGDIR/bench.log" ]]; then
  echo
  sed -n '/^==== summary/,$p' "$LOGDIR/bench.log"
  grep -E '^(gdn_rows|attention|argmax_rows|topk_rows)' "$LOGDIR/bench.log" || true
fi
echo
printf '%-8s %-8s %6s  %s\n' step status secs detail
fail=0
for i in "${!NAMES[@]}"; do
  printf '%-8s %-8s %6s  %s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}" "${DETAIL[$i]}"
  case "${STATUS[$i]}" in FAIL|TIMEOUT|MISSING) fail=1 ;; esac
done
exit $fail

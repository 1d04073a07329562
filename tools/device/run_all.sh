#!/usr/bin/env bash
# Everything the H200 session needs in one call, after building here:
#   cmake -S . -B build-cuda -DQFLASH_CUDA=ON && cmake --build build-cuda -j2
#   mkdir -p build-gpu && cp build-cuda/{qflash,qflash_tests,qflash_e2e_tests,qflash_gemv_bench} build-gpu/
#   device run: bash tools/device/run_all.sh build-gpu      (carry ["build-gpu"], timeout 600)
# Size: the tracked tree is ~40 MB (models/demo is 30 MB) and a call carries at most 64 MiB, so
# the carried binaries must stay under ~24 MB: `strip build-gpu/*` first; if still too large,
# carry qflash_tests (+ qflash_gemv_bench) in one call and qflash + qflash_e2e_tests in another.
# Steps: gpu_check.sh (op parity, row-invariance, model-level identity/rollback/parity on cuda,
# GEMV bench, a demo run), the demo-pair e2e tests on cuda, then qflash bench on the full-size
# synthetic 27B pair (forced acceptance) and on the demo pair (real acceptance). Logs and JSON go
# to $OUT; copy the numbers into docs/BENCHMARKS.md with the commit and date.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="${1:-build-gpu}"
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
OUTDIR="${OUT:-$(mktemp -d)}"
cd "$ROOT"
GPU_CHECK_BENCH_TIMEOUT=${GPU_CHECK_BENCH_TIMEOUT:-150} bash tools/device/gpu_check.sh "$BUILD" --quick
echo "== e2e on cuda"
timeout 200 "$BUILD/qflash_e2e_tests" --gtest_filter='*cuda*' --gtest_color=no >"$OUTDIR/e2e_cuda.log" 2>&1
echo "e2e exit $?"; tail -3 "$OUTDIR/e2e_cuda.log"
echo "== bench: synthetic Qwen3.8-27B + DFlash2 (forced acceptance)"
timeout 240 "$BUILD/qflash" bench --device cuda --synthetic tests/fixtures/configs/qwen38_27b/config.json \
  --synthetic-drafter tests/fixtures/configs/dflash2_27b/config.json --force-accept 0,2,4,7 --gen 64 --reps 10 \
  --json "$OUTDIR/bench_27b.json" 2>&1 | tail -12
echo "== bench: demo pair (real acceptance)"
timeout 120 "$BUILD/qflash" bench --device cuda --prompts models/demo/validation_prompts.jsonl --gen 128 \
  --json "$OUTDIR/bench_demo.json" 2>&1 | tail -8

#!/usr/bin/env bash
# Every figure issue 12 states a target for, in one device call (meant for an H200; on another card
# the figures are that card's). Usage (carry ["gpu"], bundle gpu/bin.tar.xz of tools/device/pack.sh):
#   BUDGET=seconds bash tools/device/issue12_targets.sh
# Steps, each cut to what is left of BUDGET (default 570 s), logs and JSON under $OUT/i12:
#   short  27B + DFlash2 at a 64-token prompt: plain tok/s, verify 8 rows / decode, DFlash2 at forced
#          4 of 7 (the short-context figures that must not regress: 67.5 tok/s, 1.10, 3.84x)
#   p8k    an 8,192-token prompt (default prefill chunk): prefill time and tok/s (target >= 12,000
#          tok/s), decode and verify 8 / decode at 8k (<= 1.20), DFlash2 at forced 4 of 7 (>= 3.4x plain)
#   p64    op timings at a 64-token prompt, the same measurement as p32k's (decode at 32k >= 0.90 of it)
#   p32k   a 32,768-token prompt, op timings: prefill (<= 4 s), decode at 32k (>= 0.90 of the short
#          figure), verify 8 / decode (<= 1.20)
#   p128k  a 131,072-token prompt, op timings: time and peak GPU memory
#   prof8k the kernel profile of the 8k prompt's prefill in one 8,192-row chunk (not default)
# STEPS="short p8k" runs a subset (default: short p8k p64 p32k p128k).
cd "$(dirname "$0")/../.."
source tools/device/call_lib.sh
O=${OUT:-/tmp}/i12; mkdir -p $O
T=tests/fixtures/configs/qwen38_27b/config.json D=tests/fixtures/configs/dflash2_27b/config.json
STEPS=${STEPS:-"short p8k p64 p32k p128k"}
run() {  # name seconds args...
  local n=$1 s=$2; shift 2
  [[ " $STEPS " == *" $n "* ]] || return 0
  (( $(left) < 30 )) && { echo "$n: skipped (time)"; return; }
  timeout $(to $s) $B/qflash bench --device cuda --synthetic $T "$@" --json $O/$n.json > $O/$n.log 2>&1
  echo "== $n (rc $?, t=$(( $(date +%s) - T0 )) s)"
  grep -h '^prefill\|^at context\|^plain\|^dflash2\|^mtp\|peak\|decode step\|verify' $O/$n.log | cut -c1-220 | head -16
}
run short 120 --synthetic-drafter $D --force-accept 4 --gen 64 --reps 10 --no-mtp
run p8k 150 --synthetic-drafter $D --prompt-len 8192 --max-context 8704 --force-accept 4 --gen 64 --reps 3 --no-mtp
run p64 60 --prompt-len 64 --max-context 320 --ops-only --no-mtp --reps 5
run p32k 150 --prompt-len 32768 --max-context 33024 --ops-only --no-mtp --reps 2
run p128k 200 --prompt-len 131072 --max-context 131328 --ops-only --no-mtp --reps 1
run prof8k 120 --prompt-len 8192 --max-context 8448 --prefill-chunk 8192 --ops-only --no-mtp --reps 1 --profile
echo "end t=$(( $(date +%s) - T0 )) s"

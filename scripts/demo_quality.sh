#!/usr/bin/env bash
# Reports degenerate output of the demo pair (issue 16): for the first 16 validation prompts and the
# demo prompt, 128 greedy tokens each, whether a span of >= 8 tokens repeats 3 times in a row.
# Report only (exit 0 unless qflash fails); the failing form is `ctest -L demo_quality` in a build
# configured with -DQFLASH_DEMO_QUALITY=ON, or pass --require-clean 15 --require-demo-clean here.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/qflash ] || bash scripts/build.sh
exec python3 tools/quality/loops.py --qflash build/qflash --model "${MODEL:-models/demo}" "$@"

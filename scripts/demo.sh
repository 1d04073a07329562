#!/usr/bin/env bash
# One command: install dependencies, build, and generate with the demo pair (DFlash2 drafting).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
QFLASH_CUDA=${QFLASH_CUDA:-AUTO} bash scripts/build.sh
if [ ! -f models/demo/config.json ]; then
  echo "qflash: models/demo is missing; train it with: bash tools/train/train_all.sh OUT (see tools/train)" >&2
  exit 1
fi
build/qflash run --prompt "${1:-def parse_args(}" --max-tokens "${MAX_TOKENS:-128}" --stats
echo

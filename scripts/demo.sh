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
# The default prompt is a signature and a docstring: the model writes the body (code completion).
PROMPT=$'def parse_args(argv=None):\n    """Parse the command-line arguments and return the namespace."""\n'
build/qflash run --prompt "${1:-$PROMPT}" --max-tokens "${MAX_TOKENS:-128}" --stats
echo

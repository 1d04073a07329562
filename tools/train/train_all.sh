#!/usr/bin/env bash
# Train the qflash demo models. Usage:
#   bash tools/train/train_all.sh OUT_DIR [--stage all|part1|part2|LIST] [--smoke] [other train_all.py flags]
# See docs/experiments/demo_training.md.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 OUT_DIR [train_all.py flags]" >&2
  exit 2
fi
OUT_DIR="$1"; shift
export PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY="${PYTHON:-python3}"
exec "$PY" "$(dirname "$0")/train_all.py" --out "$OUT_DIR" "$@"

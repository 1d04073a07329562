#!/usr/bin/env bash
# Two device calls (each well under the 10-minute limit) that do not depend on the GPU machine
# staying warm in between: call 1 bundles its run folder into $OUT, the lead unpacks it here,
# and call 2 gets it back through `carry`. See docs/experiments/demo_training.md.
#
#   device call 1:  bash tools/train/remote.sh part1            (no carry)
#   here:           bash tools/train/remote.sh unpack FILES_AT   (FILES_AT = the call's files_at)
#   device call 2:  bash tools/train/remote.sh part2            (carry ["out/demo_run"])
#   here:           bash tools/train/remote.sh install FILES_AT  (-> models/demo/)
#
# RUN (default out/demo_run, git-ignored) is the run folder; extra arguments go to train_all.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN="${RUN:-out/demo_run}"
cmd="${1:-}"; shift || true
need_out() { if [ -z "${OUT:-}" ]; then echo "OUT is not set (this step runs on the device machine)" >&2; exit 2; fi; }
case "$cmd" in
  part1)
    need_out
    bash tools/train/train_all.sh "$RUN" --stage part1 "$@"
    tar -C "$RUN" -cf - . | split -b 15M -d - "$OUT/run.tar."
    cp "$RUN/train_log.txt" "$OUT/train_log.txt"
    ls -l "$OUT"
    ;;
  part2)
    need_out
    bash tools/train/train_all.sh "$RUN" --stage part2 "$@"
    tar -C "$RUN" -cf - demo | split -b 15M -d - "$OUT/demo.tar."
    cp "$RUN/train_log.txt" "$OUT/train_log.txt"
    ls -l "$OUT"
    ;;
  all)  # one call; fits in 10 minutes only with smaller budgets than the defaults
    need_out
    bash tools/train/train_all.sh "$RUN" --stage all "$@"
    tar -C "$RUN" -cf - demo | split -b 15M -d - "$OUT/demo.tar."
    cp "$RUN/train_log.txt" "$OUT/train_log.txt"
    ;;
  unpack)
    src="${1:?usage: remote.sh unpack FILES_AT}"
    rm -rf "$RUN"; mkdir -p "$RUN"
    cat "$src"/run.tar.* | tar -C "$RUN" -xf -
    echo "restored $RUN:"; ls "$RUN" "$RUN/stages"
    ;;
  install)
    src="${1:?usage: remote.sh install FILES_AT}"
    rm -rf models/demo; mkdir -p models
    cat "$src"/demo.tar.* | tar -C models -xf -
    echo "installed models/demo:"; ls -l models/demo models/demo/drafter
    ;;
  *)
    sed -n '2,13p' "$0"; exit 2 ;;
esac

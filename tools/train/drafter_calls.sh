#!/usr/bin/env bash
# Issue 16's next drafter, from the shipped pair's seed, in two device calls on one warm machine
# (docs/experiments/demo_data.md "Next call for issue 16's tau"). The target is not retrained: the
# seed (tools/train/seed_run.py) rebuilds the run folder from models/demo bit for bit.
#
#   here:   bash tools/train/drafter_calls.sh prep      corpus check, seed -> out/run_carry, weights aside
#   call 1: bash tools/train/drafter_calls.sh gen       carry ["out/run_carry", "data/pypi_v8/corpus/tokens_val.npy"]
#           (the whole-stream held-out perplexity of the shipped target, then the continuations)
#   call 2: bash tools/train/drafter_calls.sh drafter   at once after call 1, while the machine is warm
#           (out/demo_run/gen stays there); no carry
#   or one call instead of both: bash tools/train/drafter_calls.sh one   (carry ["out/run_carry"], ~9.3 min)
#   here:   bash tools/train/drafter_calls.sh restore   weights back into models/demo
#   here:   bash tools/train/remote_v2.sh install FILES_AT   the new pair
#
# Why two calls: gen (~3-4.6 min) and a drafter window of 7 min do not fit one 10-minute call.
# Why `prep` moves weights aside: the tree travels with the carry (64 MiB in all), and models/demo's
# 30 MB of weights plus the 26 MB seed and the 7 MB validation stream are over it; the folder's
# small files stay (call 1 builds the perplexity's pair folder from config.json and the seed).
set -uo pipefail
cd "$(dirname "$0")/../.."
RUN=out/demo_run
HOLD=${HOLD:-/tmp/qflash_demo_weights}
export GDN_CHECK=${GDN_CHECK:-0} COMPILE_MODEL=${COMPILE_MODEL:-off} PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True RUN
py=python3; [ -x .venv/bin/python ] && py=.venv/bin/python
unpack_run() { mkdir -p $RUN && cat out/run_carry/run.tar.xz.* | xz -dc | tar -C $RUN -xf -; }
# $OUT's 64 MB take the pair (demo.tar.*); the run's JSON travels instead of the run's bundle
pack_json() {
  rm -f "$OUT"/run.tar.xz.*
  ( cd $RUN && find . -name '*.json' -not -path './corpus/*' -not -path './tokenizer/*' | tar -czf "$OUT/run_json.tgz" -T - )
  ls -l "$OUT"
}
case "${1:-}" in
  prep)
    [ -f data/pypi_v8/corpus/tokens_val.npy ] || {
      echo "no data/pypi_v8: python3 tools/train/pypi_corpus.py --out data/pypi_v8 --pin tools/train/pypi_corpus_manifest.json --also-latest --jobs 4" >&2; exit 2; }
    $py tools/train/seed_run.py --pair models/demo --corpus data/pypi_v8 --out out/seed_run --carry out/run_carry || exit
    mkdir -p "$HOLD" && mv models/demo/*.safetensors models/demo/drafter "$HOLD"/ && echo "weights aside in $HOLD"
    ;;
  restore)
    mv "$HOLD"/*.safetensors models/demo/ && mv "$HOLD"/drafter models/demo/ && git status --short models/demo
    ;;
  gen)
    : "${OUT:?OUT is not set (this step runs on the device machine)}"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    unpack_run
    # the seeded target is the shipped one bit for bit: a pair folder for heldout_ppl.py
    P=out/ppl_pair; rm -rf $P; mkdir -p $P
    cp models/demo/config.json models/demo/generation_config.json models/demo/tokenizer.json models/demo/tokenizer_config.json $P/
    ln -s "$PWD/$RUN/target/model_int4.safetensors" $P/model.safetensors
    # PPL=0 skips it (it was measured on the CPU: 7.944, docs/experiments/demo_data.md "Session 14")
    [ "${PPL:-1}" = 0 ] || timeout 150 python3 tools/quality/heldout_ppl.py --model $P --tokens data/pypi_v8/corpus/tokens_val.npy \
      --gdn fast --batch 64 --json "$OUT/heldout_ppl.json" 2>&1 | tail -20
    # the drafter keeps every continuation's taps on the GPU (~0.43 MB each): 131,072 fit beside its
    # training on an 80 GB card, 196,608 on an H200
    mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    if [ "${mem:-0}" -gt 100000 ]; then NP=196608; MM=4.6; else NP=131072; MM=3.2; fi
    echo "gen: $NP prompts, guard $MM min (GPU memory $mem MiB)"
    bash tools/train/remote_v2.sh train gen --gen-max-min $MM --gen-batch 8192 --gen-prompts $NP
    rc=$?
    rm -f "$OUT"/run.tar.xz.*   # the gen folder is not in the bundle: the next call needs this warm machine
    du -sh $RUN/gen
    exit $rc
    ;;
  one)
    # gen and the drafter in one call (~9.3 min), when machines are scarce and a warm second call
    # is not likely: GEN_MIN (2.0) of continuations, DRAFTER_MIN (5.6) of drafter; no perplexity
    : "${OUT:?OUT is not set (this step runs on the device machine)}"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    unpack_run
    bash tools/train/remote_v2.sh train gen,drafter,package --gen-max-min "${GEN_MIN:-2.0}" --gen-batch 8192 \
      --gen-prompts 196608 --drafter-layers 3 --drafter-steps 30000 --drafter-max-min "${DRAFTER_MIN:-5.6}"
    rc=$?
    pack_json
    exit $rc
    ;;
  drafter)
    : "${OUT:?OUT is not set (this step runs on the device machine)}"
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
    [ -f $RUN/gen/meta.json ] || { echo "no $RUN/gen: the machine is cold (run call 1 again)"; exit 4; }
    bash tools/train/remote_v2.sh train drafter,package --drafter-layers 3 --drafter-steps 30000 \
      --drafter-max-min "${DRAFTER_MIN:-7.0}"
    rc=$?
    pack_json
    exit $rc
    ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac

#!/usr/bin/env python3
"""Train the qflash demo models (tiny qwen3_5 target + MTP head + DFlash2 drafter).

One command trains everything:

    python3 tools/train/train_all.py --out OUT_DIR              # all stages
    python3 tools/train/train_all.py --out OUT_DIR --stage part1  # corpus,target,mtp
    python3 tools/train/train_all.py --out OUT_DIR --stage part2  # gen,drafter,package

Stages (in order): corpus (stdlib corpus + tokenizer + token streams), target,
antiloop (unlikelihood fine-tune against the target's own greedy loops), mtp, gen (target greedy continuations), drafter, package (writes OUT_DIR/demo/).
Each stage writes OUT_DIR/stages/<stage>.json when it finishes; a finished
stage is skipped on a re-run unless --force is given, so a run that was cut
off resumes at the first unfinished stage. `--smoke` runs a tiny CPU-sized
version end to end (a couple of minutes on 2 cores).

Logs go to stdout and OUT_DIR/train_log.txt. See docs/experiments/demo_training.md.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("PYTHONUNBUFFERED", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
# never reach for a hub (the GPU box has no network)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as C  # noqa: E402

STAGES = ["corpus", "target", "antiloop", "mtp", "gen", "drafter", "package"]
GROUPS = {
    "all": STAGES,
    "part1": ["corpus", "target", "antiloop", "mtp"],
    "part2": ["gen", "drafter", "package"],
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--stage", default="all", help="all | part1 | part2 | comma list of " + ",".join(STAGES))
    p.add_argument("--force", action="store_true", help="re-run stages already marked done")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    p.add_argument("--smoke", action="store_true", help="tiny CPU-sized run of every stage")
    p.add_argument("--smoke-files", type=int, default=120, help="train files kept by --smoke")
    p.add_argument("--corpus-dir", default=None,
                   help="a corpus built by tools/train/pypi_corpus.py (its corpus/ and tokenizer/ are used "
                        "instead of the stdlib corpus and a newly trained tokenizer)")
    p.add_argument("--target-shape", default="tiny", help="tiny (qwen38.md section 9) | small | nano (CPU dry run)")
    p.add_argument("--ship-int4", action="store_true",
                   help="the target (and MTP head) ship in int4, mlx layout; MTP, gen and drafter use the "
                        "dequantized int4 target, and later device calls need only the int4 file")
    p.add_argument("--int4-group", type=int, default=64)
    p.add_argument("--gdn", choices=("fast", "ref"), default="fast",
                   help="chunked gated delta rule of the target's GDN layers, in every stage that runs the target "
                        "(target, mtp, gen, drafter, package): fast = tools/train/fast_gdn.py (same math, checked "
                        "against transformers' on the CPU by test_fast_gdn.py); ref = transformers' own choice "
                        "(its PyTorch reference, or fla's kernel when fla-core is installed)")
    p.add_argument("--gdn-solve", choices=("tri", "block"), default="tri",
                   help="fast_gdn's solver: tri = batched solve_triangular, block = block inverse from matrix products")

    g = p.add_argument_group("target")
    g.add_argument("--target-steps", type=int, default=1600)
    g.add_argument("--target-seq", type=int, default=512)
    g.add_argument("--target-batch", type=int, default=64, help="sequences per step")
    g.add_argument("--target-lr", type=float, default=2e-3)
    g.add_argument("--target-warmup", type=int, default=100)
    g.add_argument("--target-wd", type=float, default=0.1)
    g.add_argument("--target-max-min", type=float, default=5.5, help="wall-clock guard for the training loop")
    g.add_argument("--target-budget-min", type=float, default=0,
                   help="run the LR schedule over this many minutes of wall clock and end the stage, complete, "
                        "when they are spent (--target-steps becomes an upper bound; 0: off)")
    g.add_argument("--target-ckpt-every", type=int, default=500,
                   help="write target/ckpt.pt (weights, optimizer, RNG, curve) every N steps and at the guard; "
                        "a re-run resumes from it")
    g.add_argument("--compile-model", choices=("auto", "on", "off"), default="auto",
                   help="run the target's training forward through torch.compile(model) (whole model, as "
                        "gdn_check.py's +cmodel: 408-420k vs 205k tok/s on an H100). auto = on for CUDA, off "
                        "on the CPU (compiling takes minutes there and is slower than eager for the smoke "
                        "run). The first, compiling step is kept out of --target-budget-min's clock; a "
                        "compile failure falls back to eager (logged, target/metrics.json compile_failed)")
    g.add_argument("--target-compile", "--compile", dest="compile_model", action="store_const", const="on",
                   help="same as --compile-model on (older spelling)")
    g.add_argument("--target-eval-every", type=int, default=100,
                   help="validation perplexity every N steps; the best checkpoint is kept (0: off, keep last)")

    g = p.add_argument_group("antiloop")
    g.add_argument("--antiloop-min", type=float, default=2.0,
                   help="minutes of unlikelihood fine-tuning of the target against its own greedy loops "
                        "(tools/train/stage_antiloop.py; 0: skip the stage)")
    g.add_argument("--antiloop-steps", type=int, default=100000, help="upper bound on steps (the budget decides)")
    g.add_argument("--antiloop-lr", type=float, default=3e-4)
    g.add_argument("--antiloop-warmup", type=int, default=20)
    g.add_argument("--antiloop-alpha", type=float, default=1.0, help="weight of the unlikelihood term")
    g.add_argument("--antiloop-ngram", type=int, default=8, help="a token inside a repeated n-gram is a candidate")
    g.add_argument("--antiloop-prompt-len", type=int, default=64)
    g.add_argument("--antiloop-new", type=int, default=128, help="greedy tokens per continuation")
    g.add_argument("--antiloop-pool", type=int, default=4096, help="continuations generated per refresh")
    g.add_argument("--antiloop-refresh", type=int, default=64, help="steps between pool refreshes")
    g.add_argument("--antiloop-ul-batch", type=int, default=64, help="continuations per step")
    g.add_argument("--antiloop-mle-batch", type=int, default=32, help="train windows per step (next-token loss)")
    g.add_argument("--antiloop-kl", type=float, default=0.0,
                   help="weight of KL(start || current) on the train windows: keeps the fine-tuned model's "
                        "distribution on ordinary text at the starting model's (0: off)")
    g.add_argument("--antiloop-eval-prompts", type=int, default=512, help="line-start prompts per split, before/after")
    g.add_argument("--antiloop-eval-windows", type=int, default=0, help="held-out ppl windows (0: all)")
    g.add_argument("--antiloop-qat", type=int, default=1,
                   help="with --ship-int4: 1 = the forward sees the int4 round trip of each shipped matrix "
                        "(straight-through gradient); 0 = plain float32 fine-tune, rounded afterwards")
    g.add_argument("--antiloop-max-ppl-rise", type=float, default=0.08,
                   help="discard the fine-tune if the held-out perplexity rises by more than this fraction")

    g = p.add_argument_group("mtp")
    g.add_argument("--mtp-steps", type=int, default=1000)
    g.add_argument("--mtp-seq", type=int, default=512)
    g.add_argument("--mtp-batch", type=int, default=64)
    g.add_argument("--mtp-lr", type=float, default=2e-3)
    g.add_argument("--mtp-max-min", type=float, default=1.3)

    g = p.add_argument_group("gen")
    g.add_argument("--gen-prompts", type=int, default=98304, help="training continuations (train-split prompts)")
    g.add_argument("--gen-batch", type=int, default=4096)
    g.add_argument("--gen-prompt-len", type=int, default=64)
    g.add_argument("--gen-new", type=int, default=128)
    g.add_argument("--gen-heldout", type=int, default=512, help="held-out continuations (validation-split prompts)")
    g.add_argument("--gen-max-min", type=float, default=2.5)
    g.add_argument("--gen-dtype", choices=("fp32", "bf16"), default="fp32",
                   help="decode precision: fp32 = the argmax of qflash's fp32 path (TF32 off); bf16 = bf16 "
                        "autocast (up to v6), whose 8-bit logits turn near-ties into lowest-id picks")
    g.add_argument("--gen-prompt-chunks", default=None,
                   help="uint16 [C, L] .npy of train-split chunks to draw the training prompts from, instead "
                        "of the whole train stream (for a device call that cannot carry it; "
                        "`stage_gen.py chunks` writes one)")

    g = p.add_argument_group("drafter")
    g.add_argument("--drafter-steps", type=int, default=3600)
    g.add_argument("--drafter-layers", type=int, default=2, help="decoder layers of the drafter")
    g.add_argument("--drafter-batch", type=int, default=128, help="sequences per step")
    g.add_argument("--drafter-anchors", type=int, default=32, help="random anchors per sequence")
    g.add_argument("--drafter-lr", type=float, default=1e-3)
    g.add_argument("--drafter-warmup", type=int, default=100)
    g.add_argument("--drafter-max-min", type=float, default=3.5)
    g.add_argument("--drafter-taps", default="auto",
                   help="target_layer_ids: auto = build_target_layer_ids(layers, 3) (1,3,5 for the tiny target)")
    g.add_argument("--drafter-window", type=int, default=1024, help="sliding_window")
    g.add_argument("--drafter-gamma", type=float, default=4.0)
    g.add_argument("--drafter-alpha", type=float, default=1.0, help="selector loss weight")
    g.add_argument("--eval-walk", type=int, default=512, help="held-out sequences for the greedy-walk tau")

    g = p.add_argument_group("package")
    g.add_argument("--prompt-rule", default="auto", choices=("auto", "docfunc", "heads"),
                   help="validation prompts: docfunc = a held-out function's signature + docstring "
                        "(stage_package.docfunc_prompts), heads = file heads then def/class lines (the first "
                        "pair's rule); auto = docfunc for a --corpus-dir corpus, heads for the stdlib one")
    args = p.parse_args(argv)
    if args.smoke:
        apply_smoke(args, p)
    return args


def apply_smoke(a, p):
    a.target_steps, a.target_seq, a.target_batch, a.target_warmup = 12, 64, 4, 3
    a.target_eval_every = 6
    a.mtp_steps, a.mtp_seq, a.mtp_batch = 6, 64, 4
    a.antiloop_steps, a.antiloop_prompt_len, a.antiloop_new, a.antiloop_pool = 4, 16, 24, 8
    a.antiloop_refresh, a.antiloop_ul_batch, a.antiloop_mle_batch, a.antiloop_eval_prompts = 2, 4, 2, 8
    a.antiloop_eval_windows, a.antiloop_warmup = 8, 2
    a.gen_prompts, a.gen_batch, a.gen_prompt_len, a.gen_new, a.gen_heldout = 16, 12, 16, 24, 8
    a.drafter_steps, a.drafter_batch, a.drafter_anchors, a.drafter_warmup = 10, 4, 4, 2
    a.eval_walk = 8
    # the smoke run must not depend on machine load: no wall-clock guards, unless one is given
    # (the resume dry run gives --target-max-min)
    for g in ("target_max_min", "antiloop_min", "mtp_max_min", "gen_max_min", "drafter_max_min"):
        if getattr(a, g) == p.get_default(g):
            setattr(a, g, 1e6)
    if a.device is None:
        a.device = "cpu"


def select_stages(spec: str) -> list[str]:
    if spec in GROUPS:
        return GROUPS[spec]
    names = [s.strip() for s in spec.split(",") if s.strip()]
    bad = [s for s in names if s not in STAGES]
    if bad:
        raise SystemExit(f"unknown stage(s) {bad}; choose from {STAGES} or {list(GROUPS)}")
    return [s for s in STAGES if s in names]


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    args.out = str(out)
    log = C.Log(out)
    stages = select_stages(args.stage)
    log(f"=== train_all: stages {stages} out={os.path.relpath(out)} seed={args.seed} smoke={args.smoke} "
        f"python={platform.python_version()} argv={' '.join(sys.argv[1:])}")
    try:
        import torch
        import transformers

        log(f"torch {torch.__version__} (cuda {torch.cuda.is_available()}), transformers {transformers.__version__}")
    except ImportError as e:  # pragma: no cover
        log(f"import failed: {e}")
        raise
    import fast_gdn

    fast_gdn.use(args.gdn, log=log, solve=args.gdn_solve)
    C.write_json(out / "args.json", vars(args))
    t_all = time.time()
    for st in stages:
        if C.stage_done(out, st) and not args.force:
            log(f"--- stage {st}: already done ({C.stage_marker(out, st)}), skipping")
            continue
        log(f"--- stage {st}: start")
        t0 = time.time()
        C.seed_everything(C.stage_seed(args.seed, st))
        mod = __import__(f"stage_{st}")
        try:
            info = mod.run(args, log) or {}
        except Exception:
            log(f"stage {st} FAILED:\n{traceback.format_exc()}")
            raise
        if info.get("incomplete"):
            log(f"--- stage {st}: stopped at its wall-clock guard after {C.fmt_s(time.time() - t0)}; "
                f"run the same command again to resume ({info['incomplete']})")
            sys.exit(3)
        info["wall_seconds"] = time.time() - t0
        info["args"] = vars(args)
        C.mark_stage(out, st, info)
        log(f"--- stage {st}: done in {C.fmt_s(time.time() - t0)}")
    log(f"=== all requested stages done in {C.fmt_s(time.time() - t_all)}")


if __name__ == "__main__":
    main()

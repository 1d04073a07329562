"""Stage `gen`: self-distillation data for the drafter: greedy continuations of the
frozen bf16 target.

Prompts are random `--gen-prompt-len`-token windows (uniform offsets, seeded) of
the TRAIN stream for the drafter's training set, and of the VALIDATION stream for
the held-out set (`--gen-heldout` sequences), so held-out metrics measure
generalisation to unseen files. Each prompt is continued greedily for
`--gen-new` tokens with the KV/state cache (no stop on <|endoftext|>; argmax ties
go to the lowest id, as torch.argmax does).

`--gen-dtype fp32` (the default) runs the whole decode in float32 (TF32 off): the
argmax is then the one qflash's fp32 CPU path takes. `bf16` (the recipe up to v6)
decodes under bf16 autocast, whose logits round to 8 significant bits: a top-2
margin under ~0.06 at logit ~15 becomes a tie that argmax gives to the lower id.
On v6's target that was what the cached-vs-uncached check caught (0.773 on the
GPU): the continuations the drafter learns from then follow bf16 rounding at
every near-tie, not the target qflash runs.

`--gen-prompt-chunks FILE.npy` (uint16 [C, L], train split) draws the training
prompts inside those chunks instead of from OUT/corpus/tokens_train.npy: a device
call that cannot carry the whole train stream carries chunks spread over it
(`python3 tools/train/stage_gen.py chunks ...` writes them).

Outputs (OUT/gen/): train_seqs.npy [N, P+G] uint16, heldout_seqs.npy [M, P+G]
uint16, meta.json.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import common as C


def gen_ctx(device, model):
    """bf16 autocast for a bf16 model on the GPU (--gen-dtype bf16); nothing for an fp32 model."""
    import contextlib

    import torch

    if next(model.parameters()).dtype == torch.float32:
        return contextlib.nullcontext()
    return C.autocast_ctx(device)


def chunk_windows(chunks: np.ndarray, n: int, length: int, gen: np.random.Generator) -> np.ndarray:
    """n random windows of `length` tokens, each inside one row of `chunks` [C, L] (int64 [n, length])."""
    if chunks.ndim != 2 or chunks.shape[1] < length + 1:
        raise ValueError(f"prompt chunks of shape {chunks.shape}: need [C, L] with L > {length}")
    rows = gen.integers(0, chunks.shape[0], size=n)
    starts = gen.integers(0, chunks.shape[1] - length, size=n)
    idx = starts[:, None] + np.arange(length)[None, :]
    return np.asarray(chunks[rows[:, None], idx], dtype=np.int64)


def load_prompt_chunks(path, vocab: int) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"--gen-prompt-chunks {p}: no such file")
    a = np.load(p)
    if a.dtype != np.uint16 or a.ndim != 2:
        raise SystemExit(f"--gen-prompt-chunks {p}: expected uint16 [chunks, length], got {a.dtype} {a.shape}")
    if a.size and int(a.max()) >= vocab:
        raise SystemExit(f"--gen-prompt-chunks {p}: token id {int(a.max())} outside the vocabulary ({vocab})")
    return a


def greedy_generate(model, prompts, n_new, device):
    """prompts int64 [B, P] -> generated int64 [B, n_new] (greedy, cached)."""
    import torch

    kw = C.cache_kwarg_name(model)
    cache = C.new_cache(model)
    B, P = prompts.shape
    with torch.no_grad(), gen_ctx(device, model):
        out = model(input_ids=prompts, use_cache=True, logits_to_keep=1, **{kw: cache})
        nxt = out.logits[:, -1].float().argmax(-1)
        toks = [nxt]
        for i in range(1, n_new):
            pos = torch.full((B, 1), P + i - 1, dtype=torch.long, device=device)
            out = model(input_ids=nxt[:, None], position_ids=pos, use_cache=True, logits_to_keep=1, **{kw: cache})
            nxt = out.logits[:, -1].float().argmax(-1)
            toks.append(nxt)
    return torch.stack(toks, dim=1)


def run(args, log):
    import torch

    out = Path(args.out)
    C.require_stage(out, "target")
    device = C.pick_device(args.device)
    C.setup_torch(device)
    seed = C.stage_seed(args.seed, "gen")
    gen_dtype = getattr(args, "gen_dtype", "bf16")
    if gen_dtype == "fp32":
        model = C.load_target(out, device, dtype=torch.float32)
        if device.type == "cuda":  # full fp32 matmuls: TF32 would round activations to 10 bits
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
    else:
        model = C.load_target(out, device)
    chunks_file = getattr(args, "gen_prompt_chunks", None)
    if chunks_file:
        train = load_prompt_chunks(chunks_file, C.VOCAB_SIZE)
        draw_train = chunk_windows
        log(f"gen: training prompts from {train.shape[0]} chunks of {train.shape[1]} tokens ({chunks_file})")
    else:
        train = C.load_tokens(out, "train")
        draw_train = C.random_windows
    val = C.load_tokens(out, "val")
    log(f"gen: decoding in {gen_dtype}")
    gen = np.random.default_rng(seed)
    P, G = args.gen_prompt_len, args.gen_new
    n_train = args.gen_prompts

    # self-check: the cached loop against an uncached greedy decode (recurrent vs chunked GDN;
    # in bf16 near-ties can flip, after which the two continuations diverge)
    n_chk, l_chk = 8, 16
    chk = torch.from_numpy(C.random_windows(val, n_chk, P, np.random.default_rng(seed + 1))).to(device)
    g_cached = greedy_generate(model, chk, l_chk, device)
    seq = chk
    with torch.no_grad(), gen_ctx(device, model):
        for _ in range(l_chk):
            nxt = model(input_ids=seq, use_cache=False).logits[:, -1].float().argmax(-1)
            seq = torch.cat([seq, nxt[:, None]], 1)
    same = (seq[:, P:] == g_cached)
    agree = same.float().mean().item()
    first_div = torch.where(same.all(1), torch.full((n_chk,), l_chk, device=device),
                            (~same).float().argmax(1)).float().mean().item()
    log(f"gen: cached vs uncached greedy on {n_chk}x{l_chk} tokens: agreement {agree:.3f}, "
        f"mean tokens before the first difference {first_div:.1f}")

    t0 = time.time()
    deadline = t0 + args.gen_max_min * 60
    results = {}
    for split, stream, n, draw in (("heldout", val, args.gen_heldout, C.random_windows),
                                   ("train", train, n_train, draw_train)):
        seqs = []
        done = 0
        while done < n:
            b = min(args.gen_batch, n - done)
            prompts = torch.from_numpy(draw(stream, b, P, gen)).to(device)
            tb = time.time()
            cont = greedy_generate(model, prompts, G, device)
            C.sync(device)
            seqs.append(torch.cat([prompts, cont], 1).cpu().numpy().astype(np.uint16))
            done += b
            log(f"gen {split}: {done}/{n} sequences ({b} in {time.time() - tb:.1f}s, "
                f"{b * G / (time.time() - tb):.0f} tok/s)")
            if time.time() > deadline and split == "train":
                log(f"gen: wall-clock guard hit ({args.gen_max_min} min); keeping {done} train sequences")
                break
        arr = np.concatenate(seqs) if seqs else np.zeros((0, P + G), np.uint16)
        results[split] = arr
    gdir = out / "gen"
    gdir.mkdir(parents=True, exist_ok=True)
    np.save(gdir / "train_seqs.npy", results["train"])
    np.save(gdir / "heldout_seqs.npy", results["heldout"])
    stats = {}
    for split, arr in results.items():
        cont = arr[:, P:]
        distinct = len({c.tobytes() for c in cont})
        eot = float((cont == C.EOT_ID).any(1).mean()) if len(cont) else 0.0
        # fraction of continuation tokens that repeat the token 8 positions earlier (loopiness)
        rep = float((cont[:, 8:] == cont[:, :-8]).mean()) if cont.shape[1] > 8 and len(cont) else 0.0
        stats[split] = {"sequences": int(len(arr)), "distinct_continuations": distinct,
                        "with_eot": eot, "repeat_at_lag8": rep}
    meta = {"prompt_len": P, "new_tokens": G, "seconds": time.time() - t0,
            "cached_vs_uncached_agreement": agree, "stats": stats, "dtype": gen_dtype,
            "train_prompts_from": (f"train split, {train.shape[0]} chunks of {train.shape[1]} tokens"
                                   if chunks_file else "train split"),
            "heldout_prompts_from": "validation split"}
    C.write_json(gdir / "meta.json", meta)
    log(f"gen: {stats} in {C.fmt_s(time.time() - t0)}")
    return meta


def write_chunks(argv=None):
    """`python3 tools/train/stage_gen.py chunks TOKENS_TRAIN.npy OUT.npy --chunks C --len L [--seed S]`:
    C chunks of L tokens at evenly spaced offsets (a random phase) over the train stream, uint16."""
    ap = argparse.ArgumentParser(prog="stage_gen.py chunks", description=write_chunks.__doc__)
    ap.add_argument("tokens")
    ap.add_argument("out")
    ap.add_argument("--chunks", type=int, required=True)
    ap.add_argument("--len", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    t = np.load(a.tokens, mmap_mode="r")
    if a.chunks < 1 or a.len < 2:
        raise SystemExit("--chunks must be >= 1 and --len >= 2")
    if a.chunks * a.len > len(t):
        raise SystemExit(f"{a.chunks} chunks of {a.len} tokens need {a.chunks * a.len:,}; the stream has {len(t):,}")
    stride = len(t) // a.chunks
    phase = int(np.random.default_rng(a.seed).integers(0, stride - a.len + 1))
    starts = phase + stride * np.arange(a.chunks)
    arr = np.stack([np.asarray(t[s : s + a.len]) for s in starts]).astype(np.uint16)
    np.save(a.out, arr)
    print(f"wrote {a.out}: {arr.shape} uint16 from {len(t):,} tokens (stride {stride:,}, phase {phase})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "chunks":
        write_chunks(sys.argv[2:])
    else:
        raise SystemExit("usage: stage_gen.py chunks TOKENS_TRAIN.npy OUT.npy --chunks C --len L [--seed S] "
                         "(the stage itself runs from train_all.py)")

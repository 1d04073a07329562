"""Stage `gen`: self-distillation data for the drafter: greedy continuations of the
frozen bf16 target.

Prompts are random `--gen-prompt-len`-token windows (uniform offsets, seeded) of
the TRAIN stream for the drafter's training set, and of the VALIDATION stream for
the held-out set (`--gen-heldout` sequences), so held-out metrics measure
generalisation to unseen files. Each prompt is continued greedily for
`--gen-new` tokens with the KV/state cache (no stop on <|endoftext|>; argmax ties
go to the lowest id, as torch.argmax does).

Outputs (OUT/gen/): train_seqs.npy [N, P+G] uint16, heldout_seqs.npy [M, P+G]
uint16, meta.json.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import common as C


def greedy_generate(model, prompts, n_new, device):
    """prompts int64 [B, P] -> generated int64 [B, n_new] (greedy, cached)."""
    import torch

    kw = C.cache_kwarg_name(model)
    cache = C.new_cache(model)
    B, P = prompts.shape
    with torch.no_grad(), C.autocast_ctx(device):
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
    model = C.load_target(out, device)
    train = C.load_tokens(out, "train")
    val = C.load_tokens(out, "val")
    gen = np.random.default_rng(seed)
    P, G = args.gen_prompt_len, args.gen_new
    n_train = args.gen_prompts

    # self-check: the cached loop against an uncached greedy decode (recurrent vs chunked GDN;
    # in bf16 near-ties can flip, after which the two continuations diverge)
    n_chk, l_chk = 8, 16
    chk = torch.from_numpy(C.random_windows(val, n_chk, P, np.random.default_rng(seed + 1))).to(device)
    g_cached = greedy_generate(model, chk, l_chk, device)
    seq = chk
    with torch.no_grad(), C.autocast_ctx(device):
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
    for split, stream, n in (("heldout", val, args.gen_heldout), ("train", train, n_train)):
        seqs = []
        done = 0
        while done < n:
            b = min(args.gen_batch, n - done)
            prompts = torch.from_numpy(C.random_windows(stream, b, P, gen)).to(device)
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
            "cached_vs_uncached_agreement": agree, "stats": stats,
            "train_prompts_from": "train split", "heldout_prompts_from": "validation split"}
    C.write_json(gdir / "meta.json", meta)
    log(f"gen: {stats} in {C.fmt_s(time.time() - t0)}")
    return meta

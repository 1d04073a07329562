#!/usr/bin/env python3
"""Held-out perplexity of a shipped demo pair's target, as it ships (issue 16's "<= 8" target).

    python3 tools/quality/heldout_ppl.py --model models/demo --tokens data/pypi_v8/corpus/tokens_val.npy

An int4 target is expanded to float32 exactly as tools/reference/demo_greedy_fixture.py does
(w = q * scale + bias per group), then evaluated with transformers' Qwen3_5ForCausalLM over
non-overlapping windows of --seq tokens of the token stream (the training stages' definition:
mean next-token NLL over every window, the first token of a window only as context). Reports the
perplexity over all windows and over the first --head-windows (the antiloop stage measures on
the first 2048 windows: this is the bridge between its figure and the full held-out stream).
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "reference"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "models" / "demo"))
    p.add_argument("--tokens", required=True, help=".npy token stream (uint16/int), e.g. the corpus's tokens_val.npy")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--head-windows", type=int, default=2048)
    p.add_argument("--max-windows", type=int, default=0, help="0: all")
    p.add_argument("--sample", type=int, default=0,
                   help="N > 0: N windows drawn uniformly without replacement (--seed) instead of all; reports the "
                        "sample's perplexity and the standard error of its mean NLL (an estimate, for machines "
                        "too slow for the whole stream)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default=None, help="cuda | cpu (default: cuda if available)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast on cuda (what the training stages measure with)")
    p.add_argument("--gdn", choices=["ref", "fast"], default="ref",
                   help="ref: transformers' own GDN; fast: tools/train/fast_gdn.py (same math, gdn_check.py-checked; much faster)")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    from demo_greedy_fixture import expand_int4

    if a.gdn == "fast":
        sys.path.insert(0, str(ROOT / "tools" / "train"))
        import fast_gdn

        fast_gdn.use("fast", log=None)

    model_dir = Path(a.model)
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"{model_dir}: no config.json")
    toks = np.load(a.tokens, mmap_mode="r")
    if toks.ndim != 1:
        raise SystemExit(f"{a.tokens}: expected a 1-D token stream, found shape {toks.shape}")
    dev = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    tmp = Path(tempfile.mkdtemp(prefix="heldout_ppl_"))
    try:
        src = model_dir
        cfg = json.loads((model_dir / "config.json").read_text())
        if "quantization" in cfg:
            expand_int4(model_dir, tmp)
            src = tmp
        model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).to(dev).eval()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    vocab = model.config.vocab_size
    if int(toks.max()) >= vocab:
        raise SystemExit(f"{a.tokens}: token id {int(toks.max())} >= the model's vocab {vocab}")
    n_all = (len(toks) - 1) // a.seq
    n_win = min(n_all, a.max_windows) if a.max_windows else n_all
    order = np.arange(n_win)
    if a.sample:
        order = np.sort(np.random.default_rng(a.seed).choice(n_win, size=min(a.sample, n_win), replace=False))
    t0 = time.time()
    nll = np.zeros(len(order))
    with torch.no_grad():
        for b0 in range(0, len(order), a.batch):
            idx = order[b0: b0 + a.batch]
            w = torch.from_numpy(np.stack([np.asarray(toks[i * a.seq: i * a.seq + a.seq + 1], dtype=np.int64) for i in idx])).to(dev)
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=a.bf16 and dev == "cuda"):
                logits = model(input_ids=w[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, vocab), w[:, 1:].reshape(-1), reduction="none")
            nll[b0: b0 + len(idx)] = loss.reshape(len(idx), -1).sum(1).double().cpu().numpy()
    per_tok = nll / a.seq
    res = {
        "model": str(model_dir), "tokens": str(a.tokens), "seq": a.seq, "device": dev, "bf16_autocast": bool(a.bf16 and dev == "cuda"), "gdn": a.gdn,
        "windows_in_stream": n_all, "windows": len(order), "predicted_tokens": len(order) * a.seq,
        "ppl": math.exp(per_tok.mean()),
        "seconds": round(time.time() - t0, 1),
    }
    if a.sample:
        se = per_tok.std(ddof=1) / math.sqrt(len(order)) if len(order) > 1 else float("nan")
        res.update({"sample_seed": a.seed, "mean_nll": per_tok.mean(), "mean_nll_se": se,
                    "ppl_95": [math.exp(per_tok.mean() - 1.96 * se), math.exp(per_tok.mean() + 1.96 * se)],
                    "window_ids": order.tolist()})
    else:
        head = min(a.head_windows, n_win)
        res.update({"head_windows": head, "ppl_head": math.exp(per_tok[:head].mean())})
    print(json.dumps({k: v for k, v in res.items() if k != "window_ids"}, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

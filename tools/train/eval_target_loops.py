#!/usr/bin/env python3
"""Greedy-loop check of a trained target from its int4 (mlx affine, group 64) weights alone.

    python tools/train/eval_target_loops.py --run RUN_DIR [--repo REPO_ROOT] [--out generations.json]

RUN_DIR is a train_all.py output folder (or the unpacked run bundle) holding target/config.json,
target/model_int4.safetensors, tokenizer/tokenizer.json, corpus/{validation_texts.json,
manifest.json,tokens_val.npy} and args.json. The script

1. dequantizes model_int4.safetensors itself (uint32 words, 8 nibbles each, column j of a word
   at bits 4j; w = q * scale + bias per group of `group` columns; rounded to bf16 as
   tools/train/common.py dequantize_state_dict does) and checks the result equals the repo's
   common.dequantize_state_dict bit for bit;
2. builds transformers' Qwen3_5ForCausalLM from target/config.json and loads those weights
   (names: transformers' own state_dict names, model.* + lm_head.weight), fp32 on the CPU;
3. perplexity over the first --ppl-windows non-overlapping 512-token windows of tokens_val.npy
   (the target stage's evaluate_ppl, fp32 instead of bf16 autocast);
4. builds the validation prompts exactly as stage_package.run does (rule auto: docfunc for the
   PyPI corpus, topped up with the heads rule), takes the first --n-prompts, adds
   tools/quality/loops.py's DEMO_PROMPT, generates --max-new greedy tokens for each (stopping at
   eos 8186 / 8188 as `qflash run` does without --ignore-eos), and runs loops.find_loop on the
   re-tokenized generated text (what loops.py does with qflash's output) and on the raw ids.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np


def dequant_int4(q_u32: np.ndarray, scales: np.ndarray, biases: np.ndarray, group: int) -> np.ndarray:
    """q [rows, cols/8] uint32, scales/biases [rows, cols/group] float32 -> w [rows, cols] float32."""
    rows = q_u32.shape[0]
    shifts = (4 * np.arange(8, dtype=np.uint32))
    nib = (q_u32[..., None] >> shifts) & np.uint32(0xF)  # [rows, cols/8, 8], column 8i+j at bits 4j
    v = nib.reshape(rows, -1, group).astype(np.float32)
    return (v * scales[..., None] + biases[..., None]).reshape(rows, -1)


def load_int4(path: Path, group: int):
    import torch
    from safetensors.torch import load_file

    raw = load_file(str(path))
    out, n_q = {}, 0
    for k, v in raw.items():
        if k.endswith((".scales", ".biases")):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if base and base + ".scales" in raw:
            qw = v.view(torch.int32).numpy().view(np.uint32)
            s = raw[base + ".scales"].float().numpy()
            b = raw[base + ".biases"].float().numpy()
            w = torch.from_numpy(dequant_int4(qw, s, b, group)).to(torch.bfloat16).float()
            out[k] = w
            n_q += 1
        else:
            out[k] = v.float()
    return raw, out, n_q


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True)
    p.add_argument("--repo", default=str(Path(__file__).resolve().parents[2]), help="repository root (default: this file's)")
    p.add_argument("--out", default="generations.json")
    p.add_argument("--n-prompts", type=int, default=16)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--ppl-windows", type=int, default=32)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from tokenizers import Tokenizer
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.set_num_threads(a.threads)
    repo, run = Path(a.repo), Path(a.run)
    sys.path.insert(0, str(repo / "tools" / "train"))
    sys.path.insert(0, str(repo / "tools" / "quality"))
    import common as C
    import stage_package as SP
    from loops import DEMO_PROMPT, find_loop

    t0 = time.time()
    group = json.loads((run / "args.json").read_text()).get("int4_group", 64)
    raw, sd, n_q = load_int4(run / "target" / "model_int4.safetensors", group)
    ref = C.dequantize_state_dict(raw, group)  # the repo's own dequantization
    assert set(ref) == set(sd), set(ref) ^ set(sd)
    same = all(torch.equal(ref[k].float(), sd[k]) for k in sd)
    print(f"int4: {len(raw)} tensors in file, {n_q} matrices dequantized (group {group}); "
          f"equal to common.dequantize_state_dict: {same}", flush=True)
    assert same

    cfg_d = json.loads((run / "target" / "config.json").read_text())
    cfg = Qwen3_5TextConfig(**{k: v for k, v in cfg_d.items() if k not in ("model_type", "transformers_version")})
    cfg._attn_implementation = "sdpa"
    model = Qwen3_5ForCausalLM(cfg)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("inv_freq" in m for m in missing), (missing, unexpected)
    model = model.float().eval()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: Qwen3_5ForCausalLM {n_params:,} params, {len(sd)} tensors loaded "
          f"(missing only {missing})", flush=True)

    # ---- perplexity (stage_target.evaluate_ppl, first windows) ----
    val = np.load(run / "corpus" / "tokens_val.npy", mmap_mode="r")
    n_win = min(a.ppl_windows, (len(val) - 1) // a.seq)
    tot, cnt = 0.0, 0
    t1 = time.time()
    with torch.no_grad():
        for b0 in range(0, n_win, 4):
            idx = range(b0, min(n_win, b0 + 4))
            w = torch.from_numpy(np.stack([np.asarray(val[i * a.seq: i * a.seq + a.seq + 1], dtype=np.int64) for i in idx]))
            lg = model(input_ids=w[:, :-1], use_cache=False).logits
            tot += F.cross_entropy(lg.float().reshape(-1, lg.shape[-1]), w[:, 1:].reshape(-1), reduction="sum").item()
            cnt += w[:, 1:].numel()
    ppl = math.exp(tot / cnt)
    print(f"ppl: {ppl:.3f} over {cnt:,} tokens ({n_win} windows of {a.seq}, first of tokens_val.npy) "
          f"in {time.time() - t1:.0f}s; metrics.json val_ppl_int4 {json.loads((run / 'target' / 'metrics.json').read_text()).get('val_ppl_int4')}",
          flush=True)

    # ---- prompts, exactly as stage_package.run builds validation_prompts.jsonl ----
    val_texts = json.loads((run / "corpus" / "validation_texts.json").read_text(encoding="utf-8"))
    by_project = "projects" in json.loads((run / "corpus" / "manifest.json").read_text())
    rule = "docfunc" if by_project else "heads"  # --prompt-rule auto
    if rule == "docfunc":
        prompts = SP.docfunc_prompts(val_texts)
        if len(prompts) < SP.N_PROMPTS:
            seen = {q["text"] for q in prompts}
            prompts += [q for q in SP.validation_prompts(val_texts, by_project=by_project) if q["text"] not in seen]
            prompts = prompts[: SP.N_PROMPTS]
    else:
        prompts = SP.validation_prompts(val_texts, by_project=by_project)
    print(f"prompts: rule {rule}, {len(prompts)} built, using the first {a.n_prompts} + the demo prompt", flush=True)

    tok = Tokenizer.from_file(str(run / "tokenizer" / "tokenizer.json"))
    eos = set(cfg_d["eos_token_id"]) if isinstance(cfg_d["eos_token_id"], list) else {cfg_d["eos_token_id"]}
    todo = [(f"val{i}", q) for i, q in enumerate(prompts[: a.n_prompts])]
    todo.append(("demo", {"file": None, "kind": "demo", "line": None, "text": DEMO_PROMPT}))
    results = []
    for name, q in todo:
        ids = tok.encode(q["text"], add_special_tokens=False).ids
        t2 = time.time()
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=a.max_new,
                                 eos_token_id=sorted(eos), pad_token_id=cfg_d.get("pad_token_id"), use_cache=True)
        gen = out[0, len(ids):].tolist()
        stopped = bool(gen) and gen[-1] in eos
        body = gen[:-1] if stopped else gen
        text = tok.decode(body, skip_special_tokens=False)
        ids_re = tok.encode(text, add_special_tokens=False).ids  # as loops.py: `qflash tokenize --no-special`
        lp, lp_raw = find_loop(ids_re), find_loop(gen)
        r = {"prompt": name, "file": q["file"], "line": q["line"], "kind": q["kind"], "text": q["text"],
             "prompt_ids": ids, "gen_ids": gen, "stopped_at_eos": stopped, "output": text,
             "n_tokens": len(ids_re), "loop": None if lp is None else vars(lp),
             "loop_raw_ids": None if lp_raw is None else vars(lp_raw), "seconds": round(time.time() - t2, 1)}
        results.append(r)
        where = "clean" if lp is None else f"LOOP at token {lp.start}: span {lp.span} x {lp.copies}"
        print(f"{name:>6}  {len(gen):4d} gen / {len(ids_re):4d} retok  {where}"
              f"{'  (eos)' if stopped else ''}  [{r['seconds']}s]  {q['text'].splitlines()[0][:60]!r}", flush=True)

    v = [r for r in results if r["prompt"] != "demo"]
    clean = sum(r["loop"] is None for r in v)
    clean_raw = sum(r["loop_raw_ids"] is None for r in v)
    demo_clean = results[-1]["loop"] is None
    summary = {"clean": clean, "n": len(v), "demo_clean": demo_clean, "clean_raw_ids": clean_raw,
               "demo_clean_raw_ids": results[-1]["loop_raw_ids"] is None, "ppl_check": ppl, "ppl_tokens": cnt,
               "criterion_met": clean >= 15 and demo_clean, "rule": rule, "max_new": a.max_new,
               "seconds": round(time.time() - t0, 1)}
    print(f"loop-free: {clean}/{len(v)} validation prompts (raw ids: {clean_raw}/{len(v)}); "
          f"demo prompt {'clean' if demo_clean else 'LOOPS'}; issue 16 bar (>=15/16 + demo): "
          f"{'MET' if summary['criterion_met'] else 'NOT MET'}", flush=True)
    Path(a.out).write_text(json.dumps({**summary, "results": results}, indent=1, ensure_ascii=False) + "\n",
                           encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stage `package`: write OUT/demo/, the folder that becomes models/demo/.

    demo/config.json, generation_config.json   transformers' own save_pretrained output
                                               (text-only qwen3_5: model_type qwen3_5_text)
    demo/model-0000i-of-0000n.safetensors      bf16, `model.*` + `lm_head.weight` + the 15 `mtp.*`
    demo/model.safetensors.index.json          (shards <= 16 MiB; mtp.* in the last shard)
    demo/tokenizer.json, tokenizer_config.json
    demo/drafter/config.json, model.safetensors   DFlash2, published schema, bf16
    demo/validation_prompts.jsonl              64 prompts from validation files
    demo/MODEL_CARD.md

Then everything is loaded back the way a user would (transformers from_pretrained,
the tokenizer, MTPHead.load_mtp_tensors, dflash2_ref.load) and checked.
"""
from __future__ import annotations

import json
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

import common as C

N_PROMPTS = 64
PROMPT_MAX_CHARS = 200
PROMPT_MAX_LINES = 3


# ---------------------------------------------------------------------------
# validation prompts
# ---------------------------------------------------------------------------
def prompt_starts(text: str) -> list[tuple[str, int]]:
    """Candidate prompt starts of one file: its first non-empty line ('head'), then every
    line that starts a def / class statement ('def'), in file order."""
    lines = text.split("\n")
    out = []
    first = next((i for i, l in enumerate(lines) if l.strip()), None)
    if first is not None:
        out.append(("head", first))
    for i, l in enumerate(lines):
        if i != first and l.lstrip().startswith(("def ", "class ", "async def ")):
            out.append(("def", i))
    return out


def prompt_at(text: str, start: int) -> str:
    """Up to 3 consecutive non-empty lines from `start`, at most 200 characters, ending in '\\n'."""
    lines = text.split("\n")
    picked = []
    total = 0
    for l in lines[start : start + PROMPT_MAX_LINES]:
        if not l.strip():
            break
        if picked and total + len(l) + 1 > PROMPT_MAX_CHARS:
            break
        picked.append(l[:PROMPT_MAX_CHARS])
        total += len(picked[-1]) + 1
    return "\n".join(picked) + "\n"


def validation_prompts(val_texts: dict, n=N_PROMPTS, by_project=False):
    """Round-robin over validation files in sorted path order: pass 0 takes each file's head,
    pass k >= 1 each file's k-th def/class start, until n prompts (distinct texts).
    by_project (keys "project/path", the PyPI corpus): the file order alternates between
    projects, so the first prompts do not all come from the alphabetically first project."""
    files = sorted(val_texts)
    if by_project:
        groups: dict[str, list[str]] = {}
        for f in files:
            groups.setdefault(f.split("/", 1)[0], []).append(f)
        depth = max(len(g) for g in groups.values())
        files = [g[i] for i in range(depth) for g in groups.values() if i < len(g)]
    starts = {f: prompt_starts(val_texts[f]) for f in files}
    prompts, seen = [], set()
    k = 0
    while len(prompts) < n and any(k < len(s) for s in starts.values()):
        for f in files:
            if k < len(starts[f]) and len(prompts) < n:
                kind, line = starts[f][k]
                text = prompt_at(val_texts[f], line)
                if text.strip() and text not in seen:
                    seen.add(text)
                    prompts.append({"file": f, "kind": kind, "line": line + 1, "text": text})
        k += 1
    return prompts


DOC_PROMPT_MAX_CHARS = 600
DOC_PROMPT_MAX_LINES = 12


def docstring_functions(text: str) -> list[tuple[int, str]]:
    """Code-completion prompts of one file (rule `docfunc`): for every function or method, in
    source order (ast.walk is breadth-first, so sort by line), whose body starts with a docstring
    and has at least one statement after it: the source lines from the `def` line (decorators not
    included) through the docstring's last line, plus a newline, i.e. the cursor where the body's
    code starts. Skipped when that is over DOC_PROMPT_MAX_LINES lines or DOC_PROMPT_MAX_CHARS
    characters. Files that do not parse (with the running Python's ast) give nothing."""
    import ast

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    lines = text.split("\n")
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or len(node.body) < 2:
            continue
        d = node.body[0]
        if not (isinstance(d, ast.Expr) and isinstance(d.value, ast.Constant) and isinstance(d.value.value, str)):
            continue
        first, last = node.lineno - 1, d.end_lineno - 1  # 0-based, inclusive
        if last - first + 1 > DOC_PROMPT_MAX_LINES:
            continue
        prompt = "\n".join(lines[first : last + 1]) + "\n"
        if len(prompt) > DOC_PROMPT_MAX_CHARS:
            continue
        out.append((first, prompt))
    return sorted(out)


def docfunc_prompts(val_texts: dict, n=N_PROMPTS):
    """Rule `docfunc` (PyPI corpus, keys "project/path"): round-robin over the held-out projects in
    sorted order; each project yields its candidates in the order pass k = 0, 1, ...: the k-th
    docstring_functions() prompt of each of its files (sorted paths). Distinct texts only. So the
    first prompts cover every held-out project before any project gives a second one."""
    groups: dict[str, list[str]] = {}
    for f in sorted(val_texts):
        groups.setdefault(f.split("/", 1)[0], []).append(f)
    queues = {}
    for proj, files in groups.items():
        cands = {f: docstring_functions(val_texts[f]) for f in files}
        depth = max((len(c) for c in cands.values()), default=0)
        queues[proj] = [(f, k, *cands[f][k]) for k in range(depth) for f in files if k < len(cands[f])]
    prompts, seen, pos = [], set(), {p: 0 for p in queues}
    while len(prompts) < n and any(pos[p] < len(q) for p, q in queues.items()):
        for proj, q in queues.items():
            while pos[proj] < len(q) and len(prompts) < n:
                f, k, line, text = q[pos[proj]]
                pos[proj] += 1
                if text not in seen:
                    seen.add(text)
                    prompts.append({"file": f, "kind": "docfunc", "line": line + 1, "text": text})
                    break
    return prompts


# ---------------------------------------------------------------------------
def run(args, log):
    import torch
    from safetensors.torch import load_file

    out = Path(args.out)
    for st in ("corpus", "target", "mtp", "drafter"):
        C.require_stage(out, st)
    t0 = time.time()
    demo = out / "demo"
    if demo.exists():
        shutil.rmtree(demo)
    demo.mkdir(parents=True)
    mtp_ref = C.import_reference("mtp_ref")
    R = C.import_reference("dflash2_ref")

    # ---- target: transformers' own config/generation_config; weights sharded by us ----
    model = C.build_target(shape=C.target_shape_of(out))
    sd = {k: v.to(torch.bfloat16) for k, v in C.load_target(out, "cpu", dtype=torch.float32).state_dict().items()
          if "inv_freq" not in k}
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("inv_freq" in m for m in missing), (missing, unexpected)
    model = model.to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as td:
        model.save_pretrained(td, safe_serialization=True)
        for name in ("config.json", "generation_config.json"):
            if (Path(td) / name).exists():
                shutil.copy(Path(td) / name, demo / name)
        saved = {}
        for f in sorted(Path(td).glob("*.safetensors")):
            saved.update(load_file(str(f)))
    # the names and values transformers itself writes
    target_tensors = {k: saved[k].to(torch.bfloat16).contiguous() for k in saved}
    assert "lm_head.weight" in target_tensors and all(k.startswith(("model.", "lm_head.")) for k in target_tensors)
    for k, v in target_tensors.items():
        assert torch.equal(v, sd[k].to(torch.bfloat16)), k
    mtp_sd = load_file(str(out / "mtp" / "mtp.safetensors"))
    mtp_tensors = {k: mtp_sd[k].to(torch.bfloat16).contiguous() for k in mtp_ref.MTP_TENSOR_NAMES}
    tensors = dict(target_tensors)
    tensors.update(mtp_tensors)  # mtp.* last, hence in the last shard
    shards = C.save_sharded(tensors, demo, "model")
    cfg_json = C.read_json(demo / "config.json")
    assert cfg_json.get("model_type") == "qwen3_5_text", cfg_json.get("model_type")
    log(f"package: target {len(target_tensors)} tensors + {len(mtp_tensors)} mtp tensors -> {shards}")

    # ---- tokenizer ----
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(out / "tokenizer" / name, demo / name)

    # ---- drafter ----
    (demo / "drafter").mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(out / "drafter" / name, demo / "drafter" / name)

    # ---- validation prompts ----
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(demo / "tokenizer.json"))
    val_texts = C.read_json(out / "corpus" / "validation_texts.json")
    by_project = "projects" in C.read_json(out / "corpus" / "manifest.json")
    rule = args.prompt_rule if args.prompt_rule != "auto" else ("docfunc" if by_project else "heads")
    if rule == "docfunc":
        prompts = docfunc_prompts(val_texts)
        if len(prompts) < N_PROMPTS:  # top up with the heads rule
            seen = {p["text"] for p in prompts}
            prompts += [p for p in validation_prompts(val_texts, by_project=by_project) if p["text"] not in seen]
            prompts = prompts[:N_PROMPTS]
    else:
        prompts = validation_prompts(val_texts, by_project=by_project)
    with open(demo / "validation_prompts.jsonl", "w", encoding="utf-8") as f:
        for i, p in enumerate(prompts):
            ids = tok.encode(p["text"], add_special_tokens=False).ids
            f.write(json.dumps({"id": i, **p, "n_tokens": len(ids), "ids": ids}, ensure_ascii=False) + "\n")
    n_files_used = len({p["file"] for p in prompts})
    log(f"package: {len(prompts)} validation prompts from {n_files_used} validation files "
        f"(rule {rule}: {sum(p['kind'] == 'docfunc' for p in prompts)} signature+docstring, "
        f"{sum(p['kind'] == 'head' for p in prompts)} file heads)")
    if len(prompts) < N_PROMPTS:
        log(f"package: WARNING only {len(prompts)} prompts available (< {N_PROMPTS})")

    # ---- load back and check ----
    checks = verify(demo, out, args, log)

    if args.ship_int4:
        ship_int4(demo, args, log)
    # ---- model card (its file table lists the files as shipped: after the int4 rewrite) + the log ----
    write_card(demo, out, args, prompts, checks)
    shutil.copy(out / "train_log.txt", demo / "TRAIN_LOG.txt")
    for p in demo.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)  # safetensors writes 0600 files
    sizes = {str(p.relative_to(demo)): p.stat().st_size for p in sorted(demo.rglob("*")) if p.is_file()}
    weights = sum(v for k, v in sizes.items() if k.endswith(".safetensors"))
    assert all(v <= C.SHARD_LIMIT_BYTES for k, v in sizes.items() if k.endswith(".safetensors")), sizes
    assert weights < 32_000_000, weights
    log(f"package: wrote {demo} ({len(sizes)} files, weights {weights / 1e6:.2f} MB) in {time.time() - t0:.1f}s")
    for k, v in sizes.items():
        log(f"    {k:45s} {v:>10,d}")
    return {"files": sizes, "weights_bytes": weights, "checks": checks, "prompts": len(prompts)}


def ship_int4(demo: Path, args, log):
    """Rewrite the target + MTP shards in int4 (mlx layout, as `qflash quantize` writes them) and
    mark config.json; the drafter stays bf16. Runs after the bf16 load-back checks."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = {}
    shards = sorted(demo.glob("model*.safetensors"))
    for f in shards:
        tensors.update(load_file(str(f)))
    for f in shards:
        f.unlink()
    (demo / "model.safetensors.index.json").unlink(missing_ok=True)
    # the target's int4 tensors exactly as the target stage wrote them (re-quantizing the dequantized
    # values need not give the same codes); the MTP head is quantized here
    q = load_file(str(Path(args.out) / "target" / "model_int4.safetensors"))
    mtp = C.int4_state_dict({k: v for k, v in tensors.items() if k.startswith("mtp.")}, args.int4_group)
    assert set(C.dequantize_state_dict(q)) | {k for k in tensors if k.startswith("mtp.")} == set(tensors)
    q.update(mtp)
    names = C.save_sharded(q, demo, "model")
    u32 = [k for k in q if q[k].dtype in (torch.int32, torch.uint32)]
    for n in names:
        C.retag_u32(demo / n, u32)
    cfg = C.read_json(demo / "config.json")
    cfg["quantization"] = {"group_size": args.int4_group, "bits": 4, "mode": "affine"}
    C.write_json(demo / "config.json", cfg)
    # the dequantized shards are the weights MTP, gen and drafter were trained against
    back = C.dequantize_state_dict({k: v for n in names for k, v in load_file(str(demo / n)).items()}, args.int4_group)
    ref = C.load_target(Path(args.out), "cpu", dtype=torch.float32).state_dict()
    assert all(torch.equal(back[k].float(), ref[k]) for k in ref if "inv_freq" not in k), "int4 round trip differs"
    log(f"package: int4 (group {args.int4_group}): {len(u32)} matrices quantized -> {names}")


def verify(demo: Path, out: Path, args, log) -> dict:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM

    mtp_ref = C.import_reference("mtp_ref")
    R = C.import_reference("dflash2_ref")
    checks = {}
    # tokenizer through transformers
    hf_tok = AutoTokenizer.from_pretrained(str(demo))
    assert len(hf_tok) == C.VOCAB_SIZE, len(hf_tok)
    assert hf_tok.eos_token == "<|endoftext|>" and hf_tok.convert_tokens_to_ids("<|mask|>") == C.MASK_ID
    sample = "def f(x):\n    return x + 1  # ünïcödé\n"
    ids = hf_tok(sample, add_special_tokens=False)["input_ids"]
    assert hf_tok.decode(ids) == sample
    checks["tokenizer_roundtrip"] = True
    # target through from_pretrained (mtp.* is ignored by transformers), same logits as trained
    m = Qwen3_5ForCausalLM.from_pretrained(str(demo), dtype=torch.float32).eval()
    ref = C.load_target(out, "cpu", dtype=torch.float32)
    sd_a, sd_b = m.state_dict(), ref.state_dict()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_b), "reloaded target differs"
    val = C.load_tokens(out, "val")
    w = torch.from_numpy(np.asarray(val[:129], dtype=np.int64))[None]
    with torch.no_grad():
        lg = m(input_ids=w[:, :-1]).logits
        nll = torch.nn.functional.cross_entropy(lg[0], w[0, 1:]).item()
    checks["target_from_pretrained"] = True
    checks["target_first_window_nll"] = nll
    # mtp tensors in the published schema
    shard_tensors = {}
    for f in sorted(demo.glob("model*.safetensors")):
        shard_tensors.update(load_file(str(f)))
    tc = C.read_json(demo / "config.json")
    mtp = mtp_ref.MTPHead.from_text_config(tc).load_mtp_tensors(shard_tensors)
    assert sum(1 for k in shard_tensors if k.startswith("mtp.")) == 15
    checks["mtp_load_strict"] = True
    # drafter through the reference loader
    d = R.load(str(demo / "drafter"))
    dcfg = C.read_json(demo / "drafter" / "config.json")
    assert dcfg["architectures"] == ["DFlash2DraftModel"] and dcfg["model_type"] == "qwen3"
    assert d.cfg.mask_token_id == C.MASK_ID and d.cfg.block_size == 8
    dsd = load_file(str(demo / "drafter" / "model.safetensors"))
    assert all(v.dtype == torch.bfloat16 for v in dsd.values())
    assert "candidate_selector.predecessor_codebook" in dsd and "candidate_selector.successor_codebook" in dsd
    checks["drafter_tensors"] = len(dsd)
    checks["drafter_load"] = True
    # index file consistency
    idx = demo / "model.safetensors.index.json"
    if idx.exists():
        wm = C.read_json(idx)["weight_map"]
        assert set(wm) == set(shard_tensors), "index weight_map mismatch"
    log(f"package: load-back checks {checks}")
    return checks


def _fmt(x, nd=3):
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


PROMPT_RULE_TEXT = {
    "docfunc": "a held-out function's signature and docstring (the `def` line through the docstring's last "
               "line, then a newline: the cursor where the body starts; functions with a docstring and at "
               f"least one more statement, prompt <= {DOC_PROMPT_MAX_LINES} lines and {DOC_PROMPT_MAX_CHARS} "
               "characters), round-robin over the held-out projects in sorted order, each project taking the "
               "k-th such function of each of its files (sorted paths) in pass k.",
    "heads": "round-robin over the validation files in sorted order; pass 0 takes each file's first "
             "non-empty lines, later passes the k-th `def`/`class` line of each file; up to 3 consecutive "
             "non-empty lines, at most 200 characters, ending in a newline.",
}


def read_antiloop(out: Path):
    p = Path(out) / "antiloop" / "metrics.json"
    return C.read_json(p) if p.exists() else None


def antiloop_card_text(al) -> str:
    """The card's paragraph on stage `antiloop` (tools/train/stage_antiloop.py), or nothing."""
    if not al or al.get("skipped"):
        return ""
    c, b, a = al["config"], al["before"], al["after"]
    verdict = ("kept" if al["kept"] else
               f"discarded (held-out perplexity rose {al['val_ppl_rise'] * 100:.1f}%, over the "
               f"{c['antiloop_max_ppl_rise'] * 100:.0f}% allowed), so the target above is the one trained")
    return f"""
Antiloop fine-tune (`tools/train/stage_antiloop.py`, {verdict}): {al['steps']} steps in {al['train_seconds']:.0f} s from
the {al['start_from']} target; each step the next-token loss on {c['antiloop_mle_batch']} train windows plus
{c['antiloop_alpha']} x an unlikelihood term (Welleck et al. 2019) on {c['antiloop_ul_batch']} of the model's own greedy
{c['antiloop_new']}-token continuations of train-split line-start prompts: every continuation token inside a
repeated {c['antiloop_ngram']}-gram gets -log(1 - p). Measured on {c.get('antiloop_eval_prompts', '?')} train- and
validation-split line-start prompts, {c['antiloop_new']} greedy tokens, with the shipped rounding:

| | before | after |
|---|---|---|
| held-out perplexity | {b['val_ppl']:.3f} | {a['val_ppl']:.3f} |
| continuations with a loop (issue 16's definition), train prompts | {b['loops_train_prompts']:.3f} | {a['loops_train_prompts']:.3f} |
| continuations with a loop, validation prompts | {b['loops_val_prompts']:.3f} | {a['loops_val_prompts']:.3f} |
| continuation tokens inside a repeated 8-gram, validation prompts | {b['repeated8_share_val']:.3f} | {a['repeated8_share_val']:.3f} |
"""


def write_card(demo: Path, out: Path, args, prompts, checks):
    kinds = {p["kind"] for p in prompts}
    prompt_rule_text = PROMPT_RULE_TEXT["docfunc" if "docfunc" in kinds else "heads"]
    if "docfunc" in kinds and len(kinds) > 1:
        prompt_rule_text += " Topped up with the heads rule (`kind` head/def) when there were fewer than 64."
    man = C.read_json(out / "corpus" / "manifest.json")
    tm = C.read_json(out / "target" / "metrics.json")
    mm = C.read_json(out / "mtp" / "metrics.json")
    gm = C.read_json(out / "gen" / "meta.json")
    dm = C.read_json(out / "drafter" / "metrics.json")
    dcfg = C.read_json(demo / "drafter" / "config.json")
    runargs = C.read_json(C.stage_marker(out, "target")).get("args") or C.read_json(out / "args.json")
    stages = {}
    for st in ("corpus", "target", "mtp", "gen", "drafter"):
        p = C.stage_marker(out, st)
        if p.exists():
            stages[st] = C.read_json(p).get("wall_seconds")
    import torch
    import transformers

    tr, ho = dm["eval_train"], dm["eval_heldout"]

    def row(name, a, b):
        return f"| {name} | " + " ".join(f"{x:.3f}" for x in a) + " | " + " ".join(f"{x:.3f}" for x in b) + " |"

    files = sorted(p for p in demo.rglob("*") if p.is_file() and p.name not in ("MODEL_CARD.md", "TRAIN_LOG.txt"))
    ftable = "\n".join(
        f"| `{p.relative_to(demo)}` | {p.stat().st_size:,} | `{C.file_sha256(p)[:16]}…` |" for p in files)
    smoke_note = ("\n> **SMOKE RUN** (`--smoke`): tiny step counts on a corpus subset; these numbers mean "
                  "nothing. Retrain without `--smoke` for the real demo.\n" if args.smoke else "")
    tc = C.read_json(out / "target" / "shape.json")["config"] if (out / "target" / "shape.json").exists() \
        else C.target_config_dict("tiny")
    full = [i for i, t in enumerate(tc["layer_types"]) if t == "full_attention"]
    shape_text = (f"hidden {tc['hidden_size']},\n{tc['num_hidden_layers']} layers (full attention at "
                  f"{', '.join(map(str, full))}, Gated DeltaNet elsewhere), attention heads {tc['num_attention_heads']} / "
                  f"KV {tc['num_key_value_heads']} / head_dim 64,\npartial rotary 0.25, GDN key heads "
                  f"{tc['linear_num_key_heads']} / value heads {tc['linear_num_value_heads']} / dims 64, intermediate "
                  f"{tc['intermediate_size']}, vocab 8192")
    al = read_antiloop(out)
    if al and al.get("kept") and args.ship_int4:
        # what ships is the int4 rounding (quantization-aware or rounded afterwards); the latent float
        # weights of the fine-tune, in bf16, are not shipped and can be much worse (v6: 14.608 vs 13.314)
        latent = ("the fine-tune's latent float weights (trained through the int4 round trip, never shipped)"
                  if al.get("quantization_aware") else "the fine-tune's float weights before int4 rounding (not shipped)")
        ppl_row = (f"| **validation perplexity** | **{al['after']['val_ppl']:.3f}** with the shipped int4 weights after "
                   f"the antiloop fine-tune (before it: {al['before']['val_ppl']:.3f} with the int4 weights it started "
                   f"from); {tm['val_ppl_bf16']:.3f} for {latent} rounded to bf16; the first "
                   f"{al['after'].get('val_tokens', tm['val_tokens']):,} tokens of the held-out stream (the antiloop's "
                   f"window count; the target stage measured all {tm['val_tokens']:,}), non-overlapping {tm['seq']}-token windows |")
    elif al and al.get("kept"):
        ppl_row = (f"| **validation perplexity** | **{tm['val_ppl_bf16']:.3f}** with the shipped bf16 weights after the "
                   f"antiloop fine-tune (before it: {al['before']['val_ppl']:.3f}), "
                   f"{tm['val_tokens']:,} tokens, non-overlapping {tm['seq']}-token windows |")
    elif args.ship_int4 and tm.get("val_ppl_int4") is not None:
        others = "; ".join(f"{tm[k]:.3f} {what}" for k, what in (("val_ppl_bf16", "with the trained weights in bf16"),
                                                                    ("val_ppl_fp32", "fp32 master weights"))
                           if tm.get(k) is not None)
        ppl_row = (f"| **validation perplexity** | **{tm['val_ppl_int4']:.3f}** with the shipped int4 weights"
                   f"{f' ({others}; not shipped)' if others else ''}, {tm['val_tokens']:,} tokens, non-overlapping "
                   f"{tm['seq']}-token windows |")
    else:
        ppl_row = (f"| **validation perplexity** | **{tm['val_ppl_bf16']:.3f}** with the shipped bf16 weights "
                   f"({tm['val_ppl_fp32']:.3f} fp32 master weights), {tm['val_tokens']:,} tokens, non-overlapping "
                   f"{tm['seq']}-token windows |")
    antiloop_text = antiloop_card_text(al)
    if args.corpus_dir:
        reproduce_text = ("The corpus: `python3 tools/train/pypi_corpus.py --out data/pypi_corpus --pin "
                          "tools/train/pypi_corpus_manifest.json`; the training stages on the GPU machine in calls of "
                          "under 10 minutes through `tools/train/remote_v2.sh` (the commands of this run: "
                          "docs/experiments/demo_data.md; every stage's arguments are in `TRAIN_LOG.txt`).")
        corpus_note = "The corpus is fixed by the pinned manifest (project versions and wheel hashes)."
    else:
        reproduce_text = ("```\nbash tools/train/train_all.sh OUT --stage part1   # corpus + tokenizer, target, mtp\n"
                          "bash tools/train/train_all.sh OUT --stage part2   # gen, drafter, package -> OUT/demo\n```\n"
                          "(on the GPU machine through `tools/train/remote.sh`, see `docs/experiments/demo_training.md`).")
        corpus_note = "The corpus depends on the Python version whose stdlib is read."
    stored = "stored bf16"
    if args.ship_int4:
        q4 = tm.get("val_ppl_int4")
        stored = (f"stored int4 (mlx layout, group {args.int4_group}; MTP head too), validation perplexity of the "
                  f"int4 weights " + (f"{q4:.3f}" if q4 is not None else "not measured"))
    if "projects" in man:  # tools/train/pypi_corpus.py
        source = (f"the Python files of {man['n_projects']['kept']} permissively licensed pure-Python PyPI projects "
                  f"(`tools/train/pypi_corpus_manifest.json`)")
        data_section = (f"- Corpus: `tools/train/pypi_corpus.py` (docs/experiments/demo_data.md): licenses "
                        f"{man['licenses']}; filtered and deduplicated (exact and normalised-text hashes).\n"
                        f"- Split by project: `{man['split_rule']}`; {man['n_projects']['train']} train projects / "
                        f"{man['files']['train']} files / {man['tokens']['train']:,} tokens; "
                        f"{man['n_projects']['val']} held-out projects / {man['files']['val']} files / "
                        f"{man['tokens']['val']:,} tokens.")
    else:
        source = f"the Python source of the standard library of **Python {man['python_version']}** (`{man['stdlib']}`)"
        data_section = f"""- Corpus: every `*.py` under the stdlib directory above, excluding any directory named
  `site-packages`, `dist-packages` or `__pycache__` (nothing from site-packages is used, it is kept
  for evaluation); files that are not UTF-8 are skipped ({man['n_files_not_utf8']} of {man['n_files_found']}).
  Sorted relative paths, each file followed by `<|endoftext|>`.
- Split: `{man['split_rule']}` (relative POSIX path).
  Train {man['n_files']['train']} files / {man['bytes']['train']:,} bytes / {man['tokens']['train']:,} tokens;
  validation {man['n_files']['val']} files / {man['bytes']['val']:,} bytes / {man['tokens']['val']:,} tokens."""
    card = f"""# qflash demo models: small Qwen3.5-architecture target + MTP head + DFlash2 drafter
{smoke_note}
Trained from scratch by `tools/train/train_all.py` (see `docs/experiments/demo_training.md`) on
{source}.
They exist to exercise qflash end to end (tokenizer, hybrid GDN/attention target, MTP and
DFlash2 speculative decoding) on real, non-random weights. They write Python-looking code and
nothing else; there is no chat or instruction tuning (the chat special tokens exist but were never
trained).

## Data

{data_section}
- `validation_prompts.jsonl`: {len(prompts)} prompts (`text`, token `ids` without BOS, source `file`,
  1-based `line`, `kind`): {prompt_rule_text}

## Tokenizer

Byte-level BPE trained with `tokenizers` on the train split: NFC normalizer; pre-tokenizer
Sequence[Split(Qwen3.5 regex, Isolated), ByteLevel(add_prefix_space=false, use_regex=false)];
ByteLevel decoder. {C.N_BPE} BPE ids (0..{C.N_BPE - 1}) + specials
`<|endoftext|>` {C.EOT_ID}, `<|im_start|>` {C.IM_START_ID}, `<|im_end|>` {C.IM_END_ID},
`<think>` {C.THINK_ID}, `</think>` {C.END_THINK_ID}, `<|mask|>` {C.MASK_ID} (drafter mask token) = {C.VOCAB_SIZE} ids.
No BOS is ever added; eos = `<|endoftext|>` (generation stops on {C.EOT_ID} and {C.IM_END_ID}).

## Target (`config.json`, `model-*.safetensors`)

`Qwen3_5ForCausalLM` (transformers {transformers.__version__}), shape `{tm.get('shape', 'tiny')}`: {shape_text},
rope theta 1e7, untied; {tm['params']:,} parameters, {stored}.

| | |
|---|---|
| steps | {tm['steps']} (planned {tm['steps_planned']}) × {tm['batch']} sequences × {tm['seq']} tokens = {tm['tokens_seen']:,} tokens |
| optimizer | AdamW (0.9, 0.95), lr {tm['lr']} warmup {runargs['target_warmup']} + cosine to 10%, wd {runargs['target_wd']} on matrices, clip 1.0, bf16 autocast |
| kept checkpoint | step {tm.get('kept_step', tm['steps'])}: lowest validation perplexity among evaluations every {runargs.get('target_eval_every')} steps (curve: {', '.join(f"{st}: {pp:.2f}" for st, pp in tm.get('val_curve', []))}) |
| train time | {tm['train_seconds']:.0f} s |
| final train loss | {tm['final_train_loss']:.4f} |
{ppl_row}
{antiloop_text}
## MTP head (`mtp.*` in the last shard)

One layer, published Qwen3.5/3.8 schema (15 tensors), `tools/reference/mtp_ref.py` `MTPHead`,
trained {mm['steps']} steps ({mm['train_seconds']:.0f} s) on the frozen target: pair j = (t_(j+1), post-final-norm H_j)
at position j predicts t_(j+2) (cross-entropy, teacher forced, single step).

| validation (bf16 weights) | |
|---|---|
| loss | {mm['val_loss']:.4f} |
| top-1 vs corpus token | {mm['val_top1_vs_corpus']:.4f} |
| top-1 agreement with the target's greedy token (first-draft acceptance, teacher forced) | {mm['val_agree_with_target_greedy']:.4f} |
| MTP tau measured by qflash | TBD-by-qflash |

## DFlash2 drafter (`drafter/`)

`tools/reference/dflash2_ref.py`, published schema (`DFlash2DraftModel`, `model_type` qwen3, bare codebooks, bf16):
{dcfg['num_hidden_layers']} layers, hidden {dcfg['hidden_size']}, heads {dcfg['num_attention_heads']}/{dcfg['num_key_value_heads']}/64, intermediate {dcfg['intermediate_size']}, `target_layer_ids`
{dcfg['dflash_config']['target_layer_ids']}, block 8, mask {dcfg['dflash_config']['mask_token_id']}, conv Kc
{dcfg['dflash_config']['conv_kernel_size']} group {dcfg['dflash_config']['conv_group_size']}, selector rank
{dcfg['dflash_config']['selector_rank']} top-K {dcfg['dflash_config']['selector_top_k']}, sliding window
{dcfg['sliding_window']} (non-causal); {dm['params']:,} parameters (embedding and LM head borrowed from the target).

Self-distillation data: {gm['stats']['train']['sequences']:,} greedy target continuations
({gm['stats']['train']['distinct_continuations']:,} distinct) of {gm['new_tokens']} tokens after random
{gm['prompt_len']}-token windows of the train split; held out: {gm['stats']['heldout']['sequences']:,}
continuations of windows of the validation split. Training: {dm['steps']} steps × {dm['batch']} sequences ×
{dm['anchors_per_seq']} random anchors in the continuation ({dm['epochs']:.1f} epochs), slot weights
exp(-(k-1)/{dm['gamma']}), selector loss weight {dm['alpha']}, AdamW lr {dm['lr']}, {dm['train_seconds']:.0f} s;
final loss {dm['final_loss']:.4f} (base {dm['final_base_loss']:.4f}, selector {dm['final_selector_loss']:.4f}).

Evaluation with an anchor at every continuation position whose block fits, bf16 weights, fp32 math
({tr['sequences']} train / {ho['sequences']} held-out sequences):

| metric (slots 1..7) | train | held-out |
|---|---|---|
{row('unary top-1', tr['slot_top1'], ho['slot_top1'])}
{row('selector top-1 (teacher forced)', tr['slot_selector_top1'], ho['slot_selector_top1'])}
{row('label in top-16', tr['slot_recall_top16'], ho['slot_recall_top16'])}

| acceptance length (anchor counts 1, max 8) | train | held-out |
|---|---|---|
| tau_walk: greedy selector walk, mean over all anchors | {tr['tau_walk']:.3f} | {ho['tau_walk']:.3f} |
| tau_unary: per-slot argmax, no selector | {tr['tau_unary']:.3f} | {ho['tau_unary']:.3f} |
| tau_oracle: label in top-16 | {tr['tau_oracle_top16']:.3f} | {ho['tau_oracle_top16']:.3f} |
| tau_sim: replayed greedy speculative decode, mean of per-request means | {tr['tau_sim']:.3f} | {ho['tau_sim']:.3f} |
| tau measured by qflash on `validation_prompts.jsonl` | | TBD-by-qflash |
| speedup measured by qflash | | TBD-by-qflash |

## Reproduce

{reproduce_text}

seed {runargs['seed']}; Python {man.get('python_version', platform.python_version())}, torch {torch.__version__}, transformers {transformers.__version__};
stage wall times (s): {json.dumps({k: round(v, 1) for k, v in stages.items() if v is not None})}.
GPU kernels are not bit-deterministic, so a rerun gives close but not identical weights.
{corpus_note}

## Files

`TRAIN_LOG.txt` is the complete log of the run that produced these files.

| file | bytes | sha256 |
|---|---|---|
{ftable}
"""
    (demo / "MODEL_CARD.md").write_text(card, encoding="utf-8")

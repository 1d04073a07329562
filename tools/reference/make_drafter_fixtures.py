"""Build tiny random DFlash2 drafters + tiny random target matrices and dump the parity
fixtures the C++ engine must match.  Also runs the reference's self-tests.

    python3 tools/reference/make_drafter_fixtures.py --out tests/fixtures/drafter

Writes
  <out>/micro/config.json, model.safetensors            DFlash2 drafter (bf16)
  <out>/micro/target_embed_head.safetensors             embed_tokens, lm_head [512, 128] bf16
  <out>/micro/reference.safetensors                     cases 0, 1 (micro) and 2 (micro_v1), fp32/int32
  <out>/micro/reference_kvbf16.safetensors              the same cases with the context K/V cache in bf16
  <out>/micro_v1/config.json, model.safetensors         DFlash v1 drafter (same backbone, no conv/selector)
See tools/reference/README_dflash2.md for the key conventions.

    python3 tools/reference/make_drafter_fixtures.py --out tests/fixtures/drafter --kvbf16-only

writes only reference_kvbf16.safetensors, from the checkpoints and case inputs already in --out.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dflash2_ref as R  # noqa: E402

torch.use_deterministic_algorithms(True)
SEED = 20260818
V, H, NT_LAYERS = 512, 128, 4
TAPS = [0, 2, 3]
B, W, TOPK = 8, 16, 16


# --------------------------------------------------------------------------------------
# configs and random weights
# --------------------------------------------------------------------------------------

def micro_config(v2: bool = True) -> R.DFlash2Config:
    dc = dict(block_size=B, mask_token_id=511, target_layer_ids=TAPS)
    if v2:
        dc.update(conv_kernel_size=2, conv_group_size=16, selector_rank=16, selector_top_k=TOPK)
    return R.DFlash2Config(
        architectures=[R.V2_ARCH if v2 else R.V1_ARCH],
        hidden_size=H, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, vocab_size=V, num_target_layers=NT_LAYERS,
        layer_types=["sliding_attention"] * 2, sliding_window=W, use_sliding_window=True,
        max_window_layers=2, max_position_embeddings=4096, is_causal=False,
        bos_token_id=None, eos_token_id=510, pad_token_id=510,
        rope_parameters={"rope_theta": 10000000, "rope_type": "default"}, rms_norm_eps=1e-6,
        dflash_config=dc)


def bf16r(t: torch.Tensor) -> torch.Tensor:
    """Round to bf16-representable values, keep fp32."""
    return t.bfloat16().float()


@torch.no_grad()
def randomize(model: R.DFlash2Drafter, g: torch.Generator) -> None:
    def n(shape, std, mean=0.0):
        return torch.randn(shape, generator=g) * std + mean
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            v = n(p.shape, 0.1, 1.0)
        elif name.endswith("base_kernel"):
            v = torch.empty(p.shape)
            v[:, 0, :] = n(v[:, 0, :].shape, 0.1, 1.0)
            v[:, 1:, :] = n(v[:, 1:, :].shape, 0.3)
        elif name.endswith("kernel_projection.weight"):
            v = n(p.shape, 0.03)
        elif name == "fc.weight":
            v = n(p.shape, 0.05)
        elif name.endswith("down_proj.weight"):
            v = n(p.shape, 0.06)
        elif name.endswith("_codebook"):
            v = n(p.shape, 0.3)
        elif name.endswith("hidden_projection.weight"):
            v = n(p.shape, 0.15)
        else:
            v = n(p.shape, 0.08)
        p.copy_(bf16r(v))


def v1_from(model: R.DFlash2Drafter) -> R.DFlash2Drafter:
    m1 = R.DFlash2Drafter(micro_config(v2=False))
    sd = {k: v for k, v in model.state_dict().items()
          if "_conv." not in k and not k.startswith("candidate_selector.")}
    m1.load_state_dict(sd, strict=True)
    return m1


def with_config(model: R.DFlash2Drafter, **changes) -> R.DFlash2Drafter:
    cfg = copy.deepcopy(model.cfg)
    for k, v in changes.items():
        setattr(cfg, k, v)
    m = R.DFlash2Drafter(cfg)
    m.load_state_dict(model.state_dict(), strict=True)
    return m


# --------------------------------------------------------------------------------------
# cases
# --------------------------------------------------------------------------------------

def run_case(model, embed, head, taps, anchor, start) -> dict:
    r = model.draft(embed, head, anchor, start, taps=taps)
    out = r["out"]
    d = {
        "taps": taps, "anchor": torch.tensor([anchor]), "start": torch.tensor([start]),
        "ctx_positions": out.ctx_positions, "block_ids": out.block_ids,
        "ctx": out.ctx, "logits": out.logits[1:], "final_hidden": out.hidden[1:],
        "drafts": r["drafts"],
    }
    for l, lo in enumerate(out.layer_out):
        d[f"layer{l}.out"] = lo
    if model.is_v2:
        d.update(cand_ids=r["cand_ids"], cand_logits=r["cand_logits"], scores=r["scores"],
                 choice=r["choice"], edges=r["edges"])
    else:
        cl, ci = R.topk_sorted(out.logits[1:], TOPK)
        d.update(cand_ids=ci, cand_logits=cl)
    return d


def to_fixture(prefix: str, d: dict) -> dict:
    res = {}
    for k, v in d.items():
        v = v.detach().cpu()
        v = v.to(torch.int32) if not v.is_floating_point() else v.float()
        res[f"{prefix}.{k}"] = v.contiguous().clone()
    return res


def margins(d: dict, tie_pair=None) -> dict:
    """Smallest gaps that a slightly different fp32 computation could flip."""
    cl = d["logits"]
    top = torch.sort(cl, dim=-1, descending=True).values
    res = {"topk_boundary_gap": float((top[:, TOPK - 1] - top[:, TOPK]).min())}
    gaps = (d["cand_logits"][:, :-1] - d["cand_logits"][:, 1:])
    ci = d["cand_ids"]
    if tie_pair is not None:
        is_tie = (ci[:, :-1] == tie_pair[0]) & (ci[:, 1:] == tie_pair[1])
        gaps = torch.where(is_tie, torch.full_like(gaps, float("inf")), gaps)
    res["cand_order_gap"] = float(gaps.min())
    if "scores" in d:
        s = d["scores"].clone()
        ch = d["choice"].long()
        best = s.gather(-1, ch[:, None]).squeeze(-1)
        s.scatter_(-1, ch[:, None], float("-inf"))
        if tie_pair is not None:
            s = torch.where(ci == tie_pair[1], torch.full_like(s, float("-inf")), s)
        res["walk_choice_gap"] = float((best - s.max(-1).values).min())
    else:
        res["argmax_gap"] = float((top[:, 0] - top[:, 1]).min())
    return res



SEARCH = 2000
MIN_GAP = 1e-2          # walk choice (v2) and argmax (v1) margins: the drafts
MIN_BOUNDARY_GAP = 3e-3  # 16th vs 17th logit: the candidate set
MIN_ORDER_GAP = 3e-4    # adjacent candidates (the deliberate tie excluded): the candidate order


@torch.no_grad()
def build(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    model = R.DFlash2Drafter(micro_config(v2=True))
    randomize(model, g)
    embed = bf16r(torch.randn(V, H, generator=g) * 0.3)
    head = bf16r(torch.randn(V, H, generator=g) * 0.1)
    cases_in = []
    for n_ctx, start in ((5, 5), (15, 40)):
        taps = bf16r(torch.randn(n_ctx, len(TAPS) * H, generator=g))
        anchor = int(torch.randint(0, 510, (1,), generator=g))
        cases_in.append((taps, anchor, start))
    # deliberate exact tie: token dst (> src) gets src's lm_head and codebook rows, src being
    # the walk's pick at some slot of case 1
    d1 = run_case(model, embed, head, *cases_in[1])
    used = {cases_in[0][1], cases_in[1][1], 511}
    slot = next((j for j in (3, 2, 4, 1, 5, 6, 0) if int(d1["drafts"][j]) < 500), 0)
    src = int(d1["drafts"][slot])
    dst = next(t for t in range(509, src, -1) if t not in used and t not in d1["cand_ids"].flatten().tolist())
    head[dst] = head[src]
    sel = model.candidate_selector
    sel.successor_codebook[dst] = sel.successor_codebook[src]
    sel.predecessor_codebook[dst] = sel.predecessor_codebook[src]
    model_v1 = v1_from(model)
    outs = {i: run_case(model, embed, head, *cases_in[i]) for i in range(2)}
    outs[2] = run_case(model_v1, embed, head, *cases_in[1])
    return dict(model=model, model_v1=model_v1, embed=embed, head=head, cases_in=cases_in, outs=outs,
                tie=(src, dst), slot=slot)


# --------------------------------------------------------------------------------------
# self-tests
# --------------------------------------------------------------------------------------

RESULTS = []


def check(name: str, ok: bool, detail: str = "") -> None:
    RESULTS.append((name, ok, detail))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""), flush=True)
    if not ok:
        raise SystemExit(f"self-test failed: {name} {detail}")


def published_27b_config() -> R.DFlash2Config:
    return R.DFlash2Config.from_dict({
        "architectures": ["DFlash2DraftModel"], "model_type": "qwen3", "attention_bias": False,
        "attention_dropout": 0.0, "is_causal": False, "bos_token_id": None, "eos_token_id": 248044,
        "pad_token_id": 248044, "dtype": "bfloat16", "transformers_version": "5.15.0",
        "hidden_size": 5120, "intermediate_size": 17408, "hidden_act": "silu", "num_hidden_layers": 5,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "num_target_layers": 64,
        "layer_types": ["sliding_attention"] * 5, "sliding_window": 2048, "use_sliding_window": True,
        "max_window_layers": 5, "max_position_embeddings": 262144,
        "rope_parameters": {"rope_theta": 10000000, "rope_type": "default"}, "rms_norm_eps": 1e-6,
        "initializer_range": 0.02, "tie_word_embeddings": False, "use_cache": True, "vocab_size": 248320,
        "dflash_config": {"block_size": 8, "mask_token_id": 248070, "target_layer_ids": [5, 19, 33, 47, 61],
                          "conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 256,
                          "selector_top_k": 16}})


def test_config() -> None:
    check("build_target_layer_ids(64,5) == [1,16,31,46,61]", R.build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61])
    check("build_target_layer_ids ties to even (7,3) -> [1,2,4]", R.build_target_layer_ids(7, 3) == [1, 2, 4])
    check("build_target_layer_ids(8,2) == [1,5], (8,1) == [4]",
          R.build_target_layer_ids(8, 2) == [1, 5] and R.build_target_layer_ids(8, 1) == [4])
    c = published_27b_config()
    ok = (c.is_v2 and c.block_size == 8 and c.mask_token_id == 248070 and c.target_layer_ids == [5, 19, 33, 47, 61]
          and c.conv_groups == 320 and c.selector_rank == 256 and c.rope_theta == 1e7 and c.layer_window(4) == 2048
          and not c.layer_is_causal(0) and c.output_multiplier == 1.0 and c.final_logit_softcapping == 0.0)
    check("published 27B config resolves", ok)
    c2 = R.DFlash2Config.from_json(c.to_json())
    check("config json round trip", c2 == c and json.loads(c2.to_json()) == json.loads(c.to_json()))
    # lookup rules: dflash_config wins; block_size default 16; default taps
    d = json.loads(c.to_json())
    d["block_size"] = 4
    d["output_multiplier"] = 0.5
    del d["dflash_config"]["target_layer_ids"]
    c3 = R.DFlash2Config.from_dict(d)
    ok = c3.block_size == 8 and c3.output_multiplier == 0.5 and c3.target_layer_ids == [1, 16, 31, 46, 61]
    del d["dflash_config"]["block_size"], d["block_size"]
    ok = ok and R.DFlash2Config.from_dict(d).block_size == 16
    check("lookup rules (dflash_config wins, block 16 default, default taps)", ok)
    # shapes / parameter count of the published checkpoint (§1.3) and the tiny drafter (§8)
    with torch.device("meta"):
        m = R.DFlash2Drafter(c)
    n = sum(p.numel() for p in m.parameters())
    names = list(m.state_dict().keys())
    check("27B drafter: 81 tensors, 1,924,404,480 params", len(names) == 81 and n == 1924404480, f"{len(names)} / {n:,}")
    tiny = R.DFlash2Config(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=64, vocab_size=8192, num_target_layers=8,
                           layer_types=["sliding_attention"] * 2, sliding_window=64,
                           dflash_config=dict(block_size=8, mask_token_id=8191, target_layer_ids=[1, 3, 5],
                                              conv_kernel_size=2, conv_group_size=16, selector_rank=32,
                                              selector_top_k=16))
    with torch.device("meta"):
        m = R.DFlash2Drafter(tiny)
    n = sum(p.numel() for p in m.parameters())
    check("spec §8 tiny drafter: 36 tensors, 2,373,376 params", len(m.state_dict()) == 36 and n == 2373376, f"{n:,}")


def test_topk_ties() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 6, (64, 40), generator=g).float()          # heavy ties
    vals, ids = R.topk_sorted(x, 7)
    ok = True
    for r in range(x.shape[0]):
        ref = sorted(range(x.shape[1]), key=lambda i: (-float(x[r, i]), i))[:7]
        ok &= ids[r].tolist() == ref and vals[r].tolist() == [float(x[r, i]) for i in ref]
    am = R.argmax_lowest(x)
    ok2 = all(int(am[r]) == min(i for i in range(40) if x[r, i] == x[r].max()) for r in range(64))
    check("topk_sorted order (logit desc, id asc) incl. boundary ties; argmax lowest id", ok and ok2)


def train_vs_infer(model, embed, head, g, label: str, docs: bool = False) -> None:
    """Batched training form vs the one-block inference form, same anchors/context."""
    N, S = 2, 48
    cfg = model.cfg
    Wn = cfg.sliding_window
    taps = bf16r(torch.randn(N, S, len(TAPS) * H, generator=g))
    toks = torch.randint(0, V - 1, (N, S), generator=g)
    anchors = torch.tensor([[0, 3, 10, 20, 21, 30, 44], [47, 17, 1, 33, 34, 35, 5]])
    pos_ids = doc_ids = None
    if docs:
        doc_ids = (torch.arange(S) >= 20).long().expand(N, S).clone()
        pos_ids = torch.where(doc_ids == 0, torch.arange(S), torch.arange(S) - 20)
    with torch.no_grad():
        out = model.forward_train(taps, toks, anchors, embed, head, position_ids=pos_ids, doc_ids=doc_ids,
                                  return_logits=True)
        full_logits = model.compute_logits(out.hidden, head)
    worst = 0.0
    for n in range(N):
        for ai, a in enumerate(anchors[n].tolist()):
            lo = 0
            if docs:
                lo = 0 if a < 20 else 20
            p = torch.arange(S) if pos_ids is None else pos_ids[n]
            variants = [(lo, a)]                                      # whole history (window masks)
            if all(cfg.layer_window(l) is not None for l in range(cfg.num_hidden_layers)):
                variants.append((max(lo, a - (Wn - 1)), a))           # last W-1 rows (engine cache)
            for (c0, c1) in variants:
                with torch.no_grad():
                    ref = model.forward_block(embed, head, int(toks[n, a]), int(p[a]), taps=taps[n, c0:c1],
                                              ctx_positions=p[c0:c1])
                worst = max(worst, float((ref.logits - full_logits[n, ai]).abs().max()),
                            float((ref.hidden - out.hidden[n, ai]).abs().max()))
    check(f"training form == inference form ({label})", worst < 1e-4, f"max |diff| {worst:.2e}")


def brute_loss(model, out, head, gamma):
    """Loop-level recomputation of dflash_loss (base + selector) from the spec text."""
    logits = model.compute_logits(out.hidden[:, :, 1:], head)
    sel = model.candidate_selector
    num_b = den_b = num_s = den_s = 0.0
    N, A, J = out.labels.shape
    for n in range(N):
        for a in range(A):
            for j in range(J):
                if not out.label_valid[n, a, j]:
                    continue
                w = torch.exp(torch.tensor(-(j) / gamma))                 # slot k = j+1
                lg = logits[n, a, j]
                lab = int(out.labels[n, a, j])
                num_b = num_b + w * (torch.logsumexp(lg, 0) - lg[lab])
                den_b = den_b + w
                if sel is None:
                    continue
                order = sorted(range(lg.numel()), key=lambda i: -float(lg[i]))[: sel.top_k]
                if lab not in order:
                    continue
                P = sel.project(out.hidden[n, a, j + 1])
                pred = int(out.predecessors[n, a, j])
                s = torch.stack([lg[c] + (sel.predecessor_codebook[pred] * P * sel.successor_codebook[c]).sum()
                                 for c in order])
                num_s = num_s + w * (torch.logsumexp(s, 0) - s[order.index(lab)])
                den_s = den_s + w
    return num_b / den_b, (num_s / den_s if sel is not None else None)


def test_loss(model, embed, head, g) -> None:
    N, S, A = 3, 40, 6
    taps = bf16r(torch.randn(N, S, len(TAPS) * H, generator=g))
    toks = torch.randint(0, V - 1, (N, S), generator=g)
    lm = torch.rand(N, S, generator=g) > 0.15
    anchors, av = R.sample_anchors(lm, A, B, generator=g)
    check("sample_anchors: sorted, loss_mask=1, not in last B positions",
          bool(((anchors[:, 1:] >= anchors[:, :-1]) | ~av[:, 1:]).all()
               and lm.gather(1, anchors)[av].all() and (anchors[av] < S - B).all()))
    anchors[0, -1] = S - 3                                           # block runs past the end
    av[0, -1] = True
    # make a few labels hit the top-K: teach tokens from the model's own argmax
    with torch.no_grad():
        o = model.forward_train(taps, toks, anchors, embed, head, anchor_valid=av, loss_mask=lm, return_logits=True)
        am = o.logits.argmax(-1)
        for n in range(N):
            for a in range(A):
                if av[n, a] and a % 2 == 0:
                    for j in range(B - 1):
                        if anchors[n, a] + j + 1 < S:
                            toks[n, anchors[n, a] + j + 1] = am[n, a, j]
    gamma = 4.0
    for chunk in (None, 4):
        model.zero_grad(set_to_none=True)
        o = model.forward_train(taps, toks, anchors, embed, head, anchor_valid=av, loss_mask=lm)
        r = R.dflash_loss(model, o, head, gamma=gamma, alpha=1.0, chunk_blocks=chunk)
        r["loss"].backward()
        grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        if chunk is None:
            r0, g0 = r, grads
            with torch.no_grad():
                bb, bs = brute_loss(model, o, head, gamma)
            ok = abs(r["base_loss"].item() - float(bb)) < 1e-4
            if bs is not None:
                ok &= abs(r["selector_loss"].item() - float(bs)) < 1e-4
            check(f"dflash_loss == loop-level recomputation ({'v2' if model.is_v2 else 'v1'})", ok,
                  f"base {r['base_loss'].item():.5f}/{float(bb):.5f}"
                  + (f", selector {r['selector_loss'].item():.5f}/{float(bs):.5f}" if bs is not None else ""))
            lab_ok = not bool(o.label_valid[0, -1, 2:].any())          # anchor S-3: slots 3..7 past the end
            check("labels past the end of the sequence are masked", lab_ok)
            fin = all(torch.isfinite(v).all() for v in grads.values())
            need = [k for k in dict(model.named_parameters())
                    if ("kernel_projection" in k or "base_kernel" in k or "codebook" in k or k == "fc.weight")]
            nz = all(k in grads and float(grads[k].abs().sum()) > 0 for k in need)
            check("gradients finite and reach fc, convs, codebooks", fin and nz)
            print(f"    metrics: acc/slot {[round(x, 3) for x in r['acc'].tolist()]}, recall@16 "
                  f"{[round(x, 3) for x in r['recall'].tolist()]}, tau_unary {float(r['tau_unary']):.3f}, "
                  f"tau_walk {float(r['tau_walk']):.3f}, tau_oracle {float(r['tau_oracle']):.3f}")
        else:
            same = abs(r["loss"].item() - r0["loss"].item()) < 1e-5 and all(
                torch.allclose(grads[k], g0[k], atol=1e-5, rtol=1e-4) for k in g0)
            check("chunked (checkpointed) loss == unchunked, incl. grads", same)
    if model.is_v2:
        # selector_detach: the selector term must not reach the backbone
        model.zero_grad(set_to_none=True)
        o = model.forward_train(taps, toks, anchors, embed, head, anchor_valid=av, loss_mask=lm)
        R.dflash_loss(model, o, head, gamma=gamma, alpha=1.0, selector_detach=True)["loss"].backward()
        g_det = model.fc.weight.grad.clone()
        sel_g = model.candidate_selector.successor_codebook.grad is not None
        model.zero_grad(set_to_none=True)
        o = model.forward_train(taps, toks, anchors, embed, head, anchor_valid=av, loss_mask=lm)
        R.dflash_loss(model, o, head, gamma=gamma, alpha=0.0)["loss"].backward()
        check("selector_detach: backbone grads == base-loss-only grads; selector still trained",
              torch.allclose(g_det, model.fc.weight.grad, atol=1e-6) and sel_g)


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------

def write_kvbf16(out_dir: str) -> None:
    """The three cases again with the drafter's context K/V cache in bf16 (K and V rounded once, as
    qflash's bf16 cache does; everything else fp32), from the checkpoints and case inputs on disk."""
    micro_dir = os.path.join(out_dir, "micro")
    m = R.load(micro_dir)
    mv1 = R.load(os.path.join(out_dir, "micro_v1"))
    te = load_file(os.path.join(micro_dir, "target_embed_head.safetensors"))
    e, h = te["embed_tokens"].float(), te["lm_head"].float()
    ref = load_file(os.path.join(micro_dir, "reference.safetensors"))
    with safe_open(os.path.join(micro_dir, "reference.safetensors"), "pt") as f:
        tie_text = json.loads(f.metadata()["info"])["tie"]  # "token DST has the lm_head and codebook rows of token SRC: ..."
    words = tie_text.split()
    tie = (int(words[words.index("token", 2) + 1].rstrip(":")), int(words[1]))  # (src, dst)
    res, gaps = {}, {}
    for i, model in ((0, m), (1, m), (2, mv1)):
        model.kv_cache_dtype = torch.bfloat16
        with torch.no_grad():
            d = run_case(model, e, h, ref[f"case{i}.taps"], int(ref[f"case{i}.anchor"][0]), int(ref[f"case{i}.start"][0]))
        res.update(to_fixture(f"case{i}", d))
        gaps[f"case{i}"] = margins(d, tie)
        same = torch.equal(d["drafts"].to(torch.int32), ref[f"case{i}.drafts"])
        diff = float((d["logits"].float() - ref[f"case{i}.logits"]).abs().max() / ref[f"case{i}.logits"].abs().max())
        print(f"    kvbf16 case{i}: drafts {d['drafts'].tolist()} (fp32 cache: {'same' if same else 'differ'}), "
              f"logits vs fp32 cache {diff:.2e} of max|ref|, margins {gaps[f'case{i}']}")
    info = {"kv_cache": "bf16 (K and V rounded to bf16 once, round to nearest even; all else fp32)",
            "inputs": "reference.safetensors (taps, anchor, start of each case)", "margins": gaps}
    save_file(res, os.path.join(micro_dir, "reference_kvbf16.safetensors"),
              metadata={"info": json.dumps(info, sort_keys=True)})
    back = load_file(os.path.join(micro_dir, "reference_kvbf16.safetensors"))
    check("reference_kvbf16: written and read back bit-exactly", all(torch.equal(back[k], res[k]) for k in res))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/drafter")
    ap.add_argument("--kvbf16-only", action="store_true",
                    help="only write micro/reference_kvbf16.safetensors from the fixtures already in --out")
    args = ap.parse_args()
    torch.set_num_threads(1)  # tiny GEMMs; more threads only spin
    if args.kvbf16_only:
        write_kvbf16(args.out)
        return
    test_config()
    test_topk_ties()

    # ---- micro drafter + target matrices (seed searched for comfortable margins) -------
    seed, built = None, None
    for trial in range(SEARCH):
        cand = build(SEED + trial)
        m = [margins(cand["outs"][i], cand["tie"]) for i in range(3)]
        ok = all(x["cand_order_gap"] >= MIN_ORDER_GAP and x["topk_boundary_gap"] >= MIN_BOUNDARY_GAP
                 and x.get("walk_choice_gap", x.get("argmax_gap")) >= MIN_GAP for x in m)
        if ok:
            seed, built = SEED + trial, cand
            break
    if built is None:
        raise SystemExit("no seed with the required margins found")
    print(f"    seed {seed} (after {trial + 1} trials)")
    model, model_v1, embed, head = built["model"], built["model_v1"], built["embed"], built["head"]
    cases_in, outs, (src, dst), slot = built["cases_in"], built["outs"], built["tie"], built["slot"]
    res = {}
    for i in range(3):
        res.update(to_fixture(f"case{i}", outs[i]))

    # tie checks on case 1
    c = outs[1]
    ci = c["cand_ids"][slot].tolist()
    ok = (src in ci and dst in ci and ci.index(dst) == ci.index(src) + 1
          and float(c["cand_logits"][slot][ci.index(src)]) == float(c["cand_logits"][slot][ci.index(dst)])
          and float(c["scores"][slot][ci.index(src)]) == float(c["scores"][slot][ci.index(dst)])
          and int(c["drafts"][slot]) == src)
    check(f"fixture tie: tokens {src} and {dst} exactly tied in case1 slot {slot + 1}; order {src} first, walk picks {src}",
          ok)
    for i in range(3):
        print(f"    case{i} margins: {margins(outs[i], (src, dst))}")
        print(f"    case{i} drafts: {outs[i]['drafts'].tolist()}" +
              (f", choice {outs[i]['choice'].tolist()}" if 'choice' in outs[i] else ""))

    # ---- write -----------------------------------------------------------------------
    micro_dir = os.path.join(args.out, "micro")
    v1_dir = os.path.join(args.out, "micro_v1")
    R.save(model, micro_dir)
    R.save(model_v1, v1_dir)
    save_file({"embed_tokens": embed.bfloat16().contiguous(), "lm_head": head.bfloat16().contiguous()},
              os.path.join(micro_dir, "target_embed_head.safetensors"), metadata={"format": "pt"})
    info = {
        "case0": "checkpoint micro, n_ctx 5, start 5 (context positions 0..4)",
        "case1": "checkpoint micro, n_ctx 15, start 40 (context positions 25..39; window 16 crossed)",
        "case2": "checkpoint micro_v1 (DFlashDraftModel), inputs identical to case1",
        "target": "micro/target_embed_head.safetensors (used by all cases)",
        "tie": f"token {dst} has the lm_head and codebook rows of token {src}: exact ties, lower id first",
        "seed": str(seed),
        "margins": {f"case{i}": margins(outs[i], (src, dst)) for i in range(3)},
    }
    # one metadata key: safetensors writes metadata from a hash map, several keys reorder run to run
    meta = {"info": json.dumps(info, sort_keys=True)}
    save_file(res, os.path.join(micro_dir, "reference.safetensors"), metadata=meta)

    # ---- reload everything from disk and recompute ---------------------------------------
    m2 = R.load(micro_dir)
    m2v1 = R.load(v1_dir)
    te = load_file(os.path.join(micro_dir, "target_embed_head.safetensors"))
    e2, h2 = te["embed_tokens"].float(), te["lm_head"].float()
    ref = load_file(os.path.join(micro_dir, "reference.safetensors"))
    ok = True
    for i, m in ((0, m2), (1, m2), (2, m2v1)):
        with torch.no_grad():
            d = to_fixture(f"case{i}", run_case(m, e2, h2, ref[f"case{i}.taps"], int(ref[f"case{i}.anchor"][0]),
                                                int(ref[f"case{i}.start"][0])))
        ok &= all(torch.equal(d[k], ref[k]) for k in d) and set(d) == {k for k in ref if k.startswith(f"case{i}.")}
    with safe_open(os.path.join(micro_dir, "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        dtypes = {f.get_slice(k).get_dtype() for k in keys}
    bare = "candidate_selector.predecessor_codebook" in keys and "candidate_selector.successor_codebook" in keys
    with safe_open(os.path.join(v1_dir, "model.safetensors"), "pt") as f:
        keys_v1 = list(f.keys())
    ok_v1 = len(keys_v1) == 25 and not any("_conv" in k or "candidate" in k for k in keys_v1)
    check("save/load round trip reproduces every fixture tensor bit-exactly", ok)
    write_kvbf16(args.out)
    check("checkpoint: 36 bf16 tensors, bare codebook names; micro_v1: 25 tensors, no conv/selector",
          len(keys) == 36 and dtypes == {"BF16"} and bare and ok_v1, f"{len(keys)} {dtypes} / v1 {len(keys_v1)}")

    # ---- identity convs == v1 exactly -------------------------------------------------------
    mid = copy.deepcopy(model)
    R.init_conv_identity(mid)
    ok = True
    for taps, anchor, start in cases_in:
        with torch.no_grad():
            a = mid.forward_block(embed, head, anchor, start, taps=taps)
            b = model_v1.forward_block(embed, head, anchor, start, taps=taps)
        ok &= torch.equal(a.logits, b.logits) and torch.equal(a.hidden, b.hidden) and all(
            torch.equal(x, y) for x, y in zip(a.layer_out, b.layer_out))
    check("identity-initialised convs give exactly the v1 forward (bitwise, both cases)", ok)
    mw = R.DFlash2Drafter(micro_config(v2=True))
    R.warm_start_from_v1(mw, model_v1.state_dict())
    with torch.no_grad():
        a = mw.forward_block(embed, head, *cases_in[1][1:], taps=cases_in[1][0])
        b = model_v1.forward_block(embed, head, *cases_in[1][1:], taps=cases_in[1][0])
    check("warm_start_from_v1 reproduces the v1 logits", torch.equal(a.logits, b.logits))

    # ---- zero codebooks: walk == per-slot argmax --------------------------------------------
    mz = copy.deepcopy(model)
    with torch.no_grad():
        mz.candidate_selector.predecessor_codebook.zero_()
        mz.candidate_selector.successor_codebook.zero_()
    ok = True
    for taps, anchor, start in cases_in:
        r = mz.draft(embed, head, anchor, start, taps=taps)
        ok &= torch.equal(r["drafts"], R.argmax_lowest(r["out"].logits[1:])) and bool((r["choice"] == 0).all())
    check("zero codebooks: greedy walk == per-slot argmax (choice 0 everywhere)", ok)

    # ---- walk consistent with the VL edge table ---------------------------------------------
    r = model.draft(embed, head, cases_in[1][1], cases_in[1][2], taps=cases_in[1][0])
    E, ch = r["edges"], r["choice"]
    rows = torch.stack([E[0, 0]] + [E[j, ch[j - 1]] for j in range(1, B - 1)])
    check("walk scores == edge-table rows of the chosen predecessors", torch.allclose(rows, r["scores"], atol=1e-5),
          f"max |diff| {float((rows - r['scores']).abs().max()):.1e}")

    # ---- sampling at T>0 -------------------------------------------------------------------
    rs = model.draft(embed, head, cases_in[1][1], cases_in[1][2], taps=cases_in[1][0], temperature=0.7,
                     generator=torch.Generator().manual_seed(3))
    qok = torch.allclose(rs["q"].sum(-1), torch.ones(B - 1)) and all(
        int(rs["drafts"][j]) == int(rs["cand_ids"][j, rs["choice"][j]]) for j in range(B - 1))
    check("T>0 walk: q rows sum to 1, drafts are chosen candidates", qok)

    # ---- optional dflash_config scalars (§1.1): output_multiplier, softcap, embedding scale ------
    dc = dict(model.cfg.dflash_config, output_multiplier=0.5, final_logit_softcapping=3.0)
    mo = with_config(model, dflash_config=dc)
    taps, anchor, start = cases_in[1]
    with torch.no_grad():
        a = mo.forward_block(embed, head, anchor, start, taps=taps)
        b = model.forward_block(embed, head, anchor, start, taps=taps)
    ok = torch.allclose(a.logits, torch.tanh(b.logits * 0.5 / 3.0) * 3.0, atol=1e-6)
    me = with_config(model, dflash_config=dict(model.cfg.dflash_config, input_embedding_scale=2.0))
    with torch.no_grad():
        d = me.forward_block(embed, head, anchor, start, taps=taps)
    # scale 2 on every column == a table scaled by 2 (exact: power of two)
    ok &= not torch.equal(d.logits, b.logits) and torch.equal(
        d.logits, model.forward_block(embed * 2.0, head, anchor, start, taps=taps).logits)
    check("output_multiplier / softcap / input_embedding_scale applied as specified", ok)

    # ---- training form == inference form ----------------------------------------------------
    tg = torch.Generator().manual_seed(SEED + 1)
    train_vs_infer(model, embed, head, tg, "micro v2, window 16, overlapping anchors")
    train_vs_infer(model_v1, embed, head, tg, "micro v1")
    train_vs_infer(with_config(model, is_causal=True), embed, head, tg, "is_causal=true variant")
    train_vs_infer(with_config(model, layer_types=["full_attention", "sliding_attention"]), embed, head, tg,
                   "layer 0 full attention")
    train_vs_infer(model, embed, head, tg, "packed documents, restarted positions", docs=True)

    # ---- loss -------------------------------------------------------------------------------
    test_loss(copy.deepcopy(model), embed, head, torch.Generator().manual_seed(SEED + 2))
    test_loss(copy.deepcopy(model_v1), embed, head, torch.Generator().manual_seed(SEED + 3))

    for dp, _, fs in os.walk(args.out):
        for f in fs:
            os.chmod(os.path.join(dp, f), 0o644)
    size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(args.out) for f in fs)
    print(f"\nfixtures written to {args.out} ({size:,} bytes); {len(RESULTS)} self-tests passed")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Build tiny random qwen3_5 checkpoints and float32 parity fixtures for the C++ engine.

The target model is Hugging Face transformers' own Qwen3_5ForCausalLM; the MTP head is the
independent spec implementation in mtp_ref.py. See tools/reference/README.md.

    python3 tools/reference/make_target_fixtures.py --out tests/fixtures/target

Writes, per config NAME in {micro, odd}:
    <out>/NAME/config.json, generation_config.json, model.safetensors (bf16, text layout + mtp.*)
    <out>/NAME/reference.safetensors                 (float32 / int32 fixtures)
and <out>/micro_mm/ : the micro weights in the published multimodal layout (sharded + index).
CPU only, deterministic (seeded), runs with transformers 5.17 and 5.24.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import transformers  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig  # noqa: E402

from mtp_ref import MTP_TENSOR_NAMES, MTPHead, selftest_incremental, selftest_layer_vs_transformers  # noqa: E402
from target_ref import TargetRef  # noqa: E402

T = 40          # tokens in the fixture sequence
PREFIX = 8      # prefill length for the cached decode / greedy fixtures
GREEDY = 64     # greedy tokens
MTP_CHAIN = 3   # chained MTP draft steps after the last pair

ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
        "mrope_section": [3, 3, 2], "mrope_interleaved": True}


def _layer_types(n, full):
    return ["full_attention" if i in full else "linear_attention" for i in range(n)]


CONFIGS = {
    "micro": dict(
        seed=1234,
        text=dict(vocab_size=256, hidden_size=128, intermediate_size=128, num_hidden_layers=4,
                  layer_types=_layer_types(4, {3}),
                  num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                  linear_num_key_heads=1, linear_num_value_heads=2,
                  linear_key_head_dim=64, linear_value_head_dim=64, linear_conv_kernel_dim=4),
    ),
    "odd": dict(
        seed=4321,
        text=dict(vocab_size=300, hidden_size=192, intermediate_size=192, num_hidden_layers=4,
                  layer_types=_layer_types(4, {3}),
                  num_attention_heads=3, num_key_value_heads=1, head_dim=64,
                  linear_num_key_heads=1, linear_num_value_heads=3,
                  linear_key_head_dim=32, linear_value_head_dim=64, linear_conv_kernel_dim=4),
    ),
}
COMMON = dict(rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu",
              max_position_embeddings=4096, rope_parameters=ROPE, mtp_num_hidden_layers=1)

# Keys that the published Qwen3.5/3.6 text_config carries beyond what transformers writes; added to
# micro_mm's text_config so the C++ config parser meets them (transformers ignores them).
PUBLISHED_TEXT_EXTRAS = {"attn_output_gate": True, "full_attention_interval": 4, "mamba_ssm_dtype": "float32",
                         "mtp_use_dedicated_embeddings": False, "output_gate_type": "swish",
                         "partial_rotary_factor": 0.25}

CONVENTIONS = (
    "All fixtures come from one batch-1 sequence `tokens` at positions 0..T-1, float32 CPU, eager attention. "
    "prefill_logits[t] = logits after token t from one full forward (GDN chunked path). "
    "hidden.0 = token embeddings (no scaling); hidden.L (1 <= L < num_layers) = raw residual-stream output of "
    "decoder layer L-1 (no norm); hidden.<num_layers> is what transformers returns last in output_hidden_states, "
    "which is the POST-final-norm hidden (equal to final_hidden; see metadata hidden_last_is_post_norm); "
    "last_layer_out = raw output of the last decoder layer (pre final norm). "
    "final_hidden = model.norm output = lm_head input. "
    "step_logits[i] = logits after feeding token PREFIX+i one at a time with the cache, after a cached prefill "
    "of tokens[0:PREFIX] (GDN recurrent path); compare with prefill_logits[PREFIX+i]. "
    "greedy_tokens: greedy_tokens[0] = argmax of the last row of the PREFIX-token prefill, then each token is "
    "fed and the next argmax taken (63 cached decode steps); argmax = first max (lowest id on ties); "
    "greedy_margin[i] = top1 - top2 logit of the row that produced greedy_tokens[i]. "
    "mtp_logits[j], mtp_hidden[j] (Hm, post mtp.norm) = MTP head on pair (tokens[j+1], final_hidden[j]) at "
    "RoPE position j, causal over the head's own pairs 0..j, for j = 0..T-2. "
    "mtp_chain_tokens[0] = argmax mtp_logits[T-2]; then for i = 1..MTP_CHAIN the pair "
    "(mtp_chain_tokens[i-1], previous Hm) is fed at position T-2+i with the head's cache holding all earlier "
    "pairs; mtp_chain_logits[i-1] is its logits and mtp_chain_tokens[i] its argmax."
)


# ----------------------------------------------------------------------------------------------
# parameters
# ----------------------------------------------------------------------------------------------

ZC_NORM_SUFFIXES = ("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
                    "k_norm.weight")


def draw(name: str, shape, g: torch.Generator) -> torch.Tensor:
    """Random value for one parameter by name; every parameter must match a rule."""
    n = lambda std, mean=0.0: torch.randn(shape, generator=g) * std + mean  # noqa: E731
    if name.endswith("embed_tokens.weight"):
        return n(1.0)
    if name == "lm_head.weight":
        return n(0.1)
    if name.endswith("linear_attn.norm.weight"):         # plain gated RMSNorm weight, ~1
        return n(0.1, 1.0)
    if name.endswith("linear_attn.A_log"):
        return torch.log(torch.rand(shape, generator=g) * 15.0 + 1.0)   # A in U(1, 16)
    if name.endswith("linear_attn.dt_bias"):
        return n(0.5)
    if name.endswith("linear_attn.conv1d.weight"):
        return n(0.3)
    if name.endswith(ZC_NORM_SUFFIXES) or name in ("model.norm.weight",) or (
            name.startswith("mtp.") and "norm" in name and len(shape) == 1):
        return n(0.1)                                    # zero-centred: effective scale 1 + w
    if name.endswith("proj.weight") or name.endswith(("fc.weight", "in_proj_qkv.weight", "in_proj_z.weight",
                                                       "in_proj_a.weight", "in_proj_b.weight")):
        assert len(shape) == 2, name
        return n(0.08)
    raise KeyError(f"no randomization rule for parameter {name} {tuple(shape)}")


def bf16_round(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def mtp_shapes(tc: dict):
    H, nh, nkv, hd, I = (tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"],
                         tc["head_dim"], tc["intermediate_size"])
    p = "mtp.layers.0."
    return {
        "mtp.fc.weight": (H, 2 * H),
        "mtp.pre_fc_norm_embedding.weight": (H,),
        "mtp.pre_fc_norm_hidden.weight": (H,),
        "mtp.norm.weight": (H,),
        p + "input_layernorm.weight": (H,),
        p + "post_attention_layernorm.weight": (H,),
        p + "self_attn.q_proj.weight": (2 * nh * hd, H),
        p + "self_attn.k_proj.weight": (nkv * hd, H),
        p + "self_attn.v_proj.weight": (nkv * hd, H),
        p + "self_attn.o_proj.weight": (H, nh * hd),
        p + "self_attn.q_norm.weight": (hd,),
        p + "self_attn.k_norm.weight": (hd,),
        p + "mlp.gate_proj.weight": (I, H),
        p + "mlp.up_proj.weight": (I, H),
        p + "mlp.down_proj.weight": (H, I),
    }


# ----------------------------------------------------------------------------------------------
# transformers version shims (5.17 uses past_key_values, 5.24 uses cache)
# ----------------------------------------------------------------------------------------------

def _cache_kw(model) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _out_cache(out):
    c = getattr(out, "cache", None)
    if c is None:
        c = getattr(out, "past_key_values", None)
    assert c is not None, "no cache returned"
    return c


@torch.no_grad()
def fwd(model, ids, cache=None, **kw):
    args = {"input_ids": ids[None], "use_cache": cache is not None or kw.pop("use_cache", False)}
    if cache is not None:
        args[_cache_kw(model)] = cache
    args.update(kw)
    return model(**args)


def save_sorted(tensors: dict, path: str, metadata: dict):
    """Write a safetensors file with keys and metadata in sorted order, so that regenerating the
    fixtures gives byte-identical files (safetensors' own writer orders metadata arbitrarily)."""
    dt = {torch.float32: "F32", torch.int32: "I32", torch.bfloat16: "BF16"}
    header, blobs, off = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for k in sorted(tensors):
        t = tensors[k].contiguous().cpu()
        b = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[k] = {"dtype": dt[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little"))
        f.write(h)
        for b in blobs:
            f.write(b)
    back = load_file(path)
    assert all(torch.equal(back[k], tensors[k]) for k in tensors) and len(back) == len(tensors)


def rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def absd(a, b):
    return float((a - b).abs().max())


# ----------------------------------------------------------------------------------------------
# one config
# ----------------------------------------------------------------------------------------------

@torch.no_grad()
def build(name: str, spec: dict, out_root: str, checks_all: dict, write_mm: bool):
    seed = spec["seed"]
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    cfg = Qwen3_5TextConfig(**spec["text"], **COMMON)
    model = Qwen3_5ForCausalLM(cfg).float().eval()

    # --- randomize every parameter (sorted names: independent of module order / version) -------------
    params = dict(model.named_parameters())
    for pname in sorted(params):
        p = params[pname]
        with torch.no_grad():
            p.copy_(bf16_round(draw(pname, p.shape, g)))
    tc_dict = json.loads(cfg.to_json_string())
    mtp_t = {k: bf16_round(draw(k, s, g)) for k, s in mtp_shapes(tc_dict).items()}
    assert sorted(mtp_t) == sorted(MTP_TENSOR_NAMES)
    tokens = torch.randint(0, cfg.vocab_size, (T,), generator=g)

    # --- save the checkpoint: transformers' save, then add mtp.* to model.safetensors ---------------
    d = os.path.join(out_root, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    model.float()
    st_path = os.path.join(d, "model.safetensors")
    assert os.path.exists(st_path) and not os.path.exists(st_path + ".index.json"), os.listdir(d)
    with safe_open(st_path, "pt") as f:
        meta = f.metadata() or {}
    sd = load_file(st_path)
    for k, v in mtp_t.items():
        sd[k] = v.to(torch.bfloat16)
    save_file(dict(sorted(sd.items())), st_path, metadata=meta or {"format": "pt"})

    # --- reload in float32 / eager exactly as a user would --------------------------------------------
    m = Qwen3_5ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    for k, v in m.state_dict().items():
        ref = sd[k].float()
        assert torch.equal(v, ref), f"reloaded {k} differs"
    text_cfg = json.load(open(os.path.join(d, "config.json")))

    checks = {}
    # --- full prefill -----------------------------------------------------------------------------
    cap = {}
    hook = m.model.layers[-1].register_forward_hook(
        lambda mod, inp, out: cap.__setitem__("last", out[0] if isinstance(out, tuple) else out))
    out = fwd(m, tokens, output_hidden_states=True)
    hook.remove()
    prefill_logits = out.logits[0].float()
    hs = [h[0].float() for h in out.hidden_states]
    nl = cfg.num_hidden_layers
    assert len(hs) == nl + 1, len(hs)
    final_hidden = m.model.norm(cap["last"][0]).float()
    last_layer_out = cap["last"][0].float()
    hidden_last_is_post_norm = bool(torch.equal(hs[nl], final_hidden))
    checks["hidden_last_is_post_norm"] = hidden_last_is_post_norm
    checks["final_hidden_lm_head_rel"] = rel(torch.nn.functional.linear(final_hidden, m.lm_head.weight),
                                             prefill_logits)

    # --- cached prefill of the prefix + one-token steps ---------------------------------------------
    o = fwd(m, tokens[:PREFIX], use_cache=True)
    cache = _out_cache(o)
    checks["prefix_prefill_vs_full_rel"] = rel(o.logits[0], prefill_logits[:PREFIX])
    steps = []
    for i in range(PREFIX, T):
        o = fwd(m, tokens[i:i + 1], cache=cache)
        cache = _out_cache(o)
        steps.append(o.logits[0, -1])
    step_logits = torch.stack(steps).float()
    checks["step_vs_prefill_rel"] = rel(step_logits, prefill_logits[PREFIX:])
    checks["step_vs_prefill_abs"] = absd(step_logits, prefill_logits[PREFIX:])
    checks["step_vs_prefill_argmax_equal"] = bool(
        torch.equal(step_logits.argmax(-1), prefill_logits[PREFIX:].argmax(-1)))

    # --- greedy from the prefix -----------------------------------------------------------------------
    o = fwd(m, tokens[:PREFIX], use_cache=True)
    cache = _out_cache(o)
    row = o.logits[0, -1]
    greedy, margins = [], []
    for i in range(GREEDY):
        top2 = torch.topk(row, 2).values
        margins.append(float(top2[0] - top2[1]))
        nxt = int(torch.argmax(row))
        greedy.append(nxt)
        if i + 1 == GREEDY:
            break
        o = fwd(m, torch.tensor([nxt]), cache=cache)
        cache = _out_cache(o)
        row = o.logits[0, -1]
    greedy_tokens = torch.tensor(greedy, dtype=torch.int32)
    greedy_margin = torch.tensor(margins, dtype=torch.float32)
    # cross-check the greedy run with one uncached forward over prefix + greedy tokens
    seq = torch.cat([tokens[:PREFIX], greedy_tokens[:-1].long()])
    full = fwd(m, seq).logits[0, PREFIX - 1:]
    checks["greedy_uncached_argmax_equal"] = bool(torch.equal(full.argmax(-1).int(), greedy_tokens))
    checks["greedy_min_margin"] = float(greedy_margin.min())

    # --- independent spec reference of the target (recurrent GDN) -----------------------------------
    tref = TargetRef(text_cfg, {k: v for k, v in sd.items() if not k.startswith("mtp.")})
    r_logits, r_fh, r_outs = tref.forward(tokens)
    checks["target_ref_vs_hf_logits_rel"] = rel(r_logits, prefill_logits)
    checks["target_ref_vs_hf_final_hidden_rel"] = rel(r_fh, final_hidden)
    checks["target_ref_vs_hf_layer_out_rel"] = max(rel(r_outs[L], hs[L + 1]) for L in range(nl - 1))
    # the same spec reference in float64: how far each float32 path is from the exact value
    l64, _, _ = TargetRef(text_cfg, {k: v for k, v in sd.items() if not k.startswith("mtp.")},
                          dtype=torch.float64).forward(tokens)
    checks["f64_vs_hf_prefill_rel"] = rel(prefill_logits.double(), l64)
    checks["f64_vs_hf_step_rel"] = rel(step_logits.double(), l64[PREFIX:])
    checks["f64_vs_target_ref32_rel"] = rel(r_logits.double(), l64)

    # --- MTP ----------------------------------------------------------------------------------------
    mtp = MTPHead.from_text_config(text_cfg).load_mtp_tensors(mtp_t)
    emb, lm = m.model.embed_tokens.weight.float(), m.lm_head.weight.float()
    pos = torch.arange(T - 1)
    mcache = mtp.new_cache()
    mtp_logits, mtp_hidden = mtp(tokens[1:], final_hidden[:-1], pos, emb, lm, cache=mcache)
    chain_tokens = [int(torch.argmax(mtp_logits[-1]))]
    chain_logits = []
    hprev = mtp_hidden[-1:]
    for i in range(1, MTP_CHAIN + 1):
        lg, hprev = mtp(torch.tensor([chain_tokens[-1]]), hprev, torch.tensor([T - 2 + i]), emb, lm, cache=mcache)
        chain_logits.append(lg[0])
        chain_tokens.append(int(torch.argmax(lg[0])))
    checks["mtp_layer_vs_transformers_rel"] = selftest_layer_vs_transformers(cfg, mtp)
    checks["mtp_incremental_vs_batch_rel"] = selftest_incremental(mtp, emb, lm, tokens[1:], final_hidden[:-1])
    checks["mtp_logits_std"] = float(mtp_logits.std())
    checks["prefill_logits_std"] = float(prefill_logits.std())

    # --- write reference.safetensors ----------------------------------------------------------------
    ref = {
        "tokens": tokens.to(torch.int32),
        "prefill_logits": prefill_logits,
        "final_hidden": final_hidden,
        "last_layer_out": last_layer_out,
        "step_logits": step_logits,
        "greedy_tokens": greedy_tokens,
        "greedy_margin": greedy_margin,
        "mtp_logits": mtp_logits.float(),
        "mtp_hidden": mtp_hidden.float(),
        "mtp_chain_tokens": torch.tensor(chain_tokens, dtype=torch.int32),
        "mtp_chain_logits": torch.stack(chain_logits).float(),
    }
    for L, h in enumerate(hs):
        ref[f"hidden.{L}"] = h
    ref = {k: v.contiguous() for k, v in ref.items()}
    metadata = {
        "format": "pt",
        "config_name": name,
        "seed": str(seed),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "T": str(T), "prefix_len": str(PREFIX), "greedy_len": str(GREEDY), "mtp_chain": str(MTP_CHAIN),
        "num_hidden_layers": str(nl),
        "hidden_last_is_post_norm": "true" if hidden_last_is_post_norm else "false",
        "conventions": CONVENTIONS,
        "text_config": json.dumps(text_cfg, sort_keys=True),
        "checks": json.dumps(checks, sort_keys=True),
    }
    save_sorted(ref, os.path.join(d, "reference.safetensors"), metadata)

    if write_mm:
        checks["micro_mm_vs_text_logits_abs"] = write_multimodal(
            name, d, os.path.join(out_root, name + "_mm"), cfg, sd, g, tokens, prefill_logits)
    checks_all[name] = checks
    return checks


# ----------------------------------------------------------------------------------------------
# published multimodal layout
# ----------------------------------------------------------------------------------------------

def write_multimodal(name, text_dir, d, cfg, sd, g, tokens, prefill_logits):
    """Same weights, published Qwen3_5ForConditionalGeneration layout: nested config, names
    model.language_model.* + lm_head.weight + mtp.* + a tiny (random, to be ignored) model.visual.*
    tower, two shards with model.safetensors.index.json (mtp.* in the last shard, as published),
    A_log and linear_attn.norm.weight stored as F32 (as in the Qwen3.5 release; values identical)."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    V = cfg.vocab_size
    tc = json.loads(cfg.to_json_string())
    for k in ("architectures", "transformers_version", "dtype", "torch_dtype"):
        tc.pop(k, None)
    tc.update(PUBLISHED_TEXT_EXTRAS)
    vc = dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=1, patch_size=2, temporal_patch_size=2,
              spatial_merge_size=2, out_hidden_size=cfg.hidden_size, num_position_embeddings=4, in_channels=3)
    mcfg = Qwen3_5Config(text_config=tc, vision_config=vc, image_token_id=V - 2, video_token_id=V - 1,
                         vision_start_token_id=V - 5, vision_end_token_id=V - 4, tie_word_embeddings=False)
    mm = Qwen3_5ForConditionalGeneration(mcfg).float().eval()
    with torch.no_grad():
        for pname, p in sorted(mm.named_parameters()):
            if pname.startswith("model.visual."):
                p.copy_(bf16_round(torch.randn(p.shape, generator=g) * 0.05))
            elif pname.startswith("model.language_model."):
                p.copy_(sd["model." + pname[len("model.language_model."):]].float())
            elif pname == "lm_head.weight":
                p.copy_(sd["lm_head.weight"].float())
            else:
                raise KeyError(pname)
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    total = sum(v.numel() * 2 for v in sd.values())
    mm.to(torch.bfloat16).save_pretrained(d, safe_serialization=True, max_shard_size=int(total * 0.6))
    idx_path = os.path.join(d, "model.safetensors.index.json")
    assert os.path.exists(idx_path), os.listdir(d)
    idx = json.load(open(idx_path))
    shards = sorted(set(idx["weight_map"].values()))
    assert len(shards) >= 2, shards
    for sh in shards:
        p = os.path.join(d, sh)
        with safe_open(p, "pt") as f:
            meta = f.metadata() or {"format": "pt"}
        t = load_file(p)
        for k in list(t):
            if k.endswith("linear_attn.A_log") or k.endswith("linear_attn.norm.weight"):
                t[k] = t[k].float()
        if sh == shards[-1]:
            for k in MTP_TENSOR_NAMES:
                t[k] = sd[k].to(torch.bfloat16)
                idx["weight_map"][k] = sh
        save_file(dict(sorted(t.items())), p, metadata=meta)
    total_size = total_params = 0
    for sh in shards:
        with safe_open(os.path.join(d, sh), "pt") as f:
            for k in f.keys():
                tt = f.get_slice(k)
                n = math.prod(tt.get_shape())
                total_params += n
                total_size += n * {"F32": 4, "BF16": 2}[tt.get_dtype()]
    idx["metadata"] = dict(idx.get("metadata", {}), total_size=total_size)
    if "total_parameters" in idx["metadata"]:
        idx["metadata"]["total_parameters"] = total_params
    idx["weight_map"] = dict(sorted(idx["weight_map"].items()))
    with open(idx_path, "w") as f:
        json.dump(idx, f, indent=2)
        f.write("\n")

    # check: the multimodal checkpoint gives the same text logits under transformers
    m2 = Qwen3_5ForConditionalGeneration.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        lg = m2(input_ids=tokens[None]).logits[0]
    return absd(lg, prefill_logits)


# ----------------------------------------------------------------------------------------------

def tidy_modes(root):
    for dp, _, fs in os.walk(root):
        for f in fs:
            os.chmod(os.path.join(dp, f), 0o644)


def folder_size(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="tests/fixtures/target")
    ap.add_argument("--configs", default="micro,odd", help="comma-separated subset of " + ",".join(CONFIGS))
    ap.add_argument("--no-mm", action="store_true", help="skip the micro_mm multimodal copy")
    args = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    checks_all = {}
    for name in args.configs.split(","):
        build(name, CONFIGS[name], args.out, checks_all, write_mm=(name == "micro" and not args.no_mm))
    tidy_modes(args.out)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(json.dumps(checks_all, indent=1, sort_keys=True))
    for name in sorted(os.listdir(args.out)):
        p = os.path.join(args.out, name)
        if os.path.isdir(p):
            print(f"{name}: {folder_size(p) / 1e6:.2f} MB")
    # hard failures
    bad = []
    for name, c in checks_all.items():
        if c["step_vs_prefill_rel"] > 1e-4:
            bad.append(f"{name}: step vs prefill rel {c['step_vs_prefill_rel']:.2e}")
        if c["target_ref_vs_hf_logits_rel"] > 1e-4:
            bad.append(f"{name}: spec reference vs transformers rel {c['target_ref_vs_hf_logits_rel']:.2e}")
        if c["mtp_layer_vs_transformers_rel"] > 1e-5 or c["mtp_incremental_vs_batch_rel"] > 1e-5:
            bad.append(f"{name}: MTP self-test")
        if not c["greedy_uncached_argmax_equal"]:
            bad.append(f"{name}: greedy cached vs uncached argmax differ")
        if c.get("micro_mm_vs_text_logits_abs", 0.0) > 1e-5:
            bad.append(f"{name}: multimodal layout logits differ")
    if bad:
        print("FAILED:\n  " + "\n  ".join(bad))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()

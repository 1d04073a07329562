"""Plain PyTorch reference of the Qwen3.5/3.8 MTP head (qwen38.md section 4.1).

Written from the spec, not from transformers' modules, so that it is an independent
check of the C++ engine. Everything runs in float32.

    e  = embed[t_{j+1}]
    u  = fc( concat( RMSzc(e; pre_fc_norm_embedding), RMSzc(H_j; pre_fc_norm_hidden) ) )
    u  = one decoder block (gated full attention at position j over the head's own KV of
         earlier pairs + SwiGLU MLP, zero-centred input/post norms, residuals)
    Hm = RMSzc(u; norm)
    logits = lm_head(Hm)

RMSzc(x; w) = x * rsqrt(mean(x^2) + eps) * (1 + w)   (computed in fp32)

The helpers (rms_zc, rope, gated_attention, swiglu) are also used by target_ref.py.

Running this file directly performs the self-tests: the MTP decoder block is compared
numerically with transformers' own Qwen3_5DecoderLayer (full attention) fed the same weights,
and incremental (one pair at a time, with KV cache) MTP runs are compared with batched runs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

MTP_TENSOR_NAMES = [
    "mtp.fc.weight",
    "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden.weight",
    "mtp.norm.weight",
    "mtp.layers.0.input_layernorm.weight",
    "mtp.layers.0.post_attention_layernorm.weight",
    "mtp.layers.0.self_attn.q_proj.weight",
    "mtp.layers.0.self_attn.k_proj.weight",
    "mtp.layers.0.self_attn.v_proj.weight",
    "mtp.layers.0.self_attn.o_proj.weight",
    "mtp.layers.0.self_attn.q_norm.weight",
    "mtp.layers.0.self_attn.k_norm.weight",
    "mtp.layers.0.mlp.gate_proj.weight",
    "mtp.layers.0.mlp.up_proj.weight",
    "mtp.layers.0.mlp.down_proj.weight",
]


# ----------------------------------------------------------------------------------------------
# Spec primitives (qwen38.md section 3)
# ----------------------------------------------------------------------------------------------

def _up(x: torch.Tensor) -> torch.Tensor:
    """At least float32 (float64 stays float64, for the high-precision cross-check)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def rms_zc(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm: x * rsqrt(mean(x^2) + eps) * (1 + w), in fp32."""
    x = _up(x)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + _up(w))


def rms_plain(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain RMSNorm (weight used as stored): x * rsqrt(mean(x^2) + eps) * w."""
    x = _up(x)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * _up(w)


def rope_cos_sin(positions: torch.Tensor, rotary_dim: int, theta: float, dtype=torch.float32):
    """NeoX RoPE tables for the first `rotary_dim` dims. positions: int [N].

    inv_freq_i = theta^(-2i/rotary_dim), i = 0..rotary_dim/2-1; angle = pos * inv_freq_i.
    Computed in float64 and rounded to float32 (transformers computes the angle in fp32;
    the difference is ~1e-7 relative for the short sequences used in fixtures).
    Returns cos, sin of shape [N, rotary_dim/2].
    """
    half = rotary_dim // 2
    i = torch.arange(half, dtype=torch.float64, device=positions.device)
    inv_freq = theta ** (-2.0 * i / rotary_dim)
    ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """x: [heads, N, head_dim]. Rotate pairs (d_i, d_{i+rotary_dim/2}) for i < rotary_dim/2;
    dims >= rotary_dim pass through."""
    half = rotary_dim // 2
    x1 = x[..., :half]
    x2 = x[..., half:rotary_dim]
    rest = x[..., rotary_dim:]
    c = cos[None]
    s = sin[None]
    y1 = x1 * c - x2 * s
    y2 = x2 * c + x1 * s
    return torch.cat([y1, y2, rest], dim=-1)


class KVCache:
    """KV cache of one attention layer: post-norm post-RoPE K, raw V, and each row's position."""

    def __init__(self):
        self.k = None  # [kv_heads, N, head_dim]
        self.v = None
        self.pos = None  # int64 [N]

    def __len__(self):
        return 0 if self.pos is None else int(self.pos.numel())

    def append(self, k, v, pos):
        if self.k is None:
            self.k, self.v, self.pos = k, v, pos.clone()
        else:
            self.k = torch.cat([self.k, k], dim=1)
            self.v = torch.cat([self.v, v], dim=1)
            self.pos = torch.cat([self.pos, pos])

    def trim(self, n: int):
        """Keep the first n rows (rollback to n committed entries)."""
        if self.k is not None:
            self.k, self.v, self.pos = self.k[:, :n], self.v[:, :n], self.pos[:n]


def gated_attention(a, positions, w, *, num_heads, num_kv_heads, head_dim, rotary_dim, theta, eps,
                    cache: KVCache | None = None):
    """Gated full attention (qwen38.md 3.2) over rows `a` [N, hidden] at int `positions` [N].

    w: dict with q_proj, k_proj, v_proj, o_proj, q_norm, k_norm.
    Row i attends to every cached row and every new row whose position <= positions[i].
    If `cache` is given, the new K/V rows are appended to it.
    """
    n = a.shape[0]
    qg = F.linear(a, w["q_proj"]).view(n, num_heads, 2 * head_dim)
    q = qg[..., :head_dim]  # per head: [query | gate]
    gate = qg[..., head_dim:].reshape(n, num_heads * head_dim)
    k = F.linear(a, w["k_proj"]).view(n, num_kv_heads, head_dim)
    v = F.linear(a, w["v_proj"]).view(n, num_kv_heads, head_dim)
    q = rms_zc(q, w["q_norm"], eps).transpose(0, 1)  # [H, N, d]
    k = rms_zc(k, w["k_norm"], eps).transpose(0, 1)  # [Hkv, N, d]
    v = v.transpose(0, 1)
    cos, sin = rope_cos_sin(positions, rotary_dim, theta, dtype=q.dtype)
    q = apply_rope(q, cos, sin, rotary_dim)
    k = apply_rope(k, cos, sin, rotary_dim)

    if cache is not None:
        cache.append(k, v, positions)
        k_all, v_all, pos_all = cache.k, cache.v, cache.pos
    else:
        k_all, v_all, pos_all = k, v, positions

    group = num_heads // num_kv_heads
    k_rep = k_all.repeat_interleave(group, dim=0)  # q head h uses kv head h // group
    v_rep = v_all.repeat_interleave(group, dim=0)
    scores = torch.matmul(q, k_rep.transpose(1, 2)) * (head_dim ** -0.5)  # [H, N, M]
    allowed = pos_all[None, :] <= positions[:, None]  # [N, M]
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    p = torch.softmax(_up(scores), dim=-1)
    o = torch.matmul(p, v_rep)  # [H, N, d]
    o = o.transpose(0, 1).reshape(n, num_heads * head_dim)
    o = o * torch.sigmoid(gate)
    return F.linear(o, w["o_proj"])


def swiglu(m, w_gate, w_up, w_down):
    return F.linear(F.silu(F.linear(m, w_gate)) * F.linear(m, w_up), w_down)


# ----------------------------------------------------------------------------------------------
# MTP head
# ----------------------------------------------------------------------------------------------

class _Vec(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n))


class _Lin(nn.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_out, n_in))


class _Attn(nn.Module):
    def __init__(self, hidden, nh, nkv, hd):
        super().__init__()
        self.q_proj = _Lin(hidden, nh * hd * 2)
        self.k_proj = _Lin(hidden, nkv * hd)
        self.v_proj = _Lin(hidden, nkv * hd)
        self.o_proj = _Lin(nh * hd, hidden)
        self.q_norm = _Vec(hd)
        self.k_norm = _Vec(hd)


class _MLP(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = _Lin(hidden, inter)
        self.up_proj = _Lin(hidden, inter)
        self.down_proj = _Lin(inter, hidden)


class _Layer(nn.Module):
    def __init__(self, hidden, nh, nkv, hd, inter):
        super().__init__()
        self.input_layernorm = _Vec(hidden)
        self.post_attention_layernorm = _Vec(hidden)
        self.self_attn = _Attn(hidden, nh, nkv, hd)
        self.mlp = _MLP(hidden, inter)


class MTPHead(nn.Module):
    """One-layer MTP head. Parameter names (with the `mtp.` prefix) follow the published schema.

    forward(tokens, hidden, positions, embed_weight, lm_head_weight, cache=None) -> (logits, Hm)
      tokens    int [N]     t_{j+1}
      hidden    f32 [N, H]  target post-final-norm hidden H_j
      positions int [N]     j (RoPE position and causal order of each pair)
      cache     list of one KVCache (the head's own KV of earlier pairs), appended to in place
    """

    def __init__(self, hidden_size, num_attention_heads, num_key_value_heads, head_dim,
                 intermediate_size, rotary_dim, rope_theta, rms_norm_eps, num_layers=1):
        super().__init__()
        self.hidden_size = hidden_size
        self.num_heads = num_attention_heads
        self.num_kv_heads = num_key_value_heads
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.theta = rope_theta
        self.eps = rms_norm_eps
        H = hidden_size
        self.fc = _Lin(2 * H, H)
        self.pre_fc_norm_embedding = _Vec(H)
        self.pre_fc_norm_hidden = _Vec(H)
        self.norm = _Vec(H)
        self.layers = nn.ModuleList(
            [_Layer(H, num_attention_heads, num_key_value_heads, head_dim, intermediate_size)
             for _ in range(num_layers)])

    @classmethod
    def from_text_config(cls, tc: dict) -> "MTPHead":
        """tc: the text config as a dict (config.json of a text-only save, or its text_config)."""
        rp = tc.get("rope_parameters") or {}
        theta = rp.get("rope_theta", tc.get("rope_theta"))
        prf = rp.get("partial_rotary_factor", tc.get("partial_rotary_factor", 0.25))
        rotary_dim = int(tc["head_dim"] * prf)
        return cls(tc["hidden_size"], tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"],
                   tc["intermediate_size"], rotary_dim, float(theta), tc["rms_norm_eps"],
                   tc.get("mtp_num_hidden_layers", 1))

    def load_mtp_tensors(self, tensors: dict):
        """tensors: name -> tensor with the `mtp.` prefix (other names ignored). Strict."""
        sd = {k[len("mtp."):]: v.float() for k, v in tensors.items() if k.startswith("mtp.")}
        self.load_state_dict(sd, strict=True)
        return self

    def new_cache(self):
        return [KVCache() for _ in self.layers]

    @torch.no_grad()
    def forward(self, tokens, hidden, positions, embed_weight, lm_head_weight, cache=None):
        eps = self.eps
        e = embed_weight.float()[tokens.long()]
        x = torch.cat([rms_zc(e, self.pre_fc_norm_embedding.weight, eps),
                       rms_zc(hidden.float(), self.pre_fc_norm_hidden.weight, eps)], dim=-1)
        h = F.linear(x, self.fc.weight)
        positions = positions.long()
        for li, L in enumerate(self.layers):
            a = rms_zc(h, L.input_layernorm.weight, eps)
            w = {n: getattr(L.self_attn, n).weight for n in
                 ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")}
            h = h + gated_attention(a, positions, w, num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
                                    head_dim=self.head_dim, rotary_dim=self.rotary_dim, theta=self.theta,
                                    eps=eps, cache=None if cache is None else cache[li])
            m = rms_zc(h, L.post_attention_layernorm.weight, eps)
            h = h + swiglu(m, L.mlp.gate_proj.weight, L.mlp.up_proj.weight, L.mlp.down_proj.weight)
        hm = rms_zc(h, self.norm.weight, eps)
        logits = F.linear(hm, lm_head_weight.float())
        return logits, hm


# ----------------------------------------------------------------------------------------------
# Self-tests
# ----------------------------------------------------------------------------------------------

def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@torch.no_grad()
def selftest_layer_vs_transformers(text_config, mtp: MTPHead, n=12, pos0=5, seed=1):
    """Feed the MTP decoder block's weights into transformers' Qwen3_5DecoderLayer (a full-attention
    layer) and compare its output with gated_attention + MLP from this file. Returns max relative diff."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

    cfg = text_config
    cfg._attn_implementation = "eager"
    full_idx = cfg.layer_types.index("full_attention")
    layer = hf.Qwen3_5DecoderLayer(cfg, full_idx).float().eval()
    L = mtp.layers[0]
    sd = {k: v.detach().clone() for k, v in L.state_dict().items()}
    missing, unexpected = layer.load_state_dict(sd, strict=False)
    assert not missing and not unexpected, (missing, unexpected)

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, mtp.hidden_size, generator=g)
    positions = torch.arange(pos0, pos0 + n)
    rot = hf.Qwen3_5TextRotaryEmbedding(cfg)
    pid = positions.view(1, 1, n).expand(3, 1, n)
    cos, sin = rot(x[None], pid)
    mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
    out = layer(x[None], position_embeddings=(cos, sin), attention_mask=mask)
    if isinstance(out, tuple):
        out = out[0]
    out = out[0]

    eps = mtp.eps
    a = rms_zc(x, L.input_layernorm.weight, eps)
    w = {nm: getattr(L.self_attn, nm).weight for nm in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")}
    h = x + gated_attention(a, positions, w, num_heads=mtp.num_heads, num_kv_heads=mtp.num_kv_heads,
                            head_dim=mtp.head_dim, rotary_dim=mtp.rotary_dim, theta=mtp.theta, eps=eps)
    m = rms_zc(h, L.post_attention_layernorm.weight, eps)
    h = h + swiglu(m, L.mlp.gate_proj.weight, L.mlp.up_proj.weight, L.mlp.down_proj.weight)
    return _rel(h, out)


@torch.no_grad()
def selftest_incremental(mtp: MTPHead, embed, lm_head, tokens, hidden):
    """Batched pairs vs one pair at a time with the KV cache; returns max relative diff of logits."""
    n = tokens.numel()
    pos = torch.arange(n)
    ref, _ = mtp(tokens, hidden, pos, embed, lm_head)
    cache = mtp.new_cache()
    rows = []
    # mixed block sizes: 3, then 1 at a time, then the rest
    splits = [0, 3] + list(range(4, min(n, 10))) + [n]
    for s, e in zip(splits[:-1], splits[1:]):
        lg, _ = mtp(tokens[s:e], hidden[s:e], pos[s:e], embed, lm_head, cache=cache)
        rows.append(lg)
    return _rel(torch.cat(rows), ref)


def _random_mtp(mtp: MTPHead, seed=0):
    g = torch.Generator().manual_seed(seed)
    for name, p in sorted(mtp.named_parameters()):
        if p.dim() == 1:
            p.data = torch.randn(p.shape, generator=g) * 0.1
        else:
            p.data = torch.randn(p.shape, generator=g) * 0.08
    return mtp


if __name__ == "__main__":
    from transformers import Qwen3_5TextConfig

    for hs, nh, nkv, hd, inter in [(128, 2, 1, 64, 256), (192, 3, 1, 64, 320), (256, 4, 2, 64, 768)]:
        cfg = Qwen3_5TextConfig(vocab_size=300, hidden_size=hs, intermediate_size=inter, num_hidden_layers=4,
                                num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd,
                                linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=64,
                                linear_value_head_dim=64, rms_norm_eps=1e-6,
                                rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                                 "partial_rotary_factor": 0.25, "mrope_section": [3, 3, 2],
                                                 "mrope_interleaved": True})
        mtp = _random_mtp(MTPHead(hs, nh, nkv, hd, inter, int(hd * 0.25), 1e7, 1e-6))
        d1 = selftest_layer_vs_transformers(cfg, mtp)
        g = torch.Generator().manual_seed(3)
        emb = torch.randn(300, hs, generator=g)
        lm = torch.randn(300, hs, generator=g) * 0.1
        toks = torch.randint(0, 300, (17,), generator=g)
        hid = torch.randn(17, hs, generator=g)
        d2 = selftest_incremental(mtp, emb, lm, toks, hid)
        print(f"hidden {hs} heads {nh}/{nkv}: layer vs transformers rel {d1:.2e}; incremental vs batch rel {d2:.2e}")
        assert d1 < 1e-5 and d2 < 1e-5
    print("mtp_ref self-test OK")

"""Independent PyTorch reference of the DFlash2 block-diffusion drafter.

Written from the qflash spec (docs/spec/dflash2.md, normative for the drafter;
speculative.md for the round; qwen38.md sections 3 and 9 for the target it
attaches to).  Section numbers in comments ("§2.5") refer to dflash2.md.

Two uses:
  * parity fixtures for the C++ engine (inference form: one block against a
    context of committed rows; `DFlash2Drafter.forward_block` / `.draft`);
  * training a drafter (batched training form: one sequence, many anchors,
    all blocks in one attention call; `DFlash2Drafter.forward_train` +
    `dflash_loss`).

The drafter owns no embedding and no LM head: both are borrowed from the
target and passed to every forward as plain matrices ([V, H]).

Numerics (qflash choices, §2.6): the residual stream is fp32; norms compute in
fp32 and emit the GEMM dtype (the parameter dtype, or the autocast dtype);
attention softmax, selector scores and the candidate softmax are fp32.  With
fp32 parameters (e.g. bf16-valued weights upcast), everything is fp32.

Run `python dflash2_ref.py --selftest` for quick CPU checks and
`python dflash2_ref.py --bench` on a GPU for a training-step timing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = [
    "DFlash2Config", "build_target_layer_ids", "RMSNorm", "GroupedDynamicCausalConv",
    "DFlash2Attention", "DFlash2MLP", "DFlash2DecoderLayer", "CandidateSelector",
    "DFlash2Drafter", "BlockOutput", "TrainOutput", "SelectorResult", "topk_sorted",
    "argmax_lowest", "slot_weights", "default_gamma", "dflash_loss", "sample_anchors",
    "init_conv_identity", "init_weights", "warm_start_from_v1", "load", "save",
]

V2_ARCH = "DFlash2DraftModel"
V1_ARCH = "DFlashDraftModel"


# --------------------------------------------------------------------------------------
# Config (§1.1)
# --------------------------------------------------------------------------------------

def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Default tap rule (§2.1).  Python round() = round half to even, on purpose."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [int(round(start + i * span / (num_draft_layers - 1))) for i in range(num_draft_layers)]


_DEFAULTS_V2 = {  # VS "defaults matching the released checkpoint" (§5.2); used only if absent
    "conv_kernel_size": 2,
    "conv_group_size": 16,
    "selector_rank": 256,
    "selector_top_k": 16,
}


@dataclass
class DFlash2Config:
    """Mirror of the published config.json (§1.1).  Unknown top-level keys are kept in
    `extra` and written back by `to_json`.  Drafter-specific values are read through the
    resolved properties below, which apply the ZL lookup rules: a key inside
    `dflash_config` wins over a top-level key of the same name."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_target_layers: int
    dflash_config: dict = field(default_factory=dict)
    architectures: list = field(default_factory=lambda: [V2_ARCH])
    model_type: str = "qwen3"
    attention_bias: bool = False
    attention_dropout: float = 0.0
    is_causal: Optional[bool] = False
    bos_token_id: Optional[int] = None
    eos_token_id: Any = None
    pad_token_id: Optional[int] = None
    dtype: str = "bfloat16"
    transformers_version: str = "5.15.0"
    hidden_act: str = "silu"
    layer_types: Optional[list] = None
    sliding_window: Optional[int] = None
    use_sliding_window: bool = True
    max_window_layers: Optional[int] = None
    max_position_embeddings: int = 262144
    rope_parameters: Optional[dict] = field(
        default_factory=lambda: {"rope_theta": 10000000, "rope_type": "default"})
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    use_cache: bool = True
    extra: dict = field(default_factory=dict)

    # ---- json ----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict) -> "DFlash2Config":
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        kw = {k: v for k, v in d.items() if k in names}
        extra = {k: v for k, v in d.items() if k not in names}
        if "torch_dtype" in extra and "dtype" not in kw:
            kw["dtype"] = extra.pop("torch_dtype")
        cfg = cls(**kw, extra=extra)
        cfg.validate()
        return cfg

    @classmethod
    def from_json(cls, path_or_text: str) -> "DFlash2Config":
        if os.path.isdir(path_or_text):
            path_or_text = os.path.join(path_or_text, "config.json")
        if os.path.exists(path_or_text):
            with open(path_or_text) as f:
                return cls.from_dict(json.load(f))
        return cls.from_dict(json.loads(path_or_text))

    _DROP_IF_NONE = ("layer_types", "sliding_window", "max_window_layers", "is_causal", "rope_parameters")

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
             if f.name != "extra" and not (f.name in self._DROP_IF_NONE and getattr(self, f.name) is None)}
        d.update(self.extra)
        return d

    def to_json(self, path: Optional[str] = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        if path is not None:
            if os.path.isdir(path):
                path = os.path.join(path, "config.json")
            with open(path, "w") as f:
                f.write(text)
        return text

    # ---- lookup ----------------------------------------------------------------------
    def _lookup(self, name: str, default: Any = None) -> Any:
        dc = self.dflash_config or {}
        if name in dc and dc[name] is not None:
            return dc[name]
        if name in self.extra and self.extra[name] is not None:
            return self.extra[name]
        return default

    @property
    def is_v2(self) -> bool:
        archs = self.architectures or []
        if V2_ARCH in archs:
            return True
        if V1_ARCH in archs:
            return False
        raise ValueError(f"unknown drafter architecture {archs}")

    @property
    def block_size(self) -> int:
        return int(self._lookup("block_size", 16))

    @property
    def mask_token_id(self) -> int:
        v = self._lookup("mask_token_id")
        if v is None:
            raise ValueError("mask_token_id missing from config")
        return int(v)

    @property
    def target_layer_ids(self) -> list[int]:
        v = self._lookup("target_layer_ids")
        if v is None:
            return build_target_layer_ids(self.num_target_layers, self.num_hidden_layers)
        return [int(x) for x in v]

    @property
    def num_taps(self) -> int:
        return len(self.target_layer_ids)

    @property
    def conv_kernel_size(self) -> int:
        return int(self._lookup("conv_kernel_size", _DEFAULTS_V2["conv_kernel_size"]))

    @property
    def conv_group_size(self) -> int:
        return int(self._lookup("conv_group_size", _DEFAULTS_V2["conv_group_size"]))

    @property
    def conv_groups(self) -> int:
        return self.hidden_size // self.conv_group_size

    @property
    def selector_rank(self) -> int:
        return int(self._lookup("selector_rank", _DEFAULTS_V2["selector_rank"]))

    @property
    def selector_top_k(self) -> int:
        return int(self._lookup("selector_top_k", _DEFAULTS_V2["selector_top_k"]))

    @property
    def input_embedding_scale(self) -> float:
        return float(self._lookup("input_embedding_scale", 1.0))

    @property
    def output_multiplier(self) -> float:
        return float(self._lookup("output_multiplier", 1.0))

    @property
    def final_logit_softcapping(self) -> float:
        v = self._lookup("final_logit_softcapping", None)
        return float(v) if v is not None else 0.0

    @property
    def rope_theta(self) -> float:
        rp = self.rope_parameters or {}
        if "rope_theta" in rp:
            return float(rp["rope_theta"])
        if "rope_theta" in self.extra:
            return float(self.extra["rope_theta"])
        raise ValueError("rope_theta missing from config")

    def layer_type(self, layer: int) -> str:
        if self.layer_types is not None:
            return self.layer_types[layer]
        # qflash choice for configs without layer_types: sliding on every layer when a
        # window is configured and use_sliding_window is set, else full attention.
        if self.use_sliding_window and self.sliding_window:
            return "sliding_attention"
        return "full_attention"

    def layer_window(self, layer: int) -> Optional[int]:
        """Attention window of a layer (None = unbounded)."""
        return int(self.sliding_window) if self.layer_type(layer) == "sliding_attention" else None

    def layer_is_causal(self, layer: int) -> bool:
        """§2.3: the config value if set, else True on sliding layers, False on full."""
        if self.is_causal is not None:
            return bool(self.is_causal)
        return self.layer_type(layer) == "sliding_attention"

    def validate(self) -> None:
        H = self.hidden_size
        assert self.num_attention_heads % self.num_key_value_heads == 0, "nh % nkv != 0"
        assert self.head_dim % 2 == 0, "head_dim must be even (rotate_half over the full head)"
        assert self.hidden_act == "silu", "only silu is supported"
        assert 0 <= self.mask_token_id < self.vocab_size, "mask_token_id outside the vocabulary"
        assert all(0 <= t < self.num_target_layers for t in self.target_layer_ids), "tap id out of range"
        rp = self.rope_parameters or {}
        assert rp.get("rope_type", "default") == "default", "only default RoPE is supported"
        if self.layer_types is not None:
            assert len(self.layer_types) == self.num_hidden_layers
        for l in range(self.num_hidden_layers):
            w = self.layer_window(l)
            if w is not None:
                assert w >= 1
        if self.is_v2:
            assert H % self.conv_group_size == 0, "H % conv_group_size != 0"
            assert self.conv_kernel_size <= self.block_size, "Kc > block_size"
            assert self.selector_top_k <= self.vocab_size


# --------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------

def _gemm_dtype(ref: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(ref.device.type):
        return torch.get_autocast_dtype(ref.device.type)
    return ref.dtype


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm, plain form (weight as stored, no +1; §2.6).  Computes in fp32,
    multiplies by the weight in fp32, returns `out_dtype` (default: the weight's GEMM dtype)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, out_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        y = y * self.weight.float()
        return y.to(out_dtype or _gemm_dtype(self.weight))


def _linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    if torch.is_autocast_enabled(x.device.type):
        return F.linear(x, w)
    return F.linear(x.to(w.dtype), w)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float):
    """NeoX RoPE tables over the full head_dim (§2.2).  Angles in float64, returned fp32.
    positions: integer tensor of any shape -> cos, sin of shape [..., head_dim]."""
    half = head_dim // 2
    inv_freq = theta ** (-torch.arange(0, half, dtype=torch.float64, device=positions.device) * 2.0 / head_dim)
    ang = positions.to(torch.float64).unsqueeze(-1) * inv_freq
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().float(), ang.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., heads, d]; cos/sin [..., d] (broadcast over heads).  rotate_half form."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    y = xf * cos.unsqueeze(-2) + rot * sin.unsqueeze(-2)
    return y.to(x.dtype)


class GroupedDynamicCausalConv(nn.Module):
    """§2.5.  base_kernel [2, Kc, H]; kernel_projection [2*Kc*G, H] (no bias).

    prepare(x_in): D = kernel_projection(x_in) viewed [.., L, 2, Kc, G]
                   (flat index side*Kc*G + tap*G + group);
                   out[i,c] = sum_t (base[0,t,c] + D[i,0,t,c//gs]) * x_in[i-t, c]
    finish(z, D):  out[i,c] = sum_t (base[1,t,c] + D[i,1,t,c//gs]) * z[i-t, c]
    Rows are block rows along dim -2 (in-block index i); x[i-t] = 0 for i-t < 0.
    Computed in fp32, returned in the input dtype."""

    def __init__(self, hidden: int, kernel_size: int, group_size: int):
        super().__init__()
        assert hidden % group_size == 0
        self.hidden, self.kc, self.gs = hidden, kernel_size, group_size
        self.groups = hidden // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel_size * self.groups, bias=False)
        self.reset_identity()

    @torch.no_grad()
    def reset_identity(self) -> None:
        self.base_kernel.zero_()
        self.base_kernel[:, 0, :] = 1.0
        self.kernel_projection.weight.zero_()

    def coefficients(self, x_in: torch.Tensor) -> torch.Tensor:
        D = _linear(x_in, self.kernel_projection.weight).float()
        return D.view(*x_in.shape[:-1], 2, self.kc, self.groups)

    def _conv(self, x: torch.Tensor, D: torch.Tensor, side: int) -> torch.Tensor:
        L = x.shape[-2]
        xf = x.float()
        base = self.base_kernel.float()
        out = torch.zeros_like(xf)
        for t in range(self.kc):
            if t >= L:
                break
            coef = base[side, t] + D[..., side, t, :].repeat_interleave(self.gs, dim=-1)  # [.., L, H]
            if t == 0:
                src = xf
            else:
                src = torch.cat([torch.zeros_like(xf[..., :t, :]), xf[..., : L - t, :]], dim=-2)
            out = out + coef * src
        return out.to(x.dtype)

    def prepare(self, x_in: torch.Tensor):
        D = self.coefficients(x_in)
        return self._conv(x_in, D, 0), D

    def finish(self, z: torch.Tensor, D: torch.Tensor) -> torch.Tensor:
        return self._conv(z, D, 1)


class DFlash2Attention(nn.Module):
    def __init__(self, cfg: DFlash2Config):
        super().__init__()
        H, nh, nkv, d = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.nh, self.nkv, self.d = nh, nkv, d
        self.q_proj = nn.Linear(H, nh * d, bias=False)
        self.k_proj = nn.Linear(H, nkv * d, bias=False)
        self.v_proj = nn.Linear(H, nkv * d, bias=False)
        self.o_proj = nn.Linear(nh * d, H, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """K/V of rows x [.., n, H] (context rows or block rows): k_norm, then RoPE."""
        k = _linear(x, self.k_proj.weight).view(*x.shape[:-1], self.nkv, self.d)
        v = _linear(x, self.v_proj.weight).view(*x.shape[:-1], self.nkv, self.d)
        k = apply_rope(self.k_norm(k), cos, sin)
        return k, v

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        q = _linear(x, self.q_proj.weight).view(*x.shape[:-1], self.nh, self.d)
        return apply_rope(self.q_norm(q), cos, sin)

    def out(self, o: torch.Tensor) -> torch.Tensor:
        return _linear(o.reshape(*o.shape[:-2], self.nh * self.d), self.o_proj.weight)


class DFlash2MLP(nn.Module):
    def __init__(self, cfg: DFlash2Config):
        super().__init__()
        H, I = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(H, I, bias=False)
        self.up_proj = nn.Linear(H, I, bias=False)
        self.down_proj = nn.Linear(I, H, bias=False)

    def forward(self, x):
        return _linear(F.silu(_linear(x, self.gate_proj.weight)) * _linear(x, self.up_proj.weight),
                       self.down_proj.weight)


class DFlash2DecoderLayer(nn.Module):
    """Qwen3 pre-norm layer with the two conv wrappers (§2.5; no convs in v1)."""

    def __init__(self, cfg: DFlash2Config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DFlash2Attention(cfg)
        self.mlp = DFlash2MLP(cfg)
        self.has_conv = cfg.is_v2
        if self.has_conv:
            self.attention_conv = GroupedDynamicCausalConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)
            self.mlp_conv = GroupedDynamicCausalConv(cfg.hidden_size, cfg.conv_kernel_size, cfg.conv_group_size)

    def forward(self, h: torch.Tensor, attend) -> torch.Tensor:
        """h: fp32 residual [.., L, H] (block rows, in-block index along dim -2).
        attend(self_attn, u) -> [.., L, H]: the attention sublayer for these rows."""
        u = self.input_layernorm(h)
        if self.has_conv:
            u, D1 = self.attention_conv.prepare(u)
        a = attend(self.self_attn, u)
        if self.has_conv:
            a = self.attention_conv.finish(a, D1)
        h = h + a.float()
        m = self.post_attention_layernorm(h)
        if self.has_conv:
            m, D2 = self.mlp_conv.prepare(m)
        f = self.mlp(m)
        if self.has_conv:
            f = self.mlp_conv.finish(f, D2)
        return h + f.float()


# --------------------------------------------------------------------------------------
# Top-K ordering and the candidate selector (§3)
# --------------------------------------------------------------------------------------

def argmax_lowest(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Index of the largest value, lowest index among exact ties (speculative.md §2)."""
    if dim not in (-1, x.dim() - 1):
        raise NotImplementedError("argmax_lowest works on the last dim")
    mx = x.max(dim=-1, keepdim=True).values
    idx = torch.arange(x.shape[-1], device=x.device).expand_as(x)
    return torch.where(x == mx, idx, torch.full_like(idx, x.shape[-1])).min(dim=-1).values


def topk_sorted(logits: torch.Tensor, k: int, exact_ties: bool = True):
    """Top-k of the last dim ordered by (value desc, index asc) -- §3.2 qflash choice.

    With exact_ties the candidate *set* is exact as well: when ties straddle the k-th
    value, the lowest ids among the tied values are taken.  Returns (values, ids) [.., k]."""
    shp = logits.shape
    x = logits.reshape(-1, shp[-1])
    vals, idx = torch.topk(x, k, dim=-1, largest=True, sorted=True)
    if exact_ties:
        thr = vals[:, -1:]
        n_ge = (x >= thr).sum(-1)
        for r in (n_ge > k).nonzero().flatten().tolist():
            gt = (x[r] > thr[r]).nonzero().flatten()
            eq = (x[r] == thr[r]).nonzero().flatten()[: k - gt.numel()]
            idx[r] = torch.cat([gt, eq])
        idx = idx.sort(dim=-1).values                       # ascending id
        v = x.gather(-1, idx)
        order = torch.sort(v, dim=-1, descending=True, stable=True).indices  # stable: id asc among ties
        idx = idx.gather(-1, order)
    vals = x.gather(-1, idx)
    return vals.view(*shp[:-1], k), idx.view(*shp[:-1], k)


@dataclass
class SelectorResult:
    drafts: torch.Tensor        # [.., J] int64 (J = B-1 slots)
    choice: torch.Tensor        # [.., J] index into the candidates
    cand_ids: torch.Tensor      # [.., J, K] int64, ordered (logit desc, id asc)
    cand_logits: torch.Tensor   # [.., J, K] fp32 unary logits U_j
    scores: torch.Tensor        # [.., J, K] fp32 s_j(pred_j, C_j[k]) with the walk's predecessor
    q: Optional[torch.Tensor]   # [.., J, K] softmax(scores/T) for T > 0, else None


class CandidateSelector(nn.Module):
    """§3.  Parameter names match the checkpoint: hidden_projection.weight [R, H];
    predecessor_codebook [V, R] and successor_codebook [V, R] are bare tensors."""

    def __init__(self, hidden: int, vocab: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.zeros(vocab, rank))
        self.successor_codebook = nn.Parameter(torch.zeros(vocab, rank))

    def project(self, h: torch.Tensor) -> torch.Tensor:
        """P_j = hidden_projection(h_j), fp32."""
        return F.linear(h.float(), self.hidden_projection.weight.float())

    def edge_scores(self, P: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor,
                    pred_ids: torch.Tensor) -> torch.Tensor:
        """s(a, b) = U(b) + sum_r Epre[a,r] * P[r] * Esuc[b,r] in fp32.
        P [.., R]; cand_ids/cand_logits [.., K]; pred_ids [..] -> [.., K]."""
        epre = self.predecessor_codebook.float()[pred_ids]            # [.., R]
        esuc = self.successor_codebook.float()[cand_ids]              # [.., K, R]
        gated = epre * P                                              # [.., R]
        return cand_logits.float() + (esuc * gated.unsqueeze(-2)).sum(-1)

    @torch.no_grad()
    def edge_table(self, h: torch.Tensor, cand_ids: torch.Tensor, cand_logits: torch.Tensor,
                   anchor: torch.Tensor) -> torch.Tensor:
        """VL form: E_j[p, c] = U_j(c) + <Epre[C_{j-1}[p]] * P_j, Esuc[C_j[c]]>; for j = 1 every
        row uses the anchor.  h [.., J, H]; cand [.., J, K]; anchor [..] -> [.., J, K, K]."""
        J, K = cand_ids.shape[-2], cand_ids.shape[-1]
        P = self.project(h)                                           # [.., J, R]
        prev = torch.cat([anchor[..., None, None].expand(*anchor.shape, 1, K), cand_ids[..., :-1, :]], dim=-2)
        epre = self.predecessor_codebook.float()[prev]                # [.., J, K(p), R]
        esuc = self.successor_codebook.float()[cand_ids]              # [.., J, K(c), R]
        bil = torch.einsum("...pr,...cr->...pc", epre * P.unsqueeze(-2), esuc)
        return cand_logits.float().unsqueeze(-2) + bil

    @torch.no_grad()
    def walk(self, h: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor,
             temperature: float = 0.0, generator: Optional[torch.Generator] = None,
             exact_ties: bool = True) -> SelectorResult:
        """Greedy (T = 0) or sampled (T > 0) walk from the anchor (§3.1 step 4-6).
        h: final-normed hidden of the draft slots [.., J, H]; logits [.., J, V]; anchor [..].
        exact_ties=False skips the exact tie handling of the candidate set (training metrics)."""
        cand_logits, cand_ids = topk_sorted(logits.float(), self.top_k, exact_ties=exact_ties)
        P = self.project(h)
        J = h.shape[-2]
        pred = anchor.long()
        drafts, choices, scores, qs = [], [], [], []
        for j in range(J):
            s = self.edge_scores(P[..., j, :], cand_ids[..., j, :], cand_logits[..., j, :], pred)
            if temperature > 0:
                q = torch.softmax(s / temperature, dim=-1)
                flat = q.reshape(-1, q.shape[-1])
                k = torch.multinomial(flat, 1, generator=generator).view(q.shape[:-1])
                qs.append(q)
            else:
                k = argmax_lowest(s)                                  # ties -> lower candidate index
            d = cand_ids[..., j, :].gather(-1, k.unsqueeze(-1)).squeeze(-1)
            drafts.append(d); choices.append(k); scores.append(s)
            pred = d
        return SelectorResult(
            drafts=torch.stack(drafts, dim=-1), choice=torch.stack(choices, dim=-1),
            cand_ids=cand_ids, cand_logits=cand_logits, scores=torch.stack(scores, dim=-2),
            q=torch.stack(qs, dim=-2) if qs else None)

    def loss_terms(self, h: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor,
                   predecessors: torch.Tensor, detach: bool = False, cand_ids: Optional[torch.Tensor] = None):
        """Teacher-forced selector terms (§5.2) per row.
        h [.., H] final-normed; logits [.., V]; labels, predecessors [..] (int).
        Returns (ce [..], in_topk [..] bool, correct [..] bool, cand_ids [.., K]).
        ce is the K-way cross-entropy against the label's candidate index (meaningful only
        where in_topk; other rows must get zero weight -- qflash choice).  cand_ids: precomputed
        top-K ids (training uses plain torch.topk; the order does not matter for the loss)."""
        if detach:
            h, logits = h.detach(), logits.detach()
        if cand_ids is None:
            with torch.no_grad():
                _, cand_ids = torch.topk(logits.float(), self.top_k, dim=-1, sorted=True)
        U = logits.float().gather(-1, cand_ids)
        s = self.edge_scores(self.project(h), cand_ids, U, predecessors.long())
        hit = cand_ids == labels.long().unsqueeze(-1)
        in_topk = hit.any(-1)
        lab_idx = hit.float().argmax(-1)
        ce = torch.logsumexp(s, dim=-1) - s.gather(-1, lab_idx.unsqueeze(-1)).squeeze(-1)
        correct = in_topk & (argmax_lowest(s.detach()) == lab_idx)
        return ce, in_topk, correct, cand_ids


# --------------------------------------------------------------------------------------
# The drafter
# --------------------------------------------------------------------------------------

@dataclass
class BlockOutput:
    logits: torch.Tensor            # [L, V] fp32, all block rows (row 0 = anchor, not a draft)
    hidden: torch.Tensor            # [L, H] final-normed hidden (after `norm`)
    ctx: torch.Tensor               # [n_ctx, H] context features after hidden_norm
    ctx_positions: torch.Tensor     # [n_ctx] int64
    block_ids: torch.Tensor         # [L] int64
    positions: torch.Tensor         # [L] int64
    layer_out: list                 # per layer: residual after the layer, [L, H] fp32


@dataclass
class TrainOutput:
    hidden: torch.Tensor            # [N, A, B, H] final-normed hidden of every block row
    block_ids: torch.Tensor         # [N, A, B]
    anchors: torch.Tensor           # [N, A] (clamped)
    anchor_valid: torch.Tensor      # [N, A] bool
    labels: torch.Tensor            # [N, A, B-1] tok[a+k] for slots k = 1..B-1 (0 where invalid)
    predecessors: torch.Tensor      # [N, A, B-1] tok[a+k-1] (slot 1: the anchor token)
    label_valid: torch.Tensor       # [N, A, B-1] bool
    logits: Optional[torch.Tensor] = None   # [N, A, B-1, V] fp32 when return_logits


class DFlash2Drafter(nn.Module):
    def __init__(self, cfg: DFlash2Config):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        H = cfg.hidden_size
        self.fc = nn.Linear(cfg.num_taps * H, H, bias=False)
        self.hidden_norm = RMSNorm(H, cfg.rms_norm_eps)
        self.layers = nn.ModuleList([DFlash2DecoderLayer(cfg, l) for l in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(H, cfg.rms_norm_eps)
        if cfg.is_v2:
            self.candidate_selector = CandidateSelector(H, cfg.vocab_size, cfg.selector_rank, cfg.selector_top_k)
        else:
            self.candidate_selector = None
        init_weights(self)

    # ---- shared pieces -------------------------------------------------------------------
    @property
    def is_v2(self) -> bool:
        return self.cfg.is_v2

    def project_context(self, taps: torch.Tensor) -> torch.Tensor:
        """ctx = hidden_norm(fc(concat taps)) (§2.2).  taps [.., Nt*H] -> [.., H]."""
        return self.hidden_norm(_linear(taps, self.fc.weight))

    def embed_block(self, block_ids: torch.Tensor, embed_weight: torch.Tensor) -> torch.Tensor:
        """Target embedding * input_embedding_scale (all columns, §2.4), fp32."""
        return F.embedding(block_ids, embed_weight).float() * self.cfg.input_embedding_scale

    def compute_logits(self, hidden: torch.Tensor, lm_head_weight: torch.Tensor) -> torch.Tensor:
        """§2.7: logits = lm_head(h_out) * output_multiplier, then softcap if > 0.  fp32 out."""
        logits = _linear(hidden, lm_head_weight).float()
        if self.cfg.output_multiplier != 1.0:
            logits = logits * self.cfg.output_multiplier
        cap = self.cfg.final_logit_softcapping
        if cap > 0:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def block_ids_for(self, anchor: torch.Tensor, length: int) -> torch.Tensor:
        """[anchor, M, ..., M] along a new last dim of size `length`."""
        anchor = torch.as_tensor(anchor).long()
        ids = torch.full((*anchor.shape, length), self.cfg.mask_token_id, dtype=torch.long, device=anchor.device)
        ids[..., 0] = anchor
        return ids

    # ---- inference form (§2, §4) ---------------------------------------------------------
    def forward_block(self, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor, anchor: int, start: int,
                      taps: Optional[torch.Tensor] = None, ctx: Optional[torch.Tensor] = None,
                      ctx_positions: Optional[torch.Tensor] = None, block_len: Optional[int] = None) -> BlockOutput:
        """One drafter pass for one block.

        anchor: the verified token at position `start`.  Context: either `taps`
        [n_ctx, Nt*H] (projected here) or precomputed `ctx` [n_ctx, H].  Context positions
        default to start-n_ctx .. start-1 and must all be < start.  The block is
        [anchor, M x (L-1)] at start .. start+L-1, L = block_len (default block_size).
        Attention: explicit fp32 softmax over [context rows | block rows] with the per-layer
        window (p - k < W, and k - p < W) and bidirectional (or causal) in the block."""
        cfg = self.cfg
        L = block_len or cfg.block_size
        if ctx is None:
            if taps is None:
                raise ValueError("need taps or ctx")
            ctx = self.project_context(taps)
        device = ctx.device
        n_ctx = ctx.shape[0]
        if ctx_positions is None:
            ctx_positions = torch.arange(start - n_ctx, start, device=device)
        ctx_positions = ctx_positions.long().to(device)
        assert n_ctx == 0 or int(ctx_positions.max()) < start, "context rows must precede the anchor"
        pos = torch.arange(start, start + L, device=device)
        ids = self.block_ids_for(torch.tensor(int(anchor), device=device), L)
        cos_b, sin_b = rope_cos_sin(pos, cfg.head_dim, cfg.rope_theta)
        cos_c, sin_c = rope_cos_sin(ctx_positions, cfg.head_dim, cfg.rope_theta)
        key_pos = torch.cat([ctx_positions, pos])
        is_block_key = torch.cat([torch.zeros(n_ctx, dtype=torch.bool, device=device),
                                  torch.ones(L, dtype=torch.bool, device=device)])
        qi = torch.arange(L, device=device)

        def visible(layer: int) -> torch.Tensor:           # [L, n_ctx + L]
            W = cfg.layer_window(layer)
            diff = pos[:, None] - key_pos[None, :]         # p - k
            ok = torch.ones_like(diff, dtype=torch.bool)
            if W is not None:
                ok &= (diff < W) & (-diff < W)
            if cfg.layer_is_causal(layer):
                ok &= ~is_block_key[None, :] | (diff >= 0)
            return ok

        # Inference engines may keep the context K/V in a narrower cache (kv_cache_dtype, e.g.
        # torch.bfloat16: K and V rounded once, everything else fp32); None = fp32 throughout.
        kv_dtype = getattr(self, "kv_cache_dtype", None)

        def make_attend(layer: int):
            ok = visible(layer)

            def attend(attn: DFlash2Attention, u: torch.Tensor) -> torch.Tensor:
                q = attn.queries(u, cos_b, sin_b).float()                        # [L, nh, d]
                kb, vb = attn.keys_values(u, cos_b, sin_b)
                kc, vc = attn.keys_values(ctx, cos_c, sin_c)
                k = torch.cat([kc, kb], 0).float()                               # [T, nkv, d]
                v = torch.cat([vc, vb], 0).float()
                if kv_dtype is not None:                                         # a cache of that dtype
                    k, v = k.to(kv_dtype).float(), v.to(kv_dtype).float()
                grp = attn.nh // attn.nkv
                k = k.repeat_interleave(grp, dim=1)                              # head h -> kv h // grp
                v = v.repeat_interleave(grp, dim=1)
                s = torch.einsum("qhd,khd->hqk", q, k) * (attn.d ** -0.5)
                s = s.masked_fill(~ok[None], float("-inf"))
                p = torch.softmax(s, dim=-1)
                o = torch.einsum("hqk,khd->qhd", p, v)
                return attn.out(o.to(_gemm_dtype(u)))
            return attend

        h = self.embed_block(ids, embed_weight)
        layer_out = []
        for l, layer in enumerate(self.layers):
            h = layer(h, make_attend(l))
            layer_out.append(h)
        hn = self.norm(h)
        logits = self.compute_logits(hn, lm_head_weight)
        return BlockOutput(logits=logits, hidden=hn, ctx=ctx, ctx_positions=ctx_positions,
                           block_ids=ids, positions=pos, layer_out=layer_out)

    @torch.no_grad()
    def draft(self, embed_weight, lm_head_weight, anchor: int, start: int, taps=None, ctx=None,
              ctx_positions=None, block_len=None, temperature: float = 0.0,
              generator: Optional[torch.Generator] = None) -> dict:
        """forward_block + the DFlash2 selector walk (or per-row argmax for v1).
        Returns dict: out (BlockOutput), drafts [L-1], and for v2 the SelectorResult fields."""
        out = self.forward_block(embed_weight, lm_head_weight, anchor, start, taps=taps, ctx=ctx,
                                 ctx_positions=ctx_positions, block_len=block_len)
        res = {"out": out}
        lg, hd = out.logits[1:], out.hidden[1:]
        if self.is_v2:
            sel = self.candidate_selector.walk(hd, lg, torch.tensor(int(anchor), device=lg.device),
                                               temperature=temperature, generator=generator)
            res.update(dataclasses.asdict(sel))
            res["edges"] = self.candidate_selector.edge_table(hd, sel.cand_ids, sel.cand_logits,
                                                              torch.tensor(int(anchor), device=lg.device))
        else:
            if temperature > 0:
                q = torch.softmax(lg / temperature, dim=-1)
                res["drafts"] = torch.multinomial(q, 1, generator=generator).squeeze(-1)
                res["q"] = q
            else:
                res["drafts"] = argmax_lowest(lg)
        return res

    # ---- training form (§5.1) -----------------------------------------------------------
    def training_mask(self, layer: int, anchors: torch.Tensor, pos_ids: torch.Tensor,
                      doc_ids: Optional[torch.Tensor], S: int) -> torch.Tensor:
        """Boolean visibility [N, A*B, S + A*B] (True = attend) for one layer.
        Query (a, i) at position p = pos[a] + i sees: context index k iff k < a (strictly
        before the anchor), same document (if doc_ids), p - pos[k] < W; block row (a', j)
        iff a' == a, |i - j| < W, and j <= i if the layer is causal.  Blocks never see
        each other."""
        cfg = self.cfg
        B = cfg.block_size
        N, A = anchors.shape
        W = cfg.layer_window(layer)
        dev = anchors.device
        i = torch.arange(B, device=dev)
        kidx = torch.arange(S, device=dev)
        anc_pos = pos_ids.gather(1, anchors)                                      # [N, A]
        qpos = anc_pos[:, :, None] + i                                            # [N, A, B]
        ctx_ok = kidx[None, None, :] < anchors[:, :, None]                        # [N, A, S]
        if doc_ids is not None:
            ctx_ok = ctx_ok & (doc_ids[:, None, :] == doc_ids.gather(1, anchors)[:, :, None])
        ctx_ok = ctx_ok[:, :, None, :].expand(N, A, B, S)
        if W is not None:
            ctx_ok = ctx_ok & ((qpos[..., None] - pos_ids[:, None, None, :]) < W)
        blk = torch.ones(B, B, dtype=torch.bool, device=dev)
        if W is not None:
            blk &= (i[:, None] - i[None, :]).abs() < W
        if cfg.layer_is_causal(layer):
            blk &= i[None, :] <= i[:, None]
        same = torch.eye(A, dtype=torch.bool, device=dev)
        blk_ok = (same[:, None, :, None] & blk[None, :, None, :]).reshape(A * B, A * B)
        return torch.cat([ctx_ok.reshape(N, A * B, S), blk_ok[None].expand(N, A * B, A * B)], dim=-1)

    def forward_train(self, taps: torch.Tensor, tokens: torch.Tensor, anchors: torch.Tensor,
                      embed_weight: torch.Tensor, lm_head_weight: Optional[torch.Tensor] = None,
                      anchor_valid: Optional[torch.Tensor] = None, loss_mask: Optional[torch.Tensor] = None,
                      position_ids: Optional[torch.Tensor] = None, doc_ids: Optional[torch.Tensor] = None,
                      return_logits: bool = False, checkpoint_layers: bool = False) -> TrainOutput:
        """Batched training form.

        taps [N, S, Nt*H]: per-position tap features (concatenated target layer outputs).
        tokens [N, S] int: the sequence (target-generated responses for self-distillation).
        anchors [N, A] int: anchor indices into the sequence (any order; padding allowed with
            anchor_valid [N, A] = False).
        loss_mask [N, S] bool/int: positions whose token may be a label (assistant tokens).
        position_ids [N, S]: absolute positions (default arange); doc_ids [N, S]: document
            ids for packed sequences (context restricted to the anchor's document).
        The query stream is all blocks concatenated (A*B rows per sequence); K/V =
        [context features of the whole sequence | all block rows]; one SDPA call per layer
        with the boolean mask of `training_mask`.
        Labels: slot k (1..B-1) predicts tokens[a+k]; valid iff anchor valid, a+k < S,
        loss_mask[a+k] and same document.  Slot 0 is never trained."""
        cfg = self.cfg
        B = cfg.block_size
        N, S = tokens.shape
        A = anchors.shape[1]
        dev = tokens.device
        anchors = anchors.long().clamp(0, S - 1)
        if anchor_valid is None:
            anchor_valid = torch.ones(N, A, dtype=torch.bool, device=dev)
        anchor_valid = anchor_valid.bool()
        if position_ids is None:
            position_ids = torch.arange(S, device=dev).expand(N, S)
        position_ids = position_ids.long()

        # labels / predecessors
        k = torch.arange(1, B, device=dev)
        lab_idx = anchors[:, :, None] + k                                          # [N, A, B-1]
        in_seq = lab_idx < S
        lab_idx_c = lab_idx.clamp(max=S - 1)
        flat = lambda t, idx: t.gather(1, idx.reshape(N, -1)).view(idx.shape)
        labels = flat(tokens.long(), lab_idx_c)
        preds = flat(tokens.long(), lab_idx_c - 1)
        valid = anchor_valid[:, :, None] & in_seq
        if loss_mask is not None:
            valid = valid & flat(loss_mask.long(), lab_idx_c).bool()
        if doc_ids is not None:
            valid = valid & (flat(doc_ids, lab_idx_c) == doc_ids.gather(1, anchors)[:, :, None])
        labels = torch.where(valid, labels, torch.zeros_like(labels))

        # block inputs
        anchor_tok = tokens.long().gather(1, anchors)                               # [N, A]
        block_ids = self.block_ids_for(anchor_tok, B)                               # [N, A, B]
        bpos = position_ids.gather(1, anchors)[:, :, None] + torch.arange(B, device=dev)  # [N, A, B]
        cos_b, sin_b = rope_cos_sin(bpos.reshape(N, A * B), cfg.head_dim, cfg.rope_theta)
        cos_c, sin_c = rope_cos_sin(position_ids, cfg.head_dim, cfg.rope_theta)

        ctx = self.project_context(taps)                                            # [N, S, H]
        masks = {}

        def mask_for(layer):
            key = (cfg.layer_window(layer), cfg.layer_is_causal(layer))
            if key not in masks:
                masks[key] = self.training_mask(layer, anchors, position_ids, doc_ids, S)[:, None]
            return masks[key]

        def make_attend(layer):
            mask = mask_for(layer)

            def attend(attn: DFlash2Attention, u: torch.Tensor) -> torch.Tensor:
                uf = u.reshape(N, A * B, -1)
                q = attn.queries(uf, cos_b, sin_b)                                  # [N, AB, nh, d]
                kb, vb = attn.keys_values(uf, cos_b, sin_b)
                kc, vc = attn.keys_values(ctx, cos_c, sin_c)
                kk = torch.cat([kc, kb], dim=1)
                vv = torch.cat([vc, vb], dim=1)
                grp = attn.nh // attn.nkv
                if grp > 1:
                    kk = kk.repeat_interleave(grp, dim=2)
                    vv = vv.repeat_interleave(grp, dim=2)
                dt = _gemm_dtype(u)
                o = F.scaled_dot_product_attention(
                    q.transpose(1, 2).to(dt), kk.transpose(1, 2).to(dt), vv.transpose(1, 2).to(dt),
                    attn_mask=mask, scale=attn.d ** -0.5)
                o = o.transpose(1, 2)                                               # [N, AB, nh, d]
                return attn.out(o).view(N, A, B, -1)
            return attend

        h = self.embed_block(block_ids, embed_weight)                              # [N, A, B, H] fp32
        for l, layer in enumerate(self.layers):
            att = make_attend(l)
            if checkpoint_layers and torch.is_grad_enabled():
                h = torch.utils.checkpoint.checkpoint(layer, h, att, use_reentrant=False)
            else:
                h = layer(h, att)
        hn = self.norm(h)
        out = TrainOutput(hidden=hn, block_ids=block_ids, anchors=anchors, anchor_valid=anchor_valid,
                          labels=labels, predecessors=preds, label_valid=valid)
        if return_logits:
            assert lm_head_weight is not None
            out.logits = self.compute_logits(hn[:, :, 1:], lm_head_weight)
        return out


# --------------------------------------------------------------------------------------
# Loss (§5)
# --------------------------------------------------------------------------------------

_GAMMA = {8: 4.0, 10: 5.0, 16: 7.0}


def default_gamma(block_size: int) -> float:
    """SF table (§5.1): 4 for B 8, 5 for B 10, 7 for B 16; otherwise 7 if B > 10 else 4 (qflash)."""
    return _GAMMA.get(block_size, 7.0 if block_size > 10 else 4.0)


def slot_weights(block_size: int, gamma: float, device=None) -> torch.Tensor:
    """w_k = exp(-(k-1)/gamma) for slots k = 1..B-1 (w_0 = 0 is implicit: slot 0 is dropped)."""
    k = torch.arange(1, block_size, dtype=torch.float32, device=device)
    return torch.exp(-(k - 1) / gamma)


def _block_terms(model: DFlash2Drafter, h, lm_head_weight, labels, preds, valid, anchor_tok,
                 with_selector: bool, selector_detach: bool, with_metrics: bool):
    """Per-row terms for a chunk of blocks.  h [nb, J, H]; labels/preds/valid [nb, J]."""
    logits = model.compute_logits(h, lm_head_weight)                                  # [nb, J, V] fp32
    lab = labels.long()
    ce = torch.logsumexp(logits, -1) - logits.gather(-1, lab.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        correct = (argmax_lowest(logits) == lab) & valid
        cand_ids = torch.topk(logits, model.cfg.selector_top_k, dim=-1, sorted=True).indices
        in_topk = (cand_ids == lab.unsqueeze(-1)).any(-1) & valid
    sel_ce = torch.zeros_like(ce)
    sel_correct = torch.zeros_like(valid)
    tau_walk = tau_unary = tau_oracle = torch.zeros(h.shape[0], device=h.device)
    if with_selector:
        sel = model.candidate_selector
        sel_ce, _, sel_correct, _ = sel.loss_terms(h, logits, lab, preds, detach=selector_detach, cand_ids=cand_ids)
        sel_correct = sel_correct & valid
    if with_metrics:
        with torch.no_grad():
            lead = lambda ok: torch.cumprod(ok.long(), dim=-1).sum(-1).float() + 1.0
            tau_unary = lead(correct)
            tau_oracle = lead(in_topk)
            if with_selector:
                w = sel.walk(h.detach(), logits.detach(), anchor_tok, exact_ties=False)
                tau_walk = lead((w.drafts == lab) & valid)
            else:
                tau_walk = tau_unary
    return ce, correct, sel_ce, in_topk, sel_correct, tau_unary, tau_walk, tau_oracle


def dflash_loss(model: DFlash2Drafter, out: TrainOutput, lm_head_weight: torch.Tensor, *,
                gamma: Optional[float] = None, alpha: float = 1.0, selector_detach: bool = False,
                chunk_blocks: Optional[int] = None, with_metrics: bool = True) -> dict:
    """DFlash2 training loss (§5.1, §5.2).

    base = sum_k w_k * CE_k / sum_k w_k over valid slot rows (k = 1..B-1, w_k = exp(-(k-1)/gamma));
    selector = same weighting over rows whose label is in the unary top-K (others weight 0),
               K-way CE of the teacher-forced scores s(tok[a+k-1], C_k) against the label's index;
    loss = base + alpha * selector (selector term only for v2 and alpha != 0).

    chunk_blocks: compute logits/CE for that many blocks at a time under activation
    checkpointing, so the [rows, V] logits are never all alive (large vocabularies).
    selector_detach: stop gradients from the selector into the backbone (VS) -- default
    False (SP/NM: gradients reach the unary logits and the hidden).

    Returns a dict of tensors: loss, base_loss, selector_loss, acc [B-1] (per-slot unary top-1
    accuracy), sel_acc [B-1] (teacher-forced selector top-1 among valid rows), recall [B-1]
    (label in top-K), count [B-1] (valid rows per slot), and when with_metrics the mean block
    acceptance lengths tau_unary (per-slot argmax), tau_walk (greedy selector walk from the
    true anchor), tau_oracle (top-K oracle), each counting the anchor as 1 and stopping at the
    first miss or invalid label, over blocks with a valid slot 1."""
    cfg = model.cfg
    B = cfg.block_size
    J = B - 1
    H = out.hidden.shape[-1]
    gamma = default_gamma(B) if gamma is None else gamma
    w = slot_weights(B, gamma, device=out.hidden.device)
    with_selector = cfg.is_v2 and model.candidate_selector is not None

    h = out.hidden[:, :, 1:, :].reshape(-1, J, H)
    labels = out.labels.reshape(-1, J)
    preds = out.predecessors.reshape(-1, J)
    valid = out.label_valid.reshape(-1, J)
    keep = valid.any(-1)
    h, labels, preds, valid = h[keep], labels[keep], preds[keep], valid[keep]
    anchor_tok = preds[:, 0]
    nb = h.shape[0]

    fn = lambda *a: _block_terms(model, *a, with_selector=with_selector, selector_detach=selector_detach,
                                 with_metrics=with_metrics)
    if chunk_blocks is None or nb <= chunk_blocks:
        parts = [fn(h, lm_head_weight, labels, preds, valid, anchor_tok)]
    else:
        parts = []
        for s in range(0, nb, chunk_blocks):
            e = s + chunk_blocks
            args = (h[s:e], lm_head_weight, labels[s:e], preds[s:e], valid[s:e], anchor_tok[s:e])
            if torch.is_grad_enabled():
                parts.append(torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False))
            else:
                parts.append(fn(*args))
    ce, correct, sel_ce, in_topk, sel_correct, tau_u, tau_w, tau_o = [torch.cat(x, 0) for x in zip(*parts)]

    vf = valid.float()
    wb = w[None, :] * vf
    base = (wb * torch.where(valid, ce, torch.zeros_like(ce))).sum() / wb.sum().clamp_min(1e-12)
    res = {"base_loss": base}
    loss = base
    if with_selector:
        ws = w[None, :] * in_topk.float()
        sel_loss = (ws * torch.where(in_topk, sel_ce, torch.zeros_like(sel_ce))).sum() / ws.sum().clamp_min(1e-12)
        res["selector_loss"] = sel_loss
        if alpha:
            loss = loss + alpha * sel_loss
    else:
        res["selector_loss"] = torch.zeros((), device=h.device)
    cnt = vf.sum(0)
    res.update(loss=loss, count=cnt,
               acc=correct.float().sum(0) / cnt.clamp_min(1),
               recall=in_topk.float().sum(0) / cnt.clamp_min(1),
               sel_acc=sel_correct.float().sum(0) / cnt.clamp_min(1))
    if with_metrics:
        m = valid[:, 0]
        denom = m.float().sum().clamp_min(1)
        res["tau_unary"] = (tau_u * m).sum() / denom
        res["tau_walk"] = (tau_w * m).sum() / denom
        res["tau_oracle"] = (tau_o * m).sum() / denom
    return res


def sample_anchors(loss_mask: torch.Tensor, num_anchors: int, block_size: int,
                   generator: Optional[torch.Generator] = None):
    """SF/SP anchor sampling (§5.1): per sequence up to num_anchors random positions with
    loss_mask = 1, excluding the last block_size positions, sorted.
    loss_mask [N, S] -> (anchors [N, A] int64, anchor_valid [N, A] bool), A = num_anchors."""
    N, S = loss_mask.shape
    dev = loss_mask.device
    ok = loss_mask.bool().clone()
    ok[:, max(S - block_size, 0):] = False
    r = torch.rand(N, S, generator=generator, device="cpu").to(dev)
    r = torch.where(ok, r, torch.full_like(r, 2.0))
    order = r.argsort(dim=-1)[:, :num_anchors]
    valid = ok.gather(1, order)
    anchors = torch.where(valid, order, torch.full_like(order, S))    # invalid last
    anchors, perm = anchors.sort(dim=-1)
    valid = valid.gather(1, perm)
    anchors = torch.where(valid, anchors, torch.zeros_like(anchors))
    if anchors.shape[1] < num_anchors:
        pad = num_anchors - anchors.shape[1]
        anchors = F.pad(anchors, (0, pad))
        valid = F.pad(valid, (0, pad))
    return anchors, valid


# --------------------------------------------------------------------------------------
# Init, load, save
# --------------------------------------------------------------------------------------

@torch.no_grad()
def init_conv_identity(model: DFlash2Drafter) -> None:
    """base_kernel[:,0,:] = 1, base_kernel[:,1:,:] = 0, kernel_projection = 0 (§2.5)."""
    for layer in model.layers:
        if layer.has_conv:
            layer.attention_conv.reset_identity()
            layer.mlp_conv.reset_identity()


@torch.no_grad()
def init_weights(model: DFlash2Drafter, std: Optional[float] = None) -> None:
    """Standard Qwen3 init (normal, std = initializer_range), norms = 1, convs identity,
    selector normal std (SP: 0.02)."""
    std = model.cfg.initializer_range if std is None else std
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.fill_(1.0)
        elif "attention_conv" in name or "mlp_conv" in name:
            continue
        else:
            p.normal_(0.0, std)
    init_conv_identity(model)


@torch.no_grad()
def warm_start_from_v1(model: DFlash2Drafter, v1_state: dict) -> None:
    """Load a DFlash v1 backbone into a v2 drafter: shared tensors copied, convs identity,
    selector left as initialised."""
    missing, unexpected = model.load_state_dict(v1_state, strict=False)
    assert not unexpected, unexpected
    assert all(("_conv." in m) or m.startswith("candidate_selector.") for m in missing), missing
    init_conv_identity(model)


_CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


def save(model: DFlash2Drafter, directory: str, dtype: torch.dtype = torch.bfloat16) -> None:
    """config.json (published schema) + model.safetensors (bf16, bare codebook names)."""
    from safetensors.torch import save_file
    os.makedirs(directory, exist_ok=True)
    model.cfg.to_json(os.path.join(directory, "config.json"))
    sd = {k: v.detach().to(dtype).contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(sd, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def load(directory: str, dtype: torch.dtype = torch.float32, device="cpu") -> DFlash2Drafter:
    """Inverse of save.  Also accepts codebooks stored as `<name>.weight` (ZL key_mapping form)."""
    from safetensors.torch import load_file
    cfg = DFlash2Config.from_json(os.path.join(directory, "config.json"))
    sd = load_file(os.path.join(directory, "model.safetensors"))
    for n in _CODEBOOKS:
        if n + ".weight" in sd and n not in sd:
            sd[n] = sd.pop(n + ".weight")
    model = DFlash2Drafter(cfg)
    model.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True)
    return model.to(device=device, dtype=dtype)


# --------------------------------------------------------------------------------------
# CLI: quick self-test and a GPU training-step benchmark
# --------------------------------------------------------------------------------------

def _bench(args) -> None:
    import time
    dev = args.device
    torch.manual_seed(0)
    shapes = {
        "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=64, vocab_size=8192, num_target_layers=8, taps=[1, 3, 5]),
        "small": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=16,
                      num_key_value_heads=8, head_dim=128, vocab_size=151936, num_target_layers=28,
                      taps=[1, 13, 25]),
    }
    for name, s in shapes.items():
        if name not in args.shapes.split(","):
            continue
        taps = s.pop("taps")
        cfg = DFlash2Config(**s, sliding_window=2048, layer_types=["sliding_attention"] * s["num_hidden_layers"],
                            dflash_config=dict(block_size=8, mask_token_id=s["vocab_size"] - 1, target_layer_ids=taps,
                                               conv_kernel_size=2, conv_group_size=16, selector_rank=256,
                                               selector_top_k=16))
        model = DFlash2Drafter(cfg).to(dev)
        V, H = cfg.vocab_size, cfg.hidden_size
        emb = (torch.randn(V, H, device=dev) * 0.02).bfloat16()
        head = (torch.randn(V, H, device=dev) * 0.02).bfloat16()
        N, S, A = args.batch, args.seq, args.anchors
        taps_t = torch.randn(N, S, len(taps) * H, device=dev).bfloat16()
        toks = torch.randint(0, V - 1, (N, S), device=dev)
        lm = torch.ones(N, S, dtype=torch.bool, device=dev)
        anchors, av = sample_anchors(lm, A, 8)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            with torch.autocast(dev, dtype=torch.bfloat16):
                o = model.forward_train(taps_t, toks, anchors.to(dev), emb, anchor_valid=av.to(dev), loss_mask=lm)
                r = dflash_loss(model, o, head, chunk_blocks=args.chunk_blocks, with_metrics=False)
            r["loss"].backward()
            opt.step(); opt.zero_grad(set_to_none=True)
            return r
        for _ in range(3):
            step()
        sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
        sync()
        if dev == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.time()
        n = 10 if dev == "cuda" else 1
        for _ in range(n):
            r = step()
        sync()
        dt = (time.time() - t0) / n
        peak = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else float("nan")
        print(f"[bench {name}] N={N} S={S} A={A} B=8 V={V} H={H} chunk_blocks={args.chunk_blocks}: "
              f"{dt*1e3:.1f} ms/step (fwd+loss+bwd+AdamW, bf16 autocast), peak {peak:.1f} GiB, "
              f"loss {r['loss'].item():.3f}", flush=True)


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=192)
    ap.add_argument("--anchors", type=int, default=32)
    ap.add_argument("--chunk-blocks", type=int, default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shapes", default="tiny,small")
    a = ap.parse_args()
    if a.bench:
        _bench(a)
    else:
        assert build_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
        assert build_target_layer_ids(7, 3) == [1, 2, 4]   # 2.5 rounds to 2 (ties to even)
        print("dflash2_ref: basic checks ok; run make_drafter_fixtures.py for the full self-tests")

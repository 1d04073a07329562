"""Plain PyTorch reference of the qwen3_5 text model (qwen38.md section 3), written from the
spec without transformers' modules. float32 throughout; the Gated DeltaNet runs as the
token-by-token recurrence of section 3.3 (no chunking), the conv as an explicit 4-tap window.

Used by make_target_fixtures.py as an extra independent cross-check of transformers' logits.
It is a check, not a fixture producer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mtp_ref import gated_attention, rms_plain, rms_zc, swiglu


def _softplus(x):
    return F.softplus(x)


class TargetRef:
    def __init__(self, tc: dict, tensors: dict, dtype=torch.float32):
        """tc: text config dict; tensors: text-only names (`model.*`, `lm_head.weight`).
        dtype: compute precision (float32; float64 for a high-precision check)."""
        self.tc = tc
        self.dtype = dtype
        self.w = {k: v.to(dtype) for k, v in tensors.items()}
        rp = tc.get("rope_parameters") or {}
        self.theta = float(rp.get("rope_theta", tc.get("rope_theta", 1e7)))
        self.rotary_dim = int(tc["head_dim"] * rp.get("partial_rotary_factor", tc.get("partial_rotary_factor", 0.25)))
        self.eps = tc["rms_norm_eps"]
        n = tc["num_hidden_layers"]
        self.layer_types = tc.get("layer_types") or [
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]

    def W(self, name):
        return self.w[name]

    @torch.no_grad()
    def gdn(self, L, a):
        """Gated DeltaNet over rows a [N, hidden], fresh state. Returns [N, hidden]."""
        tc = self.tc
        p = f"model.layers.{L}.linear_attn."
        Hk, Hv = tc["linear_num_key_heads"], tc["linear_num_value_heads"]
        dk, dv = tc["linear_key_head_dim"], tc["linear_value_head_dim"]
        K = tc["linear_conv_kernel_dim"]
        n = a.shape[0]
        mixed = F.linear(a, self.W(p + "in_proj_qkv.weight"))  # [N, conv_dim]
        z = F.linear(a, self.W(p + "in_proj_z.weight")).view(n, Hv, dv)
        alpha = F.linear(a, self.W(p + "in_proj_a.weight"))  # [N, Hv]
        bt = F.linear(a, self.W(p + "in_proj_b.weight"))
        cw = self.W(p + "conv1d.weight")[:, 0, :]  # [C, K], tap K-1 = current token
        C = mixed.shape[1]
        window = torch.zeros(K - 1, C, dtype=self.dtype)  # last K-1 raw rows, oldest first
        A = torch.exp(self.W(p + "A_log"))
        dt_bias = self.W(p + "dt_bias")
        S = torch.zeros(Hv, dv, dk, dtype=self.dtype)  # S[h, dv, dk]
        ratio = Hv // Hk
        out = torch.zeros(n, Hv, dv, dtype=self.dtype)
        for t in range(n):
            rows = torch.cat([window, mixed[t:t + 1]], dim=0)  # [K, C]
            u = F.silu((rows * cw.t()).sum(0))  # sum_j w[c, j] * r[t-K+1+j, c]
            window = rows[1:]
            q = u[:Hk * dk].view(Hk, dk)
            k = u[Hk * dk:2 * Hk * dk].view(Hk, dk)
            v = u[2 * Hk * dk:].view(Hv, dv)
            q = q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-6) * dk ** -0.5
            k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)
            g = torch.exp(-A * _softplus(alpha[t] + dt_bias))  # [Hv]
            beta = torch.sigmoid(bt[t])
            for h in range(Hv):
                kh, qh = k[h // ratio], q[h // ratio]
                S[h] = g[h] * S[h]
                r = S[h] @ kh
                delta = beta[h] * (v[h] - r)
                S[h] = S[h] + torch.outer(delta, kh)
                out[t, h] = S[h] @ qh
        o = rms_plain(out, self.W(p + "norm.weight"), self.eps) * F.silu(z)
        return F.linear(o.reshape(n, Hv * dv), self.W(p + "out_proj.weight"))

    @torch.no_grad()
    def attn(self, L, a, positions):
        tc = self.tc
        p = f"model.layers.{L}.self_attn."
        w = {nm: self.W(p + nm + ".weight") for nm in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")}
        return gated_attention(a, positions, w, num_heads=tc["num_attention_heads"],
                               num_kv_heads=tc["num_key_value_heads"], head_dim=tc["head_dim"],
                               rotary_dim=self.rotary_dim, theta=self.theta, eps=self.eps)

    @torch.no_grad()
    def forward(self, tokens):
        """Returns (logits [N, V], final_hidden [N, H] post-norm, layer_outputs list of [N, H] raw)."""
        eps = self.eps
        h = self.W("model.embed_tokens.weight")[tokens.long()]
        positions = torch.arange(tokens.numel())
        outs = []
        for L, lt in enumerate(self.layer_types):
            p = f"model.layers.{L}."
            a = rms_zc(h, self.W(p + "input_layernorm.weight"), eps)
            h = h + (self.gdn(L, a) if lt == "linear_attention" else self.attn(L, a, positions))
            m = rms_zc(h, self.W(p + "post_attention_layernorm.weight"), eps)
            h = h + swiglu(m, self.W(p + "mlp.gate_proj.weight"), self.W(p + "mlp.up_proj.weight"),
                           self.W(p + "mlp.down_proj.weight"))
            outs.append(h)
        fh = rms_zc(h, self.W("model.norm.weight"), eps)
        return F.linear(fh, self.W("lm_head.weight")), fh, outs

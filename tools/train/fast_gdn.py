"""A faster chunked gated delta rule for training the demo target (transformers' Qwen3_5 GDN layer).

`chunk_gated_delta_rule` takes the arguments of transformers' `torch_chunk_gated_delta_rule`
(`transformers.models.qwen3_5.modeling_qwen3_5`, 5.17) and returns the same values: the output
[batch, seq, v_heads, v_dim] in the query's dtype and, when `output_final_state`, the final state
[batch, v_heads, k_dim, v_dim] in float32 (else None). Same math, same padding to whole chunks,
same l2norm and 1/sqrt(k_dim) query scale; what differs is how the work is laid out:

- the two unit-lower-triangular systems of a chunk (the "UT transform": new values u and decayed
  keys w) are solved once, on their right-hand sides side by side ([v*beta | -k*beta*exp(G)]),
  either with one batched `torch.linalg.solve_triangular` (`solve="tri"`) or with an explicit
  inverse built from 2x2 block merges that uses matrix products only (`solve="block"`);
- everything that does not depend on the state is computed for all chunks at once, and the
  sequential loop over chunks does only what it must: v_new = u - w @ S and
  S <- exp(G_last) * S + (k * exp(G_last - G))^T @ v_new (three kernels a chunk);
  the output, q*exp(G) @ S + (q k^T * decay) @ v_new, is one batched product afterwards over the
  stacked per-chunk states;
- autocast is switched off inside, so every product runs on float32 operands (TF32 where the caller
  allows it) and the state stays float32, as the reference's explicit float32 casts intend (under
  bf16 autocast the reference's own products run in bf16).

Autograd differentiates all of it (solve_triangular included), except the block inverse, which has
its own two-product backward.
`install()` puts it in place of transformers' function; `reference()` returns transformers' PyTorch
implementation (the decorator's `__wrapped__`). Checked against the reference on the CPU by
tools/train/test_fast_gdn.py; docs/experiments/demo_data.md, "Fast GDN for training".
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

QWEN35_MODULE = "transformers.models.qwen3_5.modeling_qwen3_5"
FUNC_NAME = "torch_chunk_gated_delta_rule"
SOLVERS = ("tri", "block")


def l2norm(x: torch.Tensor, dim: int = -1, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum(x^2) + eps), the reference's formula (rsqrt of the sum plus eps)."""
    return x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)


def _unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    n = a.shape[-1]
    if n & (n - 1):
        raise ValueError(f"unit_lower_inverse: size {n} is not a power of two")
    batch = a.shape[:-2]
    low = a.tril(-1)
    inv = torch.ones(*batch, n, 1, 1, dtype=a.dtype, device=a.device)  # inverses of the 1x1 blocks
    b = 1
    while b < n:
        m = n // (2 * b)
        # the m diagonal blocks of size 2b: blocks[..., i, r, c] = low[i*2b + r, i*2b + c]
        blocks = torch.diagonal(low.reshape(*batch, m, 2 * b, m, 2 * b), dim1=-4, dim2=-2).movedim(-1, -3)
        c = blocks[..., b:, :b]
        x_inv, y_inv = inv.reshape(*batch, m, 2, b, b).unbind(-3)
        off = (y_inv @ (c @ x_inv)).neg_()
        top = torch.cat([x_inv, torch.zeros_like(x_inv)], dim=-1)
        bottom = torch.cat([off, y_inv], dim=-1)
        inv = torch.cat([top, bottom], dim=-2)
        b *= 2
    return inv.reshape(*batch, n, n)


class _UnitLowerInverse(torch.autograd.Function):
    """T = (I + tril(a, -1))^-1; backward dL/da = tril(-T^T (dL/dT) T^T, -1) (from dT = -T dM T)."""

    @staticmethod
    def forward(ctx, a):
        t = _unit_lower_inverse(a)
        ctx.save_for_backward(t)
        return t

    @staticmethod
    def backward(ctx, grad):
        (t,) = ctx.saved_tensors
        tt = t.transpose(-1, -2)
        return (tt @ grad @ tt).neg_().tril_(-1)


def unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    """(I + tril(a, -1))^-1 for a batch of n x n matrices (n a power of two), built bottom-up by
    merging 2x2 block-lower-triangular blocks: [[X, 0], [C, Y]]^-1 = [[X^-1, 0], [-Y^-1 C X^-1, Y^-1]]
    (log2 n levels of matrix products and concatenations, no triangular solve). The diagonal and
    upper part of `a` are not read, as with solve_triangular(unitriangular=True). Differentiable
    through its own backward (two products), checked by finite differences in test_fast_gdn.py."""
    return _UnitLowerInverse.apply(a)


def chunk_gated_delta_rule(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    solve: str = "tri",
    compute_dtype: torch.dtype = torch.float32,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunked gated delta rule; arguments and results as transformers' `torch_chunk_gated_delta_rule`.

    query, key [B, T, H, Dk]; value [B, T, H, Dv]; g (log decay, <= 0), beta [B, T, H];
    initial_state [B, H, Dk, Dv] or None. Extra keyword arguments (cu_seqlens, ...) are ignored,
    as the reference ignores them. `solve`: "tri" or "block" (see the module docstring);
    `compute_dtype`: float32 like the reference (float64 for tests)."""
    if solve not in SOLVERS:
        raise ValueError(f"solve: expected one of {SOLVERS}, found {solve!r}")
    initial_dtype = query.dtype
    dev = query.device.type  # (the meta device, for counting operations, has no autocast)
    with contextlib.nullcontext() if dev == "meta" else torch.autocast(device_type=dev, enabled=False):
        out, state = _forward(query, key, value, g, beta, chunk_size, initial_state, use_qk_l2norm_in_kernel,
                              solve, compute_dtype)
    return out.to(initial_dtype, memory_format=torch.contiguous_format), (state if output_final_state else None)


def _forward(query, key, value, g, beta, chunk_size, initial_state, use_l2norm, solve, dt):
    bsz, seq, heads, dk = key.shape
    dv = value.shape[-1]
    if query.shape != key.shape or value.shape[:3] != key.shape[:3]:
        raise ValueError(f"fast_gdn: query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                         f"{tuple(value.shape)} must share batch, sequence and heads (the layer repeats "
                         "q/k to the value heads before the call)")
    # [B, T, H, D] -> [B, H, T, D] in the compute dtype (one copy each, as the reference)
    q, k, v = (x.transpose(1, 2).to(dt, memory_format=torch.contiguous_format) for x in (query, key, value))
    beta = beta.transpose(1, 2).to(dt)
    g = g.transpose(1, 2).to(dt)
    if use_l2norm:
        q = l2norm(q)
        k = l2norm(k)
    q = q * dk ** -0.5
    pad = (chunk_size - seq % chunk_size) % chunk_size
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    n = (seq + pad) // chunk_size
    bh = bsz * heads
    # [B*H, n, C, D]: batch and head flattened so that the loop can use baddbmm
    q, k, v = (x.reshape(bh, n, chunk_size, x.shape[-1]) for x in (q, k, v))
    beta = beta.reshape(bh, n, chunk_size, 1)
    gc = g.reshape(bh, n, chunk_size).cumsum(-1)  # log decay from the chunk start, inclusive

    # decay[i, j] = exp(gc_i - gc_j) for j <= i, 0 above the diagonal (masked before exp: no overflow)
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    decay = (gc.unsqueeze(-1) - gc.unsqueeze(-2)).masked_fill(upper, float("-inf")).exp()
    kb = k * beta
    kt = k.transpose(-1, -2)
    ut = (kb @ kt) * decay  # strictly lower part = the UT system (diagonal not read)
    attn = (q @ kt) * decay  # causal intra-chunk attention, diagonal included
    eg = gc.exp().unsqueeze(-1)
    # right-hand sides [v*beta | -k*beta*exp(gc)]: the solve gives u and -w (the sign saves a kernel
    # in the loop)
    rhs = torch.cat([v * beta, kb * eg.neg()], dim=-1)  # [.., C, Dv + Dk]
    if solve == "tri":
        uw = torch.linalg.solve_triangular(ut, rhs, upper=False, unitriangular=True)
    else:
        uw = unit_lower_inverse(ut) @ rhs

    glast = gc[..., -1:]  # [B*H, n, 1]
    kdec = (k * (glast - gc).exp().unsqueeze(-1)).transpose(-1, -2)  # [B*H, n, Dk, C]
    cdec = glast.exp().unsqueeze(-1)  # [B*H, n, 1, 1]
    qdec = q * eg

    if initial_state is None:
        state = torch.zeros(bh, dk, dv, dtype=dt, device=q.device)
    else:
        state = initial_state.to(dtype=dt).reshape(bh, dk, dv)
    # per-chunk views by unbind, not indexing: the backward of n indexings would write n zero-filled
    # full-size gradients and add them up, unbind's backward is one stack
    us, nws = (x.unbind(1) for x in uw.split([dv, dk], dim=-1))  # u, -w
    kds, cds = kdec.unbind(1), cdec.unbind(1)
    states, vnew = [], []
    for i in range(n):  # the only sequential part: 3 kernels a chunk
        states.append(state)
        vn = torch.baddbmm(us[i], nws[i], state)  # u - w @ S
        vnew.append(vn)
        state = torch.baddbmm(state * cds[i], kds[i], vn)
    s_prev = torch.stack(states, dim=1).reshape(bh * n, dk, dv)  # state before each chunk
    vn_all = torch.stack(vnew, dim=1).reshape(bh * n, chunk_size, dv)
    out = torch.baddbmm(attn.reshape(bh * n, chunk_size, chunk_size) @ vn_all,
                        qdec.reshape(bh * n, chunk_size, dk), s_prev)
    out = out.reshape(bsz, heads, n * chunk_size, dv)[:, :, :seq].transpose(1, 2)
    return out, state.reshape(bsz, heads, dk, dv)


def make(solve: str = "tri", compile: bool = False):
    """The function to install: `chunk_gated_delta_rule` with this solver, optionally through
    torch.compile (one graph, no breaks allowed; dynamic shapes off: one graph per input shape)."""
    if solve not in SOLVERS:
        raise ValueError(f"solve: expected one of {SOLVERS}, found {solve!r}")
    impl = torch.compile(chunk_gated_delta_rule, dynamic=False, fullgraph=True) if compile else chunk_gated_delta_rule

    def fn(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
           use_qk_l2norm_in_kernel=False, **kwargs):
        return impl(query, key, value, g, beta, chunk_size=chunk_size, initial_state=initial_state,
                    output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                    solve=solve)

    fn.__name__ = fn.__qualname__ = f"fast_gdn.chunk_gated_delta_rule[{solve}{',compiled' if compile else ''}]"
    fn.fast_gdn = True  # type: ignore[attr-defined]
    return fn


def _module(module=None):
    if module is None or isinstance(module, str):
        import importlib

        module = importlib.import_module(module or QWEN35_MODULE)
    return module


_ORIGINAL: dict = {}


def reference(module=None):
    """transformers' PyTorch `torch_chunk_gated_delta_rule` (the body under its hub-kernel decorator),
    whatever is installed now."""
    module = _module(module)
    f = _ORIGINAL.get(module.__name__, getattr(module, FUNC_NAME))
    return getattr(f, "__wrapped__", f)


def install(module=None, solve: str = "tri", compile: bool = False):
    """Replace `torch_chunk_gated_delta_rule` in transformers' Qwen3_5 modeling module (the layer
    looks the name up at call time, so models built before and after the call both use it).
    Returns the installed function. `uninstall()` restores transformers' own (decorated) one."""
    module = _module(module)
    _ORIGINAL.setdefault(module.__name__, getattr(module, FUNC_NAME))
    fn = make(solve=solve, compile=compile)
    setattr(module, FUNC_NAME, fn)
    return fn


def uninstall(module=None):
    module = _module(module)
    if module.__name__ in _ORIGINAL:
        setattr(module, FUNC_NAME, _ORIGINAL.pop(module.__name__))
    return getattr(module, FUNC_NAME)


def use(kind: str, module=None, log=print, solve: str = "tri", compile: bool = False):
    """The `--gdn` flag of the training scripts: "fast" installs this implementation (with `solve`,
    `compile`), "ref" leaves transformers' own choice (its PyTorch reference, or fla's kernel when
    fla-core is installed). Returns a one-line description, also passed to `log`."""
    module = _module(module)
    if kind == "ref":
        desc = "transformers' own torch_chunk_gated_delta_rule"
        if getattr(getattr(module, FUNC_NAME), "fast_gdn", False):
            uninstall(module)
            desc += " (fast_gdn uninstalled)"
    elif kind == "fast":
        desc = install(module, solve=solve, compile=compile).__name__
    else:
        raise SystemExit(f"--gdn: expected fast or ref, found {kind!r}")
    if log:
        log(f"gdn: chunked gated delta rule = {desc}")
    return desc

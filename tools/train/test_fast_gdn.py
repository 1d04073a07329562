#!/usr/bin/env python3
"""CPU checks of tools/train/fast_gdn.py against transformers' `torch_chunk_gated_delta_rule` and
against a float64 token-by-token recurrence written here from the definition.

    python3 tools/train/test_fast_gdn.py          # plain: prints one line per check, exit 0 / 1
    python3 -m pytest tools/train/test_fast_gdn.py
    FAST_GDN_TEST_COMPILE=1 ...                   # also the torch.compile variant (minutes on 2 cores)

Needs torch and transformers (the Qwen3_5 module); not part of CI (whose venv has no torch).

Tolerances (errors are max |difference| over max |reference|, per tensor; for a gradient that is
identically zero, over 1e-3 of the largest gradient):
- float64 against the float64 recurrence: 1e-11. Both are float64 (eps 1.1e-16); the chunked form
  reorders sums of at most a few hundred terms and solves a 64x64 unit-triangular system whose
  entries are bounded by 1 here, so the error is a few hundred eps times the growth of that solve;
  observed ~1e-15 to 1e-14.
- float32 against transformers' reference (float32 too): 2e-5 for outputs and states, 1e-4 for
  gradients. Same formulas in a different order (one solve for both right-hand sides, products
  regrouped, the block inverse in `solve="block"`): a few eps32 (6e-8) times the same growth;
  observed ~1e-7 to 1e-6 (gradients accumulate over more terms, hence the looser bound).
- float32 against the float64 recurrence: 2e-5 / 1e-4 likewise (the reference must pass them too,
  which says the bound is not tuned to our own error).
"""
from __future__ import annotations

import itertools
import os
import sys
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fast_gdn as FG  # noqa: E402

TOL = {torch.float64: (1e-11, 1e-11), torch.float32: (2e-5, 1e-4)}  # (values, gradients)

# (batch, seq, heads, k_dim, v_dim, chunk)
SHAPES = [
    (1, 1, 2, 8, 8, 64),  # a single token
    (1, 37, 1, 16, 16, 64),  # seq < chunk
    (2, 150, 3, 16, 32, 64),  # seq not a multiple of the chunk, k_dim != v_dim
    (2, 128, 2, 64, 64, 64),  # whole chunks, the model's head size
    (1, 70, 2, 8, 8, 16),  # another chunk size
]


def naive(q, k, v, g, beta, s0=None, l2=False):
    """The gated delta rule token by token, float64: S <- exp(g_t) S; S <- S + k_t (beta_t (v_t - S^T k_t))^T;
    o_t = S^T q_t / sqrt(k_dim). Returns (o [B, T, H, Dv], final state [B, H, Dk, Dv])."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    if l2:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * q.shape[-1] ** -0.5
    b, t, h, dk = k.shape
    s = torch.zeros(b, h, dk, v.shape[-1], dtype=torch.float64) if s0 is None else s0.double()
    out = []
    for i in range(t):
        s = s * g[:, i].exp()[..., None, None]
        pred = torch.einsum("bhkv,bhk->bhv", s, k[:, i])
        s = s + k[:, i].unsqueeze(-1) * (beta[:, i].unsqueeze(-1) * (v[:, i] - pred)).unsqueeze(-2)
        out.append(torch.einsum("bhkv,bhk->bhv", s, q[:, i]))
    return torch.stack(out, 1), s


def make_inputs(shape, dtype, with_state, l2, seed):
    b, t, h, dk, dv, _ = shape
    gen = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=gen, dtype=torch.float64)

    q, k, v = r(b, t, h, dk), r(b, t, h, dk), r(b, t, h, dv)
    if not l2:  # keep |k| ~ 1 as the model's l2norm does, or the UT system is far from the model's
        q, k = q / dk ** 0.5, k / dk ** 0.5
    # log decays as the layer makes them (-exp(A_log) * softplus(...)): mostly small, some large
    g = -torch.nn.functional.softplus(r(b, t, h)) * torch.where(r(b, t, h) > 1.5, 8.0, 0.5)
    beta = torch.sigmoid(r(b, t, h))
    s0 = r(b, h, dk, dv) * 0.5 if with_state else None
    xs = [q, k, v, g, beta] + ([s0] if with_state else [])
    return [x.to(dtype).requires_grad_(True) for x in xs]


def run_impl(fn, xs, with_state, l2, chunk, seed):
    """Output, final state, and gradients of a fixed random functional of both w.r.t. every input."""
    q, k, v, g, beta = xs[:5]
    s0 = xs[5] if with_state else None
    o, s = fn(q, k, v, g, beta, chunk_size=chunk, initial_state=s0, output_final_state=True,
              use_qk_l2norm_in_kernel=l2)
    gen = torch.Generator().manual_seed(seed + 1)
    wo = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)
    ws = torch.randn(s.shape, generator=gen, dtype=torch.float64).to(s.dtype)
    loss = (o * wo).sum() + (s * ws).sum()
    grads = torch.autograd.grad(loss, xs)
    return o.detach(), s.detach(), [gr.detach() for gr in grads]


def rel(a, b, floor=1e-30):
    a, b = a.double(), b.double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(floor)).item()


def compare(name, got, want, tol_v, tol_g):
    """Max relative errors of (output, state, gradients); raises on a tolerance miss."""
    eo, es = rel(got[0], want[0]), rel(got[1], want[1])
    # a gradient that is exactly zero in the oracle (g of the first token when there is no initial
    # state: it scales a zero state) is measured against 1e-3 of the largest gradient instead
    floor = 1e-3 * max(b.abs().max().item() for b in want[2])
    eg = max(rel(a, b, floor) for a, b in zip(got[2], want[2]))
    ok = eo <= tol_v and es <= tol_v and eg <= tol_g
    print(f"{'ok  ' if ok else 'FAIL'} {name}: out {eo:.1e} state {es:.1e} grad {eg:.1e} (tol {tol_v:.0e}/{tol_g:.0e})",
          flush=True)
    if not ok:
        raise AssertionError(f"{name}: out {eo:.2e} state {es:.2e} grad {eg:.2e}")
    return eo, es, eg


def naive_impl(q, k, v, g, beta, chunk_size=64, initial_state=None, output_final_state=True,
               use_qk_l2norm_in_kernel=False):
    return naive(q, k, v, g, beta, initial_state, use_qk_l2norm_in_kernel)


CASES = [(shape, with_state, l2) for shape in SHAPES for with_state, l2 in itertools.product((False, True), (True, False))]


def check_case(shape, with_state, l2, solves=FG.SOLVERS):
    ref = FG.reference()
    chunk = shape[-1]
    tag = f"B{shape[0]} T{shape[1]} H{shape[2]} Dk{shape[3]} Dv{shape[4]} C{chunk} state={int(with_state)} l2={int(l2)}"
    seed = zlib.crc32(tag.encode()) % 10000
    # float64: the recurrence in float64 is the oracle
    xs64 = make_inputs(shape, torch.float64, with_state, l2, seed)
    want64 = run_impl(naive_impl, xs64, with_state, l2, chunk, seed)
    for solve in solves:
        fn = lambda *a, **kw: FG.chunk_gated_delta_rule(*a, **kw, solve=solve, compute_dtype=torch.float64)  # noqa: E731
        compare(f"f64 fast[{solve}] vs recurrence  {tag}", run_impl(fn, xs64, with_state, l2, chunk, seed), want64,
                *TOL[torch.float64])
    # float32: transformers' reference and the float64 recurrence
    xs32 = make_inputs(shape, torch.float32, with_state, l2, seed)
    want_ref = run_impl(ref, xs32, with_state, l2, chunk, seed)
    compare(f"f32 reference vs recurrence       {tag}", want_ref, want64, *TOL[torch.float32])
    for solve in solves:
        fn = lambda *a, **kw: FG.chunk_gated_delta_rule(*a, **kw, solve=solve)  # noqa: E731
        got = run_impl(fn, xs32, with_state, l2, chunk, seed)
        compare(f"f32 fast[{solve}] vs reference    {tag}", got, want_ref, *TOL[torch.float32])
        compare(f"f32 fast[{solve}] vs recurrence   {tag}", got, want64, *TOL[torch.float32])
        assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32


def check_contract():
    """Return values as the reference's: dtypes, shapes, None state, bf16 in -> bf16 out, fp32 state."""
    ref = FG.reference()
    xs = [x.detach() for x in make_inputs((2, 70, 2, 16, 16, 64), torch.bfloat16, True, True, 5)]
    q, k, v, g, beta, s0 = xs
    g = g.float()  # the layer passes g in float32
    for fn in (ref, FG.chunk_gated_delta_rule):
        o, s = fn(q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True,
                  cu_seqlens=None)
        assert o.dtype == torch.bfloat16 and o.shape == (2, 70, 2, 16) and o.is_contiguous(), (o.dtype, o.shape)
        assert s.dtype == torch.float32 and s.shape == (2, 2, 16, 16)
        o2, s2 = fn(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)
        assert s2 is None
    o_r, s_r = ref(q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_f, s_f = FG.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=s0, output_final_state=True,
                                         use_qk_l2norm_in_kernel=True)
    assert rel(s_f, s_r) < 1e-5, rel(s_f, s_r)
    assert rel(o_f, o_r) < 1e-2, rel(o_f, o_r)  # both round the float32 result to bf16
    print("ok   contract: dtypes, shapes, None final state, bf16 in/out, float32 state", flush=True)


def check_unit_lower_inverse():
    gen = torch.Generator().manual_seed(3)
    for n in (1, 2, 8, 64):
        a = torch.randn(5, n, n, generator=gen, dtype=torch.float64) * 0.3
        inv = FG.unit_lower_inverse(a)
        eye = torch.eye(n, dtype=torch.float64)
        err = ((eye + a.tril(-1)) @ inv - eye).abs().max().item()
        assert err < 1e-12 and torch.equal(inv.triu(1), torch.zeros_like(inv)), (n, err)
    print("ok   unit_lower_inverse: (I + tril(a, -1)) @ inv == I to 1e-12 for n = 1, 2, 8, 64", flush=True)


def check_gradcheck():
    """Finite differences in float64 (small sizes): the backward autograd builds is the derivative."""
    for solve in FG.SOLVERS:
        xs = make_inputs((1, 20, 2, 4, 4, 8), torch.float64, True, True, 11)

        def f(*xs):
            o, s = FG.chunk_gated_delta_rule(*xs[:5], chunk_size=8, initial_state=xs[5], output_final_state=True,
                                             use_qk_l2norm_in_kernel=True, solve=solve, compute_dtype=torch.float64)
            return o, s

        assert torch.autograd.gradcheck(f, xs, eps=1e-6, atol=1e-7, rtol=1e-5)
        print(f"ok   gradcheck fast[{solve}] (float64, finite differences)", flush=True)


def check_model(shape="nano", solves=FG.SOLVERS):
    """A whole Qwen3_5ForCausalLM (common.build_target) with transformers' function and with ours
    installed the way the training scripts install it: loss and every parameter gradient."""
    import common as C
    import transformers.models.qwen3_5.modeling_qwen3_5 as M

    torch.manual_seed(0)
    model = C.build_target(shape=shape)
    ids = torch.randint(0, C.VOCAB_SIZE, (2, 97))

    def loss_grads():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        return loss.item(), torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])

    FG.uninstall(M)
    assert not getattr(M.torch_chunk_gated_delta_rule, "fast_gdn", False)
    l_ref, g_ref = loss_grads()
    try:
        for solve in solves:
            fn = FG.install(M, solve=solve)
            assert M.torch_chunk_gated_delta_rule is fn
            l_f, g_f = loss_grads()
            dl, dg = abs(l_f - l_ref) / l_ref, ((g_f - g_ref).norm() / g_ref.norm()).item()
            ok = dl < 1e-6 and dg < 1e-4
            print(f"{'ok  ' if ok else 'FAIL'} model ({shape}, 2x96 tokens, float32) fast[{solve}] vs transformers: "
                  f"loss {l_ref:.6f} rel diff {dl:.1e}, gradient rel err {dg:.1e}", flush=True)
            assert ok
    finally:
        FG.uninstall(M)
    assert not getattr(M.torch_chunk_gated_delta_rule, "fast_gdn", False)


def check_compile():
    """FG.make(compile=True) (torch.compile, fullgraph) against eager: values and gradients."""
    shape = (2, 150, 3, 16, 32, 64)
    xs = make_inputs(shape, torch.float32, True, True, 7)
    for solve in FG.SOLVERS:
        want = run_impl(FG.make(solve=solve), xs, True, True, 64, 7)
        got = run_impl(FG.make(solve=solve, compile=True), xs, True, True, 64, 7)
        compare(f"f32 torch.compile fast[{solve}] vs eager", got, want, *TOL[torch.float32])


# pytest entry points (plain `python3 test_fast_gdn.py` needs no pytest)
try:
    import pytest

    _cases = pytest.mark.parametrize("shape,with_state,l2", CASES)
    _slow = pytest.mark.skipif(not os.environ.get("FAST_GDN_TEST_COMPILE"), reason="FAST_GDN_TEST_COMPILE not set (slow)")
except ImportError:  # pragma: no cover
    _cases = _slow = lambda f: f


@_cases
def test_against_reference_and_recurrence(shape, with_state, l2):
    check_case(shape, with_state, l2)


def test_contract():
    check_contract()


def test_unit_lower_inverse():
    check_unit_lower_inverse()


def test_gradcheck():
    check_gradcheck()


def test_model():
    check_model()


@_slow
def test_compile():
    check_compile()


def main() -> int:
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    n_ok = n_fail = 0
    checks = [(check_case, c) for c in CASES] + [(check_contract, ()), (check_unit_lower_inverse, ()),
                                                 (check_gradcheck, ()), (check_model, ())]
    if os.environ.get("FAST_GDN_TEST_COMPILE"):
        checks.append((check_compile, ()))
    for fn, args in checks:
        try:
            fn(*args)
            n_ok += 1
        except Exception as e:  # noqa: BLE001
            print(f"FAIL {fn.__name__}{args}: {type(e).__name__}: {e}", flush=True)
            n_fail += 1
    print(f"{n_ok} passed, {n_fail} failed")
    return 1 if n_fail else 0


if __name__ == "__main__":
    sys.exit(main())

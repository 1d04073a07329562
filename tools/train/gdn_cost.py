#!/usr/bin/env python3
"""What a training step of the demo target costs with each gated-delta-rule implementation,
measured without a GPU (docs/experiments/demo_data.md, "Fast GDN for training").

    python3 tools/train/gdn_cost.py census [--shape small] [--batch 64] [--seq 512]
    python3 tools/train/gdn_cost.py cpu    [--shape small] [--batch 4] [--seq 512] [--reps 5]

census: one forward + backward on PyTorch's `meta` device (shapes only, nothing computed), every
ATen operation counted through a dispatch mode: operations that launch a kernel on a GPU (views and
allocations excluded), the bytes they read and write, and the multiply-add FLOPs of the matrix
products, for the GDN function alone at the layer's shapes and for the whole model's loss + backward.
The meta device has no autocast: every tensor is counted in float32 (under bf16 autocast the
model's linear layers move half as many bytes; the GDN functions work in float32 either way).
cpu: wall time on this machine, the same implementations interleaved, minimum of --reps.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

IMPLS = ("ref", "tri", "block")
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view", "detach",
             "alias", "lift_fresh", "_reshape_alias", "set_", "resize_", "_local_scalar_dense", "view", "t"}


def impl_fn(name):
    import fast_gdn as FG

    if name == "ref":
        return FG.reference()
    return FG.make(solve=name)


def _bytes(t):
    import torch

    if not isinstance(t, torch.Tensor):
        return 0
    n = 1
    for s, st in zip(t.shape, t.stride()):
        if st != 0:  # broadcast dimensions are read once
            n *= s
    return n * t.element_size()


def _flops(name, args, out):
    """2 x multiply-adds of the matrix products; 0 for everything else."""
    import torch

    def numel(t):
        return t.numel() if isinstance(t, torch.Tensor) else 0

    if name in ("mm", "bmm", "matmul"):
        a = args[0]
        return 2 * numel(out) * a.shape[-1]
    if name in ("addmm", "baddbmm", "addbmm"):
        a = args[1]
        return 2 * numel(out) * a.shape[-1]
    if name == "linalg_solve_triangular":
        a, b = args[0], args[1]
        return numel(b) * a.shape[-1]  # n^2 * nrhs per matrix
    if name.startswith("_scaled_dot_product") or name == "scaled_dot_product_attention":
        q, k = args[0], args[1]
        return 4 * q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2] * q.shape[3]
    return 0


class Census:
    """A dispatch mode that records (op, bytes, flops) of every kernel-launching ATen operation."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        rec = self.rec = []

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                name = func.overloadpacket.__name__
                if not func.is_view and name not in NO_KERNEL:
                    flat_in, _ = tree_flatten((args, kwargs or {}))
                    flat_out, _ = tree_flatten(out)
                    nb = sum(_bytes(x) for x in flat_in) + sum(_bytes(x) for x in flat_out)
                    o = flat_out[0] if flat_out else None
                    rec.append((name, nb, _flops(name, args, o)))
                return out

        self.mode = Mode()

    def __enter__(self):
        self.rec.clear()
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)

    def summary(self):
        ops = collections.Counter(r[0] for r in self.rec)
        return {"kernels": len(self.rec), "gbytes": sum(r[1] for r in self.rec) / 1e9,
                "gflops": sum(r[2] for r in self.rec) / 1e9, "top": ops.most_common(8),
                "solves": ops.get("linalg_solve_triangular", 0)}


def census_gdn(name, batch, seq, heads, dim=64):
    import torch

    fn = impl_fn(name)
    with torch.device("meta"):
        q, k, v = (torch.empty(batch, seq, heads, dim, requires_grad=True) for _ in range(3))
        g, beta = (torch.empty(batch, seq, heads, requires_grad=True) for _ in range(2))
    c = Census()
    with c:
        o, _ = fn(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    fwd = c.summary()
    with c:
        o.backward(torch.empty_like(o))
    return fwd, c.summary()


def census_model(name, shape, batch, seq):
    import torch
    import torch.nn.functional as F
    import transformers.masking_utils as MU
    import transformers.models.qwen3_5.modeling_qwen3_5 as M

    import common as C
    import fast_gdn as FG

    # the causal-mask helper inspects position ids with .item(), which the meta device cannot do;
    # unpacked sequences are what training feeds anyway
    MU.find_packed_sequence_indices = lambda *a, **k: None
    FG.uninstall(M)
    if name == "ref":
        M.torch_chunk_gated_delta_rule = FG.reference(M)
    else:
        FG.install(M, solve=name)
    try:
        with torch.device("meta"):
            model = C.build_target(shape=shape)
            ids = torch.zeros(batch, seq + 1, dtype=torch.long)
        c = Census()
        with c:
            logits = model(input_ids=ids[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        fwd = c.summary()
        with c:
            loss.backward()
        return fwd, c.summary()
    finally:
        FG.uninstall(M)


def cmd_census(a):
    import common as C

    heads = C.TARGET_SHAPES[a.shape]["gdn_v"]
    n_gdn = sum(1 for i in range(C.TARGET_SHAPES[a.shape]["layers"]) if (i + 1) % 4 != 0)
    res = {"shape": a.shape, "batch": a.batch, "seq": a.seq, "gdn_layers": n_gdn, "gdn": {}, "model": {}}
    print(f"census: {a.shape}, batch {a.batch}, seq {a.seq}; GDN at {a.batch}x{a.seq}x{heads} heads x 64 "
          f"({n_gdn} GDN layers); meta device, float32 bytes")
    print(f"{'':24s}{'kernels fwd':>12s}{'bwd':>7s}{'GB fwd':>9s}{'bwd':>8s}{'GFLOP fwd':>11s}{'bwd':>8s}{'solves':>8s}")
    for part, fn in (("gdn", lambda n: census_gdn(n, a.batch, a.seq, heads)),
                     ("model", lambda n: census_model(n, a.shape, a.batch, a.seq))):
        for n in IMPLS:
            f, b = fn(n)
            res[part][n] = {"fwd": f, "bwd": b}
            print(f"{part + ' ' + n:24s}{f['kernels']:12d}{b['kernels']:7d}{f['gbytes']:9.2f}{b['gbytes']:8.2f}"
                  f"{f['gflops']:11.1f}{b['gflops']:8.1f}{f['solves'] + b['solves']:8d}", flush=True)
    for n in IMPLS:
        print(f"  {n} gdn backward, most frequent: {res['gdn'][n]['bwd']['top']}")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return res


def cmd_cpu(a):
    import numpy as np
    import torch
    import torch.nn.functional as F
    import transformers.models.qwen3_5.modeling_qwen3_5 as M

    import common as C
    import fast_gdn as FG

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    heads = C.TARGET_SHAPES[a.shape]["gdn_v"]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(a.batch, a.seq, heads, 64, generator=gen).requires_grad_() for _ in range(3))
    g = (-F.softplus(torch.randn(a.batch, a.seq, heads, generator=gen))).requires_grad_()
    beta = torch.sigmoid(torch.randn(a.batch, a.seq, heads, generator=gen)).requires_grad_()

    def gdn_step(fn):
        o, _ = fn(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
        o.square().sum().backward()

    torch.manual_seed(0)
    model = C.build_target(shape=a.shape)
    ids = torch.from_numpy(np.random.default_rng(0).integers(0, C.VOCAB_SIZE - 6, size=(a.batch, a.seq + 1)))

    def model_step(_):
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids[:, :-1], use_cache=False).logits
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).backward()

    def fwd_only(fn):
        with torch.no_grad():
            fn(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)

    times = {(p, n): [] for p in ("gdn_fwd", "gdn", "model") for n in IMPLS}
    for rep in range(a.reps + 1):  # rep 0 warms up
        for n in IMPLS:
            fn = impl_fn(n)
            FG.uninstall(M)
            if n != "ref":
                FG.install(M, solve=n)
            for part, step in (("gdn_fwd", lambda: fwd_only(fn)), ("gdn", lambda: gdn_step(fn)),
                               ("model", lambda: model_step(None))):
                t0 = time.perf_counter()
                step()
                if rep:
                    times[(part, n)].append(time.perf_counter() - t0)
        FG.uninstall(M)
    print(f"cpu: {a.shape}, batch {a.batch}, seq {a.seq}, {torch.get_num_threads()} threads, float32, "
          f"min (median) of {a.reps} interleaved repetitions, seconds")
    res = {}
    for part in ("gdn_fwd", "gdn", "model"):
        row = []
        for n in IMPLS:
            t = sorted(times[(part, n)])
            res[f"{part}_{n}_min"], res[f"{part}_{n}_median"] = t[0], t[len(t) // 2]
            row.append(f"{n} {t[0]:.3f} ({t[len(t) // 2]:.3f})")
        print(f"  {part:8s} " + "   ".join(row), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("census", "cpu"))
    ap.add_argument("--shape", default="small")
    ap.add_argument("--batch", type=int, default=None, help="census: 64, cpu: 4")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    if a.batch is None:
        a.batch = 64 if a.what == "census" else 4
    (cmd_census if a.what == "census" else cmd_cpu)(a)


if __name__ == "__main__":
    main()

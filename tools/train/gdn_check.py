#!/usr/bin/env python3
"""Gated-delta-rule implementations for transformers' Qwen3_5 GDN layer: do they agree with the
PyTorch reference, and how fast does each train the target (docs/experiments/demo_data.md, v3 and
"Fast GDN for training").

    python3 tools/train/gdn_check.py [--gdn picked|fast] [--shape small] [--batch 64] [--seq 512]
                                     [--steps 10] [--compile] [--micro 20] [--json F]

--gdn picked (default; the fla-core check of remote_v2.sh): transformers decorates
`torch_chunk_gated_delta_rule` at import time with
`use_kernel_func_from_hub_with_fallback("chunk_gated_delta_rule", "fla")`: if
`fla.ops.gated_delta_rule.chunk_gated_delta_rule` imports (package fla-core), that kernel runs,
else the PyTorch reference (`__wrapped__`). The candidate is whichever was picked.

--gdn fast: the candidates are tools/train/fast_gdn.py with each solver (`--solve`, default both:
`tri` = one batched solve_triangular, `block` = block inverse from matrix products); `--compile`
adds, for each, the GDN function alone through torch.compile (`+cgdn`) and the whole model through
torch.compile as `--target-compile` trains it (`+cmodel`); `--compile-ref` also compiles the
reference model (is torch.compile alone the win?). `--variants a,b,...` names them directly.

On one random batch each variant's loss and gradients (every parameter) are compared with the
reference's (module attribute swapped); then --steps training steps (forward + backward + AdamW)
of each are timed, and with --micro N the GDN function alone (forward + backward at the layer's
shapes, bf16 inputs under autocast as in training) N times.

Exit 0: every candidate that ran agrees with the reference (relative loss difference <= --tol,
gradient-norm ratio within --tol of 1, relative gradient error ||g - g_ref|| / ||g_ref|| <=
--grad-tol). Exit 1: an eager candidate failed, or any candidate disagrees (a torch.compile variant
that fails to compile is reported, not counted: the eager path is what the flag installs).
Exit 2: setup error.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def default_variants(a) -> list[str]:
    if a.gdn == "picked":
        out = ["picked"]
        if a.compile:
            out.append("picked+cmodel")
        return out
    solves = ["tri", "block"] if a.solve == "both" else [a.solve]
    out = list(solves)
    if a.compile:
        out += [f"{s}+cgdn" for s in solves] + [f"{s}+cmodel" for s in solves]
    if a.compile_ref:
        out.append("ref+cmodel")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gdn", choices=("picked", "fast"), default="picked",
                    help="picked: transformers' own choice (fla if installed); fast: tools/train/fast_gdn.py")
    ap.add_argument("--solve", choices=("tri", "block", "both"), default="both", help="fast_gdn solver(s)")
    ap.add_argument("--variants", default=None,
                    help="comma list instead of the default set: ref, picked, tri, block, each optionally "
                         "+cgdn (GDN function compiled) or +cmodel (whole model compiled)")
    ap.add_argument("--shape", default="small")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10, help="timed training steps per variant (0: none)")
    ap.add_argument("--micro", type=int, default=0, help="time the GDN function alone N times per variant (0: off)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--compile", action="store_true", help="add the torch.compile variants of the candidates")
    ap.add_argument("--compile-ref", action="store_true", help="add the reference with the model compiled")
    ap.add_argument("--tol", type=float, default=0.02)
    ap.add_argument("--grad-tol", type=float, default=0.1,
                    help="relative gradient error allowed (bf16 autocast: the reference's GDN products are "
                         "bf16, fast_gdn's float32)")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)

    import numpy as np
    import torch
    import torch.nn.functional as F

    import common as C
    import fast_gdn as FG
    import transformers.models.qwen3_5.modeling_qwen3_5 as M

    FG.uninstall(M)
    picked = M.torch_chunk_gated_delta_rule
    ref = getattr(picked, "__wrapped__", None)
    if ref is None:
        print("gdn_check: transformers' torch_chunk_gated_delta_rule has no __wrapped__; cannot compare", file=sys.stderr)
        return 2
    # `picked` is transformers' wrapper either way; which implementation it calls is in its closure
    impl = None
    for cell in picked.__closure__ or ():
        v = cell.cell_contents
        if callable(v) and getattr(v, "__name__", "") in ("chunk_gated_delta_rule", "torch_chunk_gated_delta_rule"):
            if v is not ref:
                impl = v
    kind = f"{impl.__module__}.{impl.__name__}" if impl is not None else "reference (PyTorch fallback)"
    try:
        import fla  # noqa: F401
        fla_version = getattr(sys.modules["fla"], "__version__", "?")
    except Exception as e:  # noqa: BLE001
        fla_version = f"not importable ({type(e).__name__}: {e})"
    variants = [v.strip() for v in a.variants.split(",")] if a.variants else default_variants(a)
    for v in variants:
        base, _, mode = v.partition("+")
        if base not in ("ref", "picked", "tri", "block") or mode not in ("", "cgdn", "cmodel") or (mode == "cgdn" and base in ("ref", "picked")):
            print(f"gdn_check: unknown variant {v!r}", file=sys.stderr)
            return 2
    device = C.pick_device(a.device)
    C.setup_torch(device)
    print(f"gdn_check: torch {torch.__version__}, transformers {__import__('transformers').__version__}, "
          f"fla {fla_version}; device {device}"
          f"{' (' + torch.cuda.get_device_name(device) + ')' if device.type == 'cuda' else ''}; "
          f"transformers picks {kind}; variants {variants}", flush=True)

    torch.manual_seed(0)
    model = C.build_target(device=device, shape=a.shape)
    gen = np.random.default_rng(0)
    w = torch.from_numpy(gen.integers(0, C.VOCAB_SIZE - 6, size=(a.batch, a.seq + 1))).to(device)

    def set_impl(v):
        base, _, mode = v.partition("+")
        if base == "ref":
            M.torch_chunk_gated_delta_rule = ref
        elif base == "picked":
            M.torch_chunk_gated_delta_rule = picked
        else:
            FG.install(M, solve=base, compile=(mode == "cgdn"))

    def loss_and_grads(fwd):
        model.zero_grad(set_to_none=True)
        with C.autocast_ctx(device):
            logits = fwd(input_ids=w[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        loss.backward()
        g = torch.cat([p.grad.float().reshape(-1) for p in model.parameters() if p.grad is not None])
        return loss.item(), g

    def timed(fwd, n):
        if n <= 0:
            return None
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=(device.type == "cuda"))
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        loss_and_grads(fwd)  # warm-up (kernel compilation, autotuning)
        C.sync(device)
        t0 = time.time()
        for _ in range(n):
            loss_and_grads(fwd)
            opt.step()
        C.sync(device)
        dt = (time.time() - t0) / n
        model.load_state_dict(state)
        return dt

    def micro(fn, n):
        """The GDN function alone, forward + backward, at the layer's shapes (q/k already repeated to
        the value heads, as the layer passes them), bf16 q/k/v/beta and float32 g under autocast."""
        sh = C.TARGET_SHAPES[a.shape]
        hv, d = sh["gdn_v"], 64
        gq = torch.Generator(device=device).manual_seed(1)
        mk = lambda *s: torch.randn(*s, generator=gq, device=device)  # noqa: E731
        q, k, vv = (mk(a.batch, a.seq, hv, d).to(torch.bfloat16).requires_grad_() for _ in range(3))
        g = (-F.softplus(mk(a.batch, a.seq, hv))).requires_grad_()
        beta = torch.sigmoid(mk(a.batch, a.seq, hv)).to(torch.bfloat16).requires_grad_()
        go = torch.randn(a.batch, a.seq, hv, d, generator=gq, device=device).to(torch.bfloat16)

        def once():
            with C.autocast_ctx(device):
                o, _ = fn(q, k, vv, g=g, beta=beta, initial_state=None, output_final_state=False,
                          use_qk_l2norm_in_kernel=True)
            torch.autograd.backward(o, go)

        once()
        C.sync(device)
        t0 = time.time()
        for _ in range(n):
            once()
        C.sync(device)
        return (time.time() - t0) / n

    res = {"kind": kind, "fla": fla_version, "device": str(device), "batch": a.batch, "seq": a.seq,
           "shape": a.shape, "variants": {}}
    if device.type == "cuda":
        res["device_name"] = torch.cuda.get_device_name(device)
    rc = 0
    tok = a.batch * a.seq
    # the reference first: its loss and gradients are what every variant is compared with
    order = ["ref"] + [v for v in variants if v != "ref"]
    g_ref = None
    for v in order:
        r = res["variants"].setdefault(v, {})
        base, _, mode = v.partition("+")
        compiled = mode in ("cgdn", "cmodel")
        if v == "picked" and impl is None:
            r["same_as"] = "ref"
            continue
        try:
            set_impl(v)
            if compiled:
                torch._dynamo.reset()
            fwd = torch.compile(model) if mode == "cmodel" else model
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.time()
            loss, g = loss_and_grads(fwd)
            C.sync(device)
            r["first_step_s"] = time.time() - t0
            r["loss"], r["gnorm"] = loss, g.norm().item()
            if v == "ref":
                g_ref, l_ref = g, loss
            else:
                r["rel_loss_diff"] = abs(loss - l_ref) / abs(l_ref)
                r["gnorm_ratio"] = r["gnorm"] / max(1e-12, res["variants"]["ref"]["gnorm"])
                gd, rd = g.double(), g_ref.double()
                r["grad_rel_err"] = ((gd - rd).norm() / rd.norm()).item()
                r["grad_cos"] = (gd @ rd / (gd.norm() * rd.norm())).item()
                del gd, rd
                r["agree"] = (r["rel_loss_diff"] <= a.tol and abs(r["gnorm_ratio"] - 1) <= a.tol
                              and r["grad_rel_err"] <= a.grad_tol)
                if not r["agree"]:
                    rc = 1
            del g
            s = timed(fwd, a.steps)
            if s:
                r["s_per_step"], r["tok_per_s"] = s, tok / s
            if a.micro > 0 and mode != "cmodel":
                r["gdn_ms_per_call"] = 1e3 * micro(M.torch_chunk_gated_delta_rule, a.micro)
            if device.type == "cuda":
                r["peak_mem_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
        except Exception as e:  # noqa: BLE001
            r["error"] = f"{type(e).__name__}: {str(e)[:400]}"
            print(f"gdn_check: {v} failed: {r['error']}", flush=True)
            if v == "ref":
                return 2
            if not compiled:
                rc = 1
        finally:
            FG.uninstall(M)
            M.torch_chunk_gated_delta_rule = picked
        line = " ".join(f"{k} {x:.4g}" if isinstance(x, float) else f"{k} {x}" for k, x in r.items())
        print(f"gdn_check: {v}: {line}", flush=True)
    # the old top-level keys of the picked-implementation check (remote_v2.sh reads the JSON file)
    if "picked" in res["variants"]:
        p, rr = res["variants"]["picked"], res["variants"]["ref"]
        res["picked_loss"], res["ref_loss"] = p.get("loss", rr.get("loss")), rr.get("loss")
        res["picked_s_per_step"], res["ref_s_per_step"] = p.get("s_per_step", rr.get("s_per_step")), rr.get("s_per_step")
    base_s = res["variants"]["ref"].get("s_per_step")
    if base_s:
        for v, r in res["variants"].items():
            if r.get("s_per_step"):
                r["speedup_vs_ref"] = base_s / r["s_per_step"]
    print("gdn_check: " + json.dumps(res), flush=True)
    print(f"gdn_check: {'OK' if rc == 0 else 'FAILED'}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())

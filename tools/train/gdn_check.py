#!/usr/bin/env python3
"""Which gated-delta-rule kernel transformers' Qwen3_5 GDN layer uses, whether it agrees with the
PyTorch reference, and how fast each trains the target (docs/experiments/demo_data.md, v3).

    python3 tools/train/gdn_check.py [--shape small] [--batch 64] [--seq 512] [--steps 10] [--compile]

transformers decorates `torch_chunk_gated_delta_rule` at import time with
`use_kernel_func_from_hub_with_fallback("chunk_gated_delta_rule", "fla")`: if
`fla.ops.gated_delta_rule.chunk_gated_delta_rule` imports (package fla-core, part of
flash-linear-attention), that kernel runs, else the PyTorch reference (`__wrapped__`). This
script reports which one was picked, then on one random batch runs the loss and gradients with
the picked implementation and with the reference (the module attribute swapped), and times
--steps training steps (forward + backward + AdamW) of each.

Exit 0: the picked implementation is the reference, or it agrees with it (relative loss
difference <= --tol and gradient-norm ratio within --tol of 1). Exit 1: it disagrees or fails
(then remove fla-core and train with the reference). Exit 2: setup error.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="small")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10, help="timed training steps per implementation (0: none)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile of the picked implementation")
    ap.add_argument("--tol", type=float, default=0.02)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)

    import numpy as np
    import torch
    import torch.nn.functional as F

    import common as C
    import transformers.models.qwen3_5.modeling_qwen3_5 as M

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
    device = C.pick_device(a.device)
    C.setup_torch(device)
    print(f"gdn_check: torch {torch.__version__}, transformers {__import__('transformers').__version__}, "
          f"fla {fla_version}; device {device}; chunk_gated_delta_rule -> {kind}", flush=True)

    torch.manual_seed(0)
    model = C.build_target(device=device, shape=a.shape)
    gen = np.random.default_rng(0)
    w = torch.from_numpy(gen.integers(0, C.VOCAB_SIZE - 6, size=(a.batch, a.seq + 1))).to(device)

    def loss_and_gnorm(fwd):
        model.zero_grad(set_to_none=True)
        with C.autocast_ctx(device):
            logits = fwd(input_ids=w[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        loss.backward()
        g = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in model.parameters() if p.grad is not None))
        return loss.item(), g.item()

    def timed(fwd, n):
        if n <= 0:
            return None
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=(device.type == "cuda"))
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        loss_and_gnorm(fwd)  # warm-up (kernel compilation)
        C.sync(device)
        t0 = time.time()
        for _ in range(n):
            loss_and_gnorm(fwd)
            opt.step()
        C.sync(device)
        dt = (time.time() - t0) / n
        model.load_state_dict(state)
        return dt

    res = {"kind": kind, "fla": fla_version, "device": str(device), "batch": a.batch, "seq": a.seq}
    rc = 0
    try:
        res["picked_loss"], res["picked_gnorm"] = loss_and_gnorm(model)
        res["picked_s_per_step"] = timed(model, a.steps)
    except Exception as e:  # noqa: BLE001
        res["picked_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        print(f"gdn_check: the picked implementation failed: {res['picked_error']}", flush=True)
        rc = 1
    M.torch_chunk_gated_delta_rule = ref
    try:
        res["ref_loss"], res["ref_gnorm"] = loss_and_gnorm(model)
        res["ref_s_per_step"] = timed(model, a.steps) if impl is not None else res.get("picked_s_per_step")
    finally:
        M.torch_chunk_gated_delta_rule = picked
    if a.compile and rc == 0:
        try:
            cm = torch.compile(model)
            t0 = time.time()
            loss_and_gnorm(cm)
            res["compile_first_step_s"] = time.time() - t0
            res["compiled_s_per_step"] = timed(cm, a.steps)
        except Exception as e:  # noqa: BLE001
            res["compile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    if rc == 0 and impl is not None:
        rel = abs(res["picked_loss"] - res["ref_loss"]) / abs(res["ref_loss"])
        gr = res["picked_gnorm"] / max(1e-12, res["ref_gnorm"])
        res["rel_loss_diff"], res["gnorm_ratio"] = rel, gr
        if rel > a.tol or abs(gr - 1) > a.tol:
            rc = 1
    tok = a.batch * a.seq
    for k in ("picked", "ref", "compiled"):
        s = res.get(f"{k}_s_per_step")
        if s:
            res[f"{k}_tok_per_s"] = tok / s
    print("gdn_check: " + json.dumps(res), flush=True)
    print(f"gdn_check: {'OK' if rc == 0 else 'FAILED'}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())

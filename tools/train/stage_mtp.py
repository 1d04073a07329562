"""Stage `mtp`: train the one-layer MTP head (tools/reference/mtp_ref.py `MTPHead`,
published `mtp.*` names) on the frozen bf16 target.

Pairs (qwen38.md 4.1): for a window t_0..t_{L-1} the frozen target gives the
post-final-norm hidden H_j; pair j = (t_{j+1}, H_j) at RoPE position j predicts
t_{j+2}, for j = 0..L-3. Loss: cross-entropy against the corpus token t_{j+2}
(teacher forcing, one MTP step; no chained steps). The shared embedding and
lm_head are the target's and stay frozen.

The forward is exactly `MTPHead.forward` of the reference (its undecorated body,
batched with torch.func.vmap so it can be trained); evaluation uses the plain
reference forward on the bf16-rounded weights.

Outputs (OUT/mtp/): mtp.safetensors (fp32 master weights, `mtp.*` names),
metrics.json.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

import common as C
from stage_target import lr_at


def init_mtp(mtp, std=0.02, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(mtp.named_parameters()):
            if p.dim() == 1:
                p.zero_()  # zero-centred norms: effective scale 1
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return mtp


def patch_rope_device(mtp_ref):
    """mtp_ref.rope_cos_sin builds its inv_freq table on the CPU, so the reference MTP head
    cannot run on a GPU as written. Replace it (module global, looked up at call time by
    gated_attention) with the same float64 math on the positions' device."""
    import torch

    orig = mtp_ref.rope_cos_sin
    if getattr(orig, "_device_aware", False):
        return

    def rope_cos_sin(positions, rotary_dim, theta, dtype=torch.float32):
        half = rotary_dim // 2
        i = torch.arange(half, dtype=torch.float64, device=positions.device)
        inv_freq = theta ** (-2.0 * i / rotary_dim)
        ang = positions.to(torch.float64)[:, None] * inv_freq[None, :]
        return ang.cos().to(dtype), ang.sin().to(dtype)

    # same numbers as the original on the CPU
    p = torch.arange(37)
    a, b = orig(p, 16, 1e7), rope_cos_sin(p, 16, 1e7)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    rope_cos_sin._device_aware = True
    mtp_ref.rope_cos_sin = rope_cos_sin


def run(args, log):
    import torch
    import torch.nn.functional as F

    out = Path(args.out)
    C.require_stage(out, "target")
    mtp_ref = C.import_reference("mtp_ref")
    patch_rope_device(mtp_ref)
    device = C.pick_device(args.device)
    C.setup_torch(device)
    seed = C.stage_seed(args.seed, "mtp")
    target = C.load_target(out, device)
    tc = json.loads(target.config.to_json_string())
    embed = target.model.embed_tokens.weight.detach()
    lm_head = target.lm_head.weight.detach()

    mtp = init_mtp(mtp_ref.MTPHead.from_text_config(tc), seed=seed).to(device)
    n_params = sum(p.numel() for p in mtp.parameters())
    names = sorted("mtp." + k for k in mtp.state_dict())
    assert names == sorted(mtp_ref.MTP_TENSOR_NAMES), names
    log(f"mtp: MTPHead {n_params:,} params; seq {args.mtp_seq} batch {args.mtp_batch} steps {args.mtp_steps}")

    raw_forward = mtp_ref.MTPHead.forward.__wrapped__  # the reference body without @torch.no_grad

    def one(tokens, hidden, positions):
        logits, _ = raw_forward(mtp, tokens, hidden, positions, embed, lm_head)
        return logits

    batched = torch.func.vmap(one)

    def target_hidden(w):
        with torch.no_grad():
            with C.autocast_ctx(device):
                o = target.model(input_ids=w, use_cache=False)
            return o.last_hidden_state.float()

    def make_batch(w):
        H = target_hidden(w)  # [B, L, H]
        L = w.shape[1]
        toks = w[:, 1 : L - 1]
        hid = H[:, : L - 2]
        labels = w[:, 2:]
        pos = torch.arange(L - 2, device=device).expand(w.shape[0], L - 2)
        return toks, hid, pos, labels

    train = C.load_tokens(out, "train")
    val = C.load_tokens(out, "val")
    opt = torch.optim.AdamW(mtp.parameters(), lr=args.mtp_lr, betas=(0.9, 0.95), weight_decay=0.0,
                            fused=(device.type == "cuda"))
    gen = np.random.default_rng(seed)
    warm = max(1, min(50, args.mtp_steps // 10))
    t0 = time.time()
    deadline = t0 + args.mtp_max_min * 60
    log_every = max(1, args.mtp_steps // 20)
    stopped_early = False
    for step in range(args.mtp_steps):
        lr = lr_at(step, args.mtp_steps, args.mtp_lr, warm)
        for g in opt.param_groups:
            g["lr"] = lr
        w = torch.from_numpy(C.random_windows(train, args.mtp_batch, args.mtp_seq, gen)).to(device)
        toks, hid, pos, labels = make_batch(w)
        with C.autocast_ctx(device):
            logits = batched(toks, hid, pos)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == args.mtp_steps - 1:
            el = time.time() - t0
            log(f"mtp step {step:5d}/{args.mtp_steps} loss {loss.item():.4f} lr {lr:.2e} {el / (step + 1):.3f}s/step")
        if time.time() > deadline:
            log(f"mtp: wall-clock guard hit ({args.mtp_max_min} min) at step {step}; stopping early")
            stopped_early = True
            break
    C.sync(device)
    train_time = time.time() - t0
    final_loss = loss.item()

    # ---- save fp32 + evaluate the bf16-rounded head with the plain reference forward ----
    mdir = out / "mtp"
    mdir.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    sd = {"mtp." + k: v.detach().float().cpu().contiguous() for k, v in mtp.state_dict().items()}
    save_file(sd, str(mdir / "mtp.safetensors"), metadata={"format": "pt"})
    ref = mtp_ref.MTPHead.from_text_config(tc).load_mtp_tensors(
        {k: v.to(torch.bfloat16).float() for k, v in sd.items()}).to(device)
    metrics = evaluate(ref, target, val, args, device, embed, lm_head, make_batch, log)
    metrics.update(params=n_params, steps=step + 1, steps_planned=args.mtp_steps, stopped_early=stopped_early,
                   train_seconds=train_time, final_train_loss=final_loss, seq=args.mtp_seq, batch=args.mtp_batch)
    C.write_json(mdir / "metrics.json", metrics)
    return metrics


def evaluate(ref, target, val, args, device, embed, lm_head, make_batch, log, n_windows=None):
    """Plain reference forward (one sequence at a time) on validation windows.
    acc: MTP argmax == t_{j+2}; agree: MTP argmax == target greedy token at j+1 (what a
    first MTP draft needs to be accepted); target_acc: the target's own next-token accuracy."""
    import torch
    import torch.nn.functional as F

    seq = args.mtp_seq
    n_win = (len(val) - 1) // seq
    n_windows = n_windows or (8 if args.smoke else 64)
    n_win = min(n_win, n_windows)
    tot = dict(n=0, nll=0.0, acc=0, agree=0, tacc=0)
    with torch.no_grad():
        for i in range(n_win):
            w = torch.from_numpy(np.asarray(val[i * seq : i * seq + seq], dtype=np.int64))[None].to(device)
            toks, hid, pos, labels = make_batch(w)
            with C.autocast_ctx(device):
                tl = target(input_ids=w, use_cache=False).logits.float()[0]
            t_next = tl[1:-1].argmax(-1)  # target greedy token at position j+1 -> predicts t_{j+2}
            logits, _ = ref(toks[0], hid[0], pos[0], embed, lm_head)
            am = logits.argmax(-1)
            tot["n"] += labels.numel()
            tot["nll"] += F.cross_entropy(logits.float(), labels[0], reduction="sum").item()
            tot["acc"] += (am == labels[0]).sum().item()
            tot["agree"] += (am == t_next).sum().item()
            tot["tacc"] += (t_next == labels[0]).sum().item()
    n = max(1, tot["n"])
    m = {
        "val_pairs": tot["n"],
        "val_loss": tot["nll"] / n,
        "val_top1_vs_corpus": tot["acc"] / n,
        "val_agree_with_target_greedy": tot["agree"] / n,
        "target_top1_vs_corpus_at_j+1": tot["tacc"] / n,
    }
    log("mtp eval (bf16 weights, reference forward): " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                                                   for k, v in m.items()))
    return m

"""Stage `drafter`: train the DFlash2 drafter (tools/reference/dflash2_ref.py) on the
frozen bf16 target by self-distillation on the `gen` continuations.

Data: every `gen` sequence is [prompt (P tokens, corpus text) | greedy target
continuation (G tokens)]. Tap features (raw outputs of target layers
`--drafter-taps`) are computed once for every sequence with the frozen target
(one uncached forward per sequence batch) and kept on the device.
Training (dflash2.md 5.1/5.2, via the reference): per step `--drafter-batch`
sequences (epoch-wise random permutation), `--drafter-anchors` random anchors
per sequence among continuation positions (`sample_anchors` with loss_mask =
continuation; the anchor's block labels are continuation tokens), the block
mask of `forward_train`, `dflash_loss` with slot weights exp(-(k-1)/gamma)
(gamma 4 for block 8) and the selector loss (alpha 1, rows whose label is
outside the unary top-16 get weight 0). AdamW, warmup + cosine, bf16 autocast.

Evaluation (fp32, bf16-rounded weights reloaded with dflash2_ref.load), on train
sequences and on held-out sequences (prompts from the validation split), with
an anchor at EVERY continuation position whose block fits (P .. S-B):
per-slot unary top-1, teacher-forced selector top-1, top-16 recall, and the
greedy selector walk from the true anchor (tau_walk: accepted drafts + 1 per
block, the acceptance length of a verify round that starts there). Because
the held-out continuations are the target's own greedy output, `tau_sim`
replays a speculative decode: the first anchor is the first generated token,
each round accepts the walk's leading matches and the next anchor is the
bonus token; tau_sim = mean over requests of the per-request mean round length.

Outputs (OUT/drafter/): config.json + model.safetensors (published schema, bf16),
metrics.json.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

import common as C
from stage_target import lr_at, param_groups


def drafter_config(R, args):
    import transformers

    # the drafter reads the target's embedding and lm_head: its width is the target's
    tcfg = C.target_config_dict(C.target_shape_of(Path(args.out)))
    n_target = tcfg["num_hidden_layers"]
    if args.drafter_taps == "auto":
        taps = list(R.build_target_layer_ids(n_target, 3))
    else:
        taps = [int(x) for x in str(args.drafter_taps).split(",")]
    if max(taps) >= n_target:
        raise SystemExit(f"--drafter-taps {taps}: the target has {n_target} layers")
    n_layers = int(getattr(args, "drafter_layers", 2))
    if n_layers < 1:
        raise SystemExit(f"--drafter-layers {n_layers}: must be >= 1")
    return R.DFlash2Config(
        hidden_size=tcfg["hidden_size"],
        intermediate_size=tcfg["intermediate_size"],
        num_hidden_layers=n_layers,
        num_attention_heads=tcfg["num_attention_heads"],
        num_key_value_heads=tcfg["num_key_value_heads"],
        head_dim=64,
        vocab_size=C.VOCAB_SIZE,
        num_target_layers=n_target,
        dflash_config=dict(
            block_size=8,
            mask_token_id=C.MASK_ID,
            target_layer_ids=taps,
            conv_kernel_size=2,
            conv_group_size=16,
            selector_rank=32,
            selector_top_k=16,
        ),
        is_causal=False,
        bos_token_id=None,
        eos_token_id=C.EOT_ID,
        pad_token_id=C.EOT_ID,
        dtype="bfloat16",
        transformers_version=transformers.__version__,
        layer_types=["sliding_attention"] * n_layers,
        sliding_window=int(args.drafter_window),
        use_sliding_window=True,
        max_window_layers=n_layers,
        max_position_embeddings=4096,
        rope_parameters={"rope_theta": 10000000, "rope_type": "default"},
        rms_norm_eps=1e-6,
        initializer_range=0.02,
        tie_word_embeddings=False,
        use_cache=True,
    )


def compute_taps(target, seqs, layer_ids, device, chunk, log, label):
    """Raw outputs of the tap layers for every sequence: [N, S, Nt*H] (bf16 on GPU)."""
    import torch

    rec = C.TapRecorder(target, layer_ids)
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    # filled in place: collecting chunks and concatenating them needs twice the memory (the
    # 98,304 training sequences' taps are ~40 GiB at the small shape, over half of an 80 GB card)
    taps = None
    t0 = time.time()
    try:
        with torch.no_grad():
            for i in range(0, len(seqs), chunk):
                w = torch.from_numpy(seqs[i : i + chunk].astype(np.int64)).to(device)
                with C.autocast_ctx(device):
                    target.model(input_ids=w, use_cache=False)
                t = rec.taps().to(dt)
                if taps is None:
                    taps = torch.empty((len(seqs),) + tuple(t.shape[1:]), dtype=dt, device=t.device)
                taps[i : i + t.shape[0]] = t
                del t
    finally:
        rec.remove()
    if taps is None:
        taps = torch.zeros(0)
    C.sync(device)
    log(f"drafter: {label} taps {tuple(taps.shape)} {taps.dtype} "
        f"({taps.numel() * taps.element_size() / 2**30:.2f} GiB) in {time.time() - t0:.1f}s")
    return taps


def evaluate(R, drafter, taps, tokens, P, embed, lm_head, device, chunk=16, gamma=4.0, alpha=1.0):
    """All-anchor evaluation (fp32, no autocast). Returns a metrics dict."""
    import torch

    B = drafter.cfg.block_size
    J = B - 1
    N, S = tokens.shape
    anchors_1 = torch.arange(P, S - B + 1, device=device)  # every block that fits
    A = anchors_1.numel()
    sums = {k: torch.zeros(J, dtype=torch.float64) for k in ("acc", "sel_acc", "recall", "count")}
    lead_walk = []
    lead_unary = []
    lead_oracle = []
    embed = embed.float()
    lm_head = lm_head.float()
    drafter.eval()
    with torch.no_grad():
        for s in range(0, N, chunk):
            tk = tokens[s : s + chunk]
            n = tk.shape[0]
            tp = taps[s : s + chunk].float()
            anchors = anchors_1.expand(n, A)
            lm = torch.zeros_like(tk, dtype=torch.bool)
            lm[:, P:] = True
            out = drafter.forward_train(tp, tk, anchors, embed, loss_mask=lm)
            res = R.dflash_loss(drafter, out, lm_head, gamma=gamma, alpha=alpha, with_metrics=False)
            cnt = res["count"].double().cpu()
            for k in ("acc", "sel_acc", "recall"):
                sums[k] += res[k].double().cpu() * cnt
            sums["count"] += cnt
            hn = out.hidden[:, :, 1:]  # [n, A, J, H]
            logits = drafter.compute_logits(hn, lm_head)  # [n, A, J, V] fp32
            labels = out.labels
            valid = out.label_valid
            anchor_tok = out.predecessors[..., 0]
            walk = drafter.candidate_selector.walk(hn, logits, anchor_tok)
            lead = lambda ok: torch.cumprod((ok & valid).long(), dim=-1).sum(-1)
            lead_walk.append(lead(walk.drafts == labels).cpu())
            lead_unary.append(lead(R.argmax_lowest(logits) == labels).cpu())
            topk = R.topk_sorted(logits, drafter.candidate_selector.top_k)[1]
            lead_oracle.append(lead((topk == labels.unsqueeze(-1)).any(-1)).cpu())
    lw = torch.cat(lead_walk)  # [N, A] accepted drafts per anchor
    lu = torch.cat(lead_unary)
    lo = torch.cat(lead_oracle)
    cnt = sums["count"].clamp_min(1)
    m = {
        "sequences": int(N),
        "blocks": int(lw.numel()),
        "slot_top1": (sums["acc"] / cnt).tolist(),
        "slot_selector_top1": (sums["sel_acc"] / cnt).tolist(),
        "slot_recall_top16": (sums["recall"] / cnt).tolist(),
        "tau_walk": float(lw.float().mean() + 1),
        "tau_unary": float(lu.float().mean() + 1),
        "tau_oracle_top16": float(lo.float().mean() + 1),
    }
    # replayed speculative decode over each sequence (anchor = first generated token)
    per_req = []
    all_rounds = []
    for r in range(N):
        a = P
        rounds = []
        while a <= S - B:
            acc = int(lw[r, a - P])
            rounds.append(acc + 1)
            a += acc + 1
        if rounds:
            per_req.append(sum(rounds) / len(rounds))
            all_rounds += rounds
    m["tau_sim"] = float(np.mean(per_req)) if per_req else float("nan")
    m["tau_sim_pooled"] = float(np.mean(all_rounds)) if all_rounds else float("nan")
    m["slot_top1_mean"] = float(np.mean(m["slot_top1"]))
    return m


def fmt_metrics(m):
    s1 = " ".join(f"{x:.2f}" for x in m["slot_top1"])
    s2 = " ".join(f"{x:.2f}" for x in m["slot_selector_top1"])
    return (f"slot top1 [{s1}] selector top1 [{s2}] tau_walk {m['tau_walk']:.3f} tau_unary {m['tau_unary']:.3f} "
            f"tau_oracle {m['tau_oracle_top16']:.3f} tau_sim {m['tau_sim']:.3f} ({m['sequences']} seqs)")


def run(args, log):
    import torch

    out = Path(args.out)
    C.require_stage(out, "gen")
    R = C.import_reference("dflash2_ref")
    device = C.pick_device(args.device)
    C.setup_torch(device)
    seed = C.stage_seed(args.seed, "drafter")
    target = C.load_target(out, device)
    embed = target.model.embed_tokens.weight.detach()
    lm_head = target.lm_head.weight.detach()
    meta = C.read_json(out / "gen" / "meta.json")
    P = int(meta["prompt_len"])
    train_np = np.load(out / "gen" / "train_seqs.npy")
    held_np = np.load(out / "gen" / "heldout_seqs.npy")
    S = train_np.shape[1]

    cfg = drafter_config(R, args)
    torch.manual_seed(seed)
    drafter = R.DFlash2Drafter(cfg).to(device)
    B = cfg.block_size
    n_params = sum(p.numel() for p in drafter.parameters())
    log(f"drafter: DFlash2 {cfg.num_hidden_layers} layers, taps {cfg.target_layer_ids}, block {B}, window "
        f"{cfg.sliding_window}, mask id {cfg.mask_token_id}; {n_params:,} params; train seqs {len(train_np)} "
        f"held-out {len(held_np)} (S={S}, prompt {P})")

    chunk = 256 if device.type == "cuda" else 8
    taps_tr = compute_taps(target, train_np, cfg.target_layer_ids, device, chunk, log, "train")
    taps_ho = compute_taps(target, held_np, cfg.target_layer_ids, device, chunk, log, "held-out")
    tok_tr = torch.from_numpy(train_np.astype(np.int64)).to(device)
    tok_ho = torch.from_numpy(held_np.astype(np.int64)).to(device)
    lm_all = torch.zeros(S, dtype=torch.bool, device=device)
    lm_all[P:] = True

    opt = torch.optim.AdamW(param_groups(drafter, 0.01), lr=args.drafter_lr, betas=(0.9, 0.95),
                            fused=(device.type == "cuda"))
    rng = np.random.default_rng(seed)
    tgen = torch.Generator().manual_seed(seed)
    order = rng.permutation(len(train_np))
    cursor = 0
    t0 = time.time()
    deadline = t0 + args.drafter_max_min * 60
    log_every = max(1, args.drafter_steps // 30)
    stopped_early = False
    nb = min(args.drafter_batch, len(train_np))
    drafter.train()
    for step in range(args.drafter_steps):
        # the cosine also follows the wall-clock guard, so a run the guard cuts short still ends annealed
        frac = (time.time() - t0) / (args.drafter_max_min * 60)
        lr = lr_at(step, args.drafter_steps, args.drafter_lr, args.drafter_warmup, frac=frac)
        for g in opt.param_groups:
            g["lr"] = lr
        if cursor + nb > len(order):
            order = rng.permutation(len(train_np))
            cursor = 0
        idx = torch.from_numpy(order[cursor : cursor + nb]).to(device)
        cursor += nb
        tk = tok_tr[idx]
        lm = lm_all.expand(nb, S)
        anchors, av = R.sample_anchors(lm, args.drafter_anchors, B, generator=tgen)
        with C.autocast_ctx(device):
            o = drafter.forward_train(taps_tr[idx], tk, anchors.to(device), embed, anchor_valid=av.to(device),
                                      loss_mask=lm)
            res = R.dflash_loss(drafter, o, lm_head, gamma=args.drafter_gamma, alpha=args.drafter_alpha,
                                with_metrics=False)
        loss = res["loss"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % log_every == 0 or step == args.drafter_steps - 1:
            el = time.time() - t0
            acc = " ".join(f"{x:.2f}" for x in res["acc"].tolist())
            log(f"drafter step {step:5d}/{args.drafter_steps} loss {loss.item():.4f} base {res['base_loss'].item():.4f} "
                f"sel {res['selector_loss'].item():.4f} lr {lr:.2e} gnorm {gn.item():.2f} slot-acc [{acc}] "
                f"{el / (step + 1):.3f}s/step")
        if time.time() > deadline:
            log(f"drafter: wall-clock guard hit ({args.drafter_max_min} min) at step {step}; stopping early")
            stopped_early = True
            break
    C.sync(device)
    train_time = time.time() - t0
    epochs = (step + 1) * nb / max(1, len(train_np))

    ddir = out / "drafter"
    R.save(drafter, str(ddir))
    del opt
    ref = R.load(str(ddir), dtype=torch.float32, device=device)  # bf16-rounded weights, published schema
    t1 = time.time()
    n_eval = min(args.eval_walk, len(train_np), len(held_np)) if len(held_np) else min(args.eval_walk, len(train_np))
    m_tr = evaluate(R, ref, taps_tr[:n_eval], tok_tr[:n_eval], P, embed, lm_head, device,
                    gamma=args.drafter_gamma, alpha=args.drafter_alpha)
    log("drafter eval TRAIN    : " + fmt_metrics(m_tr))
    m_ho = evaluate(R, ref, taps_ho[: args.eval_walk], tok_ho[: args.eval_walk], P, embed, lm_head, device,
                    gamma=args.drafter_gamma, alpha=args.drafter_alpha)
    log("drafter eval HELD-OUT : " + fmt_metrics(m_ho))
    log(f"drafter eval in {time.time() - t1:.1f}s")
    metrics = {
        "params": n_params,
        "steps": step + 1,
        "steps_planned": args.drafter_steps,
        "stopped_early": stopped_early,
        "epochs": epochs,
        "batch": nb,
        "anchors_per_seq": args.drafter_anchors,
        "train_seconds": train_time,
        "final_loss": loss.item(),
        "final_base_loss": res["base_loss"].item(),
        "final_selector_loss": res["selector_loss"].item(),
        "lr": args.drafter_lr,
        "gamma": args.drafter_gamma,
        "alpha": args.drafter_alpha,
        "train_sequences": int(len(train_np)),
        "heldout_sequences": int(len(held_np)),
        "eval_train": m_tr,
        "eval_heldout": m_ho,
    }
    C.write_json(ddir / "metrics.json", metrics)
    return {k: v for k, v in metrics.items() if not k.startswith("eval_")} | {
        "heldout_tau_walk": m_ho["tau_walk"], "heldout_tau_sim": m_ho["tau_sim"],
        "train_tau_walk": m_tr["tau_walk"]}

"""Stage `target`: train the tiny qwen3_5 target (transformers' Qwen3_5ForCausalLM)
on random windows of the packed train stream.

Recipe: fp32 master weights, bf16 autocast (GPU), AdamW (betas 0.9/0.95, weight
decay on matrices only), linear warmup then cosine to 10% of the peak LR, grad
clip 1.0. Each step draws `--target-batch` windows of `--target-seq`+1 tokens at
uniformly random offsets of the train stream (documents are packed with
<|endoftext|> between them; attention crosses document boundaries as in plain
packed LM training).

Outputs (OUT/target/): model.safetensors (bf16, the weights every later stage
and the package use), config.json, metrics.json.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

import common as C


def lr_at(step, total, peak, warmup, floor=0.1, frac=None):
    """Linear warmup over `warmup` steps, then cosine to `floor` x peak. The cosine's progress is
    the step's share of `total`, or, when `frac` is given (a wall-clock budget), the larger of that
    and the share of the budget already spent."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    if frac is not None:
        t = max(t, min(1.0, frac))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def resolve_compile(args, device) -> bool:
    """--compile-model on|off|auto (auto: on for CUDA only). On the CPU whole-model compilation
    takes minutes on 2 cores and the compiled nano step was slower than eager (gdn_check.py), so the
    smoke run stays eager unless `on` is forced to exercise the code path."""
    mode = getattr(args, "compile_model", "auto")
    if mode == "auto":
        return device.type == "cuda"
    return mode == "on"


def param_groups(model, wd):
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def evaluate_ppl(model, tokens, seq, device, batch=32, max_windows=None):
    """Mean next-token NLL over non-overlapping windows of the stream."""
    import torch
    import torch.nn.functional as F

    n_win = (len(tokens) - 1) // seq
    if max_windows is not None:
        n_win = min(n_win, max_windows)
    if n_win == 0:
        return float("nan"), 0
    was_training = model.training
    model.eval()
    tot, cnt = 0.0, 0
    with torch.no_grad():
        for b0 in range(0, n_win, batch):
            idx = np.arange(b0, min(n_win, b0 + batch))
            w = np.stack([np.asarray(tokens[i * seq : i * seq + seq + 1], dtype=np.int64) for i in idx])
            w = torch.from_numpy(w).to(device)
            with C.autocast_ctx(device):
                logits = model(input_ids=w[:, :-1], use_cache=False).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum")
            tot += loss.item()
            cnt += w[:, 1:].numel()
    model.train(was_training)
    return math.exp(tot / cnt), cnt


def run(args, log):
    import torch
    import torch.nn.functional as F

    out = Path(args.out)
    C.require_stage(out, "corpus")
    device = C.pick_device(args.device)
    C.setup_torch(device)
    seed = C.stage_seed(args.seed, "target")
    train = C.load_tokens(out, "train")
    val = C.load_tokens(out, "val")

    model = C.build_target(device=device, shape=args.target_shape)
    tdir = out / "target"
    tdir.mkdir(parents=True, exist_ok=True)
    C.write_json(tdir / "shape.json", {"shape": args.target_shape, "config": C.target_config_dict(args.target_shape)})
    n_params = sum(p.numel() for p in model.parameters())
    log(f"target: Qwen3_5ForCausalLM {n_params:,} params on {device}; seq {args.target_seq} batch {args.target_batch} "
        f"({args.target_seq * args.target_batch:,} tokens/step) steps {args.target_steps} lr {args.target_lr}")
    opt = torch.optim.AdamW(
        param_groups(model, args.target_wd), lr=args.target_lr, betas=(0.9, 0.95), eps=1e-8,
        fused=(device.type == "cuda"),
    )
    gen = np.random.default_rng(seed)
    model.train()
    # --compile-model (docs/experiments/demo_data.md, "Whole-model compile in training"): the training
    # forward runs through torch.compile(model), as gdn_check.py's `+cmodel` variant. The compiled
    # wrapper shares the module's parameters; evaluation, checkpoints, the saved weights and the int4
    # export use the plain `model` (so no `_orig_mod.` key prefix anywhere). The first step compiles
    # (~95 s on an H100): it is kept out of the wall-clock budget's clock (see below). A failure to
    # compile falls back to the plain module for the rest of the run.
    compile_mode = resolve_compile(args, device)
    compile_info = {"compile_model": getattr(args, "compile_model", "auto"), "compiled": compile_mode,
                    "compile_seconds": None, "compile_failed": None}
    fwd = model
    if compile_mode:
        fwd = torch.compile(model)
        log(f"target: training forward through torch.compile (--compile-model {compile_info['compile_model']}, "
            f"device {device.type}); the first step compiles and is kept out of the budget clock")
    else:
        log(f"target: training forward not compiled (--compile-model {compile_info['compile_model']}, "
            f"device {device.type})")
    t0 = time.time()
    deadline = t0 + args.target_max_min * 60
    # --target-budget-min: the schedule runs over wall-clock time and the stage ends, complete, when
    # the budget is spent (target_steps is then an upper bound): one device call always yields an
    # annealed model, whatever the machine's speed.
    budget = args.target_budget_min * 60 if args.target_budget_min else None
    if budget is not None and budget > args.target_max_min * 60:
        raise SystemExit(f"--target-budget-min {args.target_budget_min} exceeds --target-max-min {args.target_max_min}")
    log_every = 25 if budget is not None else max(1, args.target_steps // 40)
    ema = None
    step = 0
    mw = 16 if args.smoke else None
    # in-loop evaluations use the first 256 windows (a full pass over the validation stream costs
    # ~25 training steps); the final figures below use all of it
    mw_loop = mw if mw is not None else 256
    curve = []
    best = (0, float("inf"), None)
    stopped_early = False
    tokens_seen = 0
    start, ckpt_path = 0, tdir / "ckpt.pt"
    if ckpt_path.exists():  # resume a run cut at its guard (same arguments)
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        if ck["steps_planned"] != args.target_steps or ck["shape"] != args.target_shape:
            raise SystemExit(f"{ckpt_path}: written for {ck['steps_planned']} steps / shape {ck['shape']}, "
                             f"this run asks for {args.target_steps} / {args.target_shape}; remove it to start over")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        gen.bit_generator.state = ck["rng"]
        start, curve, tokens_seen = ck["step"], ck["curve"], ck["tokens_seen"]
        best = (ck["best_step"], ck["best_ppl"], ck["best_model"])
        log(f"target: resumed from {ckpt_path} at step {start} (best ppl {best[1]:.3f} at step {best[0]})")

    def save_ckpt(next_step):
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": gen.bit_generator.state,
                    "step": next_step, "curve": curve, "tokens_seen": tokens_seen, "best_step": best[0],
                    "best_ppl": best[1], "best_model": best[2], "steps_planned": args.target_steps,
                    "shape": args.target_shape}, tmp)
        tmp.replace(ckpt_path)

    def fwd_bwd(f, w):
        with C.autocast_ctx(device):
            logits = f(input_ids=w[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        return loss

    # the budget clock: wall time since t0 less `excluded`, the first (compiling) step's time when the
    # forward is compiled (0 otherwise, so an uncompiled run is timed as before). The tok/s and s/step
    # of the log and `train_tok_per_s` use the same clock and leave that step's tokens out.
    excluded, tokens_excluded, steps_excluded = 0.0, 0, 0

    def clock():
        return time.time() - t0 - excluded

    for step in range(start, args.target_steps):
        frac = clock() / budget if budget is not None else None
        if frac is not None and frac >= 1.0:
            log(f"target: time budget ({budget / 60:.2f} min{', after the compile step' if excluded else ''}) "
                f"spent after {step} steps")
            step -= 1  # the last step run
            break
        lr = lr_at(step, args.target_steps, args.target_lr, args.target_warmup, frac=frac)
        for g in opt.param_groups:
            g["lr"] = lr
        w = torch.from_numpy(C.random_windows(train, args.target_batch, args.target_seq + 1, gen)).to(device, non_blocking=True)
        first = step == start
        ts = time.time()
        if fwd is model:
            loss = fwd_bwd(fwd, w)
        else:
            try:
                loss = fwd_bwd(fwd, w)
            except Exception as e:  # noqa: BLE001 - any compile/lowering error: train on, uncompiled
                msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                log(f"target: COMPILE FAILED at step {step} ({msg}); falling back to the uncompiled module")
                compile_info["compile_failed"] = {"step": step, "error": msg}
                compile_info["compiled"] = False
                fwd = model
                torch._dynamo.reset()
                loss = fwd_bwd(fwd, w)
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens_seen += w[:, 1:].numel()
        if first and compile_mode:
            C.sync(device)
            excluded = time.time() - ts
            tokens_excluded, steps_excluded = tokens_seen, step + 1
            compile_info["compile_seconds"] = excluded
            log(f"target: first step (torch.compile{' failed, eager' if compile_info['compile_failed'] else ''}) "
                f"took {excluded:.1f} s; the budget clock starts now")
            if budget is not None:
                room = deadline - time.time() - max(5.0, 0.02 * args.target_max_min * 60)
                if room < budget:
                    log(f"target: budget {budget / 60:.2f} min does not fit under the guard after compiling; "
                        f"shortened to {max(room, 0) / 60:.2f} min (raise --target-max-min by the compile time)")
                    budget = max(room, 1.0)
        if step % log_every == 0 or step == args.target_steps - 1:
            lv = loss.item()
            ema = lv if ema is None else 0.9 * ema + 0.1 * lv
            el = clock()
            n_tok, n_steps = tokens_seen - tokens_excluded, step + 1 - steps_excluded
            rate = f"{n_tok / el / 1e3:.0f}k tok/s {el / n_steps:.3f}s/step" if n_steps > 0 and el > 0 else "compile step"
            log(f"target step {step:5d}/{args.target_steps} loss {lv:.4f} lr {lr:.2e} gnorm {gnorm.item():.2f} {rate}")
        last = step == args.target_steps - 1 or time.time() > deadline
        if budget is not None and clock() >= budget:
            last = True
        if args.target_eval_every and ((step + 1) % args.target_eval_every == 0 or last):
            ppl, _ = evaluate_ppl(model, val, args.target_seq, device, max_windows=mw_loop)
            curve.append((step + 1, ppl))
            if ppl < best[1]:
                best = (step + 1, ppl, {k: v.detach().clone() for k, v in model.state_dict().items()})
            log(f"target step {step + 1}: val ppl {ppl:.3f} (best {best[1]:.3f} at step {best[0]})")
        if args.target_ckpt_every and (step + 1) % args.target_ckpt_every == 0 and step + 1 < args.target_steps:
            save_ckpt(step + 1)
        if time.time() > deadline and step + 1 < args.target_steps:
            save_ckpt(step + 1)
            log(f"target: wall-clock guard hit ({args.target_max_min} min) at step {step + 1}; checkpoint {ckpt_path}")
            return {"incomplete": f"target at step {step + 1}/{args.target_steps}"}
    C.sync(device)
    train_time = time.time() - t0
    train_clock = train_time - excluded
    final_loss = loss.item()
    final_step = step + 1
    if best[2] is not None and best[0] != final_step:
        log(f"target: keeping the best validation checkpoint (step {best[0]}, ppl {best[1]:.3f}) "
            f"instead of the last (step {final_step})")
        model.load_state_dict(best[2])
    kept_step = best[0] if best[2] is not None else final_step

    # evaluate with fp32 master weights, then with the bf16-rounded weights that ship
    ppl32, nval = evaluate_ppl(model, val, args.target_seq, device, max_windows=mw)
    sd = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()}
    model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    ppl16, _ = evaluate_ppl(model, val, args.target_seq, device, max_windows=mw)
    trainppl16, ntr = evaluate_ppl(model, train, args.target_seq, device, max_windows=max(8, nval // args.target_seq))
    log(f"target: trained {final_step} steps (kept step {kept_step}) in {C.fmt_s(train_time)}; final train loss {final_loss:.4f}; "
        f"val ppl {ppl32:.3f} (fp32 weights) / {ppl16:.3f} (bf16 weights) over {nval:,} tokens; "
        f"train-sample ppl {trainppl16:.3f}")
    from safetensors.torch import save_file

    bad = [k for k in sd if "_orig_mod" in k]
    if bad:  # the compiled wrapper's names must never reach a saved file
        raise RuntimeError(f"target: state_dict has torch.compile wrapper keys, e.g. {bad[:3]}")
    save_file(sd, str(tdir / "model.safetensors"), metadata={"format": "pt"})
    ppl_int4 = None
    if args.ship_int4:
        q = C.int4_state_dict(sd, args.int4_group)
        save_file(q, str(tdir / "model_int4.safetensors"), metadata={"format": "mlx"})
        C.retag_u32(tdir / "model_int4.safetensors", [k for k in q if k + "" in sd and q[k].dtype == torch.int32])
        model.load_state_dict({k: v.float() for k, v in C.dequantize_state_dict(q, args.int4_group).items()}, strict=False)
        ppl_int4, _ = evaluate_ppl(model, val, args.target_seq, device, max_windows=mw)
        log(f"target: int4 (group {args.int4_group}) val ppl {ppl_int4:.3f} (bf16 {ppl16:.3f})")
    if ckpt_path.exists():
        ckpt_path.unlink()
    model.config.to_json_file(str(tdir / "config.json"))
    metrics = {
        "params": n_params,
        "steps": final_step,
        "kept_step": kept_step,
        "val_curve": curve,
        "steps_planned": args.target_steps,
        "stopped_early": stopped_early,
        "seq": args.target_seq,
        "batch": args.target_batch,
        "tokens_seen": tokens_seen,
        "train_seconds": train_time,
        "final_train_loss": final_loss,
        "val_ppl_fp32": ppl32,
        "val_ppl_bf16": ppl16,
        "val_ppl_int4": ppl_int4,
        "shape": args.target_shape,
        "val_tokens": nval,
        "train_sample_ppl_bf16": trainppl16,
        "lr": args.target_lr,
        "compiled": compile_info["compiled"],
        "compile_model": compile_info["compile_model"],
        "compile_seconds": compile_info["compile_seconds"],
        "compile_failed": compile_info["compile_failed"],
        "budget_seconds": budget,
        "train_seconds_excl_compile": train_clock,
        "train_tok_per_s": (tokens_seen - tokens_excluded) / train_clock if train_clock > 0 else None,
        "gdn": getattr(args, "gdn", "ref") + ("/" + args.gdn_solve if getattr(args, "gdn", "ref") == "fast" else ""),
    }
    if compile_mode:
        try:  # how many graphs dynamo compiled (1 forward graph expected; more = graph breaks/recompiles)
            metrics["dynamo_unique_graphs"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        except Exception:  # noqa: BLE001
            pass
    C.write_json(tdir / "metrics.json", metrics)
    return metrics

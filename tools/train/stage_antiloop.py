"""Stage `antiloop`: fine-tune the trained target so that its own greedy continuations stop
repeating themselves (issue 16: the demo's first command printed a loop).

Why a stage of its own. Lower perplexity did not buy fewer loops: the v2 target (held-out
perplexity 14.7) looped on 16 of 16 validation prompts, the v4 target (12.2) on 13 of 16. A greedy
loop is a property of the model's argmax path, which plain next-token training never sees. This
stage trains on that path directly, with a token-level *unlikelihood* term on the model's own
greedy continuations (the sequence-level objective of Welleck et al. 2019, "Neural Text
Generation with Unlikelihood Training", arXiv:1908.04319), mixed with the ordinary next-token loss
on the training stream so the distribution stays where pre-training left it.

One step:
  * next-token cross-entropy on `--antiloop-mle-batch` random windows of the train stream;
  * with `--antiloop-kl` beta > 0, beta * KL(p_start || p) on the same windows, p_start being a
    frozen copy of the weights the stage started from (v8: the next-token term alone let the
    held-out perplexity rise 16-20% in 88-175 steps; the KL term ties the distribution on ordinary
    text to the starting model's token by token, which is what perplexity measures);
  * the unlikelihood term on `--antiloop-ul-batch` continuations from a pool of the model's own
    greedy continuations (128 new tokens after a 64-token train-split window that ends at a line
    end, the cursor position of the validation prompts). A continuation token is a *candidate*
    when it belongs to a repeated n-gram: an n-gram (n = `--antiloop-ngram`, 8 by default, the span
    of issue 16's loop definition) of the continuation that already occurred earlier in the same
    sequence (prompt included). For a candidate x_t the loss is -log(1 - p(x_t | x_<t)),
    averaged over all continuation tokens, weighted by `--antiloop-alpha`.
  * the pool is regenerated with the current weights every `--antiloop-refresh` steps (greedy
    decoding is the expensive part; a pool at most that many steps stale is close to on-policy).

With --ship-int4 the fine-tune is quantization-aware (`--antiloop-qat`, default on): every matrix
that ships in int4 goes through fake_int4 (the exact int4 round trip of the package) in the forward,
with a straight-through gradient to its float32 weight, so the pool, the loss and the measurement
see the weights that ship.

The stage starts from the weights the later stages see (the dequantized int4 target with
--ship-int4, else the bf16 one), runs for `--antiloop-min` minutes of wall clock (cosine LR from
`--antiloop-lr`), and rewrites target/model.safetensors (bf16) and, with --ship-int4,
target/model_int4.safetensors, so mtp, gen, drafter and package train on and ship the fine-tuned
target. Before and after it measures the held-out perplexity and how many greedy continuations loop
(tools/quality/loops.find_loop, issue 16's definition) on train- and validation-split line-start
prompts. If the held-out perplexity rises by more than `--antiloop-max-ppl-rise` (relative), the
fine-tune is discarded and the target is left as it was (logged, metrics say so).
Outputs: antiloop/metrics.json; target/metrics.json gains "antiloop" and its val_ppl_* fields
describe the weights that ship.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

import common as C

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "quality"))
from loops import find_loop  # noqa: E402  (issue 16's loop definition, the CI check's detector)


def repeated_ngram_mask(seq: np.ndarray, start: int, n: int) -> np.ndarray:
    """bool [len(seq)]: True at positions >= start that lie inside an n-gram seq[s:s+n] (s >= start)
    which also occurs at some earlier start s' < s (anywhere in the sequence, prompt included)."""
    L = len(seq)
    mask = np.zeros(L, dtype=bool)
    if n < 1 or L < n:
        return mask
    seen: dict[bytes, int] = {}
    a = np.ascontiguousarray(seq)
    for s in range(0, L - n + 1):
        key = a[s : s + n].tobytes()
        if key in seen and s >= start:
            mask[s : s + n] = True
        seen.setdefault(key, s)
    return mask


def line_end_ids(tokenizer_path: Path) -> np.ndarray:
    """Ids whose decoded text ends with a newline (a window ending at one puts the cursor at a line
    start, as in the validation prompts)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    ids = [i for i in range(tok.get_vocab_size()) if tok.decode([i], skip_special_tokens=False).endswith("\n")]
    return np.array(sorted(ids), dtype=np.int64)


def line_start_windows(tokens: np.ndarray, n: int, length: int, nl_ids: np.ndarray,
                       gen: np.random.Generator) -> np.ndarray:
    """n windows of `length` tokens whose last token ends a line (int64 [n, length]). Random offsets;
    each is moved forward to the next line end (up to 256 tokens), else kept where it is."""
    hi = len(tokens) - length - 256
    if hi <= 0:
        raise ValueError(f"token stream too short ({len(tokens)}) for windows of {length}")
    is_nl = np.zeros(int(max(nl_ids.max(initial=0), C.N_BPE + 8)) + 1, dtype=bool)
    is_nl[nl_ids] = True
    out = np.empty((n, length), dtype=np.int64)
    for i, s in enumerate(gen.integers(0, hi, size=n)):
        look = np.asarray(tokens[s + length - 1 : s + length - 1 + 256], dtype=np.int64)
        hit = np.nonzero(is_nl[look])[0]
        s2 = s + (int(hit[0]) if len(hit) else 0)
        out[i] = np.asarray(tokens[s2 : s2 + length], dtype=np.int64)
    return out


def fake_int4(w, group: int):
    """The values a weight takes once shipped in int4: bf16-rounded, quantized group-affine the way
    common.int4_quantize does (bf16 scale and bias, round half up, clamp to 0..15), dequantized and
    rounded to bf16 as common.dequantize_state_dict does. Same float32 operations as those
    functions, on the weight's own device."""
    import torch

    rows, cols = w.shape
    x = w.detach().to(torch.bfloat16).float().reshape(rows, cols // group, group)
    lo, hi = x.amin(-1), x.amax(-1)
    s = ((hi - lo) / 15.0).to(torch.bfloat16).float()[..., None]
    b = lo.to(torch.bfloat16).float()[..., None]
    v = torch.where(s > 0, torch.floor((x - b) / s + 0.5), torch.zeros_like(x)).clamp(0, 15)
    return (v * s + b).reshape(rows, cols).to(torch.bfloat16).to(w.dtype)


def quantize_aware(model, group: int) -> list:
    """Route every weight that ships in int4 (common.int4_eligible) through a parametrization for
    quantization-aware fine-tuning: the forward sees fake_int4(w), the gradient reaches the float32
    weight unchanged (straight-through). Returns the (module, name) pairs for unquantize_aware."""
    import torch
    from torch.nn.utils import parametrize

    class FakeInt4(torch.nn.Module):
        def forward(self, w):
            return w + (fake_int4(w, group) - w).detach()

    done = []
    for mname, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        full = f"{mname}.weight" if mname else "weight"
        if not isinstance(w, torch.nn.Parameter) or parametrize.is_parametrized(mod):
            continue
        if C.int4_eligible(full, w, group):
            parametrize.register_parametrization(mod, "weight", FakeInt4())
            done.append((mod, "weight"))
    return done


def unquantize_aware(pairs):
    from torch.nn.utils import parametrize

    for mod, name in pairs:
        parametrize.remove_parametrizations(mod, name, leave_parametrized=False)


def loop_rate(model, prompts, n_new, device, batch=256) -> tuple[float, float]:
    """Greedy continuations of the prompts: (fraction that contain a loop, mean repeated-8-gram
    token share of the continuations)."""
    import torch
    from stage_gen import greedy_generate

    loops, rep = 0, 0.0
    was = model.training
    model.eval()
    for b0 in range(0, len(prompts), batch):
        p = torch.from_numpy(prompts[b0 : b0 + batch]).to(device)
        g = greedy_generate(model, p, n_new, device).cpu().numpy()
        for j in range(len(g)):
            loops += find_loop(g[j].tolist()) is not None
            full = np.concatenate([prompts[b0 + j], g[j]])
            rep += repeated_ngram_mask(full, prompts.shape[1], 8)[prompts.shape[1]:].mean()
    model.train(was)
    return loops / max(1, len(prompts)), rep / max(1, len(prompts))


def docfunc_loops(model, out: Path, n_new: int, device, n_prompts: int = 16):
    """Issue 16's own check, as far as transformers can run it: greedy n_new tokens after the first
    n_prompts `docfunc` validation prompts (the ones the package writes and scripts/demo_quality.sh
    reads) and after the demo prompt of scripts/demo.sh, one prompt at a time; loops by
    loops.find_loop on the generated ids. A proxy for qflash's figure (other kernels, and qflash
    re-encodes the generated text), reported only: nothing is chosen by it."""
    import torch
    from tokenizers import Tokenizer

    from loops import DEMO_PROMPT
    from stage_gen import greedy_generate
    from stage_package import docfunc_prompts

    tok = Tokenizer.from_file(str(out / "tokenizer" / "tokenizer.json"))
    texts = [p["text"] for p in docfunc_prompts(C.read_json(out / "corpus" / "validation_texts.json"), n=n_prompts)]
    clean = 0
    was = model.training
    model.eval()
    demo_loops = None
    for i, text in enumerate(texts + [DEMO_PROMPT]):
        ids = tok.encode(text, add_special_tokens=False).ids
        g = greedy_generate(model, torch.tensor([ids], dtype=torch.long, device=device), n_new, device)[0].tolist()
        looped = find_loop(g) is not None
        if i < len(texts):
            clean += not looped
        else:
            demo_loops = looped
    model.train(was)
    return {"docfunc_loop_free": clean, "docfunc_prompts": len(texts), "demo_prompt_loops": demo_loops}


def run(args, log):
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file, save_file

    from stage_gen import greedy_generate
    from stage_target import evaluate_ppl, lr_at, param_groups

    out = Path(args.out)
    C.require_stage(out, "target")
    device = C.pick_device(args.device)
    C.setup_torch(device)
    seed = C.stage_seed(args.seed, "antiloop")
    rng = np.random.default_rng(seed)
    tdir = out / "target"
    adir = out / "antiloop"
    adir.mkdir(parents=True, exist_ok=True)
    train = C.load_tokens(out, "train")
    val = C.load_tokens(out, "val")
    nl_ids = line_end_ids(out / "tokenizer" / "tokenizer.json")
    P, G, n = args.antiloop_prompt_len, args.antiloop_new, args.antiloop_ngram
    seq = args.target_seq
    mw = args.antiloop_eval_windows or None

    if args.antiloop_min <= 0:
        log("antiloop: --antiloop-min 0: skipped, the target is left as trained")
        info = {"skipped": True}
        C.write_json(adir / "metrics.json", info)
        return info

    # the weights the later stages would see: fp32 copies of the shipped values
    model = C.load_target(out, device, dtype=torch.float32)
    for p in model.parameters():
        p.requires_grad_(True)
    start_from = "int4 (dequantized)" if (tdir / "model_int4.safetensors").exists() else "bf16"
    orig = {k: v.detach().clone() for k, v in model.state_dict().items()}
    teacher = None
    if args.antiloop_kl > 0:  # the starting weights, frozen (before quantize_aware: they already are the shipped values)
        teacher = C.load_target(out, device, dtype=torch.float32)
        teacher.eval()
        for p in teacher.parameters():
            p.requires_grad_(False)

    # fixed evaluation prompts (train and validation split; validation never trains)
    ev_tr = line_start_windows(train, args.antiloop_eval_prompts, P, nl_ids, np.random.default_rng(seed + 1))
    ev_va = line_start_windows(val, args.antiloop_eval_prompts, P, nl_ids, np.random.default_rng(seed + 2))

    def measure(tag):
        t = time.time()
        ppl, ntok = evaluate_ppl(model, val, seq, device, max_windows=mw)
        lr_tr, rep_tr = loop_rate(model, ev_tr, G, device)
        lr_va, rep_va = loop_rate(model, ev_va, G, device)
        m = {"val_ppl": ppl, "val_tokens": ntok, "loops_train_prompts": lr_tr, "loops_val_prompts": lr_va,
             "repeated8_share_train": rep_tr, "repeated8_share_val": rep_va}
        log(f"antiloop {tag}: val ppl {ppl:.3f} ({ntok:,} tokens); greedy {G}-token continuations that loop: "
            f"train prompts {lr_tr:.3f}, val prompts {lr_va:.3f} (of {len(ev_tr)} each); tokens in a repeated "
            f"{n}-gram: {rep_tr:.3f} / {rep_va:.3f} ({C.fmt_s(time.time() - t)})")
        return m

    before = measure("before")
    # quantization-aware: with --ship-int4 the int4 rounding of the fine-tuned weights undid most of
    # the first (plain) run's effect (looping pool continuations 0.69 -> 0.06 in float32, 0.71 -> 0.54
    # on the validation prompts once rounded to int4: docs/experiments/demo_data.md), so the
    # forward, the pool and the loss all see the weights as they will ship
    qat = bool(args.ship_int4 and args.antiloop_qat)
    qpairs = quantize_aware(model, args.int4_group) if qat else []
    if qat:
        log(f"antiloop: quantization-aware ({len(qpairs)} matrices through int4 group {args.int4_group} in the forward)")
    model.train()
    opt = torch.optim.AdamW(param_groups(model, args.target_wd), lr=args.antiloop_lr, betas=(0.9, 0.95))
    t0 = time.time()
    budget = args.antiloop_min * 60
    step, pool, pool_mask, pool_at = 0, None, None, -10**9
    hist = []
    while True:
        frac = (time.time() - t0) / budget
        if frac >= 1.0 or step >= args.antiloop_steps:
            break
        if step - pool_at >= args.antiloop_refresh:
            prompts = line_start_windows(train, args.antiloop_pool, P, nl_ids, rng)
            model.eval()
            g = greedy_generate(model, torch.from_numpy(prompts).to(device), G, device).cpu().numpy()
            model.train()
            pool = np.concatenate([prompts, g], 1)
            pool_mask = np.stack([repeated_ngram_mask(s, P, n) for s in pool])
            pool_at = step
            pool_loops = float(np.mean([find_loop(s[P:].tolist()) is not None for s in pool]))
        lr = lr_at(step, args.antiloop_steps, args.antiloop_lr, args.antiloop_warmup, frac=frac)
        for gr in opt.param_groups:
            gr["lr"] = lr
        # next-token loss on the training stream
        w = torch.from_numpy(C.random_windows(train, args.antiloop_mle_batch, seq + 1, rng)).to(device)
        with C.autocast_ctx(device):
            logits = model(input_ids=w[:, :-1], use_cache=False).logits
        mle = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        kl = torch.zeros((), device=device)
        if teacher is not None:
            with torch.no_grad(), C.autocast_ctx(device):
                t_logp = F.log_softmax(teacher(input_ids=w[:, :-1], use_cache=False).logits.float(), -1)
            s_logp = F.log_softmax(logits.float(), -1)
            kl = (t_logp.exp() * (t_logp - s_logp)).sum(-1).mean()
        # unlikelihood on the model's own repeated n-grams
        pick = rng.choice(len(pool), size=min(args.antiloop_ul_batch, len(pool)), replace=False)
        x = torch.from_numpy(pool[pick].astype(np.int64)).to(device)
        cand = torch.from_numpy(pool_mask[pick][:, 1:]).to(device)
        cand[:, : P - 1] = False
        with C.autocast_ctx(device):
            lg = model(input_ids=x[:, :-1], use_cache=False).logits
        prob = torch.softmax(lg.float(), -1).gather(-1, x[:, 1:, None]).squeeze(-1)
        ul_tok = -torch.log(torch.clamp(1.0 - prob, min=1e-5))
        ul = (ul_tok * cand).sum() / float(x.shape[0] * G)
        loss = mle + args.antiloop_kl * kl + args.antiloop_alpha * ul
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 25 == 0 or step == 1:
            hist.append({"step": step, "mle": mle.item(), "kl": kl.item(), "ul": ul.item(),
                         "cand_share": cand.float().mean().item(), "pool_loops": pool_loops, "lr": lr})
            log(f"antiloop step {step:5d} mle {mle.item():.4f} kl {kl.item():.4f} ul {ul.item():.4f} candidates "
                f"{cand.float().mean().item():.3f} pool loops {pool_loops:.3f} lr {lr:.2e} gnorm {gn:.2f} "
                f"({(time.time() - t0) / step:.3f}s/step)")
    train_s = time.time() - t0
    teacher = None  # its memory back before the measurements
    log(f"antiloop: {step} steps in {C.fmt_s(train_s)}")

    # what ships: bf16 (and int4) roundings of the fine-tuned weights
    model.eval()
    unquantize_aware(qpairs)
    qat_mismatch = None
    sd = {k: v.detach().to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()}
    if args.ship_int4:
        q = C.int4_state_dict(sd, args.int4_group)
        ship = {k: v.float() for k, v in C.dequantize_state_dict(q, args.int4_group).items()}
        if qat:  # the forward saw exactly what ships (fake_int4 == the package's int4 round trip)
            latent = model.state_dict()
            bad = [k for k in q if k.endswith(".scales") for k in [k[: -len(".scales")] + ".weight"]
                   if not torch.equal(fake_int4(latent[k].float(), args.int4_group).cpu().float(), ship[k])]
            # logged, not raised: the CPU checks (smoke run) are exact; on a GPU a difference would mean
            # the forward saw slightly other weights than ship, which the "after" measurement covers
            log(f"antiloop: fake_int4 vs the package's int4 round trip: {len(bad)} of "
                f"{sum(k.endswith('.scales') for k in q)} matrices differ" + (f", e.g. {bad[:3]}" if bad else ""))
            qat_mismatch = len(bad)
    else:
        q, ship = None, {k: v.float() for k, v in sd.items()}
    model.load_state_dict(ship, strict=False)
    after = measure("after (shipped rounding)")
    t_df = time.time()
    after.update(docfunc_loops(model, out, G, device))
    log(f"antiloop after: docfunc validation prompts loop-free {after['docfunc_loop_free']}/{after['docfunc_prompts']}, "
        f"demo prompt {'loops' if after['demo_prompt_loops'] else 'clean'} (transformers greedy on the shipped "
        f"rounding, a proxy for scripts/demo_quality.sh; {C.fmt_s(time.time() - t_df)})")
    rise = after["val_ppl"] / before["val_ppl"] - 1.0
    kept = rise <= args.antiloop_max_ppl_rise
    info = {"start_from": start_from, "quantization_aware": qat, "qat_mismatched_matrices": qat_mismatch, "steps": step, "train_seconds": train_s, "before": before, "after": after,
            "val_ppl_rise": rise, "kept": kept, "history": hist,
            "config": {k: getattr(args, k) for k in vars(args) if k.startswith("antiloop_")}}
    if not kept:
        log(f"antiloop: held-out perplexity rose {rise * 100:.1f}% (> {args.antiloop_max_ppl_rise * 100:.1f}%): "
            f"fine-tune discarded, the target is left as trained")
        model.load_state_dict(orig)
    else:
        tm = C.read_json(tdir / "metrics.json")
        tm["antiloop"] = {"val_ppl_before": before["val_ppl"], "val_ppl_after": after["val_ppl"],
                          "steps": step, "loops_val_prompts": [before["loops_val_prompts"], after["loops_val_prompts"]]}
        save_file(sd, str(tdir / "model.safetensors"), metadata={"format": "pt"})
        model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
        tm["val_ppl_bf16"], _ = evaluate_ppl(model, val, seq, device, max_windows=mw)
        if q is not None:
            save_file(q, str(tdir / "model_int4.safetensors"), metadata={"format": "mlx"})
            C.retag_u32(tdir / "model_int4.safetensors", [k for k in q if k in sd and q[k].dtype == torch.int32])
            tm["val_ppl_int4"] = after["val_ppl"]
        tm["val_ppl_fp32"] = None  # the fp32 master weights of the fine-tune are not kept
        C.write_json(tdir / "metrics.json", tm)
        log(f"antiloop: kept; val ppl {before['val_ppl']:.3f} -> {after['val_ppl']:.3f} "
            f"(bf16 {tm['val_ppl_bf16']:.3f}); looping continuations on val prompts "
            f"{before['loops_val_prompts']:.3f} -> {after['loops_val_prompts']:.3f}")
    C.write_json(adir / "metrics.json", info)
    return {k: v for k, v in info.items() if k != "history"}

#!/usr/bin/env python3
"""Long-prompt parity fixtures: transformers' Qwen3_5ForCausalLM on a 2,100-token prompt.

    ATEN_CPU_CAPABILITY=avx2 python3 tools/reference/make_long_prompt_fixtures.py   # rewrites tests/fixtures/target/long/*.safetensors

(ATEN_CPU_CAPABILITY=avx2: the committed files were made with torch's AVX2 CPU kernels; where torch
would pick its AVX-512 ones the fp32 tensors differ in the last bits.)

Reads the committed tiny checkpoints tests/fixtures/target/{micro,odd}/ (written by
make_target_fixtures.py; max_position_embeddings 4096) and writes, per checkpoint NAME,
tests/fixtures/target/long/NAME.safetensors with the reference outputs at a strided subset of
positions (every 61st and the last 8), so each file stays a few hundred KB. Two references:

- fp32: the model as transformers runs it, float32 throughout (eager attention, chunked GDN);
- bf16in: the same forward with every decoder-layer projection (nn.Linear inside model.layers)
  reading its input rounded to bf16 (round to nearest even), lm_head not rounded. That is the
  function the engine's prefill path computes (Backend::gemm: bf16(x) W^T with fp32 accumulation;
  the head is the fp32 GEMV), so it is the tight reference for the prefill path.

Greedy continuations: from the whole prompt (cached forward), GREEDY tokens fed one at a time;
`greedy_fp32` with the fp32 prefill, `greedy_bf16in` with the bf16in prefill and fp32 decode
steps (what the engine does: prefill ops for the prompt, decode ops after it).
The bf16in reference's own spread under jittered projection inputs is stored twice: for the
CPU's fp32 arithmetic (bf16in_spread.*) and for the GPU's tensor-core products (bf16in_spread_gpu.*,
see SPREAD_RUNS_GPU). See tools/reference/README.md ("Long-prompt fixtures"). CPU, float32,
deterministic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import transformers  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import Qwen3_5ForCausalLM  # noqa: E402

from make_target_fixtures import _out_cache, absd, fwd, rel, save_sorted  # noqa: E402
from target_ref import TargetRef  # noqa: E402

T = 2100        # prompt length: 32 chunks of 64 plus 52 rows (a partial last chunk)
STRIDE = 61     # stored positions: 0, 61, 122, ... and the last TAIL
TAIL = 8
GREEDY = 32
STEP_FROM = 2048  # HF self-check: cached prefill of tokens[:STEP_FROM], then one token at a time
SEEDS = {"micro": 2026, "odd": 2027}

# The jittered runs that measure the bf16in reference's own spread, (relative jitter j, seed): every
# projection input is scaled by 1 + U(-j, j) before its bf16 rounding.
#  - bf16in_spread.*: j = 2^-23 and 2^-21, 1 and 4 fp32 ulps of 1.0 (2 and 8 fp32 unit roundoffs
#    2^-24): another fp32 evaluation order, the CPU backend's arithmetic.
#  - bf16in_spread_gpu.*: the CPU runs and, in addition, j = 2^-20 and 2^-19. The CUDA backend's
#    chunked DeltaNet and attention prefill multiply on tensor cores with each fp32 operand split
#    into two tf32 (or bf16) parts; one such product is off by up to 3 * 2^-22 + 2^-23 < 2^-20 of
#    itself, so its tests take the GPU's unit roundoff as u = 2^-20 in place of fp32's 2^-24
#    (tests/unit/gdn_chunked_test.cpp, tolerance_gpu; docs/DESIGN.md, the chunked DeltaNet's
#    "Tolerance"). The GPU runs jitter by that u and by 2u. They are added to the CPU runs rather
#    than replacing them because most of the GPU's ops are still plain fp32, so its deviations
#    range from the last bit up to u. Fixed from the documented u, not fitted to any measurement.
SPREAD_RUNS_CPU = ((2.0 ** -23, 1), (2.0 ** -23, 2), (2.0 ** -21, 3), (2.0 ** -21, 4))
SPREAD_RUNS_GPU = ((2.0 ** -20, 5), (2.0 ** -20, 6), (2.0 ** -19, 7), (2.0 ** -19, 8))

CONVENTIONS = (
    "One batch-1 prompt `tokens` [T] at positions 0..T-1; rows are stored only at `positions` (every STRIDE-th "
    "and the last TAIL, increasing). logits_fp32[i] = transformers' float32 logits after token positions[i] "
    "(one uncached forward, eager attention, chunked GDN); final_hidden_fp32 = model.norm output (lm_head input); "
    "hidden_fp32.0 = embeddings, hidden_fp32.L (1 <= L < N) = raw residual stream after decoder layer L-1; "
    "last_layer_out_fp32 = raw output of layer N-1. hidden_bf16in.L and the other *_bf16in: the same forward with every decoder-layer "
    "nn.Linear reading bf16(input) (round to nearest even), lm_head in fp32. greedy_fp32 / greedy_bf16in: "
    "GREEDY tokens after the prompt, [0] = argmax of the prompt's last row, each then fed with the cache and the "
    "next argmax taken (torch.argmax: lowest id on ties); the bf16in run rounds only during the prompt's forward; "
    "greedy_margin_* = top1 - top2 of the row that chose each token, greedy_scale_* = max|logit| of that row. "
    "bf16in_spread.K [1] = max over 4 runs of max|bf16in_jittered - bf16in| / max|bf16in| of tensor K (logits, "
    "final_hidden, last_layer_out, hidden.L) at the stored positions (last_logits: the last row alone; "
    "greedy_logits: the GREEDY rows of the bf16in greedy run, teacher-forced along greedy_bf16in), where a jittered run scales every projection "
    "input by 1 + U(-j, j), j in {2^-23, 2^-23, 2^-21, 2^-21}, before rounding: how far the bf16in function moves when its fp32 "
    "inputs change in the last bits. bf16in_spread_gpu.K [1]: the same over 8 runs, those 4 and 4 more with j in "
    "{2^-20, 2^-20, 2^-19, 2^-19} (the unit roundoff u = 2^-20 of the GPU's split-tf32 tensor-core products, and 2u): "
    "the spread for a backend whose values differ from the reference by up to that much."
)


def positions_of(n: int) -> list[int]:
    return sorted(set(range(0, n, STRIDE)) | set(range(n - TAIL, n)))


def make_prompt(vocab: int, seed: int) -> torch.Tensor:
    """Random ids, with one long span repeated 1,200 positions later (attention then sees equal
    keys far apart, and the GDN state re-enters a context it has already absorbed)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, vocab, (T,), generator=g)
    t[1400:2000] = t[200:800].clone()
    return t


class Bf16Inputs:
    """Context manager: every nn.Linear under model.model.layers rounds its input to bf16. With
    `jitter` > 0 each input element is first scaled by 1 + U(-jitter, jitter) (seeded): another
    fp32 evaluation order of the same function, for measuring the reference's own spread."""

    def __init__(self, model, jitter: float = 0.0, seed: int = 0):
        self.mods = [mod for mod in model.model.layers.modules() if isinstance(mod, torch.nn.Linear)]
        self.handles = []
        self.jitter, self.g = jitter, torch.Generator().manual_seed(seed)

    def __enter__(self):
        def hook(mod, args):
            x = args[0]
            if self.jitter:
                x = x * (1 + self.jitter * (2 * torch.rand(x.shape, generator=self.g, dtype=x.dtype) - 1))
            return (x.to(torch.bfloat16).to(args[0].dtype),) + tuple(args[1:])
        self.handles = [mod.register_forward_pre_hook(hook) for mod in self.mods]
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def full_forward(m, tokens):
    cap = {}
    hook = m.model.layers[-1].register_forward_hook(
        lambda mod, inp, out: cap.__setitem__("last", out[0] if isinstance(out, tuple) else out))
    out = fwd(m, tokens, output_hidden_states=True)
    hook.remove()
    last = cap["last"][0].float()
    return out.logits[0].float(), [h[0].float() for h in out.hidden_states], last, m.model.norm(last).float()


@torch.no_grad()
def greedy(m, tokens, n, bf16_prompt: bool):
    if bf16_prompt:
        with Bf16Inputs(m):
            o = fwd(m, tokens, use_cache=True)
    else:
        o = fwd(m, tokens, use_cache=True)
    cache, row = _out_cache(o), o.logits[0, -1]
    toks, margins, scales = [], [], []
    for i in range(n):
        top2 = torch.topk(row, 2).values
        margins.append(float(top2[0] - top2[1]))
        scales.append(float(row.abs().max()))
        toks.append(int(torch.argmax(row)))
        if i + 1 == n:
            break
        o = fwd(m, torch.tensor([toks[-1]]), cache=cache)
        cache, row = _out_cache(o), o.logits[0, -1]
    return (torch.tensor(toks, dtype=torch.int32), torch.tensor(margins, dtype=torch.float32),
            torch.tensor(scales, dtype=torch.float32))


@torch.no_grad()
def forced_rows(m, tokens, toks, jitter, seed):
    """Logits of the rows that chose `toks` after the prompt (bf16in prompt with `jitter`, fp32
    steps), the steps fed `toks` whatever their argmax."""
    with Bf16Inputs(m, jitter, seed):
        o = fwd(m, tokens, use_cache=True)
    cache, rows = _out_cache(o), [o.logits[0, -1]]
    for t in toks[:-1]:
        o = fwd(m, torch.tensor([int(t)]), cache=cache)
        cache = _out_cache(o)
        rows.append(o.logits[0, -1])
    return torch.stack(rows).float()


@torch.no_grad()
def build(name: str, src_root: str, out_dir: str) -> dict:
    d = os.path.join(src_root, name)
    text_cfg = json.load(open(os.path.join(d, "config.json")))
    assert text_cfg["max_position_embeddings"] >= T + GREEDY, text_cfg["max_position_embeddings"]
    m = Qwen3_5ForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    tokens = make_prompt(text_cfg["vocab_size"], SEEDS[name])
    pos = torch.tensor(positions_of(T))
    checks = {}

    logits, hs, last, fh = full_forward(m, tokens)
    with Bf16Inputs(m):
        logits_b, hs_b, last_b, fh_b = full_forward(m, tokens)
    nl = len(hs) - 1
    checks["bf16in_vs_fp32_logits_rel"] = rel(logits_b[pos], logits[pos])
    checks["bf16in_vs_fp32_final_hidden_rel"] = rel(fh_b[pos], fh[pos])

    # The bf16in reference's own spread: rounding to bf16 is discontinuous, so fp32 values that
    # differ in the last bit (another summation order) round to neighbouring bf16 values now and
    # then, and the model carries those steps. Max over jitters of 1 and 4 fp32 ulps, two seeds each;
    # the greedy rows teacher-forced along greedy_bf16in.
    # The GPU's spread: the same with the larger jitters of SPREAD_RUNS_GPU added (see there).
    gb, gmb, gsb = greedy(m, tokens, GREEDY, bf16_prompt=True)
    forced0 = forced_rows(m, tokens, gb, 0.0, 0)

    def spread_of(runs) -> dict:
        out = {}
        for jitter, seed in runs:
            with Bf16Inputs(m, jitter, seed):
                lj, hj, lastj, fhj = full_forward(m, tokens)
            pairs = {"logits": (lj, logits_b), "final_hidden": (fhj, fh_b), "last_layer_out": (lastj, last_b)}
            pairs.update({f"hidden.{L}": (hj[L], hs_b[L]) for L in range(1, nl)})
            for k, (a, b) in pairs.items():
                out[k] = max(out.get(k, 0.0), rel(a[pos], b[pos]))
            out["last_logits"] = max(out.get("last_logits", 0.0), rel(lj[-1], logits_b[-1]))
            out["greedy_logits"] = max(out.get("greedy_logits", 0.0),
                                       rel(forced_rows(m, tokens, gb, jitter, seed), forced0))
        return out

    spread = spread_of(SPREAD_RUNS_CPU)
    gpu_runs = spread_of(SPREAD_RUNS_GPU)
    spread_gpu = {k: max(v, gpu_runs[k]) for k, v in spread.items()}
    checks["bf16in_spread"] = spread
    checks["bf16in_spread_gpu_runs_only"] = gpu_runs
    checks["bf16in_spread_gpu"] = spread_gpu

    # transformers' own cached path at this length (recurrent GDN for the steps)
    o = fwd(m, tokens[:STEP_FROM], use_cache=True)
    cache, steps = _out_cache(o), []
    checks["hf_cached_prefix_vs_full_rel"] = rel(o.logits[0], logits[:STEP_FROM])
    for i in range(STEP_FROM, T):
        o = fwd(m, tokens[i:i + 1], cache=cache)
        cache = _out_cache(o)
        steps.append(o.logits[0, -1])
    checks["hf_step_vs_full_rel"] = rel(torch.stack(steps).float(), logits[STEP_FROM:])

    # independent spec reference (recurrent GDN) in float64: how far transformers' fp32 is from exact
    sd = {k: v for k, v in load_file(os.path.join(d, "model.safetensors")).items() if not k.startswith("mtp.")}
    l64, fh64, _ = TargetRef(text_cfg, sd, dtype=torch.float64).forward(tokens)
    checks["f64_vs_hf_fp32_logits_rel"] = rel(logits[pos].double(), l64[pos])
    checks["f64_vs_hf_fp32_logits_rel_all_rows"] = rel(logits.double(), l64)
    checks["f64_vs_hf_fp32_final_hidden_rel"] = rel(fh[pos].double(), fh64[pos])
    checks["f64_vs_hf_fp32_argmax_equal"] = bool(torch.equal(logits.argmax(-1), l64.argmax(-1)))

    g32, gm32, gs32 = greedy(m, tokens, GREEDY, bf16_prompt=False)
    checks["greedy_fp32_first_is_full_argmax"] = int(g32[0]) == int(logits[-1].argmax())
    checks["greedy_bf16in_first_is_full_argmax"] = int(gb[0]) == int(logits_b[-1].argmax())
    checks["greedy_fp32_min_rel_margin"] = float((gm32 / gs32).min())
    checks["greedy_bf16in_min_rel_margin"] = float((gmb / gsb).min())
    checks["greedy_fp32_equals_bf16in"] = bool(torch.equal(g32, gb))
    top2 = torch.topk(logits[pos], 2, dim=-1).values
    checks["stored_rows_min_rel_margin_fp32"] = float(((top2[:, 0] - top2[:, 1]) / logits[pos].abs().amax(-1)).min())

    ref = {
        "tokens": tokens.to(torch.int32),
        "positions": pos.to(torch.int32),
        "logits_fp32": logits[pos],
        "logits_bf16in": logits_b[pos],
        "final_hidden_fp32": fh[pos],
        "final_hidden_bf16in": fh_b[pos],
        "last_layer_out_fp32": last[pos],
        "last_layer_out_bf16in": last_b[pos],
        "greedy_fp32": g32, "greedy_margin_fp32": gm32, "greedy_scale_fp32": gs32,
        "greedy_bf16in": gb, "greedy_margin_bf16in": gmb, "greedy_scale_bf16in": gsb,
    }
    for k, v in spread.items():
        ref[f"bf16in_spread.{k}"] = torch.tensor([v], dtype=torch.float32)
    for k, v in spread_gpu.items():
        ref[f"bf16in_spread_gpu.{k}"] = torch.tensor([v], dtype=torch.float32)
    for L in range(nl):  # hs[nl] is the post-norm hidden (= final_hidden): not repeated
        ref[f"hidden_fp32.{L}"] = hs[L][pos]
        ref[f"hidden_bf16in.{L}"] = hs_b[L][pos]
    ref = {k: v.contiguous() for k, v in ref.items()}
    with open(os.path.join(d, "model.safetensors"), "rb") as f:
        weights_sha = hashlib.sha256(f.read()).hexdigest()
    metadata = {
        "format": "pt",
        "checkpoint": f"tests/fixtures/target/{name}",
        "checkpoint_sha256": weights_sha,
        "seed": str(SEEDS[name]),
        "T": str(T), "stride": str(STRIDE), "tail": str(TAIL), "greedy_len": str(GREEDY),
        "num_hidden_layers": str(nl),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "conventions": CONVENTIONS,
        "checks": json.dumps(checks, sort_keys=True),
    }
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, name + ".safetensors")
    save_sorted(ref, path, metadata)
    os.chmod(path, 0o644)
    return checks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default="tests/fixtures/target", help="folder holding the micro/ and odd/ checkpoints")
    ap.add_argument("--out", default="tests/fixtures/target/long")
    ap.add_argument("--configs", default="micro,odd")
    args = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    all_checks = {name: build(name, args.src, args.out) for name in args.configs.split(",")}
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    print(json.dumps(all_checks, indent=1, sort_keys=True))
    for name in args.configs.split(","):
        print(f"{name}: {os.path.getsize(os.path.join(args.out, name + '.safetensors')) / 1e3:.0f} KB")
    bad = []
    for name, c in all_checks.items():
        if c["hf_step_vs_full_rel"] > 1e-4 or c["f64_vs_hf_fp32_logits_rel_all_rows"] > 1e-4:
            bad.append(f"{name}: transformers fp32 paths disagree beyond 1e-4 (see checks)")
        if not (c["greedy_fp32_first_is_full_argmax"] and c["greedy_bf16in_first_is_full_argmax"]):
            bad.append(f"{name}: cached greedy start differs from the uncached forward")
    if bad:
        print("FAILED:\n  " + "\n  ".join(bad))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()

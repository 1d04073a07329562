#!/usr/bin/env python3
"""Greedy agreement of int4 (--weights int4) with bf16 on a prompt file, through the qflash CLI.

For every prompt, plain greedy decoding (--draft none) under each weight setting: the text
(stdout) and the tokens after the first (--trace: one round per token). Prints, per int4
setting, how many prompts give the same text as bf16 and the mean length of the common token
prefix. tau per setting is `qflash bench
--prompts FILE --weights ...` (docs/BENCHMARKS.md, "int4 on the demo pair").

usage: tools/int4_agreement.py [--qflash build/qflash] [--model DIR] [--prompts FILE]
                               [--n N] [--tokens T] [--device cpu]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def tokens(qflash, model, device, text, n_tokens, weights, head, tmp):
    trace = os.path.join(tmp, "trace.jsonl")
    cmd = [qflash, "-q", "run", "--device", device, "--draft", "none", "--max-tokens", str(n_tokens),
           "--prompt", text, "--trace", trace, "--weights", weights, "--lm-head", head]
    if model:
        cmd += ["--model", model]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE).stdout
    with open(trace) as f:
        return out, [json.loads(line)["bonus"] for line in f if line.strip()]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    ap = argparse.ArgumentParser()
    ap.add_argument("--qflash", default=os.path.join(root, "build", "qflash"))
    ap.add_argument("--model", default="")
    ap.add_argument("--prompts", default=os.path.join(root, "models", "demo", "validation_prompts.jsonl"))
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    prompts = []
    with open(a.prompts) as f:
        for line in f:
            if line.strip() and len(prompts) < a.n:
                prompts.append(json.loads(line)["text"])
    settings = [("bf16", "int4"), ("int4", "int4"), ("int4", "bf16")]
    runs = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as tmp:
        for i, text in enumerate(prompts):
            for s in settings:
                runs[s].append(tokens(a.qflash, a.model, a.device, text, a.tokens, s[0], s[1], tmp))
            print(f"\r{i + 1}/{len(prompts)} prompts", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    ref = runs[settings[0]]
    for s in settings[1:]:
        same, prefix = 0, 0.0
        for (rtext, r), (ttext, t) in zip(ref, runs[s]):
            same += rtext == ttext
            k = 0
            while k < min(len(r), len(t)) and r[k] == t[k]:
                k += 1
            prefix += k / max(len(r), 1)
        print(f"weights {s[0]}, lm_head {s[1]}: {same}/{len(ref)} prompts give bf16's text, "
              f"mean common prefix {100 * prefix / len(ref):.1f}% of the bf16 tokens")


if __name__ == "__main__":
    main()

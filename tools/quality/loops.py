#!/usr/bin/env python3
"""Degenerate-output check for a model pair: does greedy output fall into a loop?

A loop (issue 16's definition) is a span of >= 8 tokens repeated 3 times in a row:
ids[s:s+L] == ids[s+L:s+2L] == ids[s+2L:s+3L] for some s and some L >= 8. A loop of a shorter
period p counts once it has run for three copies of a multiple of p that is >= 8.

    python3 tools/quality/loops.py --qflash build/qflash --model models/demo            # report
    python3 tools/quality/loops.py ... --require-clean 15 --require-demo-clean           # a check

For each of the first --n-prompts validation prompts (MODEL/validation_prompts.jsonl) and the
demo prompt, `qflash run` generates --max-tokens greedy tokens without a drafter (speculative
output is byte-identical, so the drafter does not matter here), `qflash tokenize` re-encodes
the generated text, and the detector runs on those ids. Without --require-* it only reports
(exit 0 unless qflash fails); with them it exits 1 when the pair misses the bar.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

# scripts/demo.sh's prompt: a signature and a one-line docstring, the cursor where the body starts
# (the `docfunc` shape of the validation prompts, docs/experiments/demo_data.md).
DEMO_PROMPT = 'def parse_args(argv=None):\n    """Parse the command-line arguments and return the namespace."""\n'


@dataclass
class Loop:
    start: int  # index of the first token of the first copy
    span: int  # L, the repeated span's length in tokens
    copies: int  # how many whole copies follow one another from start


def find_loop(ids: list[int], min_span: int = 8, repeats: int = 3) -> Loop | None:
    """The earliest loop (smallest span at that start), or None.

    For each span L, ids[j] == ids[j+L] over a run of (repeats-1)*L consecutive j means the
    window of repeats*L tokens starting at the run's start is `repeats` copies of its first L
    tokens. O(n^2) for n tokens, which is nothing at n = 128.
    """
    n = len(ids)
    if min_span < 1 or repeats < 2:
        raise ValueError(f"find_loop: min_span must be >= 1 and repeats >= 2 (got {min_span}, {repeats})")
    best: Loop | None = None
    for L in range(min_span, n // repeats + 1):
        need = (repeats - 1) * L
        run = 0
        for j in range(n - L):
            run = run + 1 if ids[j] == ids[j + L] else 0
            if run == need:
                s = j - need + 1
                if best is None or s < best.start:
                    # extend to count every whole copy
                    k = j + 1
                    while k < n - L and ids[k] == ids[k + L]:
                        k += 1
                    best = Loop(s, L, (k + L - s) // L)
                break  # later starts for this L cannot beat this one
    return best


def load_prompts(model: Path, n: int) -> list[dict]:
    path = model / "validation_prompts.jsonl"
    if not path.exists():
        raise SystemExit(f"loops: {path} not found (the pair's validation prompts)")
    rows = [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    if len(rows) < n:
        raise SystemExit(f"loops: {path} has {len(rows)} prompts, --n-prompts asks for {n}")
    for i, r in enumerate(rows[:n]):
        if not isinstance(r.get("text"), str) or not r["text"]:
            raise SystemExit(f"loops: {path} line {i + 1}: field 'text' missing or empty")
    return rows[:n]


def generate_ids(qflash: str, model: Path, prompt: str, max_tokens: int, tmp: Path) -> tuple[str, list[int]]:
    pf = tmp / "prompt.txt"
    pf.write_text(prompt, encoding="utf-8")
    r = subprocess.run([qflash, "-q", "run", "--model", str(model), "--draft", "none", "--device", "cpu",
                        "--prompt-file", str(pf), "--max-tokens", str(max_tokens)],
                       capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"loops: qflash run failed ({r.returncode}) on prompt {prompt!r}:\n"
                         f"{r.stderr.decode('utf-8', 'replace')}")
    text = r.stdout.decode("utf-8", "replace")
    of = tmp / "out.txt"
    of.write_text(text, encoding="utf-8")
    r = subprocess.run([qflash, "-q", "tokenize", "--tokenizer", str(model), "--file", str(of), "--no-special"],
                       capture_output=True)
    if r.returncode != 0:
        raise SystemExit(f"loops: qflash tokenize failed ({r.returncode}):\n{r.stderr.decode('utf-8', 'replace')}")
    try:
        ids = json.loads(r.stdout)
    except json.JSONDecodeError as e:
        raise SystemExit(f"loops: qflash tokenize printed no JSON id list ({e}): {r.stdout[:200]!r}")
    return text, ids


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--qflash", default="build/qflash")
    p.add_argument("--model", default="models/demo")
    p.add_argument("--n-prompts", type=int, default=16)
    p.add_argument("--demo-prompt", default=DEMO_PROMPT)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--min-span", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--require-clean", type=int, default=None, help="fail unless >= N validation prompts are loop-free")
    p.add_argument("--require-demo-clean", action="store_true", help="fail if the demo prompt loops")
    p.add_argument("--json", help="write the per-prompt results here")
    a = p.parse_args(argv)
    model = Path(a.model)
    if not os.access(a.qflash, os.X_OK):
        raise SystemExit(f"loops: --qflash {a.qflash} is not an executable (build qflash first)")
    if a.require_clean is not None and not 0 <= a.require_clean <= a.n_prompts:
        raise SystemExit(f"loops: --require-clean must be in 0..{a.n_prompts}, got {a.require_clean}")
    prompts = [(f"val{r.get('id', i)}", r["text"]) for i, r in enumerate(load_prompts(model, a.n_prompts))]
    prompts.append(("demo", a.demo_prompt))
    results = []
    with tempfile.TemporaryDirectory() as td:
        for name, text in prompts:
            out, ids = generate_ids(a.qflash, model, text, a.max_tokens, Path(td))
            lp = find_loop(ids, a.min_span, a.repeats)
            results.append({"prompt": name, "text": text, "output": out, "n_tokens": len(ids),
                            "loop": None if lp is None else vars(lp)})
            where = "clean" if lp is None else f"LOOP at token {lp.start}: span {lp.span} x {lp.copies}"
            print(f"{name:>6}  {len(ids):4d} tokens  {where}   {text.splitlines()[0][:50]!r}", flush=True)
    val = [r for r in results if r["prompt"] != "demo"]
    clean = sum(r["loop"] is None for r in val)
    demo_clean = results[-1]["loop"] is None
    print(f"loop-free: {clean}/{len(val)} validation prompts; demo prompt {'clean' if demo_clean else 'LOOPS'}")
    if a.json:
        Path(a.json).write_text(json.dumps({"clean": clean, "n": len(val), "demo_clean": demo_clean,
                                            "results": results}, indent=1, ensure_ascii=False) + "\n")
    ok = (a.require_clean is None or clean >= a.require_clean) and (not a.require_demo_clean or demo_clean)
    if not ok:
        print(f"FAILED: need >= {a.require_clean} loop-free validation prompts"
              + (" and a loop-free demo prompt" if a.require_demo_clean else ""), file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

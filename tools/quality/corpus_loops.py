#!/usr/bin/env python3
"""How much of the demo training stream is itself a loop (issue 16's definition), per project and file.

    python3 tools/quality/corpus_loops.py --corpus data/pypi_corpus --pin tools/train/pypi_corpus_manifest.json \
        --out data/corpus_loops [--no-filter]

Reads the wheels already in CORPUS/wheels (run tools/train/pypi_corpus.py first, or its download
step), selects files exactly as pypi_corpus.py does (license, per-file filters, per-project cap,
dedup; with --no-filter the v3 repetition filter and the held-out cap are off, i.e. the v2
selection plus the `--platform any` wheels), tokenizes them with the demo tokenizer, and measures on the token
stream of each split:

- loop tokens: tokens covered by some window of 3 consecutive copies of a span of L tokens,
  8 <= L <= --max-span (the detector of tools/quality/loops.py, applied to the whole stream
  instead of a 128-token output; spans over --max-span are not looked for);
- the line-level measures of pypi_corpus.repetition_stats (literal-only lines, lines repeated
  within the file, longest run of identical lines).

Writes OUT/file_stats.jsonl (one row per file) and OUT/summary.json, and prints the projects and
files with the most loop tokens.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "tools" / "train"))
import pypi_corpus as pc  # noqa: E402


def loop_mask(a: np.ndarray, min_span: int = 8, max_span: int = 256, repeats: int = 3) -> np.ndarray:
    """bool mask over a: True where the token lies in a window of `repeats` consecutive copies of
    some span L, min_span <= L <= max_span. For each L, a run of (repeats-1)*L or more consecutive
    j with a[j] == a[j+L] starting at s and ending at e (exclusive) covers a[s : e + L]."""
    n = a.size
    cover = np.zeros(n + 1, np.int32)
    for L in range(min_span, max_span + 1):
        if n <= L:
            break
        eq = np.empty(n - L + 2, np.int8)
        eq[0] = eq[-1] = 0
        eq[1:-1] = a[:-L] == a[L:]
        d = np.diff(eq)
        s = np.flatnonzero(d == 1)
        e = np.flatnonzero(d == -1)
        keep = (e - s) >= (repeats - 1) * L
        if keep.any():
            np.add.at(cover, s[keep], 1)
            np.add.at(cover, np.minimum(e[keep] + L, n), -1)
    return np.cumsum(cover[:-1]) > 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default="data/pypi_corpus", help="pypi_corpus.py --out folder (its wheels/)")
    ap.add_argument("--pin", default=str(REPO / "tools" / "train" / "pypi_corpus_manifest.json"))
    ap.add_argument("--out", default="data/corpus_loops")
    ap.add_argument("--max-span", type=int, default=256)
    ap.add_argument("--no-filter", action="store_true", help="v3 repetition filter off (measure the v2 selection)")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args(argv)

    args = pc.parse_args(["--out", a.corpus, "--pin", a.pin] + (["--no-repetition-filter", "--max-val-package-mb", "6"] if a.no_filter else []))
    wheels = Path(a.corpus) / "wheels"
    pins = {pc.norm_name(p["name"]): p["version"] for p in json.loads(Path(a.pin).read_text())["projects"]
            if p.get("version")}
    names = [l.split("#")[0].strip() for l in Path(args.packages).read_text().splitlines()]
    names = [n for n in dict.fromkeys(n for n in names if n) if pc.norm_name(n) in pins]
    got = []
    for n in names:
        w = pc.find_wheel(wheels, n, pins[pc.norm_name(n)])
        got.append((w, "cached") if w else (None, "not downloaded"))
    t0 = time.time()
    projects, corpus, _ = pc.gather(names, got, args)
    final, dups = pc.dedup(corpus)
    print(f"{len(final)} files after dedup ({time.time() - t0:.0f} s)", flush=True)

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(args.tokenizer)
    eot = tok.token_to_id(pc.EOT)
    t0 = time.time()
    enc = tok.encode_batch([f[3] for f in final], add_special_tokens=False)
    print(f"tokenized in {time.time() - t0:.0f} s", flush=True)

    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    summary = {"max_span": a.max_span, "no_filter": a.no_filter, "splits": {}}
    for sp in ("train", "val"):
        idx = [i for i, f in enumerate(final) if f[0] == sp]
        if not idx:
            continue
        lens = np.array([len(enc[i].ids) + 1 for i in idx])
        stream = np.concatenate([np.asarray(enc[i].ids + [eot], np.int32) for i in idx])
        t0 = time.time()
        m = loop_mask(stream, max_span=a.max_span)
        print(f"{sp}: {stream.size:,} tokens, loop mask in {time.time() - t0:.0f} s", flush=True)
        cum = np.concatenate([[0], np.cumsum(m)])
        offs = np.concatenate([[0], np.cumsum(lens)])
        loop_tok = cum[offs[1:]] - cum[offs[:-1]]
        for k, i in enumerate(idx):
            _, name, path, text = final[i]
            rows.append({"split": sp, "project": name, "path": path, "bytes": len(text.encode("utf-8")),
                         "tokens": int(lens[k]), "loop_tokens": int(loop_tok[k]), **pc.repetition_stats(text)})
        summary["splits"][sp] = {"files": len(idx), "tokens": int(stream.size), "loop_tokens": int(m.sum()),
                                 "loop_share": float(m.mean())}
    with open(out / "file_stats.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")

    per = {}
    for r in rows:
        d = per.setdefault((r["split"], r["project"]), {"files": 0, "tokens": 0, "loop_tokens": 0})
        d["files"] += 1
        d["tokens"] += r["tokens"]
        d["loop_tokens"] += r["loop_tokens"]
    summary["projects"] = [{"split": k[0], "project": k[1], **v} for k, v in
                           sorted(per.items(), key=lambda kv: -kv[1]["loop_tokens"])]
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for sp, d in summary["splits"].items():
        print(f"{sp}: {d['files']} files, {d['tokens']:,} tokens, loop tokens {d['loop_tokens']:,} "
              f"({100 * d['loop_share']:.2f}%)")
    tot = summary["splits"]["train"]["loop_tokens"]
    print(f"\ntop projects by loop tokens (train share of all train loop tokens):")
    for p in summary["projects"][: a.top]:
        print(f"  {p['split']:5} {p['project']:24} tokens {p['tokens']:>10,} loop {p['loop_tokens']:>9,} "
              f"({100 * p['loop_tokens'] / max(1, p['tokens']):5.1f}% of project, "
              f"{100 * p['loop_tokens'] / max(1, tot):5.1f}% of train loops)")
    print(f"\ntop files by loop tokens:")
    for r in sorted(rows, key=lambda r: -r["loop_tokens"])[: a.top]:
        print(f"  {r['split']:5} {r['project']}/{r['path']}: {r['tokens']:,} tok, loop {r['loop_tokens']:,}, "
              f"lit {r['literal_frac']:.2f} dup {r['dup_frac']:.2f} run {r['max_run']} run3 {r['run3_frac']:.2f}")


if __name__ == "__main__":
    main()

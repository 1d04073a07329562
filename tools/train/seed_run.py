#!/usr/bin/env python3
"""Rebuild a training run folder from a shipped demo pair, so later stages need no retraining.

    python3 tools/train/seed_run.py --pair models/demo --corpus data/pypi_v8 --meta tools/train/seeds/v10 \
        --out out/demo_run [--carry out/run_carry]

Why. The stages after the target (gen, drafter, package) need the run folder that the target,
antiloop and MTP stages wrote: the int4 target, the bf16 MTP head, the corpus streams, the
stage markers and the metrics the model card is written from. That folder lives in the ignored
`out/` and does not survive a new checkout; rebuilding it meant ~15 minutes of device time
(session 13 retrained the v8 target because of it). The shipped pair already holds the int4
target bit for bit, and its run's small JSON files are kept in git (`tools/train/seeds/<version>/`),
so the folder can be put back here:

  * target/model_int4.safetensors: the pair's target tensors (everything but `mtp.*`) unchanged,
    the int4 words tagged U32 as the target stage writes them;
  * mtp/mtp.safetensors: the pair's int4 MTP head expanded to bf16 (w = q * scale + bias in
    float32, then bf16). The run kept the bf16 head the package rounded; a package made from a
    seeded run rounds this expansion again, which can move a few int4 words of the head;
  * corpus/ and tokenizer/ from the corpus folder (`pypi_corpus.py --pin` rebuilds it exactly),
    checked against the run's (`corpus_check.json`: token counts, the streams' and the tokenizer's sha256);
  * args.json, stages/{corpus,target,antiloop,mtp}.json, target/{config,shape,metrics}.json,
    mtp/metrics.json, antiloop/metrics.json from --meta; train_log.txt from the pair's TRAIN_LOG.txt.

--meta also records the sha256 of the pair's weight files (`pair_sha256.json`), and the seed
refuses a pair whose target weights differ from the ones the metrics describe. --carry writes
the folder as `remote_v2.sh train` unpacks a carried run (run.tar.xz.NN, 15 MB parts), with the
train stream cut to CARRY_TRAIN_TOKENS (default 12,000,000) and the validation stream to
CARRY_VAL_TOKENS (default 4,000,000), like the bundles the device calls return.

--record PAIR writes pair_sha256.json for a new --meta folder (after a run, from the pair it shipped).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "train"))
import common as C  # noqa: E402
META_FILES = ["args.json", "stages/corpus.json", "stages/target.json", "stages/antiloop.json", "stages/mtp.json",
              "target/config.json", "target/shape.json", "target/metrics.json", "mtp/metrics.json",
              "antiloop/metrics.json"]


def weight_files(pair: Path) -> list[Path]:
    files = sorted(pair.glob("model*.safetensors"))
    if not files:
        raise SystemExit(f"{pair}: no model*.safetensors")
    return files


def record(pair: Path, meta: Path) -> None:
    sums = {f.name: C.file_sha256(f) for f in weight_files(pair)}
    (meta / "pair_sha256.json").write_text(json.dumps(sums, indent=1) + "\n")
    print(f"wrote {meta / 'pair_sha256.json'} ({len(sums)} files)")


def load_pair(pair: Path):
    import torch
    from safetensors.torch import load_file

    cfg = json.loads((pair / "config.json").read_text())
    q = cfg.get("quantization")
    if not q or q.get("bits") != 4:
        raise SystemExit(f"{pair / 'config.json'}: expected an int4 pair (quantization.bits 4), found {q}")
    tensors = {}
    for f in weight_files(pair):
        tensors.update(load_file(str(f)))
    return tensors, int(q["group_size"]), torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", default=str(ROOT / "models" / "demo"))
    p.add_argument("--corpus", help="corpus folder of pypi_corpus.py (corpus/ and tokenizer/ inside)")
    p.add_argument("--meta", default=str(ROOT / "tools" / "train" / "seeds" / "v10"))
    p.add_argument("--out", default="out/demo_run")
    p.add_argument("--carry", default=None, help="also write the run as a carried bundle into this folder")
    p.add_argument("--record", action="store_true", help="write --meta/pair_sha256.json from --pair and stop")
    a = p.parse_args(argv)
    pair, meta, out = Path(a.pair), Path(a.meta), Path(a.out)
    if a.record:
        record(pair, meta)
        return 0
    if not a.corpus:
        raise SystemExit("--corpus is required (the folder pypi_corpus.py wrote)")
    corpus = Path(a.corpus)
    for f in META_FILES + ["pair_sha256.json", "corpus_check.json"]:
        if not (meta / f).is_file():
            raise SystemExit(f"{meta}: missing {f}")
    want = json.loads((meta / "pair_sha256.json").read_text())
    have = {f.name: C.file_sha256(f) for f in weight_files(pair)}
    if have != want:
        diff = sorted(set(want) ^ set(have) | {k for k in want if k in have and want[k] != have[k]})
        raise SystemExit(f"{pair}: weight files differ from the ones {meta} describes ({', '.join(diff)}); "
                         "seed from the pair that run shipped")
    cman = corpus / "corpus" / "manifest.json"
    if not cman.is_file():
        raise SystemExit(f"{corpus}: no corpus/manifest.json (run tools/train/pypi_corpus.py --pin first)")
    man = json.loads(cman.read_text())
    for key, want_v in json.loads((meta / "corpus_check.json").read_text()).items():
        if man.get(key) != want_v:
            raise SystemExit(f"{cman}: {key} {man.get(key)} differs from the run's {want_v} ({meta / 'corpus_check.json'})")
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"{out} exists and is not empty; refusing to overwrite")

    tensors, group, torch = load_pair(pair)
    from safetensors.torch import save_file

    for d in ("target", "mtp", "antiloop", "stages", "corpus", "tokenizer"):
        (out / d).mkdir(parents=True, exist_ok=True)
    target = {k: (v.view(torch.int32) if v.dtype != torch.bfloat16 and v.dtype != torch.float32 else v)
              for k, v in tensors.items() if not k.startswith("mtp.")}
    save_file(target, str(out / "target" / "model_int4.safetensors"), metadata={"format": "mlx"})
    C.retag_u32(out / "target" / "model_int4.safetensors", [k for k, v in target.items() if v.dtype == torch.int32])
    mtp = {}
    for k, v in tensors.items():
        if not k.startswith("mtp.") or k.endswith((".scales", ".biases")):
            continue
        base = k[: -len(".weight")] if k.endswith(".weight") else None
        if base and base + ".scales" in tensors:
            mtp[k] = C.int4_dequantize(v.view(torch.int32), tensors[base + ".scales"], tensors[base + ".biases"],
                                       group).to(torch.bfloat16)
        else:
            mtp[k] = v.to(torch.bfloat16)
    save_file(mtp, str(out / "mtp" / "mtp.safetensors"), metadata={"format": "pt"})
    for f in META_FILES:
        shutil.copy(meta / f, out / f)
    args = json.loads((out / "args.json").read_text())
    args["out"] = str(out.resolve())
    (out / "args.json").write_text(json.dumps(args, indent=1) + "\n")
    for f in sorted((corpus / "corpus").iterdir()):
        shutil.copy(f, out / "corpus" / f.name)
    for f in sorted((corpus / "tokenizer").iterdir()):
        shutil.copy(f, out / "tokenizer" / f.name)
    shutil.copy(pair / "TRAIN_LOG.txt", out / "train_log.txt")
    print(f"seeded {out}: target {len(target)} tensors, mtp {len(mtp)} tensors (bf16), stages corpus,target,antiloop,mtp done")

    if a.carry:
        carry = Path(a.carry)
        if carry.exists():
            shutil.rmtree(carry)
        carry.mkdir(parents=True)
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            shutil.copytree(out, tmp / "run")
            for sp, n in (("train", int(os.environ.get("CARRY_TRAIN_TOKENS", 12_000_000))),
                          ("val", int(os.environ.get("CARRY_VAL_TOKENS", 4_000_000)))):
                f = tmp / "run" / "corpus" / f"tokens_{sp}.npy"
                np.save(f, np.array(np.load(f, mmap_mode="r")[:n]))
            tar = subprocess.Popen(["tar", "-C", str(tmp / "run"), "-cf", "-", "."], stdout=subprocess.PIPE)
            xz = subprocess.Popen(["xz", "-T0", "-6"], stdin=tar.stdout, stdout=subprocess.PIPE)
            split = subprocess.run(["split", "-b", "15M", "-d", "-", str(carry / "run.tar.xz.")], stdin=xz.stdout)
            if tar.wait() or xz.wait() or split.returncode:
                raise SystemExit("seed_run: packing the carry failed")
        size = sum(f.stat().st_size for f in carry.iterdir())
        print(f"wrote {carry} ({size / 1e6:.1f} MB): carry it as out/run_carry for remote_v2.sh train")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Stage `corpus`: gather the stdlib corpus, split it, train the BPE tokenizer,
tokenize both splits into packed uint16 streams.

Corpus  = every `*.py` file under `sysconfig.get_paths()['stdlib']` of the
          interpreter running this script, skipping any directory named
          `site-packages`, `dist-packages` or `__pycache__` (anywhere in the
          tree), and skipping files that are not valid UTF-8.
Order   = sorted relative POSIX paths.
Split   = validation iff int(sha256(relpath_utf8).hexdigest()[:8], 16) % 10000 < 200
          (about 2% of files), else train. Depends only on the relative path.
Packing = each file's text is NFC-normalised by the tokenizer, encoded, and
          followed by <|endoftext|>; files are concatenated in sorted order.

Outputs (OUT/corpus/): manifest.json, tokens_train.npy, tokens_val.npy,
validation_files.json; OUT/tokenizer/: tokenizer.json, tokenizer_config.json.
"""
from __future__ import annotations

import hashlib
import os
import platform
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

import common as C

EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}
VAL_MODULUS = 10000
VAL_THRESHOLD = 200  # 2%


def is_validation(relpath: str) -> bool:
    h = int(hashlib.sha256(relpath.encode("utf-8")).hexdigest()[:8], 16)
    return h % VAL_MODULUS < VAL_THRESHOLD


def gather_files(root: Path) -> list[str]:
    rels = []
    for dp, dns, fns in os.walk(root):
        dns[:] = [d for d in dns if d not in EXCLUDED_DIRS]
        for fn in fns:
            if fn.endswith(".py"):
                rels.append(Path(dp, fn).relative_to(root).as_posix())
    return sorted(rels)


def build_tokenizer_skeleton():
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(C.QWEN35_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    return tok


def train_tokenizer(texts: list[str], log) -> "Tokenizer":
    from tokenizers import AddedToken, pre_tokenizers, trainers

    tok = build_tokenizer_skeleton()
    trainer = trainers.BpeTrainer(
        vocab_size=C.N_BPE,
        min_frequency=2,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    n = tok.get_vocab_size(with_added_tokens=False)
    if n != C.N_BPE:
        raise SystemExit(f"BPE training produced {n} tokens, expected {C.N_BPE} (corpus too small?)")
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in C.SPECIAL_TOKENS])
    assert tok.get_vocab_size(with_added_tokens=True) == C.VOCAB_SIZE
    for i, s in enumerate(C.SPECIAL_TOKENS):
        assert tok.token_to_id(s) == C.N_BPE + i, (s, tok.token_to_id(s))
    log(f"tokenizer: {n} BPE ids + {len(C.SPECIAL_TOKENS)} specials = {C.VOCAB_SIZE}; mask id {C.MASK_ID}")
    return tok


def tokenizer_config() -> dict:
    added = {
        str(C.N_BPE + i): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, s in enumerate(C.SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": False,
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "mask_token": "<|mask|>",
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<think>", "</think>"],
        "added_tokens_decoder": added,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 4096,
        "errors": "replace",
    }


def run_prebuilt(args, log):
    """--corpus-dir: take the packed streams, validation texts and tokenizer of pypi_corpus.py."""
    import shutil

    src, out = Path(args.corpus_dir), Path(args.out)
    need = ["corpus/tokens_train.npy", "corpus/tokens_val.npy", "corpus/validation_texts.json",
            "corpus/manifest.json", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"]
    missing = [n for n in need if not (src / n).exists()]
    if missing:
        raise SystemExit(f"--corpus-dir {src}: missing {missing} (build it with tools/train/pypi_corpus.py)")
    for sub in ("corpus", "tokenizer"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    for n in need + ["corpus/validation_files.json"]:
        if (src / n).exists():
            shutil.copy(src / n, out / n)
    counts = {}
    for sp in ("train", "val"):
        arr = np.load(out / "corpus" / f"tokens_{sp}.npy", mmap_mode="r")
        if arr.dtype != np.uint16 or (arr.size and int(arr.max()) >= C.VOCAB_SIZE):
            raise SystemExit(f"corpus/tokens_{sp}.npy: expected uint16 ids < {C.VOCAB_SIZE}, found {arr.dtype} "
                             f"max {int(arr.max()) if arr.size else None}")
        counts[sp] = int(arr.size)
    if args.smoke:  # a CPU run: the first slice of each stream
        for sp, n in (("train", 200_000), ("val", 20_000)):
            arr = np.load(out / "corpus" / f"tokens_{sp}.npy")[:n]
            np.save(out / "corpus" / f"tokens_{sp}.npy", arr)
            counts[sp] = int(arr.size)
    man = C.read_json(src / "corpus" / "manifest.json")
    log(f"corpus: prebuilt {src}: {man['n_projects']['train']} train / {man['n_projects']['val']} validation projects, "
        f"tokens used train {counts['train']:,} val {counts['val']:,}")
    return {"prebuilt": str(src), "tokens": counts, "files": man.get("files"), "bytes": man.get("bytes"),
            "python_version": platform.python_version()}


def run(args, log):
    if getattr(args, "corpus_dir", None):
        return run_prebuilt(args, log)
    out = Path(args.out)
    t0 = time.time()
    root = Path(sysconfig.get_paths()["stdlib"]).resolve()
    rels = gather_files(root)
    texts, kept, skipped = [], [], []
    for rel in rels:
        data = (root / rel).read_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(rel)
            continue
        if not text.strip():
            continue
        texts.append(text)
        kept.append(rel)
    if args.smoke:
        # tiny, but keep both splits populated: every validation file + a slice of train
        val_idx = [i for i, r in enumerate(kept) if is_validation(r)]
        tr_idx = [i for i, r in enumerate(kept) if not is_validation(r)][: args.smoke_files]
        keep = sorted(set(val_idx[: max(8, args.smoke_files // 10)]) | set(tr_idx))
        kept = [kept[i] for i in keep]
        texts = [texts[i] for i in keep]
    split = ["val" if is_validation(r) else "train" for r in kept]
    n_val = split.count("val")
    nbytes = {s: sum(len(t.encode()) for t, sp in zip(texts, split) if sp == s) for s in ("train", "val")}
    log(
        f"corpus: stdlib {root} (Python {platform.python_version()}): {len(rels)} .py files, "
        f"{len(skipped)} not UTF-8 (skipped), kept {len(kept)}: train {len(kept) - n_val} files "
        f"{nbytes['train'] / 1e6:.2f} MB, val {n_val} files {nbytes['val'] / 1e6:.2f} MB"
    )

    # --- tokenizer on the train split only ---
    t1 = time.time()
    train_texts = [t for t, sp in zip(texts, split) if sp == "train"]
    tok = train_tokenizer(train_texts, log)
    tok_dir = out / "tokenizer"
    tok_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(tok_dir / "tokenizer.json"))
    C.write_json(tok_dir / "tokenizer_config.json", tokenizer_config())
    log(f"tokenizer trained in {C.fmt_s(time.time() - t1)}")

    # --- tokenize, pack with <|endoftext|> after each file ---
    t2 = time.time()
    enc = tok.encode_batch(texts, add_special_tokens=False)
    streams = {"train": [], "val": []}
    ntok = []
    for e, sp in zip(enc, split):
        ids = e.ids
        ntok.append(len(ids))
        streams[sp].append(np.asarray(ids, dtype=np.uint16))
        streams[sp].append(np.asarray([C.EOT_ID], dtype=np.uint16))
    cdir = out / "corpus"
    cdir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for sp in ("train", "val"):
        arr = np.concatenate(streams[sp]) if streams[sp] else np.zeros(0, np.uint16)
        np.save(cdir / f"tokens_{sp}.npy", arr)
        counts[sp] = int(arr.size)
    # round trip check on a few files
    for t, e in list(zip(texts, enc))[:20]:
        import unicodedata

        assert tok.decode(e.ids, skip_special_tokens=False) == unicodedata.normalize("NFC", t)
    log(
        f"tokenized in {C.fmt_s(time.time() - t2)}: train {counts['train']:,} tokens, val {counts['val']:,} tokens "
        f"({nbytes['train'] / max(1, counts['train']):.2f} bytes/token on train)"
    )
    files = [{"path": r, "split": sp, "tokens": n} for r, sp, n in zip(kept, split, ntok)]
    manifest = {
        "python_version": platform.python_version(),
        "python_executable": sys.executable,
        "stdlib": str(root),
        "excluded_dirs": sorted(EXCLUDED_DIRS),
        "split_rule": f"validation iff int(sha256(relpath).hexdigest()[:8], 16) % {VAL_MODULUS} < {VAL_THRESHOLD}",
        "n_files_found": len(rels),
        "n_files_not_utf8": len(skipped),
        "not_utf8": skipped,
        "n_files": {"train": len(kept) - n_val, "val": n_val},
        "bytes": nbytes,
        "tokens": counts,
        "smoke": bool(args.smoke),
        "files": files,
    }
    C.write_json(cdir / "manifest.json", manifest)
    C.write_json(cdir / "validation_files.json", [r for r, sp in zip(kept, split) if sp == "val"])
    # keep the validation texts for the prompt file (package stage)
    C.write_json(cdir / "validation_texts.json", {r: t for r, t, sp in zip(kept, texts, split) if sp == "val"})
    return {
        "seconds": time.time() - t0,
        "python_version": platform.python_version(),
        "tokens": counts,
        "files": manifest["n_files"],
        "bytes": nbytes,
    }

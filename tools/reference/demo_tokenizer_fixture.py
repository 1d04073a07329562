"""Reference ids for the demo tokenizer on the validation split of this machine's stdlib.

The demo pair's corpus rule (tools/train/stage_corpus.py) picks validation files by a hash of
their relative path; this script applies it to the local python3's standard library, encodes
every validation file with the Hugging Face `tokenizers` library and models/demo/tokenizer.json,
and writes text + ids to tests/fixtures/tokenizer/demo_validation.json for the C++ parity test.

    python3 tools/reference/demo_tokenizer_fixture.py
"""
import json
import os
import sys
import sysconfig
from pathlib import Path

from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools" / "train"))
from stage_corpus import gather_files, is_validation  # noqa: E402


def main():
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    tok = Tokenizer.from_file(str(ROOT / "models" / "demo" / "tokenizer.json"))
    files = []
    total = 0
    for rel in gather_files(stdlib):
        if total > 120_000:  # keep the committed fixture small (~300 KB)
            break
        if not is_validation(rel):
            continue
        try:
            text = (stdlib / rel).read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        files.append({"path": rel, "text": text, "ids": tok.encode(text).ids})
        total += len(text)
    out = ROOT / "tests" / "fixtures" / "tokenizer" / "demo_validation.json"
    payload = {"python": sys.version.split()[0], "stdlib": os.path.relpath(stdlib, sys.base_prefix), "files": files}
    out.write_text(json.dumps(payload, ensure_ascii=False, separators=(",", ":")) + "\n", encoding="utf-8")
    print(f"{len(files)} files, {sum(len(f['ids']) for f in files)} tokens -> {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()

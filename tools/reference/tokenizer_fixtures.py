#!/usr/bin/env python3
"""Writes the tokenizer parity fixtures in tests/fixtures/tokenizer/ from Hugging Face `tokenizers`.

Run:  python3 tools/reference/tokenizer_fixtures.py [--qwen3 DIR]

The Qwen3 tokenizer is the repository's own copy, tests/fixtures/tokenizer/qwen3/qwen3-tokenizer.tar.xz
(extracted into a temporary folder here; CMake extracts it into the build folder for the C++ tests).
--qwen3 DIR reads an already extracted folder (tokenizer.json, tokenizer_config.json) instead.

Outputs (all small):
  qwen3_corpus.json   corpus texts with their ids under the Qwen3 tokenizer, three ways:
                      ids (added tokens parsed), ids_plain (added tokens as text) and
                      ids_qwen35 (the same file with the Qwen3.5-family split regex, \\p{M} in
                      letter runs), pieces_qwen35 (its pre-tokens of the NFC text); also the
                      regex strings the test patches in.
  tiny_bpe_pairs.json   a small byte-level BPE trained here: ByteLevel(use_regex=true) pre-tokenizer,
                        Sequence[NFC] normalizer, merges as ["a","b"] pairs, added tokens with
                        lstrip / rstrip / single_word / normalized flags.
  tiny_bpe_strings.json the same model with merges written as "a b" strings.
  tiny_bpe_prefix.json  the same with add_prefix_space=true and no normalizer.
  tiny_corpus.json      corpus ids for the three tiny tokenizers, and ids under other Split
                        behaviors (pre_tokenizer JSON stored beside them, patched in by the test).
  chat.json             ChatML renderings by transformers' apply_chat_template (the Qwen3
                        template of tokenizer_config.json) for conversations where Qwen3 and
                        Qwen3.8 templates agree.
"""
import argparse
import copy
import json
import os
import sys
import tarfile
import tempfile
import unicodedata

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from tokenizers import AddedToken
import tokenizers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer")
QWEN3_ARCHIVE = os.path.join(OUT, "qwen3", "qwen3-tokenizer.tar.xz")
QWEN3_FILES = ("tokenizer.json", "tokenizer_config.json")

QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# (name, text). Chosen to exercise every branch of the split regex and of added-token
# matching, plus normalization and multi-byte merges.
CORPUS = [
    ("empty", ""),
    ("single_space", " "),
    ("python", "def fib(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
               "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n"
               "if __name__ == '__main__':\n\tprint(fib(30))  # 832040\n"),
    ("cpp", "#include <vector>\ntemplate <typename T>\nstd::vector<T> twice(const std::vector<T>& v) {\n"
            "  std::vector<T> out; out.reserve(v.size() * 2);\n  for (auto& x : v) { out.push_back(x); "
            "out.push_back(x); }\n  return out;  // NRVO\n}\nint main(){return x->y!=0&&z<<=3||w>>2;}\n"),
    ("prose", "The quick brown fox jumps over the lazy dog. It wasn't the fox's fault; the dog's "
              "owner (Dr. Smith, Ph.D.) had left the gate open at 5:30 p.m. on Tuesday!"),
    ("contractions_caps", "DON'T YOU KNOW? I'M HERE, WE'LL SEE, THEY'VE GONE, SHE'D, IT'S... "
                          "don't i'm we'll they've she'd it's O'Neil rock'n'roll 'tis"),
    ("chinese", "人工智能是计算机科学的一个分支，它企图了解智能的实质，并生产出一种新的能以人类智能相似的方式做出反应的智能机器。"),
    ("japanese_korean", "東京は日本の首都です。カタカナとひらがな。안녕하세요, 세계! 한국어 텍스트입니다."),
    ("hindi", "नमस्ते दुनिया, यह एक परीक्षण है। क्षत्रिय, हिंदी में संयुक्ताक्षर और मात्राएँ होती हैं।"),
    ("tamil", "தமிழ் ஒரு செம்மொழி. யாதும் ஊரே யாவரும் கேளிர்."),
    ("arabic", "مَرْحَبًا بِالْعَالَمِ! اللغة العربية جميلة، أليس كذلك؟ ١٢٣٤٥"),
    ("hebrew_thai", "שָׁלוֹם עוֹלָם. สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่าง"),
    ("greek_cyrillic", "Καλημέρα κόσμε! Привет, мир! Ёжик в тумане."),
    ("emoji", "I ❤️ tokenizers 👍🏽 👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 🧑🏿‍💻 coder, 🇯🇵 🇺🇸 flags 😀😃😄"),
    ("whitespace", "a\tb\t\tc\r\nd\r\n\r\ne   f     g\n\n\n  h \n \n  trailing   "),
    ("unicode_spaces", "nbsp\u00a0here ideographic\u3000space 全角\u3000\u3000空格 narrow\u202fnbsp "
                       "line\u2028sep para\u2029sep nel\u0085x zwsp\u200bx bom\ufeffx ogham\u1680x"),
    ("leading_ws", "   \t  leading spaces and a tab"),
    ("only_newlines", "\n\n\r\n\r\r\n\n"),
    ("numbers", "1234567890123456789 3.14159 1,000,000 -42 1e-9 0x1F ٣٤٥ ²³ ½ Ⅻ 2024-12-02"),
    ("special_tokens", "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\n"
                       "ok<|endoftext|>"),
    ("special_near_miss", "<|im_start| <|im_end <|endoftext|><|endoftext|>x<think>y</think>z <tool_call>"
                          "{\"a\":1}</tool_call><|fim_prefix|><|im_start|>"),
    ("nfc_decomposed", "cafe\u0301 e\u0301\u0301 A\u030a \u212b \u1100\u1161\u11a8 ﬁ Å o\u0308\u0304"),
    ("marks_start", "\u0301abc \u0308 \u093f\u0915"),
    ("long_word", "a" * 300 + " " + "pneumonoultramicroscopicsilicovolcanoconiosis"),
    ("many_spaces", "x" + " " * 200 + "y" + "\t" * 40 + "z"),
    ("controls", "null\x00byte bell\x07 del\x7f esc\x1b[0m \x1c\x1d\x1e\x1f"),
    ("case_fold", "'ſt 'st 'Kx 'kx 'ST ﬀ 'ﬀ 'ß 'ss"),
    ("mixed", "Hello世界!!!...??? C++ → résumé naïve coöperate Ελληνικά 123abc abc123 "
              "https://example.com/path?q=1&r=2#frag `code` **bold** — “quotes” ‘single’"),
    ("json", "{\"name\": \"qflash\", \"version\": [0, 1, 2], \"ok\": true, \"pi\": 3.14}"),
    ("indic_marks", "क़ि कि क्ष ज्ञ श्र ॐ ஸ்ரீ கொ் ಕನ್ನಡ తెలుగు മലയാളം বাংলা ਪੰਜਾਬੀ"),
    ("vietnamese", "Tiếng Việt có dấu: Nguyễn, Trường, Hà Nội, Tiê\u0301ng (decomposed)"),
]

TINY_CORPUS = [
    ("empty", ""),
    ("prose", "hello world, hello there! the cat sat on the mat."),
    ("lstrip", "left   [LS] right"),
    ("rstrip", "left [RS]   right"),
    ("single_word_ok", "a <w> b"),
    ("single_word_glued", "a<w>b x_<w> é<w>"),
    ("special", "<|sp|>hello<|sp|> <|sp|>"),
    ("longest_match", "<|sp|>long <|sp|>lon <|sp|>longer <|sp|><|sp|>long"),
    ("normalized", "caf\u00e9 cafe\u0301 ok"),
    ("both", "x [LS][RS] y<|sp|>z"),
    ("cjk", "你好世界 hello"),
    ("numbers", "12345 678"),
    ("spaces", "  a  b   "),
]


def encode_ids(tok, text):
    return tok.encode(text, add_special_tokens=False).ids


def qwen3_fixture(qwen3_dir):
    path = os.path.join(qwen3_dir, "tokenizer.json")
    raw = json.load(open(path, encoding="utf-8"))
    qwen3_regex = raw["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    tok = Tokenizer.from_file(path)
    plain = copy.deepcopy(raw)
    plain["added_tokens"] = []  # HF without added tokens = our parse_special=false
    tok_plain = Tokenizer.from_str(json.dumps(plain))
    v35 = copy.deepcopy(raw)
    v35["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN35_REGEX
    tok35 = Tokenizer.from_str(json.dumps(v35))
    items = []
    for name, text in CORPUS:
        ids = encode_ids(tok, text)
        # The round trip must hold in the reference too, or the item tests nothing sensible.
        assert tok.decode(ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text), name
        nfc = unicodedata.normalize("NFC", text)
        # Pre-tokens in the byte-level spelling: checks the regex split itself, which ids alone
        # can hide when the vocabulary has no merge across the boundary in question.
        pieces35 = [p for p, _ in tok35.pre_tokenizer.pre_tokenize_str(nfc)]
        items.append({"name": name, "text": text, "ids": ids,
                      "ids_plain": encode_ids(tok_plain, text), "ids_qwen35": encode_ids(tok35, text),
                      "pieces_qwen35": pieces35})
        if nfc != text:
            items[-1]["nfc"] = nfc
    n_diff = sum(it["ids"] != it["ids_qwen35"] for it in items)
    print(f"qwen3 corpus: {len(items)} items, {n_diff} differ under the Qwen3.5 regex")
    return {"generator": "tools/reference/tokenizer_fixtures.py", "tokenizers_version": tokenizers.__version__,
            "qwen3_regex": qwen3_regex, "qwen35_regex": QWEN35_REGEX, "items": items}


def train_tiny():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.NFC()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    training = [t for _, t in CORPUS] * 3 + [t for _, t in TINY_CORPUS] * 5
    tok.train_from_iterator(training, trainer)
    # "<|sp|>long" starts with "<|sp|>": the longest match must win.
    tok.add_special_tokens([AddedToken("<|sp|>", special=True, normalized=False),
                            AddedToken("<|sp|>long", special=True, normalized=False)])
    tok.add_tokens([
        AddedToken("[LS]", lstrip=True, normalized=False),
        AddedToken("[RS]", rstrip=True, normalized=False),
        AddedToken("<w>", single_word=True, normalized=False),
        AddedToken("café", normalized=True),
    ])
    return json.loads(tok.to_str())


def tiny_fixtures():
    pairs = train_tiny()
    assert isinstance(pairs["model"]["merges"][0], list), "expected tokenizers to save pair merges"
    strings = copy.deepcopy(pairs)
    strings["model"]["merges"] = [f"{a} {b}" for a, b in pairs["model"]["merges"]]
    prefix = copy.deepcopy(pairs)
    prefix["pre_tokenizer"]["add_prefix_space"] = True
    prefix["normalizer"] = None
    variants = {"pairs": pairs, "strings": strings, "prefix": prefix}
    toks = {k: Tokenizer.from_str(json.dumps(v)) for k, v in variants.items()}
    items = []
    for name, text in TINY_CORPUS + [(n, t) for n, t in CORPUS if len(t) < 400]:
        ids = {k: encode_ids(t, text) for k, t in toks.items()}
        assert ids["pairs"] == ids["strings"], name
        items.append({"name": name, "text": text, "ids": ids["pairs"], "ids_prefix": ids["prefix"]})
    return variants, {"generator": "tools/reference/tokenizer_fixtures.py",
                      "tokenizers_version": tokenizers.__version__, "items": items,
                      "split_texts": [t for _, t in TINY_CORPUS], "split_variants": split_variants(pairs)}


def split_variants(tiny_json):
    """Other Split behaviors / String patterns / invert, applied to the tiny model. Only the
    pre_tokenizer JSON and the ids are stored; the test patches it into tiny_bpe_pairs.json."""
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}

    def split(pattern, behavior, invert=False):
        return {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}, bl]}

    variants = [
        ("digits_removed", split({"Regex": r"\d+"}, "Removed")),
        ("punct_merged_with_previous", split({"Regex": r"[,.!]"}, "MergedWithPrevious")),
        ("space_merged_with_next", split({"String": " "}, "MergedWithNext")),
        ("ws_contiguous", split({"Regex": r"\s"}, "Contiguous")),
        ("letters_inverted_removed", split({"Regex": r"\p{L}+"}, "Removed", True)),
        ("letters_inverted_merged_next", split({"Regex": r"\p{L}+"}, "MergedWithNext", True)),
        ("literal_l_isolated", split({"String": "l"}, "Isolated")),
        ("bytelevel_prefix_no_regex", {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                                       "use_regex": False}),
    ]
    out = []
    for name, pre in variants:
        j = copy.deepcopy(tiny_json)
        j["pre_tokenizer"] = pre
        tok = Tokenizer.from_str(json.dumps(j))
        out.append({"name": name, "pre_tokenizer": pre, "ids": [encode_ids(tok, t) for _, t in TINY_CORPUS]})
    return out


def chat_fixture(qwen3_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(qwen3_dir)
    if not tok.chat_template:
        return None
    sys_user = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi!"}]
    cases = [
        ("system_user_no_think", sys_user, True, False),
        ("assistant_reasoning_last", sys_user + [{"role": "assistant", "content": "Hello.",
                                                  "reasoning_content": "Greet back."}], False, True),
        ("assistant_no_reasoning_last", [{"role": "user", "content": "2+2?"},
                                         {"role": "assistant", "content": "4"}], False, True),
        ("tool_results", [{"role": "user", "content": "Weather?"},
                          {"role": "assistant", "content": "Checking.", "reasoning_content": "Use tool."},
                          {"role": "tool", "content": "{\"t\": 21}"}, {"role": "tool", "content": "sunny"}],
         True, False),
    ]
    out = []
    for name, msgs, gen, think in cases:
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen, enable_thinking=think)
        conv = [{"role": m["role"], "content": m["content"], "reasoning": m.get("reasoning_content", "")}
                for m in msgs]
        out.append({"name": name, "messages": conv, "add_generation_prompt": gen,
                    "enable_thinking": think, "text": text})
    return {"generator": "tools/reference/tokenizer_fixtures.py",
            "note": "transformers apply_chat_template with the Qwen3 template; only cases "
                    "where it agrees with the Qwen3.8 grammar (docs/spec/qwen38.md 5.2)",
            "cases": out}


def write(name, obj):
    path = os.path.join(OUT, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qwen3", default=None,
                    help="extracted Qwen3 tokenizer folder (default: extract the repository's archive)")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        qwen3_dir = args.qwen3
        if qwen3_dir is None:
            with tarfile.open(QWEN3_ARCHIVE, "r:xz") as tar:
                tar.extractall(tmp, members=[tar.getmember(n) for n in QWEN3_FILES])
            qwen3_dir = tmp
        write("qwen3_corpus.json", qwen3_fixture(qwen3_dir))
        variants, tiny = tiny_fixtures()
        for k, v in variants.items():
            write(f"tiny_bpe_{k}.json", v)
        write("tiny_corpus.json", tiny)
        chat = chat_fixture(qwen3_dir)
        if chat is not None:
            write("chat.json", chat)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Unit tests of tools/quality/loops.py: the loop detector on synthetic id sequences, and the
driver against a stand-in qflash (so the pass/fail logic is tested without a model)."""
from __future__ import annotations

import json
import os
import random
import stat
import sys
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "quality"))
import loops  # noqa: E402


def brute_force(ids, min_span=8, repeats=3):
    """Straight from the definition: the smallest (start, span) with `repeats` equal copies."""
    n = len(ids)
    for s in range(n):
        for L in range(min_span, (n - s) // repeats + 1):
            if all(ids[s:s + L] == ids[s + k * L:s + (k + 1) * L] for k in range(1, repeats)):
                return s, L
    return None


def noise(n, seed, vocab=5000):
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


class Detector(unittest.TestCase):
    def test_random_text_has_no_loop(self):
        for seed in range(20):
            self.assertIsNone(loops.find_loop(noise(128, seed)))

    def test_three_copies_of_eight_tokens(self):
        span = list(range(100, 108))
        ids = noise(20, 1) + span * 3 + noise(20, 2)
        lp = loops.find_loop(ids)
        self.assertIsNotNone(lp)
        self.assertEqual((lp.start, lp.span, lp.copies), (20, 8, 3))

    def test_two_copies_are_not_a_loop(self):
        span = list(range(100, 112))
        self.assertIsNone(loops.find_loop(noise(30, 3) + span * 2 + noise(30, 4)))

    def test_span_of_seven_is_too_short_until_it_reaches_a_multiple(self):
        span = list(range(200, 207))  # period 7
        # 3 copies (21 tokens) are not a loop; 14-token copies need 42 tokens
        self.assertIsNone(loops.find_loop(noise(10, 5) + span * 3 + noise(10, 6)))
        self.assertIsNone(loops.find_loop(noise(10, 5) + span * 5 + noise(10, 6)))
        lp = loops.find_loop(noise(10, 5) + span * 6 + noise(10, 6))
        self.assertEqual((lp.start, lp.span, lp.copies), (10, 14, 3))

    def test_short_period_like_import_os(self):
        line = [732, 2048, 198]  # 'import os\n' is three tokens
        self.assertIsNone(loops.find_loop(noise(5, 7) + line * 8 + [1]))  # 24 tokens: 9 x 3 needs 27
        lp = loops.find_loop(noise(5, 7) + line * 9 + [1])
        self.assertEqual((lp.start, lp.span, lp.copies), (5, 9, 3))

    def test_one_changed_token_breaks_the_loop(self):
        span = list(range(300, 310))
        ids = span * 3
        ids[25] = 9999
        self.assertIsNone(loops.find_loop(ids))

    def test_loop_running_to_the_end_counts_copies(self):
        span = list(range(400, 409))
        lp = loops.find_loop(noise(7, 8) + span * 6)
        self.assertEqual((lp.start, lp.span, lp.copies), (7, 9, 6))

    def test_earliest_start_wins(self):
        a, b = list(range(10, 20)), list(range(50, 58))
        ids = noise(4, 9) + a * 3 + noise(3, 10) + b * 3
        lp = loops.find_loop(ids)
        self.assertEqual((lp.start, lp.span), (4, 10))

    def test_matches_brute_force_on_random_repetitive_sequences(self):
        rng = random.Random(11)
        found = 0
        for trial in range(300):
            vocab = rng.choice([2, 3, 4, 50])  # small vocabularies make accidental loops
            ids = [rng.randrange(vocab) for _ in range(rng.randrange(0, 70))]
            if rng.random() < 0.5 and len(ids) > 10:
                span = ids[:rng.randrange(1, 12)]
                at = rng.randrange(len(ids))
                ids = ids[:at] + span * rng.randrange(2, 6) + ids[at:]
            want = brute_force(ids)
            lp = loops.find_loop(ids)
            self.assertEqual(want, None if lp is None else (lp.start, lp.span), ids)
            found += want is not None
        self.assertGreater(found, 30)  # the comparison covered both outcomes

    def test_bad_parameters(self):
        with self.assertRaises(ValueError):
            loops.find_loop([1, 2, 3], min_span=0)
        with self.assertRaises(ValueError):
            loops.find_loop([1, 2, 3], repeats=1)


STUB = r'''#!/usr/bin/env python3
# Stand-in qflash: `run` prints LOOP for prompts that contain "loop", else distinct words;
# `tokenize` maps each whitespace-separated word of the file to an id.
import json, sys
a = sys.argv[1:]
if "run" in a:
    prompt = open(a[a.index("--prompt-file") + 1]).read()
    n = int(a[a.index("--max-tokens") + 1])
    words = ["x%d" % (i % 8) for i in range(n)] if "loop" in prompt else ["w%d" % i for i in range(n)]
    sys.stdout.write(" ".join(words))
elif "tokenize" in a:
    text = open(a[a.index("--file") + 1]).read()
    vocab = {}
    print(json.dumps([vocab.setdefault(w, len(vocab)) for w in text.split()]))
else:
    sys.exit(2)
'''


class Driver(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        d = Path(self.tmp.name)
        self.qflash = d / "qflash"
        self.qflash.write_text(STUB)
        self.qflash.chmod(self.qflash.stat().st_mode | stat.S_IXUSR)
        self.model = d / "model"
        self.model.mkdir()

    def tearDown(self):
        self.tmp.cleanup()

    def write_prompts(self, n_loop, n=4):
        rows = [{"id": i, "text": ("a loop\n" if i < n_loop else f"def f{i}():\n")} for i in range(n)]
        (self.model / "validation_prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def run_main(self, *extra, demo="def main("):
        out = Path(self.tmp.name) / "r.json"
        rc = loops.main(["--qflash", str(self.qflash), "--model", str(self.model), "--json", str(out),
                         "--max-tokens", "40", "--n-prompts", "4", "--demo-prompt", demo, *extra])
        return rc, json.loads(out.read_text())

    def test_report_only_passes_and_counts(self):
        self.write_prompts(n_loop=3)
        rc, res = self.run_main()
        self.assertEqual(rc, 0)
        self.assertEqual((res["clean"], res["n"], res["demo_clean"]), (1, 4, True))
        self.assertEqual([r["loop"] is None for r in res["results"]], [False, False, False, True, True])

    def test_require_clean_fails_below_the_bar(self):
        self.write_prompts(n_loop=2)
        self.assertEqual(self.run_main("--require-clean", "3")[0], 1)
        self.write_prompts(n_loop=1)
        self.assertEqual(self.run_main("--require-clean", "3")[0], 0)

    def test_require_demo_clean(self):
        self.write_prompts(n_loop=0)
        self.assertEqual(self.run_main("--require-demo-clean", demo="loop")[0], 1)
        self.assertEqual(self.run_main("--require-demo-clean")[0], 0)

    def test_missing_prompts_file_is_named(self):
        with self.assertRaises(SystemExit) as cm:
            self.run_main()
        self.assertIn("validation_prompts.jsonl", str(cm.exception))


if __name__ == "__main__":
    unittest.main()

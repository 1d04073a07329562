#!/usr/bin/env python3
"""Unit tests of the v3 corpus preparation (docs/experiments/demo_data.md, "v3 preparation"):
the repetition filter of tools/train/pypi_corpus.py, the stream loop mask of
tools/quality/corpus_loops.py (against the definition, brute force) and the `docfunc` validation
prompt rule of tools/train/stage_package.py. Needs numpy (scripts/setup.sh puts it in .venv/; ctest runs
this with that interpreter)."""
from __future__ import annotations

import argparse
import random
import sys
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "train"))
sys.path.insert(0, str(REPO / "tools" / "quality"))
import pypi_corpus as pc  # noqa: E402



def filter_args(**kw):
    d = {"rep_min_lines": 20, "max_literal_frac": 0.5, "max_line_run": 5, "max_dup_frac": 0.5}
    d.update(kw)
    return argparse.Namespace(**d)


class LiteralLines(unittest.TestCase):
    def test_literal(self):
        for l in ['"de_DE",', "'a': 1,", "(1, 2, 3),", "-1,", "0x1F, 0o7, 1e-3, .5, 3j", 'u"\\u00e9",  # e',
                  "    'Ana', 'Bruno', 'Carla',", '"""One line docstring."""', "b'\\x00\\x01',"]:
            self.assertTrue(pc.is_literal_line(l), l)

    def test_code(self):
        for l in ["x = 1", 'return "a"', ")", "],", "", "   ", "# 'comment'", "foo(1)", '"a" + b', "None,",
                  "def f(a='x'):", "import os"]:
            self.assertFalse(pc.is_literal_line(l), l)


class RepetitionStats(unittest.TestCase):
    def test_counts(self):
        st = pc.repetition_stats("import os\nimport os\nimport os\n\nx = 1\n")
        self.assertEqual(st["lines"], 4)
        self.assertEqual(st["max_run"], 3)
        self.assertAlmostEqual(st["dup_frac"], 2 / 4)  # 'import os' >= 8 chars, two repeats
        self.assertAlmostEqual(st["run3_frac"], 3 / 4)
        self.assertEqual(st["literal_frac"], 0.0)

    def test_short_lines_not_duplicates(self):
        st = pc.repetition_stats("pass\npass\nx\nx\n")
        self.assertEqual(st["dup_frac"], 0.0)  # under 8 characters
        self.assertEqual(st["max_run"], 2)

    def test_empty(self):
        self.assertEqual(pc.repetition_stats("")["lines"], 0)


class RepetitionReason(unittest.TestCase):
    def test_data_table(self):
        text = "NAMES = (\n" + "".join(f"    'name{i}',\n" for i in range(40)) + ")\n"
        self.assertEqual(pc.repetition_reason(text, filter_args()), "data_literals")

    def test_line_run(self):
        text = "".join(f"x{i} = f({i})\n" for i in range(20)) + "y = g(0)  # same\n" * 6
        self.assertEqual(pc.repetition_reason(text, filter_args()), "line_run")
        self.assertIsNone(pc.repetition_reason(text, filter_args(max_line_run=6)))

    def test_repeated_lines(self):
        body = "".join(f"def f{i}(self):\n    return self._client.get(path)\n" for i in range(15))
        self.assertEqual(pc.repetition_reason(body, filter_args()), None)  # 14 repeats of 30 lines
        body += "    return self._client.get(path)\n" * 3  # 17 of 33 > 0.5, a run of 4 (<= 5)
        self.assertEqual(pc.repetition_reason(body, filter_args()), "repeated_lines")

    def test_short_file_exempt(self):
        text = "'a',\n" * 19
        self.assertIsNone(pc.repetition_reason(text, filter_args()))
        self.assertEqual(pc.repetition_reason(text + "'b',\n", filter_args()), "data_literals")

    def test_plain_code_kept(self):
        text = (REPO / "tools" / "train" / "pypi_corpus.py").read_text()
        self.assertIsNone(pc.repetition_reason(text, filter_args()))


class LoopMask(unittest.TestCase):
    def test_against_definition(self):
        import numpy as np
        import corpus_loops as cl

        rng = random.Random(7)
        for _ in range(200):
            n = rng.randint(10, 110)
            ids = [rng.randint(0, 3) for _ in range(n)]
            if rng.random() < 0.7:
                L, k, s = rng.randint(1, 20), rng.randint(2, 5), rng.randint(0, n)
                blk = [rng.randint(0, 5) for _ in range(L)]
                ids = ids[:s] + blk * k + ids[s:]
            bf = [False] * len(ids)
            for L in range(8, len(ids) // 3 + 1):
                for s in range(len(ids) - 3 * L + 1):
                    if ids[s:s + L] == ids[s + L:s + 2 * L] == ids[s + 2 * L:s + 3 * L]:
                        bf[s:s + 3 * L] = [True] * (3 * L)
            m = cl.loop_mask(np.array(ids), max_span=len(ids))
            self.assertEqual(m.tolist(), bf, ids)

    def test_period_three_counts_at_nine(self):
        import numpy as np
        import corpus_loops as cl

        ids = [5, 6, 7] * 8 + [1, 2]  # 24 tokens of period 3: span 9 needs 27
        self.assertFalse(cl.loop_mask(np.array(ids)).any())
        ids = [5, 6, 7] * 9 + [1, 2]
        self.assertEqual(int(cl.loop_mask(np.array(ids)).sum()), 27)


class DocfuncPrompts(unittest.TestCase):
    SRC = '''import os


def plain(x):
    return x


def documented(a, b=1):
    """Add a and b."""
    return a + b


class K:
    def method(self):
        """Multi-line
        docstring."""
        y = 1
        return y

    def only_doc(self):
        """Nothing after me."""
'''

    def test_one_file(self):
        import stage_package as sp

        got = sp.docstring_functions(self.SRC)
        self.assertEqual([p for _, p in got], [
            'def documented(a, b=1):\n    """Add a and b."""\n',
            '    def method(self):\n        """Multi-line\n        docstring."""\n',
        ])
        self.assertEqual(sp.docstring_functions("def (:\n"), [])

    def test_limits(self):
        import stage_package as sp

        long_doc = 'def f():\n    """' + "\n".join(["x"] * 12) + '"""\n    return 1\n'
        self.assertEqual(sp.docstring_functions(long_doc), [])

    def test_round_robin_by_project(self):
        import stage_package as sp

        def fn(i):
            return f'def f{i}():\n    """Doc {i}."""\n    return {i}\n\n'

        texts = {"a/x.py": fn(1) + fn(2), "a/y.py": fn(3), "b/z.py": fn(4) + fn(5)}
        got = sp.docfunc_prompts(texts, n=10)
        # project a: pass 0 gives x.py's 1st, y.py's 1st, pass 1 x.py's 2nd; project b: 4, 5
        self.assertEqual([p["text"].split("(")[0] for p in got], ["def f1", "def f4", "def f3", "def f5", "def f2"])
        self.assertEqual(got[0]["line"], 1)
        self.assertTrue(all(p["kind"] == "docfunc" for p in got))


if __name__ == "__main__":
    unittest.main()

#!/usr/bin/env python3
"""Unit tests of stage `antiloop`'s candidate rule (tools/train/stage_antiloop.py, issue 16): which
continuation tokens the unlikelihood term pushes down. Checked against a brute-force transcription
of the rule on random sequences, plus hand cases. Needs numpy (ctest runs it with .venv's python)."""
from __future__ import annotations

import random
import sys
import unittest
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "train"))
import stage_antiloop as sa  # noqa: E402
from loops import find_loop  # noqa: E402  (stage_antiloop put tools/quality on the path)


def brute(seq, start, n):
    """Position t >= start is a candidate iff some n-gram seq[s:s+n] with start <= s <= t < s+n
    equals an n-gram seq[s2:s2+n] with s2 < s."""
    L = len(seq)
    out = [False] * L
    grams = [tuple(seq[s:s + n]) for s in range(L - n + 1)]
    for s in range(max(0, start), L - n + 1):
        if any(grams[s2] == grams[s] for s2 in range(s)):
            for t in range(s, s + n):
                out[t] = True
    return out


class RepeatedNgramMask(unittest.TestCase):
    def test_hand_cases(self):
        a = [1, 2, 3, 4, 9, 1, 2, 3, 4]
        # n = 4, start 0: the second copy of 1 2 3 4 (positions 5..8)
        self.assertEqual(sa.repeated_ngram_mask(np.array(a), 0, 4).tolist(),
                         [False] * 5 + [True] * 4)
        # start past the repeat's start: nothing (an n-gram is a candidate only if it starts >= start)
        self.assertFalse(sa.repeated_ngram_mask(np.array(a), 6, 4).any())
        # repeats of a prompt n-gram count (the copy starts at 5 >= start 5)
        self.assertEqual(sa.repeated_ngram_mask(np.array(a), 5, 4)[5:].tolist(), [True] * 4)
        # a run of one token: every n-gram after the first repeats
        r = sa.repeated_ngram_mask(np.array([7] * 12), 0, 8)
        self.assertEqual(r.tolist(), [False] + [True] * 11)
        # no repeat, short sequence, n larger than the sequence
        self.assertFalse(sa.repeated_ngram_mask(np.arange(20), 0, 3).any())
        self.assertFalse(sa.repeated_ngram_mask(np.arange(5), 0, 8).any())

    def test_against_brute_force(self):
        rng = random.Random(7)
        for _ in range(300):
            L = rng.randint(1, 60)
            vocab = rng.choice([2, 3, 5, 50])
            seq = [rng.randrange(vocab) for _ in range(L)]
            if rng.random() < 0.3 and L > 10:  # plant a loop
                p = rng.randint(1, 6)
                s = rng.randrange(L - p)
                for t in range(s + p, L):
                    seq[t] = seq[t - p]
            n = rng.randint(1, 9)
            start = rng.randint(0, L)
            got = sa.repeated_ngram_mask(np.array(seq, dtype=np.uint16), start, n).tolist()
            self.assertEqual(got, brute(seq, start, n), (seq, start, n))

    def test_every_loop_is_covered(self):
        # a continuation that find_loop calls a loop always has candidates (the term sees every loop)
        rng = random.Random(3)
        for _ in range(200):
            p = rng.randint(8, 20)
            unit = [rng.randrange(100) for _ in range(p)]
            head = [rng.randrange(100, 200) for _ in range(rng.randint(0, 10))]
            seq = head + unit * 3
            self.assertIsNotNone(find_loop(seq))
            self.assertTrue(sa.repeated_ngram_mask(np.array(seq), 0, 8).any())


class LineStartWindows(unittest.TestCase):
    def test_windows_end_at_a_line_end(self):
        rng = np.random.default_rng(0)
        toks = rng.integers(0, 50, size=5000).astype(np.uint16)
        toks[::37] = 3  # id 3 plays the newline
        w = sa.line_start_windows(toks, 64, 16, np.array([3]), np.random.default_rng(1))
        self.assertEqual(w.shape, (64, 16))
        self.assertTrue((w[:, -1] == 3).all())
        # each window is a contiguous slice of the stream
        s = toks.astype(np.int64)
        for row in w[:8]:
            starts = [i for i in range(len(s) - 16) if (s[i:i + 16] == row).all()]
            self.assertTrue(starts)


if __name__ == "__main__":
    unittest.main()

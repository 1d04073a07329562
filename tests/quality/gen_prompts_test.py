#!/usr/bin/env python3
"""Unit tests of stage `gen`'s carried prompt chunks (tools/train/stage_gen.py, issue 16 v7): every
training prompt drawn by `chunk_windows` is a contiguous run of one chunk row; `stage_gen.py chunks`
writes evenly spaced copies of the stream; bad chunk files are refused with a clear message. Needs
numpy only (ctest runs it with .venv's python)."""
from __future__ import annotations

import sys
import tempfile
import unittest
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "train"))
import stage_gen as sg  # noqa: E402


class ChunkWindows(unittest.TestCase):
    def test_windows_lie_inside_one_chunk(self):
        # chunk r holds r*1000 + 0..L-1, so a window is in one chunk iff it is consecutive values
        # that share the thousands digit
        C, L, P = 7, 50, 16
        chunks = (np.arange(C)[:, None] * 1000 + np.arange(L)[None, :]).astype(np.uint16)
        w = sg.chunk_windows(chunks, 500, P, np.random.default_rng(3))
        self.assertEqual(w.shape, (500, P))
        self.assertEqual(w.dtype, np.int64)
        self.assertTrue((np.diff(w, axis=1) == 1).all())
        self.assertTrue(((w // 1000) == (w[:, :1] // 1000)).all())
        self.assertTrue(((w % 1000) < L).all())
        # every chunk and both ends of the offsets are reached
        self.assertEqual(set((w[:, 0] // 1000).tolist()), set(range(C)))
        self.assertEqual(int((w[:, 0] % 1000).min()), 0)
        self.assertEqual(int((w[:, -1] % 1000).max()), L - 2)

    def test_chunk_too_short_is_refused(self):
        with self.assertRaises(ValueError):
            sg.chunk_windows(np.zeros((3, 16), np.uint16), 4, 16, np.random.default_rng(0))

    def test_write_chunks_copies_the_stream(self):
        with tempfile.TemporaryDirectory() as td:
            src, dst = Path(td) / "t.npy", Path(td) / "c.npy"
            np.save(src, np.arange(10_000, dtype=np.uint16))
            sg.write_chunks([str(src), str(dst), "--chunks", "8", "--len", "300", "--seed", "5"])
            a = np.load(dst)
            self.assertEqual(a.shape, (8, 300))
            self.assertEqual(a.dtype, np.uint16)
            self.assertTrue((np.diff(a.astype(np.int64), axis=1) == 1).all())
            self.assertTrue((np.diff(a[:, 0].astype(np.int64)) == 10_000 // 8).all())
            with self.assertRaises(SystemExit):  # 8 x 2000 > 10,000 tokens
                sg.write_chunks([str(src), str(dst), "--chunks", "8", "--len", "2000"])

    def test_bad_chunk_file_is_a_clear_error(self):
        with tempfile.TemporaryDirectory() as td:
            p = Path(td) / "c.npy"
            np.save(p, np.zeros((4, 100), np.int32))
            with self.assertRaisesRegex(SystemExit, "uint16"):
                sg.load_prompt_chunks(p, 8192)
            np.save(p, np.full((4, 100), 9000, np.uint16))
            with self.assertRaisesRegex(SystemExit, "vocabulary"):
                sg.load_prompt_chunks(p, 8192)
            with self.assertRaisesRegex(SystemExit, "no such file"):
                sg.load_prompt_chunks(Path(td) / "missing.npy", 8192)


if __name__ == "__main__":
    unittest.main()

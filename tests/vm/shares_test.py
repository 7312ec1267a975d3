#!/usr/bin/env python3
"""Tests of shares.py on made-up samples of the daemon's accounting.

usage: python3 -m unittest discover -s tests/vm -p '*_test.py'
"""

import io
import json
import os
import tempfile
import unittest
from contextlib import redirect_stdout

import shares

STEP = 0.1


def write_samples(path, rates, start=1000.0):
    """Samples every STEP seconds; rates[k] is each vGPU's share of the
    GPU during step k (a dict name -> fraction of the step charged)."""
    busy = {}
    t = start
    with open(path, "w", encoding="utf-8") as f:
        for rate in rates:
            doc = {"vgpus": [{"name": n, "busy_seconds": busy.get(n, 0.0)} for n in rate]}
            f.write(f"{t:.3f} {json.dumps(doc)}\n")
            for n, r in rate.items():
                busy[n] = busy.get(n, 0.0) + r * STEP
            t += STEP


def write_loads(path, first, last):
    """A guest console with a LOAD line each second from first to last."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("booting\n")
        t = first
        while t <= last + 1e-9:
            f.write(f"  LOAD torch t=0 at={t:.1f} steps=100 ms_per_step=10.00\n")
            t += 1.0


class SharesTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.stats = os.path.join(self.dir.name, "stats.jsonl")

    def tearDown(self):
        self.dir.cleanup()

    def judge(self, *args):
        out = io.StringIO()
        with redirect_stdout(out):
            rc = shares.main(["shares.py", self.stats, *args])
        return rc, out.getvalue()

    def test_weights_met_pass(self):
        write_samples(self.stats, [{"a": 0.25, "b": 0.75}] * 400)
        rc, out = self.judge("a=1", "b=3")
        self.assertEqual(rc, 0, out)
        self.assertIn("PASS shares", out)

    def test_a_share_off_by_five_points_fails(self):
        rates = [{"a": 0.25, "b": 0.75}] * 200 + [{"a": 0.30, "b": 0.70}] * 30
        rates += [{"a": 0.25, "b": 0.75}] * 200
        write_samples(self.stats, rates)
        rc, out = self.judge("a=1", "b=3")
        self.assertEqual(rc, 1, out)
        self.assertIn("worst 5.00 pp", out)

    def test_a_load_still_starting_is_left_out_by_its_log(self):
        # b's first 4 s: charged a little while it sets up, a gets the rest.
        rates = [{"a": 0.9, "b": 0.1}] * 40 + [{"a": 0.25, "b": 0.75}] * 300
        write_samples(self.stats, rates)
        rc, out = self.judge("a=1", "b=3")
        self.assertEqual(rc, 1, "judged by being charged alone, the set-up counts")
        logs = {}
        for n, (first, last) in {"a": (1000.0, 1034.0), "b": (1005.0, 1033.0)}.items():
            logs[n] = os.path.join(self.dir.name, f"{n}.log")
            write_loads(logs[n], first, last)
        rc, out = self.judge(f"a=1:{logs['a']}", f"b=3:{logs['b']}")
        self.assertEqual(rc, 0, out)
        self.assertIn("b: load loops 29 s", out)

    def test_too_few_windows_fail(self):
        write_samples(self.stats, [{"a": 0.25, "b": 0.75}] * 40)
        rc, out = self.judge("a=1", "b=3")
        self.assertEqual(rc, 1, out)

    def test_an_idle_gpu_is_not_judged(self):
        write_samples(self.stats, [{"a": 0.1, "b": 0.3}] * 400)
        rc, out = self.judge("a=1", "b=3")
        self.assertEqual(rc, 1, out)
        self.assertIn("no window", out)

    def test_load_loops_split_at_gaps(self):
        path = os.path.join(self.dir.name, "g.log")
        with open(path, "w", encoding="utf-8") as f:
            for t in [10.0, 11.0, 12.0, 20.0, 21.0]:
                f.write(f"LOAD cublas at={t:.1f} x\n")
            f.write("LOAD without a stamp\n")
        self.assertEqual(shares.load_loops(path), [(9.0, 12.0), (19.0, 21.0)])


if __name__ == "__main__":
    unittest.main()

"""Tests of ci/cuda-samples.sh's run and table on stand-in programs.

The stand-ins are shell scripts that behave as samples do: exit 0 after
"Test passed", exit 2 (EXIT_WAIVED), print "Waiving ..." and exit 0,
print "Test failed!" and exit 0, crash, hang, check their arguments.
"""

import json
import os
import stat
import subprocess
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent / "cuda-samples.sh"

PROGRAMS = {
    "passes": 'echo "Test passed"',
    "waived": 'echo "needs something"; exit 2',
    "waivesaying": 'echo "Waiving execution as device does not support Memory Pools"',
    "saysfail": 'echo "Test failed!"',
    "crashes": 'echo "CUDA error at x.cu:12"; exit 1',
    "hangs": "sleep 30",
    # Two runs with the arguments of test_args.json; the second fails.
    "args": '[ "$1" = -mode=0 ] && [ "$2" = -file=data/a.ppm ] && [ -f data/a.ppm ] && exit 0; '
    'echo "bad arguments: $*"; exit 3',
    "skipped": "exit 1",
    "twogpus": "exit 1",
    # Writes beside itself: each run has its own copy of the folder.
    "writes": 'echo x > out.txt && [ "$(cat out.txt)" = x ] && echo "Result = PASS"',
}

TEST_ARGS = {
    "args": {"runs": [{"args": ["-mode=0", "-file=data/a.ppm"]}, {"args": ["-mode=1"]}]},
    "skipped": {"skip": True},
    "twogpus": {"min_gpus": 2},
    "passes": {"args": []},
}


def make_progs(root):
    progs = Path(root) / "progs"
    for name, body in PROGRAMS.items():
        d = progs / name
        d.mkdir(parents=True)
        exe = d / name
        exe.write_text("#!/bin/sh\n" + body + "\n")
        exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    (progs / "args" / "data").mkdir()
    (progs / "args" / "data" / "a.ppm").write_text("P6\n")
    (progs / "test_args.json").write_text(json.dumps(TEST_ARGS))
    return progs


def run_script(*args, env=None):
    e = dict(os.environ, SAMPLES_GPUS="1", SAMPLES_TIMEOUT="2", SAMPLES_JOBS="3")
    e.update(env or {})
    return subprocess.run(["bash", str(SCRIPT), *args], env=e, capture_output=True,
                          text=True, check=False)


def read_results(path):
    rows = {}
    for line in Path(path).read_text().splitlines():
        f = line.split("\t")
        rows[(f[0], f[1])] = f
    return rows


class RunTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.progs = make_progs(self.tmp.name)
        self.out = Path(self.tmp.name) / "out"

    def tearDown(self):
        self.tmp.cleanup()

    def test_results_by_exit_status_and_words(self):
        p = run_script("run", str(self.progs), str(self.out))
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = read_results(self.out / "results.tsv")
        status = {k: v[2] for k, v in rows.items()}
        self.assertEqual(status, {
            ("passes", "1"): "pass",
            ("waived", "1"): "waive",
            ("waivesaying", "1"): "waive",
            ("saysfail", "1"): "fail",
            ("crashes", "1"): "fail",
            ("hangs", "1"): "timeout",
            ("args", "1"): "pass",
            ("args", "2"): "fail",
            ("skipped", "1"): "skip",
            ("twogpus", "1"): "waive",
            ("writes", "1"): "pass",
        })
        self.assertEqual(rows[("crashes", "1")][3], "1")
        self.assertEqual(rows[("crashes", "1")][5], "CUDA error at x.cu:12")
        self.assertEqual(rows[("args", "2")][3], "3")
        self.assertEqual(rows[("twogpus", "1")][5], "needs 2 GPUs")
        self.assertIn("bad arguments: -mode=1", (self.out / "logs" / "args.2.txt").read_text())
        # The program's own folder is left as it was.
        self.assertFalse((self.progs / "writes" / "out.txt").exists())
        self.assertIn("10 programs: 2 pass, 1 skip, 3 waive, 1 timeout, 3 fail", p.stderr)

    def test_two_gpus_run_it(self):
        run_script("run", str(self.progs), str(self.out), "twogpus", env={"SAMPLES_GPUS": "2"})
        rows = read_results(self.out / "results.tsv")
        self.assertEqual(list(rows), [("twogpus", "1")])
        self.assertEqual(rows[("twogpus", "1")][2], "fail")

    def test_budget(self):
        # Past the deadline nothing starts.
        run_script("run", str(self.progs), str(self.out), env={"SAMPLES_BUDGET": "1"})
        rows = read_results(self.out / "results.tsv")
        self.assertEqual(rows[("passes", "1")][2], "notrun")
        self.assertEqual(rows[("skipped", "1")][2], "skip")

    def test_shards_cover_every_program_once(self):
        seen = []
        for shard in range(2):
            out = Path(self.tmp.name) / f"shard{shard}"
            run_script("run", str(self.progs), str(out), env={"SAMPLES_SHARD": f"{shard}/2"})
            seen += [k[0] for k in read_results(out / "results.tsv") if k[1] == "1"]
        self.assertEqual(sorted(seen), sorted(PROGRAMS))


class TableTest(unittest.TestCase):
    def test_table(self):
        with tempfile.TemporaryDirectory() as tmp:
            native = Path(tmp) / "native.tsv"
            guest = Path(tmp) / "guest.tsv"
            native.write_text(
                "a\t1\tpass\t0\t0.1\tTest passed\n"
                "b\t1\tpass\t0\t0.2\tdone\n"
                "b\t2\tpass\t0\t0.2\tdone\n"
                "c\t1\twaive\t2\t0.0\tneeds 2 GPUs\n"
                "d\t1\tpass\t0\t1.0\tok\n"
                "garbage line\n")
            guest.write_text(
                "a\t1\tpass\t0\t1.1\tTest passed\n"
                "b\t1\tpass\t0\t0.2\tdone\n"
                "b\t2\tfail\t1\t0.2\tcudaMallocArray failed\n"
                "c\t1\twaive\t2\t0.0\tneeds 2 GPUs\n")
            p = run_script("table", str(native), str(guest))
            self.assertEqual(p.returncode, 0, p.stderr)
            lines = p.stdout.splitlines()
            row = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:-1]]
                   for ln in lines if ln.startswith("| ") and not ln.startswith("| program")}
            self.assertEqual(row["a"], ["pass", "pass", ""])
            self.assertEqual(row["b"], ["pass", "fail", "cudaMallocArray failed"])
            self.assertEqual(row["c"], ["waive", "waive", ""])
            self.assertEqual(row["d"], ["pass", "-", ""])
            self.assertIn("native: 4 programs: 3 pass, 1 waive", lines)
            self.assertIn("guest: 3 programs: 1 pass, 1 waive, 1 fail", lines)
            self.assertIn("guest passes 1 of the 3 programs that pass in native", lines)
            self.assertIn("not in guest: b d", lines)
            p = run_script("table", f"software={guest}")
            self.assertIn("software: 3 programs: 1 pass, 1 waive, 1 fail", p.stdout.splitlines())


if __name__ == "__main__":
    unittest.main()

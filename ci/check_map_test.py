"""Tests of ci/check-map.py against a small made-up workspace."""

import importlib.util
import tempfile
import unittest
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "check_map", Path(__file__).resolve().parent / "check-map.py"
)
check_map = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_map)

DOC = """# Architecture

## Crates

| crate | uses | knows about | does not know about |
|---|---|---|---|
| `low` | — | bytes | everything |
| `high` | `low` | the rest | |

### Code map

| crate | files |
|---|---|
| `low` | `bytes.rs` bytes; `io/` input and output |
| `high` | `main.rs` the program |
"""


class CheckMapTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        root = Path(self.tmp.name)
        self.dirs = {"low": root / "low", "high": root / "high"}
        for rel in ("low/src/lib.rs", "low/src/bytes.rs", "low/src/io/read.rs",
                    "low/src/bytes_tests.rs", "high/src/main.rs"):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text("// x\n")
        self.root = root
        self.deps = {"low": set(), "high": {"low"}}
        self.dev = {"low": set(), "high": set()}

    def tearDown(self):
        self.tmp.cleanup()

    def run_check(self, doc=DOC):
        return check_map.check(self.root, doc, self.deps, self.dev, self.dirs)

    def test_matching_map_has_no_errors(self):
        self.assertEqual(self.run_check(), [])

    def test_dependency_missing_from_row_is_reported(self):
        self.deps["high"] = {"low", "other"}
        self.dirs["other"] = self.root / "other"
        (self.root / "other/src").mkdir(parents=True)
        self.deps["other"] = set()
        errors = self.run_check()
        self.assertIn("high: depends on other, not in its row", errors)
        self.assertTrue(any("no row for 'other'" in e for e in errors))

    def test_row_naming_a_crate_not_depended_on_is_reported(self):
        self.deps["high"] = set()
        self.assertIn("high: its row names low, not a dependency", self.run_check())

    def test_dev_dependency_on_a_higher_crate_is_reported(self):
        self.dev["low"] = {"high"}
        self.assertIn("low: tests or benches use high, which depends on low", self.run_check())

    def test_dev_dependency_on_an_unrelated_crate_is_allowed(self):
        self.dev["high"] = {"low"}
        self.assertEqual(self.run_check(), [])

    def test_unnamed_source_file_is_reported(self):
        (self.root / "high/src/extra.rs").write_text("// x\n")
        errors = self.run_check()
        self.assertEqual(len(errors), 1)
        self.assertIn("high row does not name src/extra.rs", errors[0])

    def test_large_crate_root_must_be_named(self):
        (self.root / "low/src/lib.rs").write_text("//! docs\n" * 100 + "fn f() {}\n" * 40)
        self.assertTrue(any("src/lib.rs" in e for e in self.run_check()))

    def test_crate_root_of_docs_and_declarations_needs_no_mention(self):
        (self.root / "low/src/lib.rs").write_text("//! docs\n" * 100 + "pub mod bytes;\n")
        self.assertEqual(self.run_check(), [])

    def test_missing_uses_column_is_reported(self):
        doc = DOC.replace("| crate | uses |", "| crate | needs |")
        self.assertIn("no 'uses' column", self.run_check(doc)[0])


if __name__ == "__main__":
    unittest.main()

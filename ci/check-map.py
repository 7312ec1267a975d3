#!/usr/bin/env python3
"""Hold docs/architecture.md's crate table and code map against the code.

usage: python3 ci/check-map.py [--root DIR]

Checks, and prints one line per mismatch (exit 1 if any):
- the crate table has one row per workspace crate, and its "uses" column
  names exactly the workspace crates that crate depends on (normal and
  build dependencies; dev-dependencies are not listed);
- no crate's tests or benches depend on a crate above it (a
  dev-dependency that itself depends, directly or not, on the crate; a
  crate's dev-dependency on itself, which turns on its test features,
  is not one);
- the code map has one row per crate, and names every source file of the
  crate's src/ (a file by its name or its path, or a folder ending in /
  that holds it); a lib.rs, main.rs or mod.rs that only declares modules
  (fewer than 40 lines of code) and test modules need no mention.
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

DOC = Path("docs/architecture.md")
SMALL_ROOT_CODE_LINES = 40
NONE_MARKS = {"", "-", "—", "nothing", "none"}


def table_after(text, heading):
    """The rows (lists of cells) of the first Markdown table after `heading`."""
    lines = text.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == heading)
    except StopIteration:
        raise SystemExit(f"check-map: no '{heading}' heading in {DOC}")
    rows = []
    for ln in lines[start + 1 :]:
        s = ln.strip()
        if not s.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if all(re.fullmatch(r":?-+:?", c) for c in cells):
            continue
        rows.append(cells)
    if len(rows) < 2:
        raise SystemExit(f"check-map: no table under '{heading}' in {DOC}")
    return rows[0], rows[1:]


def ticked(cell):
    return re.findall(r"`([^`]+)`", cell)


def crate_name(cell):
    names = ticked(cell)
    return names[0] if names else cell.strip()


def uses_column(cell):
    if cell.strip().lower() in NONE_MARKS:
        return set()
    return set(ticked(cell))


def workspace(root):
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    meta = json.loads(out)
    members = {p["name"]: p for p in meta["packages"]}
    deps, dev = {}, {}
    for name, p in members.items():
        inner = [d for d in p["dependencies"] if d["name"] in members]
        deps[name] = {d["name"] for d in inner if d["kind"] in (None, "build")}
        dev[name] = {d["name"] for d in inner if d["kind"] == "dev"}
    dirs = {name: Path(p["manifest_path"]).parent for name, p in members.items()}
    return deps, dev, dirs


def reaches(deps, start, goal):
    seen, todo = set(), [start]
    while todo:
        c = todo.pop()
        if c == goal:
            return True
        if c not in seen:
            seen.add(c)
            todo.extend(deps.get(c, ()))
    return False


def is_test_file(rel):
    name = rel.name
    return name == "tests.rs" or name.endswith("_tests.rs") or "tests" in rel.parts[:-1]


def code_lines(path):
    """Lines that are neither blank nor comments."""
    with path.open(encoding="utf-8") as fh:
        return sum(1 for ln in fh if ln.strip() and not ln.lstrip().startswith("//"))


def source_files(src):
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src)
        if is_test_file(rel):
            continue
        if rel.name in ("lib.rs", "main.rs", "mod.rs"):
            if code_lines(f) < SMALL_ROOT_CODE_LINES:
                continue
        yield rel


def named(rel, tokens):
    parts = rel.parts
    for k in range(len(parts)):
        if "/".join(parts[k:]) in tokens:
            return True
    return any("/".join(parts[:k]) + "/" in tokens for k in range(1, len(parts)))


def check(root, doc_text, deps, dev, dirs):
    errors = []
    header, rows = table_after(doc_text, "## Crates")
    lower = [h.lower() for h in header]
    if "uses" not in lower:
        return [f"{DOC}: the crate table has no 'uses' column"]
    col = lower.index("uses")
    table = {}
    for cells in rows:
        name = crate_name(cells[0])
        if name in table:
            errors.append(f"{DOC}: crate table: '{name}' has two rows")
        table[name] = uses_column(cells[col]) if col < len(cells) else set()
    for name in sorted(set(deps) - set(table)):
        errors.append(f"{DOC}: crate table: no row for '{name}'")
    for name in sorted(set(table) - set(deps)):
        errors.append(f"{DOC}: crate table: '{name}' is no workspace crate")
    for name in sorted(set(table) & set(deps)):
        missing, extra = deps[name] - table[name], table[name] - deps[name]
        if missing:
            errors.append(f"{name}: depends on {', '.join(sorted(missing))}, not in its row")
        if extra:
            errors.append(f"{name}: its row names {', '.join(sorted(extra))}, not a dependency")
    for name in sorted(dev):
        # A crate's dev-dependency on itself only turns on its test
        # features (such as `test-utils`) for its own tests.
        for d in sorted(dev[name] - {name}):
            if reaches(deps, d, name):
                errors.append(f"{name}: tests or benches use {d}, which depends on {name}")

    _, map_rows = table_after(doc_text, "### Code map")
    code_map = {}
    for cells in map_rows:
        code_map[crate_name(cells[0])] = set(ticked(" ".join(cells[1:])))
    for name in sorted(set(deps)):
        src = dirs[name] / "src"
        if name not in code_map:
            errors.append(f"{DOC}: code map: no row for '{name}'")
            continue
        for rel in source_files(src):
            if not named(rel, code_map[name]):
                errors.append(f"{DOC}: code map: {name} row does not name src/{rel.as_posix()}")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=Path(__file__).resolve().parent.parent, type=Path)
    args = ap.parse_args()
    deps, dev, dirs = workspace(args.root)
    errors = check(args.root, (args.root / DOC).read_text(encoding="utf-8"), deps, dev, dirs)
    for e in errors:
        print(f"check-map: {e}")
    if errors:
        return 1
    print(f"check-map: {DOC} matches the {len(deps)} crates' manifests and sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())

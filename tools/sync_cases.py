"""Refresh `cases/` (the repository's copy of the team's measured cases) from the team's case folder.

    python tools/sync_cases.py FOLDER [--check]

FOLDER holds published.jsonl, user-reports.jsonl, throughput.jsonl and README.md (the team keeps them in a shared
folder beside the checkouts). Each file is compared by its rows' `id`: the rows added, removed and changed are
printed, then the file is replaced atomically. `--check` prints the same and exits 1 when anything differs, writing
nothing. The benches and tests read only `cases/` (bench/shared_cases.py), so the repository stands alone.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

CASES = Path(__file__).resolve().parents[1] / "cases"
FILES = ("published.jsonl", "user-reports.jsonl", "throughput.jsonl", "README.md")


def rows(path: Path) -> dict[str, str]:
    """id -> the row's text (a README is one row)."""
    if not path.is_file():
        return {}
    if path.suffix != ".jsonl":
        return {"text": path.read_text()}
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return {str(json.loads(line).get("id", n)): line for n, line in enumerate(lines)}


def changes(name: str, source: Path) -> str | None:
    old, new = rows(CASES / name), rows(source / name)
    added = [k for k in new if k not in old]
    removed = [k for k in old if k not in new]
    changed = [k for k in new if k in old and new[k] != old[k]]
    if not (added or removed or changed):
        return None
    return f"{name}: {len(added)} added, {len(removed)} removed, {len(changed)} changed"


def write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="the team's case folder")
    p.add_argument("--check", action="store_true", help="only say what differs; exit 1 if anything does")
    a = p.parse_args(argv)
    missing = [n for n in FILES if not (a.folder / n).is_file()]
    if missing:
        print(f"sync_cases: {a.folder} lacks {', '.join(missing)}; give the folder holding {', '.join(FILES)}")
        return 2
    differ = [line for n in FILES if (line := changes(n, a.folder))]
    for line in differ or ["cases/ is the same as " + str(a.folder)]:
        print(line)
    if a.check:
        return 1 if differ else 0
    for n in FILES:
        write_atomic(CASES / n, (a.folder / n).read_text())
    print("next: python bench/published.py and python bench/error_bands.py show what the new rows change")
    return 0


if __name__ == "__main__":
    sys.exit(main())

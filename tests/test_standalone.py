"""The repository stands alone: no tracked file points outside it, and the team's case files it checks against are
inside it (cases/, refreshed by tools/sync_cases.py)."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\.\./shared\b|\.\./\.library\b|/work/shared\b")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / n for n in names if (ROOT / n).is_file() and (ROOT / n).suffix in
            {".py", ".md", ".toml", ".txt", ".sh", ".yaml", ".yml", ".cfg", ".json", ""}]


def test_no_tracked_file_points_outside_the_repository():
    this = Path(__file__).resolve()
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in tracked_text_files() if p.resolve() != this
             for m in [OUTSIDE.search(p.read_text(errors="replace"))] if m]
    assert not found, found


def test_the_case_files_are_in_the_repository():
    for name in ("published.jsonl", "user-reports.jsonl", "throughput.jsonl", "README.md"):
        assert (ROOT / "cases" / name).stat().st_size > 1000, name
    rows = [json.loads(line) for line in (ROOT / "cases" / "published.jsonl").read_text().splitlines() if line]
    assert len({r["id"] for r in rows}) == len(rows) > 100


def _sync(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "sync_cases.py"), *args], capture_output=True,
                          text=True)


def test_sync_check_names_the_rows_that_differ(tmp_path):
    for f in (ROOT / "cases").iterdir():
        shutil.copy(f, tmp_path / f.name)
    same = _sync(str(tmp_path), "--check")
    assert same.returncode == 0 and "the same" in same.stdout
    lines = (tmp_path / "user-reports.jsonl").read_text().splitlines()
    first = json.loads(lines[0]) | {"notes": "edited"}
    (tmp_path / "user-reports.jsonl").write_text("\n".join([json.dumps(first), *lines[2:]]) + "\n")
    differs = _sync(str(tmp_path), "--check")
    assert differs.returncode == 1
    assert "user-reports.jsonl: 0 added, 1 removed, 1 changed" in differs.stdout


def test_sync_refuses_a_folder_without_the_case_files(tmp_path):
    r = _sync(str(tmp_path))
    assert r.returncode == 2 and r.stdout.count("\n") == 1 and "lacks published.jsonl" in r.stdout

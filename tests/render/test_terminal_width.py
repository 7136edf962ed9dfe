"""Issue 15 item 3: plan and bench tables read cleanly in an 80-column terminal: no line wider than the terminal,
no cell cut short ("report-qw…"), no word folded into slivers; the same output at 200 columns is a table."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from memfit.interfaces.render.common import show
from shared_cases import PUBLISHED
from shared_support import shared

ROOT = Path(__file__).resolve().parents[2]
CASES = PUBLISHED
QWEN_REPORT = ["plan", "Qwen/Qwen2-7B-Instruct", "--gpu", "rtx4090", "--gpus", "4", "--zero", "3", "--micro-batch", "4",
               "--seq", "128"]


def _run(argv: list[str], columns: int) -> str:
    env = {**os.environ, "COLUMNS": str(columns), "TERM": "dumb"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _readable(text: str, columns: int, wide: str | None = None) -> None:
    """No line wider than the terminal, nothing cut short, and every word of the wide rendering whole (a cell
    folded into a narrow column splits words across lines)."""
    assert max(len(line.rstrip()) for line in text.splitlines()) <= columns
    assert "…" not in text
    if wide is not None:
        words = set(re.findall(r"[\w.()>/+-]{6,}", wide)) - set(re.findall(r"[\w.()>/+-]{6,}", text))
        assert not words, sorted(words)[:10]


def test_memfit_plan_at_80_columns():
    out = _run([sys.executable, "-m", "memfit.interfaces.cli.main", *QWEN_REPORT], 80)
    _readable(out, 80, _run([sys.executable, "-m", "memfit.interfaces.cli.main", *QWEN_REPORT], 400))
    # every change is whole once the wrapping is undone, under its plan's number
    assert "optimizer offload none -> cpu: saves" in _flat(out)
    assert re.search(r"^ *1\. \S", out, re.M)


def test_a_bench_table_at_80_columns_keeps_every_cell_whole(tmp_path):
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(shared(CASES).read_text().splitlines(keepends=True)[:12]))
    out = _run([sys.executable, "bench/published.py", "--cases", str(cases)], 80).split("\n{", 1)[0]
    wide = _run([sys.executable, "bench/published.py", "--cases", str(cases)], 400).split("\n{", 1)[0]
    _readable(out, 80, wide)  # the table, not the JSON summary after it
    ids = re.findall(r"^│ (\S+)", wide, re.M)
    assert ids and all(i in out for i in ids)  # each case id whole at 80 columns


@pytest.mark.parametrize("width, as_table", [(80, False), (200, True)])
def test_show_switches_to_one_block_per_row_only_when_the_table_does_not_fit(width, as_table):
    table = Table(title="t")
    for name in ("case", "what memfit assumed", "label"):
        table.add_column(name)
    table.add_row("report-qwen2-7b-4x4090-z3", "offload none->cpu, ratio 1.0->0.5, padding padded->padding_free " * 2,
                  "fits")
    con = Console(width=width, record=True, file=open(os.devnull, "w"))
    show(con, table)
    text = con.export_text()
    assert ("┃" in text) is as_table
    assert "report-qwen2-7b-4x4090-z3" in text and "padded->padding_free" in _flat(text)
    _readable(text, width, "report-qwen2-7b-4x4090-z3 offload none->cpu, ratio 1.0->0.5, padding padded->padding_free")


def test_progress_stays_off_a_pipe(tmp_path):
    """Piped (a log file, --json into jq) stderr stays empty; a terminal's progress line is
    tests/cli/test_progress.py's (on a pseudo-terminal)."""
    for extra in ([], ["--json"]):
        done = subprocess.run([sys.executable, "-m", "memfit.interfaces.cli.main", *QWEN_REPORT, *extra],
                              capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert done.returncode == 0 and done.stderr == "", done.stderr[-500:]

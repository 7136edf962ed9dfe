"""The README's examples are real: each `$ memfit ...` line of its console blocks is run, and the lines shown
under it must be its output, in order (`...` stands for lines left out). The two set-up commands are there."""
from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from memfit.interfaces.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
WIDTH = "100"  # the terminal width the shown outputs were printed at


def examples() -> list[tuple[str, list[str]]]:
    """(command, shown output lines) for every `$ ` line of the README's console blocks."""
    out = []
    for block in re.findall(r"```console\n(.*?)```", README.read_text(), flags=re.S):
        for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, *shown = chunk.rstrip("\n").split("\n")
            out.append((command, shown))
    return out


def shown_in(shown: list[str], printed: list[str]) -> str | None:
    """None when `shown` is `printed` with `...` for runs of left-out lines; else the first line that is not."""
    at, skipping = 0, False
    for line in shown:
        if line == "...":
            skipping = True
            continue
        while skipping and at < len(printed) and printed[at].rstrip() != line.rstrip():
            at += 1
        if at >= len(printed) or printed[at].rstrip() != line.rstrip():
            return line
        at, skipping = at + 1, False
    return None if skipping or at == len(printed) else f"(more output after: {shown[-1]!r})"


def test_the_readme_has_the_two_set_up_commands_and_three_examples():
    text = README.read_text()
    assert "pip install . && memfit estimate" in text and "python -m pytest -q" in text
    assert len(re.findall(r"```console\n", text)) == 3 and len(text.splitlines()) <= 120


@pytest.mark.parametrize("command, shown", examples(), ids=[c[:60] for c, _ in examples()])
def test_each_example_prints_what_the_readme_shows(command, shown, tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)  # `fit` writes memfit-fit/ where it runs
    monkeypatch.setenv("COLUMNS", WIDTH)
    argv = shlex.split(command)
    assert argv[0] == "memfit"
    assert main(argv[1:]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert shown_in(shown, printed) is None, "\n".join(printed)


def test_the_comparison_fails_on_a_changed_or_missing_line():
    printed = ["OOM: 1", "detail", "more", "next: x"]
    assert shown_in(["OOM: 1", "...", "next: x"], printed) is None
    assert shown_in(["OOM: 2", "..."], printed) == "OOM: 2"
    assert shown_in(["OOM: 1", "...", "next: y"], printed) == "next: y"
    assert shown_in(["OOM: 1", "detail"], printed) is not None  # lines left out need their `...`

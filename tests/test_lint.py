"""ruff on memfit/ (pyproject.toml [tool.ruff]): unused imports, undefined names, likely bugs fail the suite."""
from __future__ import annotations

import subprocess
import tomllib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_memfit_passes_ruff():
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "memfit"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def _mypy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args],
                          cwd=ROOT, capture_output=True, text=True)


def test_memfit_passes_mypy():
    """pyproject.toml [tool.mypy]: every module of memfit/, none excused."""
    run = _mypy()
    assert run.returncode == 0, run.stdout + run.stderr


def test_no_module_of_memfit_is_excused_from_mypy():
    """The only override reads third-party packages as untyped; none silences memfit's own findings."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        overrides = tomllib.load(f)["tool"]["mypy"].get("overrides", [])
    for o in overrides:
        assert not o.get("ignore_errors") and o.get("follow_imports") == "skip", o
        assert not [m for m in o["module"] if m.startswith("memfit")], o


WRONG_LITERALS = '''from memfit.facts.scenario import Scenario


def wrong(s: Scenario) -> list[bool]:
    return [s.tuning == "qlroa", s.engine == "deepseed", s.attention == "flash2", s.quant_bits == 3]


def right(s: Scenario) -> list[bool]:
    return [s.tuning == "qlora", s.engine == "deepspeed", s.attention == "flash", s.quant_bits == 4]
'''


def test_a_knob_compared_with_a_value_it_cannot_take_is_caught(tmp_path):
    """The knobs' choices are Literal types (facts/scenario_fields.py) and strict_equality is on: a misspelled
    choice is a type error, one per comparison, and the valid spellings pass."""
    probe = tmp_path / "probe_literals.py"
    probe.write_text(WRONG_LITERALS)
    run = _mypy(str(probe))
    found = [line for line in run.stdout.splitlines() if "Non-overlapping equality check" in line]
    assert run.returncode == 1 and len(found) == 4, run.stdout + run.stderr
    assert all(":5:" in line for line in found), found
    for wrong in ("'qlroa'", "'deepseed'", "'flash2'", "Literal[3]"):
        assert any(wrong in line for line in found), (wrong, found)

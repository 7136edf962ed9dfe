"""Scenario's fields carry the knob table's types (memfit/facts/scenario_fields.py, written by
memfit/facts/knob_source.py): the written module is current, and each field's type and default say what
data/knobs.toml says."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
import typing

from memfit.facts import knob_source
from memfit.facts.knobs import knobs
from memfit.facts.scenario import Scenario
from memfit.facts.scenario_fields import ScenarioFields

PYTHON = {"int": int, "float": float, "bool": bool, "str": str, "size": int}


def test_the_written_fields_are_current_with_the_knob_table():
    assert knob_source.TARGET.read_text() == knob_source.source(), \
        "data/knobs.toml changed: run python -m memfit.facts.knob_source --write"


def test_the_check_command_says_current():
    run = subprocess.run([sys.executable, "-m", "memfit.facts.knob_source"], capture_output=True, text=True)
    assert run.returncode == 0 and "is current" in run.stdout, run.stdout + run.stderr


def _split_none(hint) -> tuple[object, bool]:
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        return rest[0], len(rest) < len(args)
    return hint, False


def test_each_field_has_its_knobs_type_choices_and_default():
    hints = typing.get_type_hints(ScenarioFields)
    defaults = {f.name: f.default for f in dataclasses.fields(Scenario)}
    for k in knobs().values():
        hint, optional = _split_none(hints[k.name])
        assert optional == (k.default is None), k.name
        assert defaults[k.name] == k.default, k.name
        if k.choices:
            assert typing.get_origin(hint) is typing.Literal and typing.get_args(hint) == k.choices, k.name
        elif k.type in PYTHON:
            assert hint is PYTHON[k.type], (k.name, hint)
        else:  # list / pairs: tuples
            assert typing.get_origin(hint) is tuple, (k.name, hint)


def test_scenario_has_exactly_the_written_fields():
    assert [f.name for f in dataclasses.fields(Scenario)] == [f.name for f in dataclasses.fields(ScenarioFields)]
    assert Scenario.__post_init__ is not ScenarioFields.__dict__.get("__post_init__")  # the rules run


def test_a_stale_module_is_reported_and_rewritten(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "scenario_fields.py"
    stale.write_text("# written before a knob was added\n")
    monkeypatch.setattr(knob_source, "TARGET", stale)
    assert knob_source.main([]) == 1 and "stale; run: python -m memfit.facts.knob_source --write" in capsys.readouterr().out
    assert knob_source.main(["--write"]) == 0 and stale.read_text() == knob_source.source()
    assert knob_source.main([]) == 0 and not list(tmp_path.glob("*.tmp"))

"""Writes memfit/facts/scenario_fields.py, the Scenario's fields with their types, from the knob table.

The knob table (data/knobs.toml) is the one place a knob is declared. A type checker cannot read a class built
from it at import, so its fields are written out as Python source: each knob's `type` becomes its Python type,
its `choices` a `Literal[...]` (so mypy's strict_equality refuses `s.tuning == "qlroa"`), and a knob without a
default may be None. tests/test_knob_types.py fails when the written module is not what the table says now.

    python -m memfit.facts.knob_source          # say whether scenario_fields.py is current
    python -m memfit.facts.knob_source --write  # rewrite it after editing data/knobs.toml
"""
from __future__ import annotations

import sys
from pathlib import Path

from memfit.facts.knobs import TABLE, Knob, knobs

TARGET = Path(__file__).parent / "scenario_fields.py"
PLAIN_TYPES = {"int": "int", "float": "float", "bool": "bool", "str": "str", "size": "int",
               "list": "tuple[str, ...]", "pairs": "tuple[tuple[str, int], ...]"}

HEADER = '''"""The fields of a Scenario: the model, the machine and every knob of data/knobs.toml, with their types.

Written by memfit/facts/knob_source.py from the knob table; do not edit by hand (`python -m
memfit.facts.knob_source --write` rewrites it, tests/test_knob_types.py fails when it is stale). The rules
between knobs and the derived facts are memfit/facts/scenario.py's Scenario, which adds them to these fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from memfit.facts.assumptions import Assumption
from memfit.facts.catalog import ModelSpec
from memfit.facts.hardware import Hardware
'''

FOOTER = '''    profile: str = "hf-trainer"
    releases: tuple[tuple[str, str], ...] = ()
    assumed: tuple[Assumption, ...] = field(default=(), compare=False)
    unread: tuple[str, ...] = field(default=(), compare=False)
'''


def alias_of(k: Knob) -> str:
    """The name of a knob's choices as a type: tuning -> Tuning, offload_optimizer -> OffloadOptimizer."""
    return "".join(part.capitalize() for part in k.name.split("_"))


def type_of(k: Knob) -> str:
    shown = alias_of(k) if k.choices else PLAIN_TYPES[k.type]
    return shown if k.default is not None else f"{shown} | None"


def source() -> str:
    """The module's text, from the knob table as it is now."""
    table = knobs().values()
    choices = [f"{alias_of(k)} = Literal[{', '.join(map(repr, k.choices))}]" for k in table if k.choices]
    lines = [HEADER, f"# the choices of each knob that has them ({TABLE.name} `choices`)", *choices, "", "",
             "@dataclass(frozen=True)", "class ScenarioFields:",
             '    """The data of a run; memfit/facts/scenario.py Scenario adds the rules (see its docstring)."""',
             "    model: ModelSpec", "    hardware: Hardware"]
    lines += [f"    {k.name}: {type_of(k)} = {k.default!r}" for k in table]
    return "\n".join(lines) + "\n" + FOOTER


def main(argv: list[str]) -> int:
    current = TARGET.exists() and TARGET.read_text() == source()
    if "--write" in argv:
        if not current:
            tmp = TARGET.with_suffix(".tmp")
            tmp.write_text(source())
            tmp.replace(TARGET)
        print(f"{TARGET} {'was already' if current else 'is now'} current with {TABLE}")
        return 0
    print(f"{TARGET} is {'current' if current else 'stale'}"
          + ("" if current else "; run: python -m memfit.facts.knob_source --write"))
    return 0 if current else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

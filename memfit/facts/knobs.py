"""The knob table (data/knobs.toml): every setting of a run that changes its memory, declared once.

A knob's name is the Scenario field, the key importers return and exporters take, and (with `-` for `_`)
the command-line flag. Everything that lists knobs (the Scenario class, the command line, build_scenario,
the formats, the planner's axes) reads them from here.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from memfit.errors import MemfitError
from memfit.facts.adapters import method_info
from memfit.facts.methods import several_models

TABLE = Path(__file__).parent / "data" / "knobs.toml"
PYTHON_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "list": tuple, "pairs": tuple, "size": int}


@dataclass(frozen=True)
class Knob:
    name: str
    type: str
    section: str = "knob"  # knob (a Scenario field) | hardware | input
    choices: tuple = ()
    min: float | None = None
    max: float | None = None
    above: float | None = None  # exclusive lower bound
    below: float | None = None  # exclusive upper bound
    default: object = None
    profile: bool = False  # framework profiles give a default
    assumed: bool = True  # a profile default filled in is listed under "assumed"
    when: str | None = None  # deepspeed | fsdp | adapters | several: where the knob acts
    needs: str | None = None  # offload | zero3: a finer condition inside `when` (only to tell the user)
    aliases: tuple[str, ...] = ()
    const: object = None  # the value of the bare flag
    group: str = "training"
    help: str = ""
    says: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def label(self) -> str:
        """How errors name the knob: every spelling a user may have typed."""
        return "/".join((self.flag, *self.aliases))

    def check(self, value) -> None:
        """One line naming the flag and what would be valid, for a value of the wrong type or range."""
        if value is None:
            if self.default is not None and self.section == "knob":
                raise MemfitError(f"{self.label} needs a value")
            return
        if self.choices and value not in self.choices:
            raise MemfitError(f"{self.label} {value!r} is not valid; choose one of: {', '.join(map(str, self.choices))}")
        if self.type == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise MemfitError(f"{self.label} expects a whole number, got {value!r}")
        if self.type == "float" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise MemfitError(f"{self.label} expects a number, got {value!r}")
        if self.type == "bool" and not isinstance(value, bool):
            raise MemfitError(f"{self.label} expects true or false, got {value!r}")
        if self.type in ("int", "float"):
            self._check_range(value)

    def _check_range(self, value) -> None:
        if self.type == "int" and self.min == 1 and value < 1:
            raise MemfitError(f"{self.label} must be a positive integer, got {value!r}")
        low_ok = (self.min is None or value >= self.min) and (self.above is None or value > self.above)
        high_ok = (self.max is None or value <= self.max) and (self.below is None or value < self.below)
        if not (low_ok and high_ok):
            show = self._show
            lo = f"[{show(self.min)}" if self.min is not None else f"({show(self.above)}" if self.above is not None else "(-inf"
            hi = f"{show(self.max)}]" if self.max is not None else f"{show(self.below)})" if self.below is not None else "inf)"
            raise MemfitError(f"{self.label} must be within {lo}, {hi}, got {show(value)}")

    def _show(self, x) -> str:
        """A bound as people read it: 16,777,216 for a count (not 1.67772e+07), 0.5 for a ratio."""
        return f"{int(x):,}" if self.type == "int" and float(x).is_integer() else f"{x:g}"


def _knob(name: str, section: str, row: dict) -> Knob:
    row = dict(row)
    for key in ("choices", "aliases"):
        row[key] = tuple(row.get(key, ()))
    if row.get("type") in ("list", "pairs") and "default" in row:
        row["default"] = tuple(row["default"])
    return Knob(name=name, section=section, **row)


@cache
def _table() -> dict:
    with open(TABLE, "rb") as f:
        return tomllib.load(f)


@cache
def knobs() -> dict[str, Knob]:
    """The knobs of a run (Scenario fields), in table order."""
    return {name: _knob(name, "knob", row) for name, row in _table()["knob"].items()}


@cache
def hardware() -> dict[str, Knob]:
    return {name: _knob(name, "hardware", row) for name, row in _table()["hardware"].items()}


@cache
def inputs() -> dict[str, Knob]:
    return {name: _knob(name, "input", row) for name, row in _table()["input"].items()}


@cache
def axes() -> dict[str, tuple[str, ...]]:
    """The planner's axes: one change as `memfit plan` proposes it, with the knobs it sets together."""
    return {name: tuple(row["knobs"]) for name, row in _table()["axis"].items()}


def knob(name: str) -> Knob:
    return knobs()[name]


# Each `when` / `needs` value of the table: whether it holds on a run.
CONDITIONS = {
    "deepspeed": lambda s: s.engine == "deepspeed", "fsdp": lambda s: s.engine == "fsdp",
    "adapters": lambda s: s.uses_adapters, "qlora": lambda s: s.tuning == "qlora",
    "nf4": lambda s: s.tuning == "qlora" and s.quant_bits == 4,
    "freeze": lambda s: s.tuning == "freeze", "every_n": lambda s: s.checkpointing == "every_n",
    "virtual_tokens": lambda s: s.virtual_tokens_in_use > 0, "several": lambda s: several_models(s.method),
    "offload": lambda s: s.offload_optimizer != "none" or s.offload_param != "none",
    "zero3": lambda s: s.zero_stage == 3, "full": lambda s: s.tuning == "full",
    # plain torch's mixed precision keeps the module as built; DeepSpeed and FSDP cast it themselves
    "plain_mixed": lambda s: s.precision.endswith("mixed") and s.engine in ("single", "ddp"),
    "ranked": lambda s: s.tuning in ("lora", "qlora") or not method_info(s.tuning).get("rankless", False),
}


def acts(s, name: str) -> bool:
    """Whether a knob acts on this run (its `when`): another engine's settings, adapter settings without
    adapters, several-model settings of a single-model run do nothing."""
    when = knobs()[name].when
    return when is None or CONDITIONS[when](s)


def inert_because(s, name: str) -> str | None:
    """Why a knob does nothing on this run (its `when`, then its `needs`, in the words of [condition.*]), or None
    when it acts."""
    k = knobs()[name]
    for condition in (k.when, k.needs):
        if condition and not CONDITIONS[condition](s):
            return _table()["condition"][condition].format_map({n: getattr(s, n) for n in knobs()})
    return None


def acting_when(when: str) -> tuple[str, ...]:
    """The knobs that act only under `when` (deepspeed, fsdp, adapters, several)."""
    return tuple(k.name for k in knobs().values() if k.when == when)


def said_by(format: str) -> frozenset[str]:
    """The knobs a file format can say."""
    return frozenset(k.name for k in knobs().values() if format in k.says)

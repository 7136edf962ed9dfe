"""Framework profiles (data/frameworks/NAME.toml, schema in its README.md): what memfit assumes of a run under
each framework: its default knob values, how it fills DeepSpeed "auto" keys, what `memfit plan` may change,
and how it runs preference / RL methods."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import cache

from memfit.errors import MemfitError
from memfit.facts.catalog import HERE

FOLDER = HERE / "frameworks"


@dataclass(frozen=True)
class Framework:
    name: str
    description: str
    defaults: dict  # knob -> value when the user does not say
    deepspeed_auto: str  # "hf" or "deepspeed"
    plan: dict  # what `memfit plan` may change
    methods: dict  # how it runs preference / RL methods


@cache
def frameworks() -> dict[str, Framework]:
    out = {}
    for path in sorted(FOLDER.glob("*.toml")):
        with open(path, "rb") as f:
            doc = tomllib.load(f)
        out[path.stem] = Framework(path.stem, doc["description"], doc["defaults"], doc["deepspeed"]["auto"],
                                   doc["plan"], doc["methods"])
    return out


def framework(name: str) -> Framework:
    table = frameworks()
    if name not in table:
        raise MemfitError(f"unknown framework profile {name!r}; choose one of: {', '.join(table)}")
    return table[name]

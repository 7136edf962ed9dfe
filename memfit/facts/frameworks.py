"""Framework profiles (data/frameworks/NAME.toml, schema in its README.md): what memfit assumes of a run under
each framework: its default knob values, how it fills DeepSpeed "auto" keys, what `memfit plan` may change,
and how it runs preference / RL methods."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
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
    model_code: dict = field(default_factory=dict)  # the framework's own model code as memory sees it (torchtune)


@cache
def frameworks() -> dict[str, Framework]:
    out = {}
    for path in sorted(FOLDER.glob("*.toml")):
        with open(path, "rb") as f:
            doc = tomllib.load(f)
        out[path.stem] = Framework(path.stem, doc["description"], doc["defaults"], doc["deepspeed"]["auto"],
                                   doc["plan"], doc["methods"], doc.get("model_code", {}))
    return out


def framework(name: str) -> Framework:
    table = frameworks()
    if name not in table:
        raise MemfitError(f"unknown framework profile {name!r}; choose one of: {', '.join(table)}")
    return table[name]


def model_code(profile: str) -> dict:
    """The profile's [model_code] facts: how its own model code saves and allocates ({} when it runs transformers')."""
    fw = frameworks().get(profile)
    return fw.model_code if fw else {}

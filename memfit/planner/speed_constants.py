"""The step-time constants (memfit/facts/data/speed.toml), loaded strictly: every section the model reads must be
there, and every leaf must be a number (or, under [cpu_optimizer.launcher], a launcher name)."""
from __future__ import annotations

import tomllib
from functools import cache

from memfit.errors import MemfitError
from memfit.facts.catalog import HERE

GB = 1e9
SECTIONS = ("mfu", "shape", "overhead", "attention", "compute", "loss", "quantization", "peft", "comm", "offload",
            "cpu_optimizer", "optimizer", "data", "band", "roles")
LAUNCHERS = ("torchrun", "node_share", "all")


def _check(table: dict, path: str) -> None:
    for key, value in table.items():
        where = f"{path}.{key}"
        if isinstance(value, dict):
            _check(value, where)
        elif where.startswith("cpu_optimizer.launcher."):
            if value not in LAUNCHERS:
                raise MemfitError(f"speed.toml {where} = {value!r}: choose from {', '.join(LAUNCHERS)}")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise MemfitError(f"speed.toml {where} = {value!r}: must be a number >= 0")


@cache
def assumptions() -> dict:
    with open(HERE / "speed.toml", "rb") as f:
        table = tomllib.load(f)
    missing = [s for s in SECTIONS if s not in table]
    unknown = [s for s in table if s not in SECTIONS]
    if missing or unknown:
        raise MemfitError(f"speed.toml: missing sections {missing}, unknown sections {unknown}")
    for name in SECTIONS:
        _check(table[name], name)
    return table

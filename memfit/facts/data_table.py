"""The catalog's TOML files (memfit/facts/data/), each read once: the one place a data file is opened."""
from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"


@cache
def data_table(name: str) -> dict:
    """data/NAME (e.g. "runtime.toml"), parsed; callers must not change what it returns (it is shared)."""
    with open(DATA / name, "rb") as f:
        return tomllib.load(f)

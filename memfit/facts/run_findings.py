"""The table `memfit watch` reads its thresholds and its causes / knobs texts from:
data/run_findings.toml (facts, not code)."""
from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

TABLE = Path(__file__).parent / "data" / "run_findings.toml"


@cache
def table() -> dict:
    with TABLE.open("rb") as f:
        return tomllib.load(f)


def thresholds() -> dict:
    return table()["thresholds"]


def finding(kind: str) -> dict:
    """{"causes": [...], "knobs": [...]} for a finding kind (growth, imbalance_tokens, imbalance_leak,
    fragmentation)."""
    entry = table()["finding"][kind]
    return {"causes": list(entry["causes"]), "knobs": list(entry["knobs"])}

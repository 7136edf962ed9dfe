"""The table `memfit watch` reads its thresholds and its causes / knobs texts from:
data/run_findings.toml (facts, not code)."""
from __future__ import annotations

from memfit.facts.data_table import data_table


def table() -> dict:
    return data_table("run_findings.toml")


def thresholds() -> dict:
    return table()["thresholds"]


def finding(kind: str) -> dict:
    """{"causes": [...], "knobs": [...]} for a finding kind (growth, imbalance_tokens, imbalance_leak,
    fragmentation)."""
    entry = table()["finding"][kind]
    return {"causes": list(entry["causes"]), "knobs": list(entry["knobs"])}

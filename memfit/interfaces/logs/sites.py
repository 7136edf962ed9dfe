"""Phase and component of a failure, from its traceback frames or the log lines before it: the table is
memfit/facts/data/failure_sites.toml; this module only matches."""
from __future__ import annotations

from dataclasses import dataclass

from memfit.facts.data_table import data_table

NO_PHASE = "steps"  # a marker that says "in the training loop": the phase is not known from the log


@dataclass(frozen=True)
class Frame:
    file: str
    function: str


def table() -> dict:
    return data_table("failure_sites.toml")


def thresholds() -> dict:
    return table()["thresholds"]


def units() -> dict:
    return table()["units"]


def _rule_for(frame: Frame) -> dict | None:
    path = frame.file.replace("\\", "/")
    return next((r for r in table()["frame"] if r["function"] == frame.function and r.get("file", "") in path), None)


def site_of_frames(frames: list[Frame]) -> tuple[str | None, str | None]:
    """(phase, component) from frames listed outermost first, as Python prints them."""
    matched = [(i, r) for i, r in enumerate(map(_rule_for, frames)) if r]
    if not matched:
        return None, None
    inner_i, inner = matched[-1]
    phase = inner["phase"]
    for nest in table().get("nesting", []):
        if phase == nest["inner"] and any(r["phase"] == nest["outer"] for i, r in matched if i < inner_i):
            phase = nest["phase"]
    # the outermost named component says which engine part (ZeRO-3 _optimizer_step), the innermost what it
    # was allocating (Adam states at the first step): both when they differ
    named = unique(r["component"] for _, r in matched if r.get("component"))
    component = named[0] if len(named) == 1 else f"{named[0]} > {named[-1]}" if named else None
    return phase, component


def unique(items) -> list:
    return list(dict.fromkeys(items))


def site_of_markers(lines: list[str]) -> tuple[str | None, str | None]:
    """(phase, component) from the last marker line among `lines` (the log before the failure)."""
    markers = table()["marker"]
    for line in reversed(lines):
        for m in markers:
            if m["text"] in line:
                if m["phase"] == NO_PHASE:
                    return None, None
                return m["phase"], m.get("component")
    return None, None

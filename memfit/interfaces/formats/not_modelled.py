"""Settings in a framework file that change memory and that memfit does not model (tables/not_modelled.json).

Each one that is on becomes a warning naming what it does and which way memfit's estimate errs, so a user never
reads an estimate that silently left out their GaLore optimizer or a trained vision tower. One that can raise
memory (the table's `errs`: low or either; host for host RAM) is also unread: the estimate is of a run without
it, so its verdict is at most "tight" (issue 27). One that can only lower memory (`errs` high) is named only."""
from __future__ import annotations

from typing import TypedDict

from memfit.interfaces.formats.base import shown
from memfit.interfaces.formats.tables import table

OFF = (None, False, 0, 0.0, "", "none", "None")
CAPS = {"low": "unread", "either": "unread", "host": "unread_host"}  # `errs` -> the ImportedConfig list it joins


def _on(value, entry: dict) -> bool:
    if "when" in entry:
        return value == entry["when"]
    return value not in OFF


def line(where: str, key: str, value, entry: dict) -> str:
    return f"{where}: {key}={shown(value)}: not modelled: {entry['does']}; memfit estimates {entry['memfit']}"


def found(fmt: str, doc: dict, where: str) -> list[tuple[str, str]]:
    """(warning, errs) for each setting of `doc` that is on and not modelled, in the file's key order."""
    entries = table("not_modelled").get(fmt, {})
    return [(line(where, key, value, entries[key]), entries[key]["errs"]) for key, value in doc.items()
            if key in entries and _on(value, entries[key])]


class Caps(TypedDict):
    """The two ImportedConfig lists of settings that can raise memory (`ImportedConfig(..., **caps(pairs))`)."""

    unread: list[str]
    unread_host: list[str]


def caps(pairs: list[tuple[str, str]]) -> Caps:
    """The warnings of settings that can raise memory, by the ImportedConfig list they join (unread, unread_host)."""
    return {"unread": [w for w, errs in pairs if CAPS.get(errs) == "unread"],
            "unread_host": [w for w, errs in pairs if CAPS.get(errs) == "unread_host"]}

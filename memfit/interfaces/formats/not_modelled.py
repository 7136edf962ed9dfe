"""Settings in a framework file that change memory and that memfit does not model (tables/not_modelled.json).

Each one that is on becomes a warning naming what it does and which way memfit's estimate errs, so a user never
reads an estimate that silently left out their GaLore optimizer or a trained vision tower."""
from __future__ import annotations

from memfit.interfaces.formats.base import shown
from memfit.interfaces.formats.tables import table

OFF = (None, False, 0, 0.0, "", "none", "None")


def _on(value, entry: dict) -> bool:
    if "when" in entry:
        return value == entry["when"]
    return value not in OFF


def named(fmt: str, doc: dict, where: str) -> list[str]:
    """A warning for each setting of `doc` that is on and not modelled, in the file's key order."""
    entries = table("not_modelled").get(fmt, {})
    return [f"{where}: {key}={shown(value)}: not modelled: {entries[key]['does']}; memfit estimates "
            f"{entries[key]['memfit']}"
            for key, value in doc.items() if key in entries and _on(value, entries[key])]

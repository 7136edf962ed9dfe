"""Which placement of memfit/roles/ runs a scenario (data/placements.toml): a framework's own layout of its
processes for a method, else the method's fallback layout. Loaded strictly: a mistyped key is a one-line error."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from memfit.errors import MemfitError
from memfit.facts.data_table import data_table
from memfit.facts.names import unknown_key

KEYS = {"description", "methods", "frameworks", "fallback", "source"}
OPTIONAL = {"facts"}


@dataclass(frozen=True)
class PlacementRow:
    name: str
    description: str
    methods: tuple[str, ...]
    frameworks: tuple[str, ...]
    fallback: bool
    source: str
    facts: dict  # the framework's own numbers the placement reads (each sourced in the table)


@cache
def placements() -> dict[str, PlacementRow]:
    out = {}
    for name, row in data_table("placements.toml")["placement"].items():
        for key in row:
            if key not in KEYS | OPTIONAL:
                raise unknown_key(f"placements.toml [placement.{name}]", key, KEYS | OPTIONAL)
        missing = sorted(KEYS - set(row))
        if missing:
            raise MemfitError(f"placements.toml [placement.{name}]: missing {', '.join(missing)}")
        out[name] = PlacementRow(name, row["description"], tuple(row["methods"]), tuple(row["frameworks"]),
                                 bool(row["fallback"]), row["source"], dict(row.get("facts", {})))
    _check_fallbacks(out)
    return out


def _check_fallbacks(rows: dict[str, PlacementRow]) -> None:
    seen: dict[str, str] = {}
    for r in rows.values():
        for m in r.methods if r.fallback else ():
            if m in seen:
                raise MemfitError(f"placements.toml: method {m!r} has two fallbacks ({seen[m]}, {r.name}); keep one")
            seen[m] = r.name


def placement_for(profile: str, method: str) -> PlacementRow:
    """The framework's own placement of the method, else the method's fallback."""
    rows = placements().values()
    own = [r for r in rows if method in r.methods and profile in r.frameworks]
    if own:
        return own[0]
    fallback = [r for r in rows if method in r.methods and r.fallback]
    if not fallback:
        raise MemfitError(f"no placement runs method {method!r} (data/placements.toml); "
                          f"methods placed: {', '.join(sorted({m for r in rows for m in r.methods}))}")
    return fallback[0]


def placement_facts(name: str) -> dict:
    """A placement's own numbers (data/placements.toml [placement.NAME.facts])."""
    return placements()[name].facts

"""Names and keys as users and data files spell them: normalized lookups, "did you mean" suggestions, and the
one-line error for a key no code reads (every fact table loads strictly through it)."""
from __future__ import annotations

import difflib

from memfit.errors import MemfitError


def norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def suggest(name: str, candidates) -> str:
    close = difflib.get_close_matches(norm(name), list(candidates), n=3, cutoff=0.5)
    return f"; did you mean: {', '.join(close)}?" if close else ""


def unknown_key(where: str, key: str, valid) -> MemfitError:
    """One line naming the file and row of a key no code reads, and the nearest valid key."""
    close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(valid))}"
    return MemfitError(f"{where}: unknown key {key!r}{hint}")

"""Which releases memfit's facts were derived on (data/versions.toml), and which are installed here.

Benches record `installed()` beside their numbers; `mismatches()` names each pinned package whose
installed release differs, so a trace or a measurement can say it ran on other code than the facts.
"""
from __future__ import annotations

import tomllib
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

TABLE = Path(__file__).parent / "data" / "versions.toml"


@cache
def pinned() -> dict[str, str]:
    """Package -> the exact release memfit's own environment pins (the [python] table)."""
    return dict(tomllib.loads(TABLE.read_text())["python"])


def release(text: str) -> str:
    """'2.13.0+cpu' -> '2.13.0': a local build tag names the wheel, not other code."""
    return text.split("+", 1)[0]


def installed() -> dict[str, str | None]:
    """Package -> its installed release, or None when it is not installed."""
    out: dict[str, str | None] = {}
    for name in pinned():
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def mismatches() -> dict[str, tuple[str, str]]:
    """Package -> (pinned, installed) for every installed package on another release than the pin."""
    return {name: (pin, got) for name, pin in pinned().items()
            if (got := installed()[name]) is not None and release(got) != pin}

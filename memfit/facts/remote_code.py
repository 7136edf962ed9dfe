"""Facts of hub remote-code model families traced on their own modeling code (data/remote_code.toml)."""
from __future__ import annotations

from memfit.facts.data_table import data_table


def remote_code(arch: str) -> dict:
    """The family's table ({} when its own code was not traced): source, traced, derived."""
    return data_table("remote_code.toml").get(arch, {})


def derived(arch: str) -> dict:
    """The facts derived from the family's own code ({} when none)."""
    return remote_code(arch).get("derived", {})

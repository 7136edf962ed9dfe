"""Facts of hub remote-code model families traced on their own modeling code (data/remote_code.toml)."""
from __future__ import annotations

from memfit.facts.data_table import data_table
from memfit.facts.frameworks import model_code


def remote_code(arch: str) -> dict:
    """The family's table ({} when its own code was not traced): source, traced, derived."""
    return data_table("remote_code.toml").get(arch, {})


def derived(arch: str) -> dict:
    """The facts derived from the family's own code ({} when none)."""
    return remote_code(arch).get("derived", {})


def ignored_checkpointing(arch: str, profile: str) -> str | None:
    """Why the family's own file leaves the layers un-checkpointed when `profile` asks for checkpointing (None when
    it does not): its gradient_checkpointing_enable never sets the flag its layers read, and only a framework that
    sets that flag itself ([NAME.checkpointing] honored_by) gets checkpointed layers. Frameworks with their own
    model code never run the file."""
    table = remote_code(arch)
    if derived(arch).get("checkpointing_enable_sets_flag", True) or model_code(profile):
        return None
    said = table.get("checkpointing", {})
    if profile in said.get("honored_by", ()):
        return None
    src = table["source"]
    return (f"checkpointing=off: {said['why']} ({src['repo']}@{src['commit'][:10]} {src['path']}; "
            f"data/remote_code.toml, {arch}.checkpointing)")

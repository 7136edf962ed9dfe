"""The DeepSpeed JSON a training YAML names (`deepspeed:` in LLaMA-Factory and axolotl files): written beside the
YAML when a plan changes an engine knob, and named the way both frameworks open it (from the working directory)."""
from __future__ import annotations

from pathlib import Path

from memfit.interfaces.formats import deepspeed as ds
from memfit.interfaces.formats.base import ImportedConfig, WrittenFile, cannot, companion_target, launch_path


def wants_deepspeed(imported: ImportedConfig, changes: dict) -> bool:
    engine = changes.get("engine", imported.knobs.get("engine"))
    if "engine" in changes:
        return engine == "deepspeed" or (engine is None and any(changes.get(k) is not None for k in ds.KNOBS))
    return engine == "deepspeed" or any(changes.get(k) is not None for k in ("zero_stage",))


def _new_name(knobs: dict) -> str:
    offload = knobs.get("offload_optimizer", "none") != "none" or knobs.get("offload_param", "none") != "none"
    return f"ds_z{knobs.get('zero_stage', 0)}{'_offload' if offload else ''}_config.json"


def deepspeed_files(imported: ImportedConfig, changes: dict, doc: dict,
                    folder: Path | None) -> tuple[list[WrittenFile], dict[Path, str]]:
    """The DeepSpeed file the changed run uses: the YAML's own, edited (into `folder` when given), or a new one in
    `folder` (default: beside the YAML). Sets or drops `deepspeed:` in `doc`. Returns the written files and the
    texts the YAML's re-read needs."""
    ds_changes = {k: v for k, v in changes.items() if k in ds.KNOBS}
    had = imported.companions.get("deepspeed")
    if not wants_deepspeed(imported, changes):
        doc.pop("deepspeed", None)
        leftover = {k: v for k, v in ds_changes.items() if v is not None}
        if leftover:
            knob = sorted(leftover)[0]
            raise cannot(imported, knob, leftover[knob], "it is a DeepSpeed setting and the run has no DeepSpeed")
        return [], {}
    if had is not None:
        ds_text = ds.write(had, {**had.knobs, **ds_changes}) if ds_changes else had.text
        target, reference = companion_target(had, ds_text, folder)
        if reference is not None:
            doc["deepspeed"] = reference
        written = [WrittenFile(target, had.text, ds_text)] if ds_text != had.text else []
        return written, {target: ds_text}
    wanted = {**{k: v for k, v in imported.knobs.items() if k in ds.KNOBS}, **ds_changes}
    folder = Path(folder) if folder else imported.path.parent if imported.path else Path.cwd()
    target = folder / _new_name(wanted)
    ds_text = ds.export(wanted)
    doc["deepspeed"] = launch_path(target)
    return [WrittenFile(target, None, ds_text)], {target: ds_text}


def engine_free(imported: ImportedConfig, changes: dict) -> dict:
    """What the re-read of a run without DeepSpeed can show: the changes less the engine's."""
    if wants_deepspeed(imported, changes):
        return dict(changes)
    return {k: v for k, v in changes.items() if k not in ds.KNOBS and k != "engine"}

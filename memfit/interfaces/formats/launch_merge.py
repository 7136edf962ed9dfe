"""Several files that together describe one run (a TRL recipe plus an accelerate YAML, TrainingArguments plus a
DeepSpeed JSON, or the files a launch script names) merged into one set of knobs.

Precedence, one knob at a time:
1. a value a file states beats a value its reader filled in as the framework's default (the `says` column of the
   knob table names the key that states it); two files stating different values is an error naming both;
2. between two defaults, the training arguments (LLaMA-Factory / HF / TRL / OpenRLHF) win over the accelerate
   config, which wins over a DeepSpeed JSON;
3. precision is the training arguments' when they are present: transformers' TrainingArguments sets
   ACCELERATE_MIXED_PRECISION from bf16 / fp16, over the accelerate config's mixed_precision (a difference is a
   warning); under a DeepSpeed engine a bf16 run keeps fp32 master weights (bf16-mixed), as the HF reader reads a
   file that names its DeepSpeed JSON.
"""
from __future__ import annotations

from pathlib import Path

from memfit.errors import MemfitError
from memfit.facts.knobs import knobs as knob_table
from memfit.interfaces.formats.base import ImportedConfig, same, shown

TRAINING = ("llamafactory", "hf", "openrlhf")
ROLE = {"llamafactory": 0, "hf": 0, "openrlhf": 0, "accelerate": 1, "deepspeed": 2}


def flatten(parts: list[ImportedConfig]) -> list[ImportedConfig]:
    """The files of merged records (a launch given beside another file), each file once: a file given twice, or
    given and also named by another as its DeepSpeed JSON, is read once."""
    out: list[ImportedConfig] = []
    seen: set[Path | int | str] = set()
    for part in parts:
        for p in (part.companions.values() if part.format == "launch" else [part]):
            named = {_key(c) for c in p.companions.values()}
            if _key(p) in seen:
                continue
            out = [q for q in out if _key(q) not in named | {_key(p)}]
            seen |= named | {_key(p)}
            out.append(p)
    return out


def _key(part: ImportedConfig) -> Path | int | str:
    try:
        return Path(part.path).resolve() if part.path else id(part)
    except (OSError, ValueError):
        return str(part.path)


def _has(doc, dotted: str) -> bool:
    for name in dotted.split("."):
        if not isinstance(doc, dict) or name not in doc:
            return False
        doc = doc[name]
    return True


def stated(part: ImportedConfig, knob: str) -> bool:
    """Does the file (or a file it names) state the knob, rather than its reader filling in a default?"""
    if any(stated(c, knob) for c in part.companions.values()):
        return True
    k = knob_table().get(knob)
    column = "llamafactory_v1" if part.format == "llamafactory" and part.variant == "v1" else part.format
    says = k.says.get(column) if k else None
    if says is None:
        return False
    if part.format == "openrlhf" or says.startswith("("):  # a command's flags, a config class: always said
        return True
    for key in says.replace("|", ",").split(","):
        key = key.strip().split(" ")[0]
        spellings = {key, key.replace("activation_", "gradient_")}
        if part.format == "hf":
            from memfit.interfaces.formats.hf_keys import other_releases

            spellings |= {old for old, r in other_releases()["renamed"].items() if r["now"] == key}
        if any(_has(part.doc, s) for s in spellings):
            return True
    return False


def _engine_precision(part: ImportedConfig, engine) -> ImportedConfig:
    """A TrainingArguments file that names no DeepSpeed JSON, launched with a DeepSpeed engine: bf16 is
    DeepSpeed's bf16 (fp32 master weights), as when the file names the JSON itself."""
    if engine == "deepspeed" and part.format == "hf" and isinstance(part.doc, dict) and part.doc.get("deepspeed") is None \
            and part.knobs.get("precision") == "bf16-pure":
        from dataclasses import replace

        return replace(part, knobs={**part.knobs, "precision": "bf16-mixed"},
                       assumed=part.assumed + ["bf16 under the DeepSpeed engine another file sets: bf16-mixed "
                                               "(fp32 master weights)"])
    return part


def merge(parts: list[ImportedConfig], *, path: Path | None = None, text: str = "", world: dict | None = None,
          world_from: str = "the launch", assumed: list[str] | None = None,
          warnings: list[str] | None = None, unread: list[str] | None = None) -> ImportedConfig:
    """One record for the run. `world`: what the launcher says (GPU count, nodes), checked against the files;
    `unread`: the launch's own memory settings no reader reads (the files' own are in their parts)."""
    parts = sorted(flatten(parts), key=lambda p: ROLE.get(p.format, 3))
    if not parts:
        raise MemfitError(f"{path or 'launch'}: names no config file and no training flags memfit reads")
    engine = next((p.knobs["engine"] for p in parts if stated(p, "engine") and "engine" in p.knobs),
                  next((p.knobs["engine"] for p in parts if "engine" in p.knobs), None))
    parts = [_engine_precision(p, engine) for p in parts]
    notes, warns = list(assumed or []), list(warnings or [])
    training = any(p.format in TRAINING for p in parts)
    merged: dict = {}
    source: dict = {}  # knob -> (part, stated)
    for part in parts:
        for knob, value in part.knobs.items():
            says = stated(part, knob)
            if knob == "precision" and part.format == "accelerate" and training:
                if knob in merged and not same(merged[knob], value):
                    warns.append(f"{part.name}: mixed_precision ({shown(value)}) is overridden by the training "
                                 f"arguments' {shown(merged[knob])} (TrainingArguments sets ACCELERATE_MIXED_PRECISION)")
                says = False
            if knob == "checkpointing" and part.format == "accelerate" and training and value == "off":
                says = False  # fsdp_activation_checkpointing: false leaves the training arguments' own checkpointing on
            if knob not in merged or (says and not source[knob][1]):
                if knob in merged and not same(merged[knob], value):
                    notes.append(f"{knob}={shown(value)} from {part.name} ({source[knob][0].name} leaves it to "
                                 f"its default {shown(merged[knob])})")
                merged[knob], source[knob] = value, (part, says)
            elif says and source[knob][1] and not same(merged[knob], value):
                raise MemfitError(f"{knob}: {_who(source[knob][0], knob)} says {shown(merged[knob])}, "
                                  f"{_who(part, knob)} says {shown(value)}; the files of one run must agree (drop one "
                                  "or make them equal)")
    return ImportedConfig(format="launch", profile=parts[0].profile, knobs=merged, text=text, doc=parts,
                          path=path or parts[0].path, model_name=_model(parts), world=_world(parts, world, world_from),
                          assumed=notes, warnings=warns, companions={p.name if p.path else f"{p.format} {i}": p
                                                                     for i, p in enumerate(parts)},
                          unread=list(unread or []))


def _who(part: ImportedConfig, knob: str) -> str:
    """The file that states the knob: a DeepSpeed JSON a file names, rather than the file naming it."""
    inner = next((c for c in part.companions.values() if stated(c, knob)), None)
    return f"{_who(inner, knob)} (named by {part.name})" if inner is not None else part.name


def _model(parts: list[ImportedConfig]) -> str | None:
    named = [(p.model_name, p) for p in parts if p.model_name]
    for name, p in named[1:]:
        if name != named[0][0]:
            raise MemfitError(f"model: {named[0][1].name} says {named[0][0]!r}, {p.name} says {name!r}; the files of "
                              "one run must name the same model")
    return named[0][0] if named else None


def _world(parts: list[ImportedConfig], world: dict | None, world_from: str) -> dict:
    out, source = dict(world or {}), {k: world_from for k in world or {}}
    for part in parts:
        for key in ("num_gpus", "nodes"):
            value = part.world.get(key)
            if value is None:
                continue
            if key in out and out[key] != value:
                what = "GPU count" if key == "num_gpus" else "node count"
                raise MemfitError(f"{what}: {source[key]} says {out[key]}, {part.name} says {value}; the files of one "
                                  "run must agree (or type --gpus / --nodes)")
            out[key], source[key] = value, part.name
    return out

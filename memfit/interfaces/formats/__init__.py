"""Framework config files in and out: the one place memfit parses or writes them.

    imported = read_config("train_lora.yaml", gpus=7)      # -> ImportedConfig (knobs for build_scenario)
    files = write_config_files(imported, {**imported.knobs, "zero_stage": 3})
    print(diff(files))                                      # unified diff of every file that changed

Formats: DeepSpeed JSON, LLaMA-Factory YAML (+ the DeepSpeed JSON it names), OpenRLHF command
lines (all flag styles), verl launches (`python3 -m verl.trainer.main_ppo key=value ...`, verl.py), accelerate config YAML, axolotl YAML, HF TrainingArguments / TRL SFT and DPO configs
(JSON or YAML). Writers change only what changed, keep comments and key order, re-read their own
output, and refuse (MemfitError) a knob the format cannot say. `validate.py` checks written files
with the frameworks' own code. The core needs only PyYAML.
"""
from __future__ import annotations

import difflib
import json
import re
from pathlib import Path

from memfit.errors import MemfitError
from memfit.facts.engines.deepspeed import overlap
from memfit.facts.knobs import acts, knobs, said_by
from memfit.interfaces.formats import accelerate, deepspeed, hf, launch, llamafactory, openrlhf, yamltext
from memfit.interfaces.formats import axolotl_write
from memfit.interfaces.formats import llamafactory_v1, verl
from memfit.interfaces.formats.verl_command import is_verl
from memfit.interfaces.formats.base import ImportedConfig, WrittenFile, read_text

MODULES = {"deepspeed": deepspeed, "llamafactory": llamafactory, "openrlhf": openrlhf, "accelerate": accelerate,
           "hf": hf, "launch": launch, "axolotl": axolotl_write,  # axolotl_write: axolotl's reader and writers
           "verl": verl}
FORMATS = tuple(MODULES)

__all__ = ["FORMATS", "ImportedConfig", "WrittenFile", "detect_format", "diff", "export_scenario", "exportable",
           "knobs_from_scenario", "read_config", "read_configs", "reread", "sayable", "write_config", "write_config_files"]
# a launch line: its first word (after VAR=value assignments) is a launcher memfit follows (formats/launch.py)
_LAUNCH_LINE = re.compile(r"(?m)^[ \t]*(?:[A-Za-z_]\w*=\S*[ \t]+)*(?:\S*/)?(?:accelerate[ \t]+launch|deepspeed|torchrun|"
                          r"llamafactory-cli[ \t]+train|lmf[ \t]+train|trl[ \t]+(?:sft|dpo)|python[\d.]*)(?=[ \t])")


def detect_format(text: str, name: str = "") -> str:
    """Which format a file is, from its extension and its content."""
    suffix = Path(name).suffix.lower()
    head = text.lstrip()
    if "openrlhf.cli." in text and (suffix in (".sh", ".txt", ".bash", "") or
                                     head.startswith(("deepspeed", "python", "torchrun", "set", "#", "read", "export"))):
        return "openrlhf"
    if is_verl(text) and suffix in (".sh", ".txt", ".bash", ""):
        return "verl"
    if suffix in (".sh", ".bash") or (suffix in (".txt", "") and _LAUNCH_LINE.search(text)):
        return "launch"
    if suffix == ".json" or head.startswith("{"):
        try:
            doc = json.loads(text)
        except (ValueError, RecursionError):  # JSONDecodeError, too many digits, too deep
            doc = None  # the format's own reader reports where the JSON breaks
        if isinstance(doc, dict) and ("zero_optimization" in doc or "train_micro_batch_size_per_gpu" in doc
                                      or "train_batch_size" in doc):
            return "deepspeed"
        if doc is None and "zero_optimization" in text:
            return "deepspeed"
        return "hf"
    if suffix in (".yaml", ".yml") or ":" in head.split("\n", 1)[0]:
        try:
            doc = None if yamltext.TOO_DEEP.search(text) else yamltext.yaml.safe_load(text)
        except (yamltext.yaml.YAMLError, ValueError, RecursionError):
            doc = None
        if isinstance(doc, dict):
            if "compute_environment" in doc or "distributed_type" in doc:
                return "accelerate"
            if _is_axolotl(doc):
                return "axolotl"
            if llamafactory.is_llamafactory(doc):
                return "llamafactory"
            if llamafactory_v1.is_v1(doc):  # v1's flat keys and plugin blocks
                return "llamafactory"
            return "hf"
        if suffix in (".yaml", ".yml"):
            return _yaml_guess(text)
    raise MemfitError(f"{name or 'config'}: cannot tell the format; memfit reads DeepSpeed JSON, LLaMA-Factory "
                      "YAML, axolotl YAML, OpenRLHF commands, accelerate YAML and TrainingArguments / TRL configs")


# axolotl's own keys beside base_model (HF / TRL and LLaMA-Factory files have none of them)
_AXOLOTL_KEYS = ("sequence_len", "micro_batch_size", "adapter", "sample_packing", "lora_target_linear")


def _is_axolotl(doc: dict) -> bool:
    if "base_model" not in doc:
        return False
    datasets = doc.get("datasets")
    typed = isinstance(datasets, list) and any(isinstance(d, dict) and "type" in d for d in datasets)
    return typed or any(k in doc for k in _AXOLOTL_KEYS)


def _yaml_guess(text: str) -> str:
    """A YAML file that does not parse: guess from its keys so the right reader reports the error."""
    if "compute_environment" in text or "distributed_type" in text:
        return "accelerate"
    if re.search(r"(?m)^base_model:", text) and re.search(r"(?m)^(sequence_len|micro_batch_size|adapter):", text):
        return "axolotl"
    if "finetuning_type" in text or "cutoff_len" in text or "\nstage:" in "\n" + text:
        return "llamafactory"
    return "hf"


def read_config(path_or_text, *, format: str | None = None, gpus: int | None = None, **options) -> ImportedConfig:
    """Read a framework file. `gpus`: the total GPU count the run will use (for global-batch math and
    to check train_batch_size = micro x accumulation x GPUs). `options` go to the format's reader
    (e.g. profile= for a bare DeepSpeed JSON, version= for OpenRLHF)."""
    if isinstance(path_or_text, str) and is_verl(path_or_text) and " " in path_or_text.strip():
        text, path = path_or_text, None  # a verl command line, even on one line
    else:
        text, path = read_text(path_or_text, "config")
    fmt = format or detect_format(text, path.name if path else "")
    if fmt not in MODULES:
        raise MemfitError(f"unknown config format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if fmt == "launch":  # the files a launch names are read back through here
        options["readers"] = (read_config, detect_format)
    return MODULES[fmt].read(path if path else text, gpus=gpus, **options)


def read_configs(paths, *, gpus: int | None = None) -> ImportedConfig:
    """One file as read_config reads it; several files of one run (and launches) merged (formats/launch_merge.py)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    if len(paths) == 1:
        return read_config(paths[0], gpus=gpus)
    return launch.read_many(paths, gpus=gpus, readers=(read_config, detect_format))


def write_config_files(imported: ImportedConfig, knobs: dict, folder: Path | None = None) -> list[WrittenFile]:
    """Every file that has to change for `knobs` (the main file first; a DeepSpeed JSON it names after).
    `knobs` may be the full set (`{**imported.knobs, ...}`) or only the changes; None resets a knob
    to the framework's default. `folder`: where a named file that changes (or a new one) is written, when not
    beside the original; the main file then names it there."""
    module = MODULES[imported.format]
    if hasattr(module, "write_files"):
        return module.write_files(imported, knobs, folder)
    return [WrittenFile(imported.path, imported.text, module.write(imported, knobs))]


def reread(imported: ImportedConfig, files: list[WrittenFile]) -> ImportedConfig:
    """The main file of `files` read back as it will be on disk, with the named files it references taken from
    `files` (what `memfit fit` is about to write), for checking the written run against the plan."""
    main = files[0]
    gpus = imported.world.get("num_gpus")
    module = MODULES[imported.format]
    if imported.format == "verl":  # the launch alone (a user YAML it names is read, never written)
        return module.read(main.new_text, gpus=gpus, path=main.path)
    if imported.format in ("deepspeed", "openrlhf"):  # one file: nothing it names
        options = {"profile": imported.profile} if imported.format == "deepspeed" else {"version": imported.variant}
        return module.read(main.new_text, gpus=gpus, **options)
    texts = {f.path: f.new_text for f in files[1:]}
    options = {"variant": imported.variant_read.split(":")[0]} if imported.format == "hf" else \
        {"script": imported.variant} if imported.format == "llamafactory" and imported.variant != "v1" else {}
    return module.read(main.new_text, gpus=gpus, files=texts, path=main.path, **options)


def write_config(imported: ImportedConfig, knobs: dict) -> str:
    """The main file's new text (see write_config_files for the DeepSpeed JSON it may also need)."""
    return write_config_files(imported, knobs)[0].new_text


def diff(files: list[WrittenFile]) -> str:
    """A unified diff of the files that changed (new files against /dev/null)."""
    out: list[str] = []
    for f in files:
        if not f.changed:
            continue
        name = str(f.path) if f.path else "config"
        old = (f.old_text or "").splitlines(keepends=True)
        new = f.new_text.splitlines(keepends=True)
        out += difflib.unified_diff(old, new, "/dev/null" if f.old_text is None else f"a/{name}", f"b/{name}")
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)


# --- from a Scenario -----------------------------------------------------------------------------------

# Formats that may name a DeepSpeed file for the engine's settings: the knobs a DeepSpeed JSON says go there.
COMPANIONS = {"llamafactory": "deepspeed", "hf": "deepspeed", "accelerate": "deepspeed", "axolotl": "deepspeed",
              "llamafactory_v1": "deepspeed"}


def exportable(format: str) -> frozenset[str]:
    """The knobs a format can say (the knob table's `says` column), with those of a DeepSpeed file it names."""
    said = said_by(format)
    return said | said_by(COMPANIONS[format]) if format in COMPANIONS else said


def sayable(imported: ImportedConfig) -> frozenset[str]:
    """The knobs this file can say: its format's, and a DeepSpeed file's when it has one or can make one. An
    accelerate config without `deepspeed_config_file` cannot: its deepspeed_config holds the plugin's few keys,
    and the rest (buckets) is what HF's "auto" gives."""
    if imported.format == "launch":
        raise launch.not_written(imported)
    if imported.format == "accelerate" and "deepspeed" not in imported.companions:
        return said_by("accelerate")
    if imported.format == "llamafactory" and imported.variant == "v1":  # its own keys (the table's column)
        return exportable("llamafactory_v1")
    return exportable(imported.format)


def knobs_from_scenario(scenario) -> dict:
    """The knobs that rebuild `scenario` with profiles.build_scenario (the inverse of it): every knob that acts
    on this run (the knob table's `when`) and has a value; overlap_comm as DeepSpeed resolves it."""
    s = scenario
    out = {name: getattr(s, name) for name in knobs() if acts(s, name) and getattr(s, name) is not None}
    if s.engine == "deepspeed":
        out["overlap_comm"] = overlap(s)
    return out


def export_scenario(scenario, format: str, *, model_name: str | None = None, **options) -> list[WrittenFile]:
    """Fresh file(s) in `format` that say `scenario`'s knobs (only what that format states; what it
    leaves to the framework's defaults is not written). LLaMA-Factory with DeepSpeed gives two files."""
    said = exportable(format) if format in MODULES else frozenset()
    knobs_ = {k: v for k, v in knobs_from_scenario(scenario).items() if k in said}
    model = model_name or scenario.model.id
    world = scenario.hardware.world_size
    if format == "deepspeed":
        return [WrittenFile(None, None, deepspeed.export_config(scenario, hf_auto=options.get("hf_auto", True)))]
    if format in ("llamafactory", "axolotl"):  # a YAML that names its DeepSpeed JSON
        files = []
        ds_name = None
        if scenario.engine == "deepspeed":
            ds_name = f"ds_z{scenario.zero_stage}_config.json"
            files.append(WrittenFile(Path(ds_name), None, deepspeed.export_config(scenario)))
        main = MODULES[format].export(knobs_, model, deepspeed_path=ds_name)
        return [WrittenFile(None, None, main)] + files
    if format == "openrlhf":
        return [WrittenFile(None, None, openrlhf.export(knobs_, model, gpus=world, **options))]
    if format == "accelerate":
        return [WrittenFile(None, None, accelerate.export(knobs_, gpus=scenario.hardware.gpus_per_node,
                                                          nodes=scenario.hardware.nodes))]
    if format == "hf":
        return [WrittenFile(None, None, hf.export(knobs_, model, **options))]
    raise MemfitError(f"unknown config format {format!r}; choose one of: {', '.join(FORMATS)}")

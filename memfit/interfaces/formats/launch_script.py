"""The files and flags of one launch command, each read by its format's reader (launch.py finds the command).

- LLaMA-Factory's launches (`llamafactory-cli train`, its src/train.py / src/train_bash.py): launch_llamafactory.py.
- `accelerate launch --config_file A.yaml --num_processes N ...`: the launcher's flags over the YAML (accelerate's
  own precedence), read as an accelerate config.
- a training script's `--flags` (and its `--config x.yaml`, or a YAML given as its first word, as TRL's parser and
  alignment-handbook's scripts take it): HF TrainingArguments / TRL config keys over the file's, read as a
  TrainingArguments / TRL config; `--deepspeed ds.json` names the DeepSpeed JSON, `--deepspeed_config ds.json`
  (DeepSpeed's add_config_arguments) too. A flag that is no TrainingArguments / TRL key is named: as a memory
  setting memfit does not model when its name says so, else in one list of flags taken as not changing memory.
Notes starting with "!" are warnings; "~" a warning on a memory setting no reader reads (it caps the verdict).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from memfit.interfaces.formats import launch_dschat, yamltext
from memfit.interfaces.formats.base import ImportedConfig, bad, read_text

# beside the HF key table's memory words: script flags that size a run (run_clm's block_size, DeepSpeed-Chat's
# max_seq_len / max_prompt_len, a script's own --num_gpus / --zero_stage)
MEMORY_WORDS = ("block_size", "_len", "gpu", "stage")
_INT = re.compile(r"-?\d+")
_FLOAT = re.compile(r"-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?")
# accelerate launch flags that set a config key (the value as the YAML would hold it)
ACCELERATE_TOP = {"num_processes": "num_processes", "num_machines": "num_machines", "mixed_precision": "mixed_precision",
                  "machine_rank": "machine_rank"}
ACCELERATE_DS = ("zero_stage", "offload_optimizer_device", "offload_param_device", "gradient_accumulation_steps",
                 "zero3_init_flag", "deepspeed_config_file", "gradient_clipping", "zero3_save_16bit_model")


def scalar(word: str):
    """A command-line word as the parsers type it: true/false, a number, None, else the text."""
    if word in ("true", "True", "false", "False"):
        return word in ("true", "True")
    if word in ("None", "null"):
        return None
    if len(word) > 40:  # no setting has a number this long; the reader's type check names it
        return word
    if _INT.fullmatch(word):
        return int(word)
    return float(word) if _FLOAT.fullmatch(word) else word


def exists(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte
        return False


def resolve(value, cwd: Path, label: str, what: str) -> Path:
    """A file the launch names, from the folder it runs in."""
    if not isinstance(value, str) or not value:
        raise bad(label, what, f"expected a file name, got {value!r}")
    path = Path(value).expanduser()
    path = path if path.is_absolute() else cwd / path
    if not exists(path):
        hint = " (a variable the script does not set)" if "$" in value else ""
        raise bad(label, what, f"{value}: no such file{hint} (paths resolve from {cwd})")
    return path


def file_part(value, cwd: Path, label: str, what: str, gpus, readers) -> ImportedConfig:
    """`readers`: (read_config, detect_format) of formats/__init__.py, passed down (importing them here would make
    an import cycle: the dispatcher imports this module)."""
    return readers[0](resolve(value, cwd, label, what), gpus=gpus)


def flags_of(args: list[str]) -> tuple[dict, list[str]]:
    """`--key value`, `--key=value`, `--switch`, `--key a b` (a list) -> {key: value}; other words in order."""
    doc: dict = {}
    words = []
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("--") or tok == "--":
            words.append(tok)
            continue
        name, eq, inline = tok[2:].partition("=")
        values = [inline] if eq else []
        while not eq and i < len(args) and not args[i].startswith("--"):
            values.append(args[i])
            i += 1
        doc[name.replace("-", "_")] = True if not values else scalar(values[0]) if len(values) == 1 \
            else [scalar(v) for v in values]
    return doc, words


def _yaml(doc: dict) -> str:
    """A merged document as YAML text for a reader (the reader's own checks then run on it)."""
    return yamltext.yaml.safe_dump(doc, sort_keys=False, allow_unicode=True) or "{}\n"


def _absolute_deepspeed(doc: dict, key: str, cwd: Path) -> None:
    value = doc.get(key)
    if isinstance(value, str) and value and not Path(value).is_absolute() and exists(cwd / value):
        doc[key] = str((cwd / value).resolve())


# --- accelerate ---------------------------------------------------------------------------------------------

def accelerate_part(flags: dict, cwd: Path, label: str, gpus) -> tuple[list[ImportedConfig], list[str]]:
    """The accelerate config with the launcher's flags over it (as `accelerate launch` applies them)."""
    from memfit.interfaces.formats import accelerate

    config = flags.get("config_file")
    path = resolve(config, cwd, label, "--config_file") if config is not None else None
    doc = yamltext.load(read_text(path, "accelerate config")[0], str(path)) if path else {}
    notes = [] if path else [f"!{label}: no --config_file: accelerate's default config (~/.cache/huggingface/"
                             "accelerate/default_config.yaml) is not read; only the launch flags are"]
    changed = {}
    for flag, key in ACCELERATE_TOP.items():
        if flag in flags:
            changed[key] = scalar(flags[flag])
    engine = "DEEPSPEED" if flags.get("use_deepspeed") else "FSDP" if flags.get("use_fsdp") else \
        "MULTI_GPU" if flags.get("multi_gpu") and doc.get("distributed_type") in (None, "NO") else None
    if engine or "distributed_type" not in doc:
        processes = changed.get("num_processes", doc.get("num_processes"))
        changed["distributed_type"] = engine or ("MULTI_GPU" if isinstance(processes, int) and processes > 1 else "NO")
    section = dict(doc.get("deepspeed_config") or {})
    for flag in ACCELERATE_DS:
        if flag in flags:
            value = scalar(flags[flag])
            section[flag] = str((cwd / value).resolve()) if flag == "deepspeed_config_file" and exists(cwd / str(value)) \
                else value
    if section != (doc.get("deepspeed_config") or {}):
        changed["deepspeed_config"] = section
    fsdp = dict(doc.get("fsdp_config") or {})
    for flag, value in flags.items():
        if flag.startswith("fsdp_"):
            fsdp[flag] = scalar(value)
    if fsdp != (doc.get("fsdp_config") or {}):
        changed["fsdp_config"] = fsdp
    if not changed and path is not None:
        return [accelerate.read(path, gpus=gpus)], notes
    if not path and not (set(changed) - {"distributed_type"}) and changed.get("distributed_type") == "NO":
        return [], notes  # a bare `accelerate launch script.py`: nothing the launcher says beyond the defaults
    said = ", ".join(f"--{f}" for f in flags if f in ACCELERATE_TOP or f in ACCELERATE_DS or f.startswith("fsdp_")
                     or f in ("use_deepspeed", "use_fsdp", "multi_gpu"))
    notes.append(f"{label}: accelerate launch flags over {path.name if path else 'no config file'}: {said}")
    where = path or Path(f"{label}: accelerate launch flags")
    return [accelerate.read(_yaml({**doc, **changed}), gpus=gpus, path=where)], notes


# --- a training script's flags ------------------------------------------------------------------------------

def script_parts(script: str, args: list[str], cwd: Path, label: str, gpus, readers, variant: str | None = None):
    """The TrainingArguments / TRL config a script's flags (and the config file they name) say, and a DeepSpeed
    JSON named by --deepspeed_config; with notes on the flags memfit does not read."""
    from memfit.interfaces.formats import hf
    from memfit.interfaces.formats.hf_keys import detect, keys, other_releases

    flags, words = flags_of(args)
    notes: list[str] = []
    if launch_dschat.matches(script, flags):  # DeepSpeed-Chat's main.py: its own flags, no TrainingArguments
        part, notes = launch_dschat.read(flags, label, gpus)
        return [part], notes + _loose_words(script, label, words)
    own_args = known_script(script, flags)  # its own arguments beside TrainingArguments (Qwen's finetune.py, run_clm.py)
    own = own_args.take(flags) if own_args else {}
    variant = "training_args" if own_args else variant
    parts: list[ImportedConfig] = []
    config = flags.pop("config", None)
    if config is None and words and str(words[0]).endswith((".yaml", ".yml", ".json")):
        config = words.pop(0)
    base: dict = {}
    config_path = None
    if config is not None:
        config_path = resolve(config, cwd, label, "--config")
        text = read_text(config_path, "training arguments file")[0]
        if readers[1](text, config_path.name) != "hf":
            parts.append(file_part(config, cwd, label, "--config", gpus, readers))
        else:
            from memfit.interfaces.formats.hf import _load

            base = _load(text, str(config_path))[1]
            base = base if isinstance(base, dict) else {}
    if flags.get("deepspeed") is True:  # DeepSpeed's add_config_arguments switch, not a file
        flags.pop("deepspeed")
        notes.append(f"{label}: --deepspeed without a file is DeepSpeed's switch (the JSON is --deepspeed_config)")
    if "deepspeed_config" in flags:
        parts.append(file_part(flags.pop("deepspeed_config"), cwd, label, "--deepspeed_config", gpus, readers))
    name = Path(script).name
    model = flags.get("model_name_or_path")
    # the shape from the flags a trainer config has: a model or dataset name alone is any script's (run_clm.py too)
    from memfit.interfaces.formats.tables import table

    scripts = {"model_name_or_path", *table("hf")["ScriptArguments"], *table("hf")["DatasetMixtureConfig"]}
    view = {**{k: v for k, v in flags.items() if k not in scripts}, **base}
    variant = variant or _trl_script(script) or detect(view, name)
    known = set(keys(variant)) | set(other_releases()["renamed"])
    for key in [k for k, v in flags.items() if k.startswith("no_") and v is True and k[3:] in known]:
        flags[key[3:]] = False  # HfArgumentParser's --no_X for a switch that defaults to true
        del flags[key]
    read_flags = {k: v for k, v in flags.items() if k in known}
    _report_unknown(script, label, {k: v for k, v in flags.items() if k not in known}, notes)
    notes += _loose_words(script, label, words)
    if config_path is not None and not base and not read_flags:
        return parts, notes
    if not read_flags and config_path is None and not own_args:
        return parts, notes
    doc = {**base, **read_flags}
    _absolute_deepspeed(doc, "deepspeed", cwd)
    if isinstance(doc.get("deepspeed"), str) and not Path(doc["deepspeed"]).is_absolute():
        resolve(doc["deepspeed"], cwd, label, "--deepspeed")
    if config_path is not None and not read_flags and doc == base and "deepspeed" not in base:
        part = hf.read(config_path, gpus=gpus, variant=variant)
    else:
        where = config_path if config_path is not None else Path(f"{label}: {name} flags")
        part = hf.read(json.dumps(doc, default=str) + "\n", gpus=gpus, variant=variant, path=where)
    if part.model_name is None and isinstance(model, str):
        from dataclasses import replace

        part = replace(part, model_name=model)
    if own_args:
        part = own_args.apply(part, own, label, notes)
    return [part] + parts, notes


def _loose_words(script: str, label: str, words: list) -> list[str]:
    if not words:
        return []
    return [f"!{label}: {Path(script).name}: words without a flag not read: {' '.join(map(str, words[:6]))}"]


def known_script(script: str, flags: dict):
    """The module reading a known training script's own arguments (matches / take / apply), or None."""
    from memfit.interfaces.formats import launch_qwen, launch_run_clm

    return next((m for m in (launch_qwen, launch_run_clm) if m.matches(script, flags)), None)


def _trl_script(script: str) -> str | None:
    """TRL's own training scripts (examples/scripts/sft.py, alignment-handbook's scripts/sft.py, run_dpo.py): their
    flags are a TRL config even when none of them is TRL-only; a model name alone does not make a script TRL's."""
    stem = Path(script).stem.removeprefix("run_")
    return stem if stem in ("sft", "dpo") else None


def _report_unknown(script: str, label: str, unknown: dict, notes: list[str]) -> None:
    from memfit.interfaces.formats.hf_keys import other_releases

    words = (*other_releases()["memory_words"], *MEMORY_WORDS)
    memory = {k: v for k, v in unknown.items() if any(w in k.lower() for w in words)}
    for key, value in memory.items():
        notes.append(f"~{label}: --{key} {value}: a flag of {Path(script).name} that looks like a memory setting; "
                     "memfit does not model it (not a TrainingArguments / TRL key), so the estimate leaves it out")
    other = [f"--{k}" for k in unknown if k not in memory and k != "model_name_or_path"]
    if other:
        notes.append(f"!{label}: flags of {Path(script).name} not read (not TrainingArguments / TRL keys; taken as "
                     f"not changing memory): {', '.join(other)}")

"""LLaMA-Factory's launches, read by its YAML reader (llamafactory.py): the flags are the YAML's keys.

- `llamafactory-cli train X.yaml key=value ...`: the YAML with the overrides merged over it, as LLaMA-Factory's
  read_args does (OmegaConf dotlist over the file); `llamafactory-cli train --key value ...` alone too;
- its training scripts run by python, torchrun, deepspeed or accelerate launch: `src/train_bash.py` (0.0.9 ..
  0.7.0), `src/train.py` (0.7.1 on), `src/llamafactory/launcher.py` (what llamafactory-cli runs under torchrun),
  with `--key value` flags or a YAML (+ overrides). The entry points are tables/llamafactory_other_releases.json's
  (written from the release tags). `train.py` is many projects' name: it is LLaMA-Factory's when its flags say
  (`--stage` or `--finetuning_type`, LLaMA-Factory's own keys, or a LLaMA-Factory YAML); any other script whose
  flags give both `--stage` and `--finetuning_type` is a copy of LLaMA-Factory's.

Flags are parsed as LLaMA-Factory's HfArgumentParser does: `--switch` alone is true, `--no_X` turns off a switch
that defaults to true, yes/no/1/0 are booleans, a key takes one value (a list is comma-separated).
"""
from __future__ import annotations

from pathlib import Path

from memfit.errors import MemfitError
from memfit.interfaces.formats import yamltext
from memfit.interfaces.formats.base import ImportedConfig, bad, read_text
from memfit.interfaces.formats.launch_script import _absolute_deepspeed, _yaml, exists, flags_of, resolve

BY_NAME_ALONE = ("src/train_bash.py", "src/llamafactory/launcher.py")  # names no other project's script has
OWN_FLAGS = {"stage": ("pt", "sft", "rm", "ppo", "dpo", "kto", "orpo"),  # of every release (orpo: 0.6.2 .. 0.7.1)
             "finetuning_type": ("lora", "freeze", "full", "oft")}
TRUE, FALSE = ("yes", "true", "t", "y", "1"), ("no", "false", "f", "n", "0")  # transformers' string_to_bool


def script_path(target: str) -> str:
    """A script as a path: a module (`llamafactory.launcher`) as the file it runs."""
    return target if target.endswith(".py") or "/" in target else target.replace(".", "/") + ".py"


def is_llamafactory(target: str, args: list[str], cwd: Path) -> bool:
    """Is the training script LLaMA-Factory's (by its path, else by its flags or the YAML it is given)?"""
    from memfit.interfaces.formats.llamafactory_releases import entry_point

    point = entry_point(script_path(target))
    if point in BY_NAME_ALONE:
        return True
    flags, words = flags_of(args)
    own = [k for k, values in OWN_FLAGS.items() if str(flags.get(k)) in values]
    if point is not None:
        return bool(own) or bool(args) and _llamafactory_yaml(str(args[0]), cwd)
    return len(own) == len(OWN_FLAGS)


def _llamafactory_yaml(word: str, cwd: Path) -> bool:
    """A first word that is a LLaMA-Factory YAML (what its read_args takes), by the file's own keys."""
    from memfit.interfaces.formats.llamafactory import is_llamafactory as lf_doc

    path = cwd / word
    if not word.endswith((".yaml", ".yml", ".json")) or not exists(path):
        return False
    try:
        doc = yamltext.load(read_text(path, "config")[0], word)
    except MemfitError:  # not YAML: not LLaMA-Factory's; the reader it goes to names what is wrong
        return False
    return isinstance(doc, dict) and lf_doc(doc)


def llamafactory_part(args: list[str], cwd: Path, label: str, gpus, script: str | None = None,
                      ) -> tuple[list[ImportedConfig], list[str]]:
    """The run a LLaMA-Factory launch's words say; `script`: the training script (None: llamafactory-cli)."""
    from memfit.interfaces.formats import llamafactory

    entry = script_path(script) if script else None
    if args and str(args[0]).endswith((".yaml", ".yml", ".json")):
        return _yaml_part(args, cwd, label, gpus, entry)
    doc = parse_flags(args, label, "llamafactory-cli train" if script is None else Path(script).name)
    _absolute_deepspeed(doc, "deepspeed", cwd)
    name = "llamafactory-cli flags" if script is None else f"{Path(script).name} flags"
    notes = [] if script is None else [f"{label}: {script} read as LLaMA-Factory's training script (its flags are "
                                       "the keys of its YAML)"]
    return [llamafactory.read(_yaml(doc), gpus=gpus, path=Path(f"{label}: {name}"), script=entry)], notes


def _yaml_part(args: list[str], cwd: Path, label: str, gpus, entry: str | None):
    from memfit.interfaces.formats import llamafactory

    path = resolve(args[0], cwd, label, "llamafactory-cli train" if entry is None else entry)
    overrides = {}
    for word in args[1:]:
        key, eq, value = word.lstrip("-").partition("=")
        if not eq:
            raise bad(label, word, "expected key=value after the YAML (LLaMA-Factory's overrides)")
        overrides[key] = _yaml_value(value)
    text = read_text(path, "LLaMA-Factory YAML")[0] if overrides or _ds_from_cwd(path, cwd) else None
    if text is None:
        return [llamafactory.read(path, gpus=gpus, script=entry)], []
    doc = {**yamltext.load(text, str(path)), **overrides}
    _absolute_deepspeed(doc, "deepspeed", cwd)
    notes = [f"{label}: {k}={v!r} over {path.name} (LLaMA-Factory's command-line overrides)"
             for k, v in overrides.items()]
    return [llamafactory.read(_yaml(doc), gpus=gpus, path=path, script=entry)], notes


def parse_flags(args: list[str], label: str, what: str) -> dict:
    """`--key value` words as LLaMA-Factory's HfArgumentParser reads them, into its YAML's keys."""
    from memfit.interfaces.formats.llamafactory import _keys

    known = _keys()
    doc, words = flags_of(args)
    if words or not doc:
        raise bad(label, None, f"{what} expects a YAML file or --key value flags"
                  + (f", not the words {' '.join(map(str, words[:3]))}" if words else ""))
    out = {}
    for key, value in doc.items():
        if key.startswith("no_") and value is True and known.get(key[3:], {}).get("default") is True:
            key, value = key[3:], False  # HfArgumentParser's --no_X for a switch that defaults to true
        if isinstance(value, list):
            raise bad(label, f"--{key}", f"takes one value, got {len(value)} (LLaMA-Factory's parser rejects the "
                      "words after the first; a list is comma-separated: q_proj,v_proj)")
        if known.get(key, {}).get("type") == "bool" and str(value).lower() in TRUE + FALSE:
            value = str(value).lower() in TRUE
        out[key] = value
    return out


def _yaml_value(text: str):
    try:
        return yamltext.yaml.safe_load(text) if text else None
    except (yamltext.yaml.YAMLError, ValueError, RecursionError):
        return text


def _ds_from_cwd(path: Path, cwd: Path) -> bool:
    """Does the YAML name a DeepSpeed JSON that the launch folder finds (LLaMA-Factory opens it from there)?"""
    try:
        value = yamltext.yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yamltext.yaml.YAMLError, ValueError, RecursionError, OSError):
        return False
    ds = value.get("deepspeed") if isinstance(value, dict) else None
    return isinstance(ds, str) and not Path(ds).is_absolute() and exists(cwd / ds)


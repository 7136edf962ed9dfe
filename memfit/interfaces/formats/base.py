"""What every format shares: the imported-config record, error wording, type checks, name maps.

An importer turns a framework file into `ImportedConfig`: the knobs `profiles.build_scenario` takes
(what the file states, plus the framework defaults the profile cannot know, each listed in
`assumed`), hints about the world size, and the parsed document so an exporter can make the
smallest edit. Nothing here imports torch or a framework.
"""
from __future__ import annotations

import copy
import difflib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memfit.errors import MemfitError


@dataclass
class ImportedConfig:
    format: str  # deepspeed, llamafactory, openrlhf, accelerate, hf
    profile: str  # framework profile for build_scenario (memfit/facts/data/frameworks/)
    knobs: dict  # for profiles.build_scenario
    text: str  # the file as read; exporters edit this text
    doc: Any  # the parsed document (dict; for openrlhf the parsed command)
    path: Path | None = None
    model_name: str | None = None  # model_name_or_path / --pretrain, when the file names one
    world: dict = field(default_factory=dict)  # num_gpus (all nodes), nodes, global_batch, when stated
    # openrlhf flag version, hf config class (training_args / sft / dpo), LLaMA-Factory "v1" or the training script
    # a launch runs a v0 file with (src/train_bash.py: its releases' defaults and spellings), ...
    variant: str | None = None
    assumed: list[str] = field(default_factory=list)  # framework defaults filled in, for the user to see
    warnings: list[str] = field(default_factory=list)  # things the framework ignores silently
    companions: dict[str, "ImportedConfig"] = field(default_factory=dict)  # e.g. {"deepspeed": <DS JSON>}
    # memory settings of the file that memfit cannot read and that can raise memory (one line each, also among
    # `warnings`): the estimate is of the run without them, so its verdict is at most "tight" (Scenario.unread);
    # `unread_host`: those that raise host RAM only (they cap the verdict when host RAM is judged)
    unread: list[str] = field(default_factory=list)
    unread_host: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name if self.path else f"<{self.format} text>"

    @property
    def variant_read(self) -> str:
        """`variant` as the reader set it (the OpenRLHF release, the HF config class and syntax, ...): the writers
        of those formats need it."""
        if self.variant is None:
            raise MemfitError(f"{self.name}: this {self.format} record has no variant; read the file with "
                              "memfit's reader (read_config) before writing it")
        return self.variant


@dataclass(frozen=True)
class WrittenFile:
    """One file an exporter produced: where it goes, what it held before (None = new file), the new text."""

    path: Path | None
    old_text: str | None
    new_text: str

    @property
    def changed(self) -> bool:
        return self.old_text != self.new_text


def bad(where: str, key: str | None, message: str) -> MemfitError:
    """One line naming the file and the key: `train.yaml: cutoff_len: expected an integer, got 'long'`."""
    return MemfitError(f"{where}: {key}: {message}" if key else f"{where}: {message}")


def suggest(key: str, known) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_key(where: str, key: str, known, framework: str) -> MemfitError:
    return bad(where, key, f"unknown key: {framework} rejects it{suggest(str(key).split('.')[-1], known)}")


def same(a, b) -> bool:
    """Equality that keeps bools apart from numbers (True == 1 in Python, not in a config file)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


# --- typed reads: every value a knob depends on goes through one of these ---------------------------

def as_int(where: str, key: str, value, *, minimum: int | None = None) -> int:
    """Integers as config files write them: 4, 5e8 (a float that is whole), "8" from a command line."""
    v = value
    if isinstance(v, str):
        try:
            v = float(v) if any(c in v.lower() for c in ".e") else int(v)
        except ValueError:
            raise bad(where, key, f"expected an integer, got {shown(value)}") from None
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v))
            or v != int(v)):
        raise bad(where, key, f"expected an integer, got {shown(value)}")
    v = int(v)
    if minimum is not None and v < minimum:
        raise bad(where, key, f"must be >= {minimum}, got {shown(value)}")
    return v


def as_float(where: str, key: str, value) -> float:
    try:
        if isinstance(value, bool):
            raise ValueError
        return float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int of 400 digits
        raise bad(where, key, f"expected a number, got {shown(value)}") from None


def as_bool(where: str, key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise bad(where, key, f"expected true or false, got {shown(value)}")


def as_choice(where: str, key: str, value, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise bad(where, key, f"expected one of {', '.join(map(str, choices))}; got {shown(value)}")
    return value


def as_str(where: str, key: str, value) -> str:
    if not isinstance(value, str):
        raise bad(where, key, f"expected a string, got {shown(value)}")
    return value


def as_mapping(where: str, key: str, value) -> dict:
    """A nested section (`deepspeed_config:`, `zero_optimization`): a mapping, or absent / empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad(where, key, f"expected a mapping of settings, got {shown(value)}")
    return value


def named(where: str, key: str, value, names: dict, what: str):
    """A value looked up in a table of names (an unhashable list or mapping is just not one of them)."""
    if isinstance(value, (list, dict, set)) or value not in names:
        raise bad(where, key, f"{what} {shown(value)} is not modelled; memfit reads {', '.join(map(str, names))}")
    return names[value]


def shown(value) -> str:
    """A value as an error shows it: repr, cut short (a YAML alias bomb's repr alone would be gigabytes)."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring, r.maxother, r.maxlist, r.maxdict, r.maxlevel = 60, 60, 4, 4, 2
    text = r.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def is_auto(value) -> bool:
    return isinstance(value, str) and value == "auto"


# --- names: the same knob spelled by each framework ---------------------------------------------------

# HF `optim` names (transformers OptimizerNames) -> memfit optimizer; the first name per optimizer is
# the one written back.
HF_OPTIM = {
    "adamw_torch_fused": "adamw-fused",
    "adamw_torch": "adamw-foreach",  # torch AdamW picks foreach on CUDA
    "adamw_bnb_8bit": "adamw-8bit",
    "adamw_8bit": "adamw-8bit",
    "paged_adamw_8bit": "paged-adamw-8bit",
    "paged_adamw_32bit": "paged-adamw-32bit",
    "sgd": "sgd",
    "adafactor": "adafactor",
}
HF_OPTIM_NAME: dict[str, str] = {}
for _name, _opt in HF_OPTIM.items():
    HF_OPTIM_NAME.setdefault(_opt, _name)

# transformers attn_implementation -> memfit attention
HF_ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash", "flash_attention_3": "flash",
                "kernels-community/flash-attn": "flash", "kernels-community/vllm-flash-attn3": "flash"}
HF_ATTENTION_NAME = {"eager": "eager", "sdpa": "sdpa", "flash": "flash_attention_2"}


def attention_from_hf(where: str, key: str | None, value) -> str:
    if not isinstance(value, str) or value not in HF_ATTENTION:
        raise bad(where, key, f"unknown attention implementation {shown(value)}; memfit knows {', '.join(HF_ATTENTION)}")
    return HF_ATTENTION[value]


def optimizer_from_hf(where: str, key: str, value) -> str:
    if not isinstance(value, str) or value not in HF_OPTIM:
        raise bad(where, key, f"optimizer {shown(value)} is not modelled; memfit knows {', '.join(HF_OPTIM)}")
    return HF_OPTIM[value]


def lora_targets(where: str, key: str, value) -> tuple[str, ...]:
    """`all` / `all-linear` / "q_proj,v_proj" / [q_proj, v_proj] -> a tuple; `all` means every linear layer."""
    if isinstance(value, str):
        items = [x.strip() for x in value.split(",") if x.strip()]
    elif isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
        items = list(value)
    else:
        raise bad(where, key, f"expected module names, got {shown(value)}")
    if items in (["all"], ["all-linear"], ["all_linear"]):
        return ("all-linear",)
    return tuple(items)


# --- applying changes ----------------------------------------------------------------------------------

def changed_knobs(imported: ImportedConfig, knobs: dict) -> dict:
    """The knobs whose value differs from the file's. None means: back to the framework default."""
    return {k: v for k, v in knobs.items() if k not in imported.knobs or not same(imported.knobs[k], v)
            if not (v is None and k not in imported.knobs)}


def doc_copy(doc):
    return copy.deepcopy(doc)


def cannot(imported: ImportedConfig, knob: str, value, why: str = "") -> MemfitError:
    reason = f": {why}" if why else ""
    return MemfitError(f"{imported.name}: cannot write {knob}={shown(value)} in a {imported.format} config{reason}")


def read_text(path_or_text, what: str) -> tuple[str, Path | None]:
    """A path (str or Path) to read, or the text itself (anything with a newline or a brace)."""
    looks_like_text = isinstance(path_or_text, str) and (
        "\n" in path_or_text or path_or_text.lstrip().startswith("{") or " --" in path_or_text or ": " in path_or_text)
    if isinstance(path_or_text, Path) or not looks_like_text:
        path = Path(path_or_text)
        try:
            return path.read_text(encoding="utf-8"), path
        except FileNotFoundError:
            raise MemfitError(f"{path}: no such file ({what})") from None
        except IsADirectoryError:
            raise MemfitError(f"{path}: is a folder, not a {what} file") from None
        except UnicodeDecodeError:
            raise MemfitError(f"{path}: not a text file ({what})") from None
    return str(path_or_text), None


def verify_written(imported: ImportedConfig, new: ImportedConfig, wanted: dict) -> None:
    """Re-read what we wrote: every knob asked for must come back as asked."""
    for key, value in wanted.items():
        if value is None:
            continue
        got = new.knobs.get(key)
        if not same(got, value):
            raise cannot(imported, key, value, f"it reads back as {shown(got)}")


# --- files a main file names -----------------------------------------------------------------------------

def launch_path(path: Path) -> str:
    """A file's path as the main file should name it: LLaMA-Factory (`deepspeed:`), HF Trainer (`deepspeed`) and
    accelerate (`deepspeed_config_file`) open the string from the working directory they are launched in, not
    from the main file's folder. Relative to here when the file is under it (launch from here), else absolute."""
    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def companion_target(companion: ImportedConfig, new_text: str, folder: Path | None) -> tuple[Path, str | None]:
    """Where a file the main file names goes when it changed, and the reference the main file then needs (None:
    it stays where it is). `folder`: where changed files are written (`memfit fit --out`); None = in place."""
    if companion.path is None:  # readers set the path of every file they follow; one given as text has none
        raise bad(companion.name, None, "a file the main file names was given as text, not read from its path; "
                  "memfit writes a changed copy of it only beside the file it was read from")
    if folder is None or new_text == companion.text:
        return companion.path, None
    target = Path(folder) / companion.path.name
    if target.resolve() == companion.path.resolve():
        return companion.path, None
    return target, launch_path(target)

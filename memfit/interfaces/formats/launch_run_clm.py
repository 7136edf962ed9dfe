"""transformers' causal-LM example (examples/pytorch/language-modeling/run_clm.py): its ModelArguments and
DataTrainingArguments beside transformers' TrainingArguments, read as memfit knobs (tables/run_clm.json names the
commit read and what main() does with each one).

launch_script.py hands a launch of it here when the script is named run_clm.py and passes one of the data
flags the script requires (--dataset_name, --train_file, --validation_file) or --block_size. What changes memory:
- group_texts concatenates the texts and cuts them into rows of exactly --block_size tokens (no padding): seq_len,
  padded rows (every row is that long). Without --block_size the length is the tokenizer's model_max_length, which
  memfit does not read: a memory setting not read (the verdict is at most "tight");
- --dtype float32 loads fp32 weights: mixed precision under --bf16 / --fp16 (a DeepSpeed engine casts the module
  itself, so there it changes nothing); None / auto / bfloat16 load the checkpoint's 16-bit weights, as the HF
  reader assumes;
- --config_name, --config_overrides, --model_type build another model than the one named: not read.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from memfit.interfaces.formats.base import ImportedConfig, as_int
from memfit.interfaces.formats.tables import check_type, table

TABLE = "run_clm"
DETECT = ("dataset_name", "train_file", "validation_file", "block_size")  # __post_init__ needs one of the first three


def facts() -> dict:
    return table(TABLE)


def matches(script: str, flags: dict) -> bool:
    """Is the launched script transformers' run_clm.py? Its name and a data flag it requires (or --block_size)."""
    return Path(script).name == facts()["script"] and bool(set(flags) & set(DETECT))


def take(flags: dict) -> dict:
    """Remove run_clm.py's own arguments from `flags` (what is left are TrainingArguments; the model name stays,
    the launch reader reads it)."""
    own = facts()["arguments"]
    return {k: flags.pop(k) for k in list(flags) if k in own and k != "model_name_or_path"}


def _checked(own: dict, label: str) -> None:
    """Types and choices as HfArgumentParser checks them."""
    for key, value in own.items():
        check_type(label, f"--{key}", value, facts()["arguments"][key])


def apply(part: ImportedConfig, own: dict, label: str, notes: list[str]) -> ImportedConfig:
    """The TrainingArguments part of the launch with run_clm.py's own knobs over it. A "~" note is a memory
    setting memfit does not read (it caps the verdict), a "!" note a warning."""
    _checked(own, label)
    spec = facts()["arguments"]
    k: dict = {}
    if own.get("block_size") is not None:
        seq = as_int(label, "--block_size", own["block_size"], minimum=1)
        k.update(seq_len=seq, padding="padded")
        notes.append(f"{label}: run_clm.py cuts the concatenated texts into rows of exactly --block_size {seq} tokens "
                     "(fewer if the tokenizer's model_max_length is shorter): every row that long, no padding")
    else:
        notes.append(f"~{label}: --block_size not given: run_clm.py then cuts rows at the tokenizer's "
                     "model_max_length (min(1024, max_position_embeddings) when that is longer), which memfit does "
                     "not read; say --block_size")
    for key in (key for key in own if spec[key].get("unread_when_given") and own[key] is not None):
        notes.append(f"~{label}: --{key} {own[key]}: {spec[key]['does']}; memfit estimates the model the launch names")
    precision = _precision(part, own.get("dtype"), label, notes)
    if precision is not None:
        k["precision"] = precision
    return replace(part, knobs={**part.knobs, **k})


def _precision(part: ImportedConfig, dtype, label: str, notes: list[str]) -> str | None:
    """The precision --dtype gives, where it differs from the checkpoint's 16-bit weights the HF reader assumes."""
    if dtype in (None, "auto", "bfloat16"):
        return None
    if part.knobs.get("engine") == "deepspeed":
        notes.append(f"{label}: --dtype {dtype}: the DeepSpeed engine casts the module to its own 16-bit dtype and keeps "
                     "fp32 master weights, whatever dtype the weights were loaded in")
        return None
    doc = part.doc if isinstance(part.doc, dict) else {}
    bf16, fp16 = bool(doc.get("bf16")), bool(doc.get("fp16"))
    if dtype == "float32":
        notes.append(f"{label}: --dtype float32: fp32 weights" + (", 16-bit autocast compute" if bf16 or fp16 else ""))
        return "bf16-mixed" if bf16 else "fp16-mixed" if fp16 else "fp32"
    if not (bf16 or fp16):  # float16 (the choices are checked): the weights train in fp16
        return "fp16-pure"
    notes.append(f"~{label}: --dtype float16 with --{'bf16' if bf16 else 'fp16'}: fp16 weights under autocast are "
                 "not modelled")
    return None


__all__ = ["matches", "take", "apply", "facts"]

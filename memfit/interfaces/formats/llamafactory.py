"""LLaMA-Factory training YAML (`llamafactory-cli train x.yaml`), with the DeepSpeed JSON it points at.

Keys and defaults follow LLaMA-Factory's hparams dataclasses (docs/knobs.md F.2): LoRA unless
`finetuning_type` says otherwise, gradient checkpointing on unless `disable_gradient_checkpointing`,
`flash_attn: auto` = transformers' choice, packing only for `stage: pt`. A key none of its
dataclasses has is an error, as it is for LLaMA-Factory (the key table is derived from its source).
The `deepspeed:` path is resolved as LLaMA-Factory would from the launch folder: next to the YAML,
then in the YAML's parent folders (example paths are written from the repository root), then here.
"""
from __future__ import annotations

from pathlib import Path

from memfit.interfaces.formats import deepspeed as ds
from memfit.interfaces.formats import jsontext, llamafactory_v1_write, yamltext
from memfit.interfaces.formats.ds_companion import deepspeed_files, engine_free
from memfit.interfaces.formats.base import (HF_OPTIM_NAME, ImportedConfig, WrittenFile, as_bool, as_choice, as_float, as_int,
                                 as_str, bad, cannot, changed_knobs, doc_copy,
                                 lora_targets, optimizer_from_hf, read_text, same, unknown_key, verify_written)
from memfit.interfaces.formats.llamafactory_v1 import is_v1, read_v1
from memfit.interfaces.formats.llamafactory_releases import current, entry_point, respell
from memfit.interfaces.formats.not_modelled import caps, found
from memfit.interfaces.formats.tables import check_type, table

FORMAT = "llamafactory"
PROFILE = "llamafactory"
CLASSES = ("ModelArguments", "DataArguments", "TrainingArguments", "FinetuningArguments", "GeneratingArguments")
STAGES = ("pt", "sft", "rm", "ppo", "dpo", "kto")
FLASH_ATTN = {"auto": None, "disabled": "eager", "sdpa": "sdpa", "fa2": "flash", "fa3": "flash"}
FLASH_ATTN_NAME = {"eager": "disabled", "sdpa": "sdpa", "flash": "fa2"}
# Where a key memfit adds goes: after the first of these the file has (LLaMA-Factory's example layout).
ANCHORS = {
    "deepspeed": ["lora_target", "lora_rank", "finetuning_type", "do_train", "stage"],
    "finetuning_type": ["do_train", "stage"],
    "lora_rank": ["finetuning_type"], "lora_alpha": ["lora_rank", "finetuning_type"],
    "lora_dropout": ["lora_alpha", "lora_rank", "finetuning_type"],
    "lora_target": ["lora_rank", "finetuning_type"], "use_dora": ["lora_target", "lora_rank", "finetuning_type"],
    "freeze_trainable_layers": ["finetuning_type"],
    "quantization_bit": ["trust_remote_code", "model_name_or_path"],
    "double_quantization": ["quantization_bit"],
    "flash_attn": ["quantization_bit", "trust_remote_code", "model_name_or_path"],
    "disable_gradient_checkpointing": ["flash_attn", "trust_remote_code", "model_name_or_path"],
    "use_unsloth_gc": ["disable_gradient_checkpointing", "flash_attn", "trust_remote_code", "model_name_or_path"],
    "use_reentrant_gc": ["use_unsloth_gc", "disable_gradient_checkpointing", "trust_remote_code", "model_name_or_path"],
    "enable_liger_kernel": ["flash_attn", "trust_remote_code", "model_name_or_path"],
    "low_cpu_mem_usage": ["trust_remote_code", "model_name_or_path"],
    "cutoff_len": ["template", "dataset"], "packing": ["cutoff_len", "template", "dataset"],
    "neat_packing": ["packing", "cutoff_len", "template"],
    "per_device_train_batch_size": ["learning_rate", "gradient_accumulation_steps"],
    "gradient_accumulation_steps": ["per_device_train_batch_size", "learning_rate"],
    "optim": ["lr_scheduler_type", "learning_rate"],
    "bf16": ["warmup_ratio", "lr_scheduler_type", "num_train_epochs"], "fp16": ["bf16", "warmup_ratio"],
    "pure_bf16": ["bf16", "fp16", "warmup_ratio"],
}


def is_llamafactory(doc: dict) -> bool:
    """A YAML document of LLaMA-Factory's (v0): it holds one of the keys only LLaMA-Factory has."""
    return any(k in doc for k in ("stage", "finetuning_type", "cutoff_len", "lora_target"))


def _keys() -> dict:
    known = {}
    for cls in CLASSES:
        known.update(table("llamafactory")[cls])
    return known


def _check_keys(doc: dict, where: str) -> None:
    known = _keys()
    for key, value in doc.items():
        if key not in known:
            raise unknown_key(where, key, known, "LLaMA-Factory")
        check_type(where, key, value, known[key])


def _default(key: str):
    return _keys()[key].get("default")


def _stated(doc: dict, key: str, assumed: list[str], note: str = "LLaMA-Factory default"):
    if key in doc and doc[key] is not None:
        return doc[key]
    value = _default(key)
    assumed.append(f"{key}={value} ({note})")
    return value


def _ds_candidates(value: str, yaml_path: Path | None) -> list[Path]:
    rel = Path(value)
    if rel.is_absolute():
        return [rel]
    base = yaml_path.parent.resolve() if yaml_path else Path.cwd()
    return [folder / rel for folder in (base, *base.parents)] + [Path.cwd() / rel]


def resolve_deepspeed(value: str, yaml_path: Path | None, where: str, files: dict | None = None) -> Path:
    written = {Path(p).resolve(): p for p in files or {}}
    for candidate in _ds_candidates(value, yaml_path):
        if candidate.resolve() in written:
            return written[candidate.resolve()]
        if candidate.is_file():
            return candidate
    raise bad(where, "deepspeed", f"{value}: no such file (looked beside the YAML, in its parent folders and here)")


def _knobs(doc: dict, where: str, assumed: list[str]) -> dict:
    k: dict = {}
    stage = as_choice(where, "stage", _stated(doc, "stage", assumed), STAGES)
    k["method"] = stage
    tuning = _stated(doc, "finetuning_type", assumed)
    tuning = as_choice(where, "finetuning_type", tuning, ("lora", "freeze", "full", "oft"))
    if tuning == "oft":
        raise bad(where, "finetuning_type", "oft is not modelled by memfit; use lora, freeze or full")
    bits = doc.get("quantization_bit")
    if bits is not None:
        bits = as_int(where, "quantization_bit", bits)
        method = doc.get("quantization_method", "bnb")
        if bits not in (4, 8) or method != "bnb":
            raise bad(where, "quantization_bit", f"{bits}-bit {method} quantization is not modelled; memfit "
                      "models 4-bit and 8-bit bitsandbytes")
        if tuning != "lora":
            raise bad(where, "quantization_bit", f"quantized training needs finetuning_type lora, not {tuning}")
        tuning = "qlora"
        k["quant_bits"] = bits
        # unstated, LLaMA-Factory's own default (ModelArguments, tables/llamafactory.json): read back as it runs
        default = table("llamafactory")["ModelArguments"]["double_quantization"]["default"]
        k["double_quant"] = as_bool(where, "double_quantization", doc.get("double_quantization", default))
    k["tuning"] = tuning
    if tuning in ("lora", "qlora"):
        k["lora_rank"] = as_int(where, "lora_rank", _stated(doc, "lora_rank", assumed), minimum=1)
        alpha = doc.get("lora_alpha")
        k["lora_alpha"] = as_int(where, "lora_alpha", alpha) if alpha is not None else 2 * k["lora_rank"]
        if "lora_dropout" in doc:
            k["lora_dropout"] = as_float(where, "lora_dropout", doc["lora_dropout"])
        k["lora_targets"] = lora_targets(where, "lora_target", _stated(doc, "lora_target", assumed))
        k["dora"] = as_bool(where, "use_dora", doc.get("use_dora", False))
    if tuning == "freeze" and "freeze_trainable_layers" in doc:
        k["freeze_trainable_layers"] = as_int(where, "freeze_trainable_layers", doc["freeze_trainable_layers"])
    off = as_bool(where, "disable_gradient_checkpointing", doc.get("disable_gradient_checkpointing", False))
    unsloth = as_bool(where, "use_unsloth_gc", doc.get("use_unsloth_gc", False))
    k["checkpointing"] = "off" if off else "unsloth" if unsloth else "full"
    if "disable_gradient_checkpointing" not in doc and "use_unsloth_gc" not in doc:
        assumed.append("gradient checkpointing on (LLaMA-Factory default: disable_gradient_checkpointing false)")
    if "use_reentrant_gc" in doc:
        k["reentrant"] = as_bool(where, "use_reentrant_gc", doc["use_reentrant_gc"])
    attn = doc.get("flash_attn", "auto")
    attention = FLASH_ATTN[as_choice(where, "flash_attn", attn, tuple(FLASH_ATTN))]
    if attention:
        k["attention"] = attention
    pure = as_bool(where, "pure_bf16", doc.get("pure_bf16", False))
    bf16 = as_bool(where, "bf16", doc.get("bf16", False))
    fp16 = as_bool(where, "fp16", doc.get("fp16", False))
    if bf16 and fp16:
        raise bad(where, "fp16", "bf16 and fp16 are both true; choose one")
    if pure:
        k["precision"], k["adapter_dtype"] = "bf16-pure", "bf16"  # trainable params stay bf16 (adapter.py)
    elif bf16:
        k["precision"] = "bf16-mixed"
    elif fp16:
        k["precision"] = "fp16-mixed"
    k["micro_batch"] = as_int(where, "per_device_train_batch_size",
                              _stated(doc, "per_device_train_batch_size", assumed, "HF TrainingArguments default"),
                              minimum=1)
    k["grad_accum"] = as_int(where, "gradient_accumulation_steps",
                             doc.get("gradient_accumulation_steps", 1), minimum=1)
    k["seq_len"] = as_int(where, "cutoff_len", _stated(doc, "cutoff_len", assumed), minimum=1)
    if as_bool(where, "enable_liger_kernel", doc.get("enable_liger_kernel", False)):
        k["loss"] = "liger"
    packing = doc.get("packing")
    neat = as_bool(where, "neat_packing", doc.get("neat_packing", False))
    if neat and stage != "sft":
        raise bad(where, "neat_packing", "LLaMA-Factory allows neat_packing only with stage sft")
    packed = neat or (as_bool(where, "packing", packing) if packing is not None else stage == "pt")
    k["padding"] = "packed" if packed else "padded"
    if doc.get("optim") is not None:
        k["optimizer"] = optimizer_from_hf(where, "optim", doc["optim"])
    if "low_cpu_mem_usage" in doc:
        k["low_cpu_mem_usage"] = as_bool(where, "low_cpu_mem_usage", doc["low_cpu_mem_usage"])
    return k


def _merge_deepspeed(knobs: dict, doc: dict, ds_cfg: ImportedConfig, where: str) -> None:
    """LLaMA-Factory's YAML wins for batch and precision; HF refuses a DeepSpeed file that states other
    numbers (`HfTrainerDeepSpeedConfig.trainer_config_finalize`: "mismatch" error)."""
    for knob, key, ds_key in (("micro_batch", "per_device_train_batch_size", "train_micro_batch_size_per_gpu"),
                              ("grad_accum", "gradient_accumulation_steps", "gradient_accumulation_steps")):
        if knob in ds_cfg.knobs and ds_cfg.knobs[knob] != knobs[knob]:
            raise bad(where, key, f"{knobs[knob]} but {ds_cfg.name} says {ds_key} {ds_cfg.knobs[knob]}; "
                      "HF Trainer refuses the mismatch (write \"auto\" in the DeepSpeed file)")
    if "precision" in ds_cfg.knobs and "precision" in knobs and ds_cfg.knobs["precision"] != knobs["precision"]:
        if not (knobs["precision"] == "bf16-pure" and ds_cfg.knobs["precision"] == "bf16-mixed"):
            raise bad(where, "bf16", f"the YAML says {knobs['precision']} but {ds_cfg.name} enables "
                      f"{ds_cfg.knobs['precision']}; HF Trainer refuses the mismatch")
    for key, value in ds_cfg.knobs.items():
        if key not in ("micro_batch", "grad_accum"):
            knobs.setdefault(key, value)
    if knobs.get("zero_stage") == 3 and knobs.get("precision") == "bf16-pure":
        raise bad(where, "pure_bf16", "LLaMA-Factory rejects pure_bf16 with DeepSpeed ZeRO-3")


def read(path_or_text, *, gpus: int | None = None, files: dict | None = None, path: Path | None = None,
         script: str | None = None) -> ImportedConfig:
    """`files` maps a path to text to use instead of the disk, and `path` says where given text lives
    (both for re-reading what was just written); `script`: the training script a launch runs it with
    (src/train_bash.py: its releases' defaults, llamafactory_releases.py)."""
    text, read_path = read_text(path_or_text, "LLaMA-Factory YAML")
    path = read_path or path
    where = str(path) if path else "LLaMA-Factory YAML"
    doc = yamltext.load(text, where)
    if is_v1(doc):  # v1's flat keys and plugin blocks (llamafactory_v1.py)
        return read_v1(doc, text, path, where, resolve_deepspeed, gpus=gpus, files=files)
    older = current(doc, where, script)  # other releases' keys and values, as the pinned release's
    view = older.doc
    _check_keys(view, where)
    assumed: list[str] = list(older.assumed)
    knobs = _knobs(view, where, assumed)
    companions = {}
    world = {"num_gpus": gpus} if gpus else {}
    if view.get("deepspeed") is not None:
        ds_value = as_str(where, "deepspeed", view["deepspeed"])
        ds_path = resolve_deepspeed(ds_value, path, where, files)
        ds_text = (files or {}).get(ds_path) or ds_path.read_text(encoding="utf-8")
        ds_cfg = ds.from_doc(jsontext.load(ds_text, str(ds_path)), ds_text, ds_path, str(ds_path),
                             profile=PROFILE, gpus=gpus)
        _merge_deepspeed(knobs, view, ds_cfg, where)
        companions["deepspeed"] = ds_cfg
        world = {**ds_cfg.world, **world}
    model = view.get("model_name_or_path")
    unmodelled = found(FORMAT, view, where)
    capped = caps(unmodelled)
    return ImportedConfig(format=FORMAT, profile=PROFILE, knobs=knobs, text=text, doc=doc, path=path,
                          model_name=model if isinstance(model, str) else None, world=world, assumed=assumed,
                          variant=entry_point(script) if script else None,
                          warnings=older.warnings + [w for w, _ in unmodelled], companions=companions,
                          unread=older.unread["unread"] + capped["unread"],
                          unread_host=older.unread["unread_host"] + capped["unread_host"])


# --- writing -------------------------------------------------------------------------------------------

def _flag(doc: dict, key: str, value: bool, default: bool) -> None:
    """A boolean key, changed with the fewest lines: edit it if present, add it only if not the default."""
    if key in doc or value != default:
        doc[key] = value


# Knobs that are one YAML key each, written as they are.
SAME_VALUE_KEYS = {"lora_rank": "lora_rank", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
                   "freeze_trainable_layers": "freeze_trainable_layers", "micro_batch": "per_device_train_batch_size",
                   "grad_accum": "gradient_accumulation_steps", "seq_len": "cutoff_len"}


def apply(doc: dict, changes: dict, imported: ImportedConfig) -> dict:
    doc = doc_copy(doc)
    for knob, value in changes.items():
        if knob in SAME_VALUE_KEYS:
            doc[SAME_VALUE_KEYS[knob]] = value
        elif knob == "tuning":
            if value in ("full", "freeze", "lora", None):
                doc["finetuning_type"] = value or "lora"
                doc.pop("quantization_bit", None)
            elif value == "qlora":
                bits = changes.get("quant_bits", imported.knobs.get("quant_bits", 4))
                doc["finetuning_type"], doc["quantization_bit"] = "lora", bits
        elif knob == "lora_targets":
            doc["lora_target"] = "all" if tuple(value or ("all-linear",)) == ("all-linear",) else ",".join(value)
        elif knob == "dora":
            _flag(doc, "use_dora", bool(value), False)
        elif knob == "double_quant":
            _flag(doc, "double_quantization", value is not False, True)
        elif knob == "quant_bits":
            if doc.get("quantization_bit") is not None or value not in (4, None):
                doc["quantization_bit"] = value or 4
        elif knob == "checkpointing":
            if value not in ("off", "full", "unsloth", None):
                raise cannot(imported, knob, value, "LLaMA-Factory has full, unsloth (use_unsloth_gc) or off")
            _flag(doc, "disable_gradient_checkpointing", value == "off", False)
            _flag(doc, "use_unsloth_gc", value == "unsloth", False)
        elif knob == "reentrant":
            _flag(doc, "use_reentrant_gc", value is not False, True)
        elif knob == "attention":
            if value is None:
                doc.pop("flash_attn", None)
            else:
                doc["flash_attn"] = FLASH_ATTN_NAME[value]
        elif knob == "precision":
            _precision(doc, value, imported)
        elif knob == "adapter_dtype":
            pure = changes.get("precision", imported.knobs.get("precision")) == "bf16-pure"
            if (value == "bf16") != pure and value is not None:
                raise cannot(imported, knob, value, "LLaMA-Factory keeps adapters in bf16 only with pure_bf16")
        elif knob == "loss":
            if value not in ("liger", "standard", None):
                raise cannot(imported, knob, value, "LLaMA-Factory has the standard loss or enable_liger_kernel")
            _flag(doc, "enable_liger_kernel", value == "liger", False)
        elif knob == "padding":
            _padding(doc, value, imported)
        elif knob == "optimizer":
            if value is None:
                doc.pop("optim", None)
            elif value not in HF_OPTIM_NAME:
                raise cannot(imported, knob, value)
            else:
                doc["optim"] = HF_OPTIM_NAME[value]
        elif knob == "low_cpu_mem_usage":
            _flag(doc, "low_cpu_mem_usage", value is not False, True)
        elif knob == "method":
            doc["stage"] = value or "sft"
        elif knob in ds.KNOBS or knob == "engine":
            continue  # the DeepSpeed file's business (write_files)
        else:
            raise cannot(imported, knob, value, "LLaMA-Factory has no such setting")
    return {k: v for k, v in doc.items() if v is not None or k in imported.doc}


def _precision(doc: dict, value, imported: ImportedConfig) -> None:
    if value == "bf16-pure":
        doc["bf16"] = True
        doc["pure_bf16"] = True
        _flag(doc, "fp16", False, False)
    elif value in ("bf16-mixed", "fp16-mixed"):
        bf16 = value == "bf16-mixed"
        _flag(doc, "bf16", bf16, False)
        _flag(doc, "fp16", not bf16, False)
        _flag(doc, "pure_bf16", False, False)
    elif value is None:
        for key in ("bf16", "fp16", "pure_bf16"):
            doc.pop(key, None)
    else:
        raise cannot(imported, "precision", value, "LLaMA-Factory trains in bf16, fp16 or pure_bf16")


def _padding(doc: dict, value, imported: ImportedConfig) -> None:
    if value == "padding_free":
        raise cannot(imported, "padding", value, "LLaMA-Factory packs (packing / neat_packing) or pads")
    packed = value == "packed"
    default = doc.get("stage", "sft") == "pt"
    if not packed:
        _flag(doc, "neat_packing", False, False)
    if packed and doc.get("neat_packing"):
        return
    if "packing" in doc or packed != default:
        doc["packing"] = packed


def write_files(imported: ImportedConfig, knobs: dict, folder: Path | None = None) -> list[WrittenFile]:
    """The YAML, and the DeepSpeed JSON when an engine knob changed: edited (into `folder` when given), or a new
    file in `folder` (default: beside the YAML) when there was none. `deepspeed:` names a new or moved file as
    LLaMA-Factory resolves it, from the working directory (base.launch_path)."""
    if imported.variant == "v1":  # v1's flat keys and plugin blocks (llamafactory_v1_write.py), read back here
        return llamafactory_v1_write.write_files(imported, knobs, folder, lambda text, files: read(
            text, gpus=imported.world.get("num_gpus"), files=files, path=imported.path))
    changes = changed_knobs(imported, knobs)
    if changes.get("engine") == "fsdp":
        raise cannot(imported, "engine", "fsdp", "LLaMA-Factory runs FSDP through an accelerate config; "
                     "write one with memfit's accelerate exporter")
    # in the keys of the file's release (the launch's script: imported.variant)
    doc = respell(imported.doc, apply(imported.doc, changes, imported), imported.name, imported.variant)
    out, files = deepspeed_files(imported, changes, doc, folder)
    text = yamltext.edit(imported.text, imported.doc, doc, imported.name, anchors=ANCHORS)
    again = read(text, gpus=imported.world.get("num_gpus"), files=files, path=imported.path, script=imported.variant)
    verify_written(imported, again, engine_free(imported, changes))
    return [WrittenFile(imported.path, imported.text, text)] + out


def write(imported: ImportedConfig, knobs: dict) -> str:
    return write_files(imported, knobs)[0].new_text


# --- a fresh file --------------------------------------------------------------------------------------

SECTIONS = {
    "model": ("model_name_or_path", "quantization_bit", "double_quantization", "flash_attn",
              "disable_gradient_checkpointing", "use_unsloth_gc", "use_reentrant_gc", "enable_liger_kernel",
              "low_cpu_mem_usage"),
    "method": ("stage", "do_train", "finetuning_type", "lora_rank", "lora_alpha", "lora_dropout", "lora_target",
               "use_dora", "freeze_trainable_layers", "deepspeed"),
    "dataset": ("cutoff_len", "packing", "neat_packing"),
    "train": ("per_device_train_batch_size", "gradient_accumulation_steps", "optim", "bf16", "fp16", "pure_bf16"),
}
ALWAYS = {"model_name_or_path", "stage", "do_train", "finetuning_type", "lora_rank", "lora_target", "cutoff_len",
          "per_device_train_batch_size", "gradient_accumulation_steps", "deepspeed"}


def export(knobs: dict, model_name: str | None = None, deepspeed_path: str | None = None) -> str:
    """A new training YAML in LLaMA-Factory's example layout (### model / method / dataset / train);
    keys equal to LLaMA-Factory's defaults are left out, except the ones its examples always state."""
    base = {"model_name_or_path": model_name or "MODEL", "stage": knobs.get("method", "sft"), "do_train": True}
    placeholder = ImportedConfig(format=FORMAT, profile=PROFILE, knobs={}, text="", doc=base)
    tuning = knobs.get("tuning", "full")
    fields = {k: v for k, v in knobs.items() if k not in ds.KNOBS and k not in ("engine", "method")}
    doc = apply(base, {"tuning": tuning, **fields}, placeholder)
    if deepspeed_path:
        doc["deepspeed"] = deepspeed_path
    known = _keys()
    kept = {k: v for k, v in doc.items() if k in ALWAYS or "default" not in known.get(k, {})
            or not same(known[k]["default"], v)}
    lines = []
    placed: set[str] = set()
    for section, names in SECTIONS.items():
        rows = [f"{k}: {yamltext.scalar(kept[k])}" for k in names if k in kept]
        placed.update(names)
        if section == "train":
            rows += [f"{k}: {yamltext.scalar(v)}" for k, v in kept.items() if k not in placed]
        if rows:
            lines += [f"### {section}", *rows, ""]
    text = "\n".join(lines)
    read(text, path=Path.cwd() / "new.yaml", files={Path.cwd() / deepspeed_path: "{}"} if deepspeed_path else None)
    return text

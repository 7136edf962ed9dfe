"""HF `TrainingArguments` and TRL `SFTConfig` / `DPOConfig` files, JSON or YAML (docs/knobs.md F.4, F.6).

Three shapes: plain TrainingArguments (`--config` of a Trainer script, `HfArgumentParser.parse_json_file`),
and TRL recipes for `trl sft|dpo --config x.yaml`, which mix ScriptArguments, the trainer config and
ModelConfig (`model_name_or_path`, `use_peft`, `lora_r`, `dtype`, `attn_implementation`, ...). The
shape is told by the keys (hf_keys.py); a key none of the shape's classes has is a warning, or an error when its
name says it is a memory setting memfit would not read (key tables from transformers 5.24 / TRL 1.16).

Precision: with DeepSpeed, bf16/fp16 mean DeepSpeed mixed precision (fp32 master weights); in a TRL
recipe the weights are loaded as ModelConfig `dtype` (default float32, TRL's `ModelConfig`) and
autocast to bf16, i.e. mixed; otherwise transformers 5 loads the checkpoint dtype (bf16) and trains it.
"""
from __future__ import annotations

from pathlib import Path

from memfit.interfaces.formats import deepspeed as ds
from memfit.interfaces.formats import jsontext, yamltext
from memfit.interfaces.formats.base import (HF_ATTENTION_NAME, HF_OPTIM_NAME, ImportedConfig, WrittenFile, as_bool,
                                            as_float, as_int, as_str, attention_from_hf, bad, cannot, changed_knobs,
                                            doc_copy, companion_target, lora_targets, optimizer_from_hf, read_text,
                                            shown, verify_written)
from memfit.interfaces.formats.hf_keys import (check_keys, ckpt_key, ckpt_kwargs_key, current_names, default, detect,
                                              get, spelling)
from memfit.interfaces.formats.not_modelled import caps, found
from memfit.interfaces.formats.tables import table

FORMAT = "hf"
PROFILES = {"training_args": "hf-trainer", "sft": "trl", "dpo": "trl"}
PEFT_DEFAULT_TARGETS = ("q_proj", "v_proj")  # PEFT's default for Llama/Qwen/Mistral when target_modules is None
FSDP_STRATEGIES = ("full_shard", "shard_grad_op", "hybrid_shard", "hybrid_shard_zero2", "no_shard")
def _fsdp(doc: dict, where: str) -> dict:
    value = doc.get("fsdp")
    config = doc.get("fsdp_config") or {}
    if value is True:  # transformers >= 5: fsdp=True, everything else in fsdp_config
        reshard = config.get("reshard_after_forward", True) if isinstance(config, dict) else True
        words = ["full_shard" if reshard in (True, "FULL_SHARD", "full_shard") else "shard_grad_op"]
        if isinstance(config, dict) and (config.get("cpu_offload") or config.get("offload_params")):
            words.append("offload")
    else:
        words = value.split() if isinstance(value, str) else value or []
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):  # a number, a mapping
            raise bad(where, "fsdp", f"expected FSDP options as words (e.g. \"full_shard auto_wrap\"), got {shown(value)}")
    if not words:
        return {}
    strategy = next((w for w in words if w in FSDP_STRATEGIES), "full_shard")
    knobs = {"engine": "fsdp", "fsdp_strategy": "hybrid_shard" if strategy.startswith("hybrid") else strategy,
             "fsdp_cpu_offload": "offload" in words}
    if isinstance(config, dict) and as_bool(where, "fsdp_config.activation_checkpointing",
                                            config.get("activation_checkpointing", False)):
        knobs["checkpointing"] = "full"
    if isinstance(config, dict) and config.get("version") is not None:  # absent: the transformers release decides
        knobs["fsdp_version"] = as_int(where, "fsdp_config.version", config["version"])
        if knobs["fsdp_version"] not in (1, 2):
            raise bad(where, "fsdp_config.version", f"expected 1 or 2, got {shown(config['version'])}")
    return knobs


def _dtype(doc: dict) -> str | None:
    kwargs = doc.get("model_init_kwargs") or {}
    return doc.get("dtype") or kwargs.get("dtype") or kwargs.get("torch_dtype")


def knobs_of(doc: dict, variant: str, where: str, assumed: list[str]) -> dict:
    k: dict = {}
    g = lambda key: get(doc, variant, key)  # noqa: E731
    if variant == "dpo":
        k["method"] = "dpo"
        if g("precompute_ref_log_probs"):
            k["precompute_ref_log_probs"] = True
    k["micro_batch"] = as_int(where, "per_device_train_batch_size", g("per_device_train_batch_size"), minimum=1)
    if "per_device_train_batch_size" not in doc:
        assumed.append(f"per_device_train_batch_size={k['micro_batch']} (TrainingArguments default)")
    k["grad_accum"] = as_int(where, "gradient_accumulation_steps", g("gradient_accumulation_steps"), minimum=1)
    ckpt = doc.get("activation_checkpointing", doc.get("gradient_checkpointing"))
    ckpt = default(variant, "gradient_checkpointing") if ckpt is None else ckpt
    k["checkpointing"] = "full" if ckpt else "off"
    kwargs = doc.get("activation_checkpointing_kwargs") or doc.get("gradient_checkpointing_kwargs") or {}
    if isinstance(kwargs, dict) and "use_reentrant" in kwargs:
        k["reentrant"] = as_bool(where, ckpt_kwargs_key(doc) + ".use_reentrant", kwargs["use_reentrant"])
    if doc.get("optim") is not None:
        k["optimizer"] = optimizer_from_hf(where, "optim", doc["optim"])
    if g("use_liger_kernel"):
        k["loss"] = "liger"
    elif variant == "sft" and doc.get("loss_type") in (None, "nll", "chunked_nll"):
        k["loss"] = "chunked_nll"  # TRL >= 1.7: nll is computed in chunks, without the full logits
    elif variant == "sft" and doc.get("loss_type") not in (None, "nll", "chunked_nll"):
        raise bad(where, "loss_type", f"{shown(doc['loss_type'])} is not modelled; memfit models nll (chunked)")
    if variant in ("sft", "dpo"):
        k["seq_len"] = as_int(where, "max_length", g("max_length"), minimum=1)
        if "max_length" not in doc:
            assumed.append(f"max_length={k['seq_len']} (TRL default)")
        if g("padding_free"):
            k["padding"] = "padding_free"
        elif variant == "sft" and g("packing"):
            k["padding"] = "packed"
        else:
            k["padding"] = "padded"
    attn = doc.get("attn_implementation") or (doc.get("model_init_kwargs") or {}).get("attn_implementation")
    if attn:
        k["attention"] = attention_from_hf(where, "attn_implementation", attn)
    if variant in ("sft", "dpo"):
        _peft(doc, variant, where, k, assumed)
    # engine
    if doc.get("deepspeed") is not None and doc.get("fsdp"):
        raise bad(where, "fsdp", "both deepspeed and fsdp are set; transformers refuses that")
    k.update(_fsdp(doc, where))
    bf16 = g("bf16")
    fp16 = as_bool(where, "fp16", g("fp16") or False)
    bf16 = (not fp16) if bf16 is None else as_bool(where, "bf16", bf16)  # TRL: bf16 None -> True unless fp16
    if bf16 and fp16:
        raise bad(where, "fp16", "bf16 and fp16 are both true; transformers refuses that")
    recipe = any(key in doc for key in table("hf")["ModelConfig"])
    dtype = _dtype(doc) or ("float32" if recipe else None)
    if doc.get("deepspeed") is not None:
        k["precision"] = "bf16-mixed" if bf16 else "fp16-mixed" if fp16 else None
    elif dtype == "float32":
        k["precision"] = "bf16-mixed" if bf16 else "fp16-mixed" if fp16 else "fp32"
        if recipe and "dtype" not in doc:
            assumed.append("dtype=float32 (TRL ModelConfig default): fp32 weights, autocast compute")
    elif fp16:
        k["precision"] = "fp16-mixed"
    elif bf16 and dtype in (None, "auto", "bfloat16"):
        k["precision"] = "bf16-pure"
    if k.get("precision") is None:
        k.pop("precision", None)
    return k


def _peft(doc: dict, variant: str, where: str, k: dict, assumed: list[str]) -> None:
    g = lambda key: get(doc, variant, key)  # noqa: E731
    if not g("use_peft"):
        for key in ("load_in_4bit", "load_in_8bit"):
            if g(key):
                raise bad(where, key, f"{key[8:]} loading trains only with use_peft: true")
        k["tuning"] = "full"
        return
    if g("load_in_4bit") and g("load_in_8bit"):
        raise bad(where, "load_in_8bit", "load_in_4bit and load_in_8bit are both true; choose one")
    k["tuning"] = "qlora" if g("load_in_4bit") or g("load_in_8bit") else "lora"
    if g("load_in_8bit"):
        k["quant_bits"] = 8
    k["lora_rank"] = as_int(where, "lora_r", g("lora_r"), minimum=1)
    k["lora_alpha"] = as_int(where, "lora_alpha", g("lora_alpha"))
    k["lora_dropout"] = as_float(where, "lora_dropout", g("lora_dropout"))
    targets = doc.get("lora_target_modules")
    if targets is None:
        k["lora_targets"] = PEFT_DEFAULT_TARGETS
        assumed.append("lora_target_modules=q_proj,v_proj (PEFT's default for Llama-style models)")
    else:
        k["lora_targets"] = lora_targets(where, "lora_target_modules", targets)
    k["dora"] = bool(g("use_dora"))
    if g("use_bnb_nested_quant") is not None and k["tuning"] == "qlora":
        k["double_quant"] = bool(g("use_bnb_nested_quant"))


def _load(text: str, where: str):
    if text.lstrip().startswith("{"):
        return "json", jsontext.load(text, where)
    return "yaml", yamltext.load(text, where)


def read(path_or_text, *, gpus: int | None = None, variant: str | None = None, files: dict | None = None,
         path: Path | None = None) -> ImportedConfig:
    text, read_path = read_text(path_or_text, "training arguments file")
    path = read_path or path
    where = str(path) if path else "training arguments"
    syntax, doc = _load(text, where)
    if not isinstance(doc, dict):
        raise bad(where, None, "expected a mapping of argument names to values")
    assumed: list[str] = []
    view = current_names(doc, where, assumed)
    variant = variant or detect(view, path.name if path else "")
    unmodelled = found("hf", view, where)
    warnings = check_keys(view, variant, where) + [w for w, _ in unmodelled]
    knobs = knobs_of(view, variant, where, assumed)
    companions = {}
    world = {"num_gpus": gpus} if gpus else {}
    dsv = doc.get("deepspeed")
    if isinstance(dsv, dict):
        for key, value in ds.engine_knobs(dsv, f"{where}: deepspeed").items():
            knobs.setdefault(key, value)
    elif dsv is not None:
        ds_path = _resolve(as_str(where, "deepspeed", dsv), path, where, files)
        ds_text = (files or {}).get(ds_path) or ds_path.read_text(encoding="utf-8")
        companion = ds.from_doc(jsontext.load(ds_text, str(ds_path)), ds_text, ds_path, str(ds_path),
                                profile=PROFILES[variant], gpus=gpus)
        for knob, name in (("micro_batch", "per_device_train_batch_size"), ("grad_accum", "gradient_accumulation_steps")):
            if knob in companion.knobs and companion.knobs[knob] != knobs[knob]:
                raise bad(where, name, f"{knobs[knob]} but {companion.name} says {companion.knobs[knob]}; "
                          "HF Trainer refuses the mismatch")
        for key, value in companion.knobs.items():
            if key not in ("micro_batch", "grad_accum", "precision"):
                knobs.setdefault(key, value)
        companions["deepspeed"] = companion
    model = doc.get("model_name_or_path")
    return ImportedConfig(format=FORMAT, profile=PROFILES[variant], knobs=knobs, text=text, doc=doc, path=path,
                          model_name=model if isinstance(model, str) else None, world=world,
                          variant=f"{variant}:{syntax}", assumed=assumed, warnings=warnings, companions=companions,
                          **caps(unmodelled))


def _resolve(value: str, path: Path | None, where: str, files: dict | None) -> Path:
    rel = Path(value)
    candidates = [rel] if rel.is_absolute() else [(path.parent if path else Path.cwd()) / rel, Path.cwd() / rel]
    written = {Path(p).resolve(): p for p in files or {}}
    for c in candidates:
        if c.resolve() in written:
            return written[c.resolve()]
        if c.is_file():
            return c
    raise bad(where, "deepspeed", f"{value}: no such file")


# --- writing -------------------------------------------------------------------------------------------

def _flag(doc: dict, key: str, value, unset) -> None:
    if key in doc or value != unset:
        doc[key] = value


# Knobs that are one TrainingArguments key each, written as they are.
SAME_VALUE_KEYS = {"micro_batch": "per_device_train_batch_size", "grad_accum": "gradient_accumulation_steps"}


def apply(doc: dict, changes: dict, imported: ImportedConfig) -> dict:
    doc = doc_copy(doc)
    variant = imported.variant_read.split(":")[0]
    trl = variant in ("sft", "dpo")
    for knob, value in changes.items():
        if knob in SAME_VALUE_KEYS:
            doc[SAME_VALUE_KEYS[knob]] = value
        elif knob == "checkpointing":
            if value not in ("full", "off", None):
                raise cannot(imported, knob, value, "transformers has full activation checkpointing or none")
            if doc.get("fsdp") and isinstance(doc.get("fsdp_config"), dict) and "activation_checkpointing" in doc["fsdp_config"]:
                doc["fsdp_config"] = dict(doc["fsdp_config"], activation_checkpointing=value == "full")
            else:
                _flag(doc, ckpt_key(doc), value == "full", bool(default(variant, "gradient_checkpointing")))
        elif knob == "reentrant":
            key = ckpt_kwargs_key(doc)
            kwargs = dict(doc.get(key) or {})
            if value is None:
                kwargs.pop("use_reentrant", None)
            else:
                kwargs["use_reentrant"] = bool(value)
            doc[key] = kwargs if kwargs or key in imported.doc else None
        elif knob == "optimizer":
            if value is not None and value not in HF_OPTIM_NAME:
                raise cannot(imported, knob, value)
            doc["optim"] = HF_OPTIM_NAME.get(value, default(variant, "optim"))
        elif knob == "loss":
            if value == "liger":
                doc["use_liger_kernel"] = True
            elif value in ("standard", "chunked_nll", None) and (value != "standard" or not trl or variant == "dpo"):
                _flag(doc, "use_liger_kernel", False, False)
            else:
                raise cannot(imported, knob, value, "TRL's SFT loss is chunked (nll) or Liger")
        elif knob == "seq_len":
            if not trl:
                raise cannot(imported, knob, value, "TrainingArguments has no sequence length (the data collator sets it)")
            doc[spelling(doc, "max_length")] = value
        elif knob == "padding":
            if not trl:
                raise cannot(imported, knob, value, "TrainingArguments has no packing setting")
            if value == "packed" and variant == "dpo":
                raise cannot(imported, knob, value, "DPOConfig has padding_free, not packing")
            _flag(doc, "padding_free", value == "padding_free", False)
            if variant == "sft":
                _flag(doc, "packing", value == "packed", False)
        elif knob == "attention":
            name = HF_ATTENTION_NAME[value] if value else None
            if trl or "attn_implementation" in doc:
                doc["attn_implementation"] = name
            elif isinstance(doc.get("model_init_kwargs"), dict):
                doc["model_init_kwargs"] = dict(doc["model_init_kwargs"], attn_implementation=name)
            else:
                raise cannot(imported, knob, value, "TrainingArguments does not load the model")
        elif knob in ("tuning", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "dora", "double_quant",
                      "quant_bits"):
            _peft_apply(doc, knob, value, changes, imported, trl)
        elif knob == "precision":
            _precision(doc, value, imported)
        elif knob == "precompute_ref_log_probs":
            _flag(doc, knob, bool(value), False)
        elif knob in ("engine", "fsdp_strategy", "fsdp_cpu_offload"):
            _engine(doc, knob, value, changes, imported)
        elif knob == "fsdp_version":
            if value is not None and (changes.get("engine") or imported.knobs.get("engine")) == "fsdp":
                doc["fsdp_config"] = dict(doc.get("fsdp_config") or {}, version=value)
        elif knob in ds.KNOBS:
            if isinstance(doc.get("deepspeed"), dict):
                doc["deepspeed"] = ds.apply_engine(doc["deepspeed"], {knob: value}, imported)
            elif doc.get("deepspeed") is None and value is not None and knob != "zero_stage":
                raise cannot(imported, knob, value, "the run has no DeepSpeed config")
        elif knob == "method":
            if value != imported.knobs.get("method", "sft"):
                raise cannot(imported, knob, value, f"this is a {variant} config")
        else:
            raise cannot(imported, knob, value, "no TrainingArguments / TRL setting for it")
    return {k: v for k, v in doc.items() if v is not None or k in imported.doc}


def _peft_apply(doc, knob, value, changes, imported, trl) -> None:
    if not trl:
        raise cannot(imported, knob, value, "TrainingArguments has no LoRA settings (a TRL recipe's use_peft does)")
    if knob == "tuning":
        if value not in ("full", "lora", "qlora", None):
            raise cannot(imported, knob, value, "TRL recipes train full or with PEFT LoRA")
        eight = value == "qlora" and changes.get("quant_bits", imported.knobs.get("quant_bits", 4)) == 8
        _flag(doc, "use_peft", value in ("lora", "qlora"), False)
        _flag(doc, "load_in_4bit", value == "qlora" and not eight, False)
        _flag(doc, "load_in_8bit", eight, False)
    elif knob == "lora_rank":
        doc["lora_r"] = value
    elif knob == "lora_alpha":
        doc["lora_alpha"] = value
    elif knob == "lora_dropout":
        doc["lora_dropout"] = value
    elif knob == "lora_targets":
        doc["lora_target_modules"] = "all-linear" if tuple(value or ()) == ("all-linear",) else list(value or [])
    elif knob == "dora":
        _flag(doc, "use_dora", bool(value), False)
    elif knob == "double_quant":
        _flag(doc, "use_bnb_nested_quant", bool(value), False)
    elif knob == "quant_bits" and (doc.get("load_in_4bit") or doc.get("load_in_8bit") or value == 8):
        _flag(doc, "load_in_4bit", value != 8, False)
        _flag(doc, "load_in_8bit", value == 8, False)


def _precision(doc: dict, value, imported: ImportedConfig) -> None:
    recipe = any(key in current_names(doc, imported.name, []) for key in table("hf")["ModelConfig"])
    dtype = spelling(doc, "dtype")
    variant = imported.variant_read.split(":")[0]
    bf16_default = default(variant, "bf16")
    with_ds = doc.get("deepspeed") is not None
    if value in ("bf16-mixed", "fp16-mixed", "fp32") and not with_ds:
        if not recipe:
            raise cannot(imported, "precision", value, "the model's load dtype is set in code; "
                         "with TRL write a recipe with model_name_or_path and dtype")
        doc[dtype] = "float32"
    elif value in ("bf16-pure",) and recipe:
        doc[dtype] = "bfloat16"
    elif value not in ("bf16-pure", "bf16-mixed", "fp16-mixed", None) or (value == "bf16-pure" and with_ds):
        raise cannot(imported, "precision", value)
    bf16 = value in ("bf16-mixed", "bf16-pure")
    fp16 = value == "fp16-mixed"
    if "bf16" in doc or bf16 != (bf16_default if bf16_default is not None else not fp16):
        doc["bf16"] = bf16
    _flag(doc, "fp16", fp16, False)


def _engine(doc, knob, value, changes, imported) -> None:
    engine = changes.get("engine", imported.knobs.get("engine"))
    if knob == "engine":
        if value == "fsdp" and not doc.get("fsdp"):
            doc.pop("deepspeed", None)
            doc["fsdp"] = "full_shard auto_wrap"
        elif value in ("ddp", "single", None):
            doc.pop("deepspeed", None)
            doc.pop("fsdp", None)
            doc.pop("fsdp_config", None)
        elif value == "deepspeed" and doc.get("deepspeed") is None:
            doc.pop("fsdp", None)
            stage_knobs = {k: v for k, v in {**imported.knobs, **changes}.items() if k in ds.KNOBS}
            doc["deepspeed"] = ds.fresh_doc(stage_knobs)
        return
    if engine != "fsdp":
        raise cannot(imported, knob, value, "the run is not FSDP")
    if doc.get("fsdp") is True:
        raise cannot(imported, knob, value, "with fsdp: true the strategy lives in fsdp_config; edit it there")
    words = (doc.get("fsdp") or "full_shard auto_wrap")
    words = words.split() if isinstance(words, str) else list(words)
    strategy = changes.get("fsdp_strategy", imported.knobs.get("fsdp_strategy", "full_shard"))
    offload = changes.get("fsdp_cpu_offload", imported.knobs.get("fsdp_cpu_offload", False))
    words = [strategy] + [w for w in words if w not in FSDP_STRATEGIES and w != "offload"] + (["offload"] if offload else [])
    doc["fsdp"] = " ".join(words) if isinstance(doc.get("fsdp"), str) or not doc.get("fsdp") else words


def write_files(imported: ImportedConfig, knobs: dict, folder: Path | None = None) -> list[WrittenFile]:
    """The file, and the DeepSpeed JSON it names when that changed (into `folder` when given, with the
    `deepspeed` path pointing there)."""
    changes = changed_knobs(imported, knobs)
    doc = apply(imported.doc, changes, imported)
    out, files = [], {}
    companion = imported.companions.get("deepspeed")
    ds_changes = {k: v for k, v in changes.items() if k in ds.KNOBS}
    if companion is not None and isinstance(doc.get("deepspeed"), str):
        ds_text = ds.write(companion, {**companion.knobs, **ds_changes}) if ds_changes else companion.text
        target, reference = companion_target(companion, ds_text, folder)
        if reference is not None:
            doc["deepspeed"] = reference
        if ds_text != companion.text:
            out.append(WrittenFile(target, companion.text, ds_text))
        files[target] = ds_text
    syntax = imported.variant_read.split(":")[1]
    editor = jsontext if syntax == "json" else yamltext
    text = editor.edit(imported.text, imported.doc, doc, imported.name)
    again = read(text, gpus=imported.world.get("num_gpus"), variant=imported.variant_read.split(":")[0], files=files,
                 path=imported.path)
    verify_written(imported, again, changes)
    return [WrittenFile(imported.path, imported.text, text)] + out


def write(imported: ImportedConfig, knobs: dict) -> str:
    return write_files(imported, knobs)[0].new_text


def export(knobs: dict, model_name: str | None = None, *, variant: str = "sft", syntax: str = "yaml") -> str:
    """A new TRL recipe (`trl sft --config`) or TrainingArguments file for these knobs."""
    base = {"output_dir": "output"}
    if variant != "training_args":
        base = {"model_name_or_path": model_name or "MODEL", **base}
    if syntax == "json":
        import json

        empty = json.dumps(base, indent=2) + "\n"
    else:
        empty = "\n".join(f"{k}: {yamltext.scalar(v)}" for k, v in base.items()) + "\n"
    placeholder = read(empty, variant=variant)
    wanted = {k: v for k, v in knobs.items() if k not in ("method",) and v is not None}
    if "engine" in wanted and wanted["engine"] in ("single", "ddp"):
        wanted.pop("engine")
    return write(placeholder, {**placeholder.knobs, **wanted})

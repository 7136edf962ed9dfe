"""axolotl training YAML (`axolotl train x.yaml`), with the DeepSpeed JSON it names.

Keys, types and defaults come from axolotl's pydantic schema (tables/axolotl.json, derived by tools/axolotl_table.py
from its source: axolotl pins its own torch, so it is not installed here). What axolotl does with them, from its
code (utils/config resolve_dtype / normalize_config, loaders/adapter.py): `bf16: auto` is bf16 on a GPU that has it,
and the model loads in that dtype (its weights train in 16 bit); no `adapter` trains every weight; `lora_r` and
`lora_alpha` unset are PEFT's 8 and 8; checkpointing without kwargs is reentrant. A key of another release is a
warning, a memory setting memfit does not read a refusal. `memfit fit` writes it with axolotl_write.py.
"""
from __future__ import annotations

import json
from pathlib import Path

from memfit.interfaces.formats import deepspeed as ds
from memfit.interfaces.formats import jsontext, yamltext
from memfit.interfaces.formats.base import (ImportedConfig, as_bool, as_choice, as_int, as_mapping, as_str, bad, named,
                                            optimizer_from_hf, read_text, shown, suggest)
from memfit.interfaces.formats.llamafactory import resolve_deepspeed
from memfit.interfaces.formats.not_modelled import caps, found
from memfit.interfaces.formats.tables import check_type, table

FORMAT = "axolotl"
PROFILES = {"sft": "hf-trainer", "dpo": "trl"}  # axolotl trains through HF Trainer, and TRL for `rl:`
ADAPTERS = ("lora", "qlora")
# attn_implementation values (and the legacy boolean flags, utils/schemas/enums.py LEGACY_ATTN_FLAG_TO_IMPL)
ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash_attention_2": "flash", "flash_attention_3": "flash",
             "kernels-community/flash-attn2": "flash", "kernels-community/flash-attn3": "flash"}
LEGACY_ATTENTION = {"flash_attention": "flash_attention_2", "sdp_attention": "sdpa", "eager_attention": "eager",
                    "xformers_attention": "xformers", "flex_attention": "flex_attention", "sage_attention": "sage"}
STRATEGIES = {"FULL_SHARD": "full_shard", "SHARD_GRAD_OP": "shard_grad_op", "NO_SHARD": "no_shard",
              "HYBRID_SHARD": "hybrid_shard", "full_shard": "full_shard", "shard_grad_op": "shard_grad_op",
              "no_shard": "no_shard", "hybrid_shard": "hybrid_shard"}
LIGER = "axolotl.integrations.liger"


def _keys() -> dict:
    t = table("axolotl")
    known = dict(t["keys"])
    for plugin_keys in t["plugins"].values():
        known.update(plugin_keys)
    return known


def _check_keys(doc: dict, where: str) -> list[str]:
    """Types of known keys; an unknown key is a warning naming the release the table comes from, unless its name
    says it changes memory (memfit would then misread the run: a refusal). Keys memfit names as not modelled
    (unsloth_* of older releases) are known."""
    known = _keys()
    others = table("not_modelled").get(FORMAT, {})
    words = table("hf_other_releases")["memory_words"]
    warnings = []
    for key, value in doc.items():
        if key in known:
            check_type(where, key, value, known[key])
        elif key in others:
            continue
        elif any(w in str(key).lower() for w in words):
            raise bad(where, key, f"unknown key that looks like a memory setting: not in {_source()}, so memfit "
                      f"cannot read it{suggest(str(key), known)}")
        else:
            warnings.append(f"{where}: {key}: not an axolotl key in {_source()}; read as not changing memory")
    return warnings


def _source() -> str:
    return table("axolotl")["source"].split(" (")[0]


def _get(doc: dict, key: str, assumed: list[str] | None = None, note: str = "axolotl default"):
    if doc.get(key) is not None:
        return doc[key]
    value = _keys()[key].get("default")
    if assumed is not None:
        assumed.append(f"{key}={value} ({note})")
    return value


def _tuning(doc: dict, where: str, k: dict, assumed: list[str]) -> None:
    adapter = doc.get("adapter")
    four = as_bool(where, "load_in_4bit", _get(doc, "load_in_4bit"))
    eight = as_bool(where, "load_in_8bit", _get(doc, "load_in_8bit"))
    if adapter in (None, ""):
        if four or eight:
            raise bad(where, "load_in_4bit" if four else "load_in_8bit", "a quantized base needs adapter lora or "
                      "qlora (axolotl cannot train quantized weights)")
        k["tuning"] = "full"
        return
    adapter = as_choice(where, "adapter", adapter, ADAPTERS)
    if eight and (four or adapter == "qlora"):
        raise bad(where, "load_in_8bit", "an 8-bit base with adapter qlora or load_in_4bit; choose one")
    k["tuning"] = "qlora" if adapter == "qlora" or four or eight else "lora"
    if eight:
        k["quant_bits"] = 8
    k["lora_rank"] = as_int(where, "lora_r", doc["lora_r"], minimum=1) if doc.get("lora_r") is not None else 8
    k["lora_alpha"] = as_int(where, "lora_alpha", doc["lora_alpha"]) if doc.get("lora_alpha") is not None else 8
    for key in ("lora_r", "lora_alpha"):
        if doc.get(key) is None:
            assumed.append(f"{key}=8 (unset: PEFT's LoraConfig default)")
    if doc.get("lora_dropout") is not None:
        k["lora_dropout"] = float(doc["lora_dropout"])
    k["lora_targets"] = _targets(doc, where)
    saved = doc.get("lora_modules_to_save")  # PEFT modules_to_save: trained copies of these modules
    if saved not in (None, [], ""):
        saved = [saved] if isinstance(saved, str) else saved
        if not isinstance(saved, list) or not all(isinstance(x, str) for x in saved):
            raise bad(where, "lora_modules_to_save", f"expected module names, got {shown(saved)}")
        k["modules_to_save"] = tuple(saved)
    if doc.get("peft_use_dora") is not None:
        k["dora"] = as_bool(where, "peft_use_dora", doc["peft_use_dora"])


def _targets(doc: dict, where: str) -> tuple[str, ...]:
    """lora_target_linear adds every linear layer to lora_target_modules (loaders/adapter.py); neither: PEFT's
    defaults for the architecture, which memfit does not know."""
    if doc.get("lora_target_linear") and as_bool(where, "lora_target_linear", doc["lora_target_linear"]):
        return ("all-linear",)
    value = doc.get("lora_target_modules")
    if value in (None, [], ""):
        raise bad(where, "lora_target_modules", "missing: say lora_target_modules or lora_target_linear: true "
                  "(memfit does not guess PEFT's per-architecture defaults)")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise bad(where, "lora_target_modules", f"expected module names, got {shown(value)}")
    return tuple(value)


def _precision(doc: dict, where: str, k: dict, assumed: list[str]) -> None:
    """resolve_dtype: the model loads in bf16 (bf16 true, or auto on a GPU with bf16), else fp16, else fp32, and
    trains those weights (no fp32 master copy): memfit's pure precisions."""
    bf16 = _get(doc, "bf16")
    fp16 = doc.get("fp16")
    if fp16 is not None and as_bool(where, "fp16", fp16) and bf16 is True:
        raise bad(where, "fp16", "bf16 and fp16 are both true; choose one")
    if fp16 is not None and as_bool(where, "fp16", fp16):
        k["precision"] = "fp16-pure"
    elif bf16 == "auto":
        k["precision"] = "bf16-pure"
        assumed.append("bf16: auto read as bf16 (axolotl picks it on a GPU with bf16; fp16 on one without)")
    elif as_bool(where, "bf16", bf16):
        k["precision"] = "bf16-pure"
    else:
        k["precision"] = "fp32"


def _checkpointing(doc: dict, where: str, k: dict, warnings: list[str]) -> None:
    value = _get(doc, "gradient_checkpointing")
    if value in ("offload", "offload_disk"):
        k["checkpointing"] = "offload"
        if value == "offload_disk":
            warnings.append(f"{where}: gradient_checkpointing=offload_disk: checkpoints go to disk; memfit counts "
                            "them in host RAM: host RAM too high")
    elif not isinstance(value, str) and as_bool(where, "gradient_checkpointing", value):
        k["checkpointing"] = "full"
    elif isinstance(value, str):
        raise bad(where, "gradient_checkpointing", f"expected true, false, offload or offload_disk; got {shown(value)}")
    else:
        k["checkpointing"] = "off"
    if k["checkpointing"] != "off":
        kwargs = as_mapping(where, "gradient_checkpointing_kwargs", doc.get("gradient_checkpointing_kwargs"))
        reentrant = kwargs.get("use_reentrant", True)  # normalize_config sets use_reentrant True when unset
        k["reentrant"] = as_bool(where, "gradient_checkpointing_kwargs.use_reentrant", reentrant)


def _attention(doc: dict, where: str, assumed: list[str]):
    impl = doc.get("attn_implementation")
    if impl is None:
        legacy = [key for key in LEGACY_ATTENTION if doc.get(key) is not None and as_bool(where, key, doc[key])]
        if not legacy:
            assumed.append("attention: transformers' choice (no attn_implementation or *_attention flag)")
            return None, None
        key, impl = legacy[0], LEGACY_ATTENTION[legacy[0]]
    else:
        key = "attn_implementation"
        impl = as_str(where, key, impl)
    return key, named(where, key, impl, ATTENTION, "attention")


def _padding(doc: dict, where: str, assumed: list[str]) -> str:
    if doc.get("sample_packing") is not None and as_bool(where, "sample_packing", doc["sample_packing"]):
        return "packed"
    pad = doc.get("pad_to_sequence_len")
    if pad is None or not as_bool(where, "pad_to_sequence_len", pad):
        assumed.append("rows padded to sequence_len (axolotl pads to the longest row of a batch: an upper bound)")
    return "padded"


def _fsdp(doc: dict, where: str, k: dict) -> None:
    words = doc.get("fsdp")
    config = as_mapping(where, "fsdp_config", doc.get("fsdp_config"))
    if not words and not config:
        return
    if doc.get("deepspeed") is not None:
        raise bad(where, "fsdp", "both deepspeed and fsdp are set; axolotl refuses that")
    words = [words] if isinstance(words, str) else list(words or [])
    get = lambda name: config.get(f"fsdp_{name}", config.get(name))  # noqa: E731 - both spellings in axolotl
    strategy = get("sharding_strategy")
    reshard = get("reshard_after_forward")
    if strategy is not None:
        k["fsdp_strategy"] = named(where, "fsdp_config.sharding_strategy", strategy, STRATEGIES, "sharding strategy")
    elif reshard is not None:
        k["fsdp_strategy"] = "full_shard" if as_bool(where, "fsdp_config.reshard_after_forward", reshard) \
            else "shard_grad_op"
    else:
        k["fsdp_strategy"] = next((STRATEGIES[w] for w in words if w in STRATEGIES), "full_shard")
    offload = get("offload_params")
    k["fsdp_cpu_offload"] = as_bool(where, "fsdp_config.offload_params", offload) if offload is not None \
        else "offload" in words
    loading = get("cpu_ram_efficient_loading")
    if loading is not None:
        k["fsdp_cpu_ram_efficient_loading"] = as_bool(where, "fsdp_config.cpu_ram_efficient_loading", loading)
    if get("activation_checkpointing") is not None and as_bool(where, "fsdp_config.activation_checkpointing",
                                                               get("activation_checkpointing")):
        k["checkpointing"] = "full"
    k["engine"] = "fsdp"


def _loss(doc: dict, where: str, k: dict) -> None:
    """The Liger plugin's fused linear cross entropy is memfit's `liger` loss; its other kernels are named as not
    modelled. Without the plugin listed, axolotl never reads the liger_* keys."""
    plugins = doc.get("plugins") or []
    if not isinstance(plugins, list):
        raise bad(where, "plugins", f"expected a list of plugin classes, got {shown(plugins)}")
    liger = any(isinstance(p, str) and p.startswith(LIGER) for p in plugins)
    if liger and doc.get("liger_fused_linear_cross_entropy") is not None and \
            as_bool(where, "liger_fused_linear_cross_entropy", doc["liger_fused_linear_cross_entropy"]):
        k["loss"] = "liger"


def _knobs(doc: dict, where: str, assumed: list[str], warnings: list[str]) -> dict:
    k: dict = {}
    rl = doc.get("rl")
    if rl not in (None, "dpo"):
        raise bad(where, "rl", f"{shown(rl)} training is not modelled for axolotl files; memfit reads SFT and DPO")
    k["method"] = "dpo" if rl == "dpo" else "sft"
    _tuning(doc, where, k, assumed)
    if doc.get("bnb_4bit_use_double_quant") is not None:
        k["double_quant"] = as_bool(where, "bnb_4bit_use_double_quant", doc["bnb_4bit_use_double_quant"])
    _precision(doc, where, k, assumed)
    _checkpointing(doc, where, k, warnings)
    _, attention = _attention(doc, where, assumed)
    if attention:
        k["attention"] = attention
    k["padding"] = _padding(doc, where, assumed)
    k["seq_len"] = as_int(where, "sequence_len", _get(doc, "sequence_len", None if "sequence_len" in doc else assumed),
                          minimum=1)
    k["micro_batch"] = as_int(where, "micro_batch_size",
                              _get(doc, "micro_batch_size", None if "micro_batch_size" in doc else assumed), minimum=1)
    k["grad_accum"] = as_int(where, "gradient_accumulation_steps", _get(doc, "gradient_accumulation_steps"), minimum=1)
    k["optimizer"] = optimizer_from_hf(where, "optimizer", _get(doc, "optimizer",
                                                                None if "optimizer" in doc else assumed))
    _loss(doc, where, k)
    _fsdp(doc, where, k)
    return k


def _deepspeed(doc: dict, where: str, path: Path | None, files: dict | None, gpus, profile: str) -> ImportedConfig:
    value = doc["deepspeed"]
    if isinstance(value, dict):  # axolotl also takes the DeepSpeed config inline
        return ds.from_doc(value, json.dumps(value), None, f"{where}: deepspeed", profile=profile, gpus=gpus)
    ds_path = resolve_deepspeed(as_str(where, "deepspeed", value), path, where, files)
    ds_text = (files or {}).get(ds_path) or ds_path.read_text(encoding="utf-8")
    return ds.from_doc(jsontext.load(ds_text, str(ds_path)), ds_text, ds_path, str(ds_path), profile=profile,
                       gpus=gpus)


def _merge_deepspeed(knobs: dict, ds_cfg: ImportedConfig, where: str) -> None:
    """axolotl fills the DeepSpeed file's "auto" from its own keys; HF Trainer refuses other numbers."""
    for knob, key, ds_key in (("micro_batch", "micro_batch_size", "train_micro_batch_size_per_gpu"),
                              ("grad_accum", "gradient_accumulation_steps", "gradient_accumulation_steps")):
        if knob in ds_cfg.knobs and ds_cfg.knobs[knob] != knobs[knob]:
            raise bad(where, key, f"{knobs[knob]} but {ds_cfg.name} says {ds_key} {ds_cfg.knobs[knob]}; "
                      "HF Trainer refuses the mismatch (write \"auto\" in the DeepSpeed file)")
    for key, value in ds_cfg.knobs.items():
        if key not in ("micro_batch", "grad_accum", "precision"):
            knobs.setdefault(key, value)


def read(path_or_text, *, gpus: int | None = None, files: dict | None = None, path: Path | None = None) -> ImportedConfig:
    text, read_path = read_text(path_or_text, "axolotl YAML")
    path = read_path or path
    where = str(path) if path else "axolotl YAML"
    doc = yamltext.load(text, where)
    if not isinstance(doc.get("base_model"), str):
        raise bad(where, "base_model", f"expected the model's name or path, got {shown(doc.get('base_model'))}")
    warnings = _check_keys(doc, where)
    assumed: list[str] = []
    knobs = _knobs(doc, where, assumed, warnings)
    profile = PROFILES[knobs["method"] if knobs["method"] == "dpo" else "sft"]
    companions = {}
    world = {"num_gpus": gpus} if gpus else {}
    if doc.get("deepspeed") is not None:
        ds_cfg = _deepspeed(doc, where, path, files, gpus, profile)
        _merge_deepspeed(knobs, ds_cfg, where)
        if ds_cfg.path is not None:
            companions["deepspeed"] = ds_cfg
        world = {**ds_cfg.world, **world}
    unmodelled = found(FORMAT, doc, where)
    warnings += [w for w, _ in unmodelled]
    return ImportedConfig(format=FORMAT, profile=profile, knobs=knobs, text=text, doc=doc, path=path,
                          model_name=doc["base_model"], world=world, assumed=assumed, warnings=warnings,
                          companions=companions, **caps(unmodelled))

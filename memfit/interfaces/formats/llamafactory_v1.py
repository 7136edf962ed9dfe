"""LLaMA-Factory v1 YAML (`USE_V1=1 llamafactory-cli sft config.yaml`; src/llamafactory/v1, examples/v1/): flat keys
(`model`, `micro_batch_size`, `cutoff_len`, `flash_attn`, `bf16`, `enable_activation_checkpointing`,
`batching_strategy`) and plugin blocks, each a mapping with a `name` (`peft_config`, `dist_config`, `quant_config`,
`kernel_config`, `optim_config`, `init_config`). Written by llamafactory_v1_write.py.

Keys are checked against v1's own argument dataclasses (tables/llamafactory_v1.json, from the installed release by
validate_llamafactory_v1.py; its parser refuses unknown keys). What v1 does with them, read from its code
(llamafactory 0.9.5 v1/core/model_engine.py, base_trainer.py, plugins/): full tuning upcasts the model to fp32 and
the loop has no autocast, so bf16 takes effect through FSDP2's MixedPrecisionPolicy (bf16 compute, fp32 reduce) or
the DeepSpeed file; LoRA keeps the checkpoint's dtype (`dtype="auto"`) with PEFT's fp32 adapters; activation
checkpointing is on by default, non-reentrant; the optimizer is torch.optim.AdamW; `dynamic_*` batching fills a
budget of micro_batch_size x cutoff_len tokens (batching.py), which is the rows x length memfit counts.
The trainer is chosen by the command (sft / dpo / rm), not the file: read as sft unless --method says otherwise.
"""
from __future__ import annotations

from memfit.interfaces.formats import deepspeed as ds
from memfit.interfaces.formats import jsontext
from memfit.interfaces.formats.base import (ImportedConfig, as_bool, as_choice, as_float, as_int, as_mapping, as_str,
                                            attention_from_hf, bad, lora_targets, shown, unknown_key)
from memfit.interfaces.formats.not_modelled import caps, line
from memfit.interfaces.formats.tables import check_type, table

FORMAT, PROFILE, VARIANT = "llamafactory", "llamafactory", "v1"
PLUGINS = ("peft_config", "dist_config", "quant_config", "kernel_config", "optim_config", "init_config",
           "lr_scheduler_config")
# keys only v1 has (v0 says model_name_or_path, per_device_train_batch_size, finetuning_type, deepspeed ...)
V1_KEYS = ("dist_config", "peft_config", "quant_config", "kernel_config", "optim_config", "init_config",
           "micro_batch_size", "batching_strategy", "enable_activation_checkpointing", "model_class", "train_dataset")
BATCHING = {"normal": "padded", "dynamic_batching": "padded", "padding_free": "padding_free",
            "dynamic_padding_free": "padding_free"}


def is_v1(doc) -> bool:
    return isinstance(doc, dict) and "model_name_or_path" not in doc and any(k in doc for k in V1_KEYS)


def _keys() -> dict:
    t = table("llamafactory_v1")
    return {k: v for cls in ("ModelArguments", "DataArguments", "TrainingArguments", "SampleArguments")
            for k, v in t[cls].items()}


def _value(doc: dict, key: str, assumed: list[str] | None = None):
    if key in doc and doc[key] is not None:
        return doc[key]
    default = _keys()[key].get("default")
    if assumed is not None and default is not None:
        assumed.append(f"{key}: {shown(default)} (LLaMA-Factory v1 default)")
    return default


def _plugin(doc: dict, key: str, where: str) -> dict | None:
    value = doc.get(key)
    if value is None:
        return None
    block = as_mapping(where, key, value)
    if "name" not in block:
        raise bad(where, key, "a plugin block needs a `name` (v1 arg_utils.get_plugin_config refuses it)")
    return block


def _check(doc: dict, where: str) -> None:
    known = _keys()
    for key, value in doc.items():
        if key not in known:
            raise unknown_key(where, key, known, "LLaMA-Factory v1")
        if key not in PLUGINS:
            check_type(where, key, value, known[key])


def _tuning(doc: dict, where: str, k: dict, notes: list[str], unmodelled: list[tuple[str, str]]) -> None:
    """`unmodelled`: (warning, errs) of what memfit does not model that can raise memory (it caps the verdict)."""
    peft, quant = _plugin(doc, "peft_config", where) or {}, _plugin(doc, "quant_config", where)
    name = peft["name"] if peft else "full"
    k["tuning"] = "full"
    if name == "lora":
        k["tuning"] = "lora"
        k["lora_rank"] = as_int(where, "peft_config.r", peft.get("r", 8))
        k["lora_alpha"] = as_int(where, "peft_config.lora_alpha", peft.get("lora_alpha", 16))
        k["lora_dropout"] = as_float(where, "peft_config.lora_dropout", peft.get("lora_dropout", 0.05))
        targets = peft.get("target_modules", "all")
        if isinstance(targets, str) and "," in targets:  # v1's peft plugin takes a string as one module's name
            raise bad(where, "peft_config.target_modules", f"{shown(targets)} is one module name to v1 (it matches no "
                      "module); write several as a list: [q_proj, v_proj]")
        k["lora_targets"] = lora_targets(where, "peft_config.target_modules", targets)
        k["dora"] = as_bool(where, "peft_config.use_dora", peft.get("use_dora", False))
        if peft.get("modules_to_save"):
            k["modules_to_save"] = lora_targets(where, "peft_config.modules_to_save", peft["modules_to_save"])
    elif name == "freeze":
        k["tuning"] = "freeze"
        k["freeze_trainable_layers"] = as_int(where, "peft_config.freeze_trainable_layers",
                                              peft.get("freeze_trainable_layers", 2))
        for key, what, errs in (("freeze_trainable_modules", "only those modules of the chosen layers train; memfit "
                                                               "estimates whole layers: too high", "high"),
                                ("freeze_extra_modules", "these modules train beside the chosen layers; memfit "
                                                         "estimates the layers alone: TOO LOW", "low")):
            if peft.get(key) not in (None, [], "all", ["all"]):
                unmodelled.append((f"{where}: peft_config.{key}={shown(peft[key])}: not modelled: {what}", errs))
    elif name != "full":
        raise bad(where, "peft_config.name", f"{shown(name)}: LLaMA-Factory v1 has lora and freeze")
    if quant:
        bits = quant.get("quantization_bit")
        if bits == 4 and k["tuning"] == "lora":
            k["tuning"], k["quant_bits"] = "qlora", 4
            k["double_quant"] = as_bool(where, "quant_config.double_quantization", quant.get("double_quantization", True))
        elif bits is not None:
            notes.append(f"{where}: quant_config.quantization_bit={shown(bits)}: not modelled: {bits}-bit weights "
                         f"with {k['tuning']} tuning; memfit estimates unquantized weights: too high")


def _engine(doc: dict, where: str, k: dict, files: dict | None, path, gpus, resolve) -> dict:
    """dist_config: none (one GPU, or DDP when launched on several), fsdp2, deepspeed (+ its JSON file)."""
    dist = _plugin(doc, "dist_config", where) or {}
    name = dist["name"] if dist else None
    bf16 = as_bool(where, "bf16", _value(doc, "bf16"))
    full = k["tuning"] in ("full", "freeze")
    if name is None:
        k["engine"] = "ddp" if (gpus or 1) > 1 else "single"
        # no autocast in v1's loop: full tuning runs the fp32 model; adapters train over the checkpoint's dtype
        k["precision"] = "fp32" if full else "bf16-pure"
        return {}
    if name == "fsdp2":
        k["engine"], k["fsdp_strategy"] = "fsdp", "full_shard" if dist.get("reshard_after_forward", True) else \
            "shard_grad_op"
        k["fsdp_cpu_offload"] = as_bool(where, "dist_config.offload_params", dist.get("offload_params", False))
        k["precision"] = "bf16-mixed" if bf16 else ("fp32" if full else "bf16-pure")
        return {}
    if name == "deepspeed":
        value = as_str(where, "dist_config.config_file", dist.get("config_file"))
        ds_path = resolve(value, path, where, files)
        ds_text = (files or {}).get(ds_path) or ds_path.read_text(encoding="utf-8")
        cfg = ds.from_doc(jsontext.load(ds_text, str(ds_path)), ds_text, ds_path, str(ds_path), profile=PROFILE,
                          gpus=gpus)
        for key, value in cfg.knobs.items():
            if key not in ("micro_batch", "grad_accum"):  # the YAML's micro_batch_size fills an "auto" batch
                k[key] = value
        k.setdefault("precision", "bf16-mixed" if bf16 else "fp32")
        return {"deepspeed": cfg}
    raise bad(where, "dist_config.name", f"{shown(name)} is not modelled (expert-parallel fsdpturbo and others); memfit "
              "reads fsdp2 and deepspeed")


def _not_modelled(doc: dict, where: str) -> list[tuple[str, str]]:
    """(warning, errs) from tables/not_modelled.json "llamafactory_v1": a key set away from its v1 default, or a
    plugin block (by `key.name`) that is present."""
    entries = table("not_modelled").get("llamafactory_v1", {})
    out = []
    for key, value in doc.items():
        if isinstance(value, dict):
            label, said = f"{key}.name", value.get("name")
        else:
            label, said = key, value
        entry = entries.get(label)  # ("_source" is no key v1 has)
        if entry is None or value is None or (label == key and value == _keys()[key].get("default")):
            continue
        out.append((line(where, label, said, entry), entry["errs"]))
    return out


def read_v1(doc: dict, text: str, path, where: str, resolve, *, gpus: int | None = None,
            files: dict | None = None) -> ImportedConfig:
    """`resolve(value, yaml_path, where, files)`: where a named DeepSpeed file is (llamafactory.resolve_deepspeed:
    v1's DeepSpeed plugin hands config_file to accelerate like v0's `deepspeed:` key)."""
    _check(doc, where)
    assumed: list[str] = ["LLaMA-Factory v1 YAML (USE_V1=1); trainer read as sft: v1 picks it from the command "
                          "(llamafactory-cli sft | dpo | rm); say --method for dpo / rm"]
    notes: list[str] = []
    k: dict = {"method": "sft", "autocast": False, "optimizer": "adamw-foreach", "reentrant": False, "loss": "standard"}
    unmodelled: list[tuple[str, str]] = []
    _tuning(doc, where, k, notes, unmodelled)
    companions = _engine(doc, where, k, files, path, gpus, resolve)
    k["attention"] = attention_from_hf(where, "flash_attn", _value(doc, "flash_attn", assumed))
    k["micro_batch"] = as_int(where, "micro_batch_size", _value(doc, "micro_batch_size", assumed), minimum=1)
    k["seq_len"] = as_int(where, "cutoff_len", _value(doc, "cutoff_len", assumed), minimum=1)
    k["checkpointing"] = "full" if as_bool(where, "enable_activation_checkpointing",
                                           _value(doc, "enable_activation_checkpointing", assumed)) else "off"
    strategy = as_choice(where, "batching_strategy", _value(doc, "batching_strategy"), BATCHING)
    k["padding"] = BATCHING[strategy]
    world = {"num_gpus": gpus} if gpus else {}
    if doc.get("global_batch_size") is not None and gpus:
        step = k["micro_batch"] * gpus  # v1: dp size = world size (0.9.5 has no context parallelism)
        total = as_int(where, "global_batch_size", doc["global_batch_size"], minimum=1)
        if total % step:
            raise bad(where, "global_batch_size", f"{total} is not micro_batch_size {k['micro_batch']} x {gpus} GPUs "
                      "x a whole number of accumulation steps")
        k["grad_accum"] = total // step
        world["global_batch"] = total
    model = doc.get("model")
    unmodelled += _not_modelled(doc, where)
    return ImportedConfig(format=FORMAT, profile=PROFILE, knobs=k, text=text, doc=doc, path=path,
                          model_name=model if isinstance(model, str) else None, world=world, variant=VARIANT,
                          assumed=assumed, warnings=notes + [w for w, _ in unmodelled], companions=companions,
                          **caps(unmodelled))

"""`memfit fit` on a LLaMA-Factory v1 YAML (USE_V1=1): the knobs the knob table's `says` column gives
`llamafactory_v1`, written in v1's own keys, and the DeepSpeed JSON `dist_config.config_file` names (ds_companion.py).

What v1 can say, read from its code (llamafactory 0.9.5, src/llamafactory/v1): the accumulation is not a key:
`global_batch_size` is micro_batch_size x data-parallel size x micro-batches per step (core/utils/batching.py), so a
new micro batch or accumulation restates it (and needs the GPU count); LoRA, freeze and QLoRA are `peft_config` and
`quant_config` blocks (its bnb plugin trains only over 4-bit weights); FSDP2's `reshard_after_forward` and
`offload_params` are the sharding and its offload; bf16 acts only through FSDP2's mixed-precision policy or the
DeepSpeed file; the optimizer (torch AdamW), the loss and non-reentrant checkpointing are fixed; there is no packing,
only padding-free batches. llamafactory.write_files hands v1 files here with its reader (`reread`), so this module
imports no reader of its own.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from memfit.interfaces.formats import deepspeed as ds
from memfit.interfaces.formats import yamltext
from memfit.interfaces.formats.base import (HF_ATTENTION_NAME, ImportedConfig, WrittenFile, cannot, changed_knobs,
                                            doc_copy, verify_written)
from memfit.interfaces.formats.ds_companion import deepspeed_files, engine_free

# Where a key memfit adds goes: after the first of these the file has (v1's example layout: model, plugins, data,
# training).
ANCHORS = {
    "peft_config": ["model_class", "model"], "quant_config": ["dist_config", "peft_config", "model_class", "model"],
    "dist_config": ["kernel_config", "peft_config", "model_class", "model"],
    "global_batch_size": ["micro_batch_size"], "micro_batch_size": ["output_dir", "train_dataset"],
    "cutoff_len": ["micro_batch_size", "output_dir"],
    "batching_strategy": ["micro_batch_size", "cutoff_len"],
    "flash_attn": ["batching_strategy", "micro_batch_size", "cutoff_len"],
    "enable_activation_checkpointing": ["cutoff_len", "micro_batch_size"],
    "bf16": ["cutoff_len", "micro_batch_size"],
}
LORA_KEYS = {"lora_rank": ("r", 8), "lora_alpha": ("lora_alpha", 16), "lora_dropout": ("lora_dropout", 0.05),
             "dora": ("use_dora", False)}
# batching_strategy for a padding knob, keeping the file's dynamic (token-budget) batching when it has it
STRATEGY = {("padded", False): "normal", ("padded", True): "dynamic_batching",
            ("padding_free", False): "padding_free", ("padding_free", True): "dynamic_padding_free"}
# knobs v1 fixes in its code, and why a file cannot say another value (the reader states the fixed one)
FIXED = {"optimizer": "v1 trains with torch.optim.AdamW (its optim_config plugin has no other optimizer)",
         "loss": "v1's loss is the standard cross entropy (kernel_config swaps modules, which memfit does not model)",
         "reentrant": "v1's activation checkpointing is always non-reentrant",
         "autocast": "v1's training loop has no autocast",
         "method": "v1 takes the trainer from the command (llamafactory-cli sft | dpo | rm), not from the file"}


def _flag(block: dict, key: str, value, default) -> None:
    """A key changed with the fewest lines: edited when present, added only when it is not v1's default."""
    if key in block or value != default:
        block[key] = value


def _mapping(doc: dict, key: str) -> dict:
    """The block at `key` when it is a mapping, else an empty one."""
    block = doc.get(key)
    return block if isinstance(block, dict) else {}


def _block(doc: dict, key: str, name: str, imported: ImportedConfig, knob: str, value) -> dict:
    block = doc.get(key)
    if not isinstance(block, dict) or block.get("name") != name:
        raise cannot(imported, knob, value, f"it is a {key} {name} setting and the file has no {key}: {{name: {name}}}")
    return block


def _tuning(doc: dict, value, changes: dict, imported: ImportedConfig) -> None:
    peft = _mapping(doc, "peft_config")
    if value == "full":
        doc.pop("peft_config", None)
        doc.pop("quant_config", None)
    elif value in ("lora", "qlora", "freeze"):
        name = "freeze" if value == "freeze" else "lora"
        doc["peft_config"] = dict(peft) if peft.get("name") == name else {"name": name}
        if value != "qlora":
            doc.pop("quant_config", None)
        else:
            bits = changes.get("quant_bits", imported.knobs.get("quant_bits", 4))
            if bits not in (4, None):
                raise cannot(imported, "quant_bits", bits, "v1's bnb plugin trains only over 4-bit weights")
            quant = _mapping(doc, "quant_config")
            doc["quant_config"] = {**({"name": "bnb"} if not quant else quant), "quantization_bit": 4}
    else:
        raise cannot(imported, "tuning", value, "LLaMA-Factory v1 trains every weight, LoRA, QLoRA or freeze")


def _lora(doc: dict, knob: str, value, imported: ImportedConfig) -> None:
    if value is None and not (isinstance(doc.get("peft_config"), dict) and doc["peft_config"].get("name") == "lora"):
        return  # back to the default of a block the run does not have: nothing to say
    block = _block(doc, "peft_config", "lora", imported, knob, value)
    if knob == "lora_targets":
        targets = tuple(value or ("all-linear",))
        # v1 reads a string as one module name ("all" = every linear layer), so several go as a list
        block["target_modules"] = "all" if targets == ("all-linear",) else list(targets)
    elif value is None:
        block.pop(LORA_KEYS[knob][0], None)
    else:
        _flag(block, *LORA_KEYS[knob][:1], value, LORA_KEYS[knob][1])


def _batch(doc: dict, changes: dict, imported: ImportedConfig) -> None:
    """micro_batch_size, and global_batch_size when the accumulation is not 1 or the file states it (v1's default
    global batch is one micro batch per GPU)."""
    micro = changes.get("micro_batch", imported.knobs.get("micro_batch", 1)) or 1
    accum = changes.get("grad_accum", imported.knobs.get("grad_accum", 1)) or 1
    doc["micro_batch_size"] = micro
    if accum == 1 and doc.get("global_batch_size") is None:
        return
    gpus = imported.world.get("num_gpus")
    if not gpus:
        knob = "grad_accum" if "grad_accum" in changes else "micro_batch"
        raise cannot(imported, knob, changes[knob], "v1 states the accumulation as global_batch_size, which needs "
                     "the GPU count (--gpus)")
    doc["global_batch_size"] = micro * accum * gpus


def _padding(doc: dict, value, imported: ImportedConfig) -> None:
    if value not in ("padded", "padding_free", None):
        raise cannot(imported, "padding", value, "LLaMA-Factory v1 pads or unpads rows (batching_strategy); it does "
                     "not pack")
    dynamic = str(doc.get("batching_strategy", "normal")).startswith("dynamic")
    _flag(doc, "batching_strategy", STRATEGY[(value or "padded", dynamic)], "normal")


def _engine(doc: dict, value, imported: ImportedConfig) -> None:
    dist = _mapping(doc, "dist_config")
    if value == "fsdp":
        doc["dist_config"] = dict(dist) if dist.get("name") == "fsdp2" else {"name": "fsdp2"}
    elif value == "deepspeed":
        doc["dist_config"] = dict(dist) if dist.get("name") == "deepspeed" else {"name": "deepspeed"}
    elif value in ("single", "ddp", None):
        doc.pop("dist_config", None)  # v1 runs plain data parallel on as many GPUs as it is launched on
    else:
        raise cannot(imported, "engine", value, "LLaMA-Factory v1 runs fsdp2, deepspeed or plain data parallel")


def _fsdp(doc: dict, knob: str, value, imported: ImportedConfig) -> None:
    if value is None and not (isinstance(doc.get("dist_config"), dict) and doc["dist_config"].get("name") == "fsdp2"):
        return
    block = _block(doc, "dist_config", "fsdp2", imported, knob, value)
    if knob == "fsdp_cpu_offload":
        _flag(block, "offload_params", bool(value), False)
    elif value in ("full_shard", "shard_grad_op", None):
        _flag(block, "reshard_after_forward", value != "shard_grad_op", True)
    else:
        raise cannot(imported, knob, value, "v1's fsdp2 shards fully (reshard_after_forward) or as shard_grad_op")


def _precision(doc: dict, value, engine, tuning, knob: str, asked, imported: ImportedConfig) -> None:
    """v1's `bf16` acts through FSDP2's mixed-precision policy (and a DeepSpeed file's "auto"); without either the
    run is what the model loads as: fp32 for full tuning, the checkpoint's bf16 under adapters. `knob`: the change
    set to `asked` that needs it (a new engine or tuning keeps the run's precision only where v1 can say it)."""
    plain = "fp32" if tuning in ("full", "freeze") else "bf16-pure"
    said = {"fsdp": ("bf16-mixed", plain), "deepspeed": ("bf16-mixed", "fp32")}.get(engine, (plain,))
    if value not in (*said, None):
        raise cannot(imported, knob, asked, f"LLaMA-Factory v1 with engine {engine} and {tuning} tuning trains in "
                     f"{' or '.join(said)} (bf16 mixed precision needs fsdp2 or DeepSpeed), not {value}")
    if engine in ("fsdp", "deepspeed") and value is not None:
        _flag(doc, "bf16", value == "bf16-mixed", True)  # a DeepSpeed file that states its own precision wins


def apply(doc: dict, changes: dict, imported: ImportedConfig) -> dict:
    doc = doc_copy(doc)
    engine = changes.get("engine", imported.knobs.get("engine"))
    tuning = changes.get("tuning", imported.knobs.get("tuning"))
    if "engine" in changes:  # the blocks first: the knobs below edit inside them
        _engine(doc, engine, imported)
    if "tuning" in changes:
        _tuning(doc, tuning, changes, imported)
    for knob, value in changes.items():
        if knob in ("engine", "tuning") or knob in ds.KNOBS:
            continue  # done above; the DeepSpeed file's business (write_files)
        if knob in LORA_KEYS or knob == "lora_targets":
            _lora(doc, knob, value, imported)
        elif knob == "freeze_trainable_layers":
            if value is not None:
                _flag(_block(doc, "peft_config", "freeze", imported, knob, value), "freeze_trainable_layers", value, 2)
        elif knob == "quant_bits":
            if value not in (4, None):
                raise cannot(imported, knob, value, "v1's bnb plugin trains only over 4-bit weights")
        elif knob == "double_quant":
            quant = doc.get("quant_config")
            if isinstance(quant, dict) and tuning == "qlora":
                _flag(quant, "double_quantization", value is not False, True)
            elif value is False:
                raise cannot(imported, knob, value, "the file has no 4-bit quant_config")
        elif knob in ("micro_batch", "grad_accum"):
            _batch(doc, changes, imported)
        elif knob == "seq_len":
            doc["cutoff_len"] = value
        elif knob == "checkpointing":
            if value not in ("full", "off", None):
                raise cannot(imported, knob, value, "LLaMA-Factory v1 checkpoints every layer or none "
                             "(enable_activation_checkpointing)")
            _flag(doc, "enable_activation_checkpointing", value != "off", True)
        elif knob == "attention":
            if value is None:
                doc.pop("flash_attn", None)
            else:
                doc["flash_attn"] = HF_ATTENTION_NAME[value]
        elif knob == "padding":
            _padding(doc, value, imported)
        elif knob in ("fsdp_strategy", "fsdp_cpu_offload"):
            _fsdp(doc, knob, value, imported)
        elif knob == "precision":
            continue  # below, with the engine and the tuning it depends on
        elif knob in FIXED:
            raise cannot(imported, knob, value, FIXED[knob])
        else:
            raise cannot(imported, knob, value, "LLaMA-Factory v1 has no such setting")
    asker = next((k for k in ("precision", "engine", "tuning") if k in changes), None)
    if asker:
        _precision(doc, changes.get("precision", imported.knobs.get("precision")), engine, tuning, asker,
                   changes[asker], imported)
    return doc


def _deepspeed(imported: ImportedConfig, changes: dict, doc: dict, folder: Path | None):
    """ds_companion works on a `deepspeed:` key (v0 and axolotl); v1 names the file in dist_config.config_file."""
    dist = _mapping(doc, "dist_config")
    scratch = {"deepspeed": dist["config_file"]} if dist.get("name") == "deepspeed" and "config_file" in dist else {}
    out, files = deepspeed_files(imported, changes, scratch, folder)
    if "deepspeed" in scratch:
        doc["dist_config"] = {**(dist if dist.get("name") == "deepspeed" else {"name": "deepspeed"}),
                              "config_file": scratch["deepspeed"]}
    return out, files


def write_files(imported: ImportedConfig, knobs: dict, folder: Path | None, reread: Callable) -> list[WrittenFile]:
    """The YAML, and the DeepSpeed JSON when an engine knob changed: edited (into `folder` when given), or a new
    file in `folder` (default: beside the YAML), named as accelerate opens it: from the working directory.
    `reread(text, files)`: the format's reader on the new text, with `files` standing in for the disk."""
    changes = changed_knobs(imported, knobs)
    doc = apply(imported.doc, changes, imported)
    out, files = _deepspeed(imported, changes, doc, folder)
    text = yamltext.edit(imported.text, imported.doc, doc, imported.name, anchors=ANCHORS)
    verify_written(imported, reread(text, files), engine_free(imported, changes))
    return [WrittenFile(imported.path, imported.text, text)] + out

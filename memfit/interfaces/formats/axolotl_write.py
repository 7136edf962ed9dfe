"""`memfit fit` on an axolotl YAML: the knobs the knob table's `says` column gives axolotl, written in the file's own
keys and style (the boolean attention flags of older releases stay flags), and the DeepSpeed JSON the YAML names
(ds_companion.py); every write is read back with axolotl.read. fsdp_config is not written. The format registry
(formats/__init__.py) takes this module for axolotl: its reader and its writers."""
from __future__ import annotations

from pathlib import Path

from memfit.interfaces.formats import deepspeed as ds
from memfit.interfaces.formats import yamltext
from memfit.interfaces.formats.axolotl import FORMAT, LEGACY_ATTENTION, LIGER, PROFILES, read  # noqa: F401 (the format's reader)
from memfit.interfaces.formats.base import (HF_OPTIM_NAME, ImportedConfig, WrittenFile, cannot, changed_knobs, doc_copy,
                                            verify_written)
from memfit.interfaces.formats.ds_companion import deepspeed_files, engine_free

# Where a key memfit adds goes: after the first of these the file has (axolotl's example layout).
ANCHORS = {
    "adapter": ["output_dir", "datasets", "base_model"], "load_in_4bit": ["adapter", "base_model"],
    "lora_r": ["adapter", "output_dir"], "lora_alpha": ["lora_r", "adapter", "output_dir"],
    "lora_dropout": ["lora_alpha", "lora_r", "adapter", "output_dir"],
    "lora_target_linear": ["lora_dropout", "lora_alpha", "lora_r", "adapter", "output_dir"],
    "lora_target_modules": ["lora_dropout", "lora_alpha", "lora_r", "adapter", "output_dir"],
    "peft_use_dora": ["lora_target_modules", "lora_target_linear", "adapter", "output_dir"],
    "sample_packing": ["sequence_len"], "gradient_checkpointing_kwargs": ["gradient_checkpointing"],
    "deepspeed": ["gradient_checkpointing", "bf16"],
    **{key: ["gradient_checkpointing_kwargs", "gradient_checkpointing", "bf16"]
       for key in ("attn_implementation", *LEGACY_ATTENTION)},
}
SAME_VALUE_KEYS = {"lora_rank": "lora_r", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
                   "micro_batch": "micro_batch_size", "grad_accum": "gradient_accumulation_steps",
                   "seq_len": "sequence_len", "dora": "peft_use_dora", "low_cpu_mem_usage": "low_cpu_mem_usage"}
ATTENTION_NAME = {"eager": "eager", "sdpa": "sdpa", "flash": "flash_attention_2"}
LEGACY_NAME = {"eager": "eager_attention", "sdpa": "sdp_attention", "flash": "flash_attention"}
CHECKPOINTING_NAME = {"off": False, "full": True, "offload": "offload"}


def _write_tuning(doc: dict, value, changes: dict, imported: ImportedConfig) -> None:
    if value == "full":
        for key in ("adapter", "load_in_4bit", "load_in_8bit"):
            doc.pop(key, None)
    elif value in ("lora", "qlora"):
        eight = value == "qlora" and changes.get("quant_bits", imported.knobs.get("quant_bits", 4)) == 8
        doc["adapter"] = "lora" if eight else value
        for key, on in (("load_in_4bit", value == "qlora" and not eight), ("load_in_8bit", eight)):
            if on or doc.get(key) is not None:
                doc[key] = on
        if doc.get("lora_target_modules") is None and doc.get("lora_target_linear") is None:
            doc["lora_target_linear"] = True
    else:
        raise cannot(imported, "tuning", value, "axolotl trains every weight, LoRA or QLoRA")


def _write_attention(doc: dict, value) -> None:
    legacy = any(doc.get(key) is not None for key in LEGACY_ATTENTION)
    for key in LEGACY_ATTENTION:
        doc.pop(key, None)
    doc.pop("attn_implementation", None)
    if value is not None and legacy:  # keep the file's own style: the boolean flags of older releases
        doc[LEGACY_NAME[value]] = True
    elif value is not None:
        doc["attn_implementation"] = ATTENTION_NAME[value]


def _write_precision(doc: dict, value, imported: ImportedConfig) -> None:
    if value not in ("bf16-pure", "fp16-pure", "fp32"):
        raise cannot(imported, "precision", value, "axolotl trains its weights in their loaded dtype: bf16, fp16 "
                     "or fp32")
    if value != "bf16-pure" or doc.get("bf16") != "auto":  # auto stays bf16 on a GPU that has it
        doc["bf16"] = value == "bf16-pure"
    if value == "fp16-pure" or doc.get("fp16") is not None:
        doc["fp16"] = value == "fp16-pure"


def _write_loss(doc: dict, value, imported: ImportedConfig) -> None:
    """Liger's fused linear cross entropy: the plugin listed and its key on (axolotl reads liger_* keys only then)."""
    if value not in ("liger", "standard", None):
        raise cannot(imported, "loss", value, "axolotl has the standard loss or the Liger plugin's fused one")
    if value == "liger":
        plugins = list(doc.get("plugins") or [])
        if not any(isinstance(x, str) and x.startswith(LIGER) for x in plugins):
            doc["plugins"] = plugins + [f"{LIGER}.LigerPlugin"]
        doc["liger_fused_linear_cross_entropy"] = True
    elif doc.get("liger_fused_linear_cross_entropy") is not None:
        doc["liger_fused_linear_cross_entropy"] = False


def apply(doc: dict, changes: dict, imported: ImportedConfig) -> dict:
    doc = doc_copy(doc)
    for knob, value in changes.items():
        if knob in SAME_VALUE_KEYS:
            doc[SAME_VALUE_KEYS[knob]] = value
        elif knob == "tuning":
            _write_tuning(doc, value, changes, imported)
        elif knob == "quant_bits":
            if "tuning" not in changes and imported.knobs.get("tuning") == "qlora":
                _write_tuning(doc, "qlora", changes, imported)
        elif knob == "lora_targets":
            all_linear = tuple(value or ("all-linear",)) == ("all-linear",)
            doc.pop("lora_target_linear" if not all_linear else "lora_target_modules", None)
            if all_linear:
                doc["lora_target_linear"] = True
            else:
                doc["lora_target_modules"] = list(value)
        elif knob == "double_quant":
            if value is False or doc.get("bnb_4bit_use_double_quant") is not None:
                doc["bnb_4bit_use_double_quant"] = value is not False
        elif knob == "checkpointing":
            if value not in CHECKPOINTING_NAME:
                raise cannot(imported, knob, value, "axolotl has gradient_checkpointing true, false or offload")
            doc["gradient_checkpointing"] = CHECKPOINTING_NAME[value]
        elif knob == "reentrant":
            doc["gradient_checkpointing_kwargs"] = {**(doc.get("gradient_checkpointing_kwargs") or {}),
                                                    "use_reentrant": value is not False}
        elif knob == "attention":
            _write_attention(doc, value)
        elif knob == "precision":
            _write_precision(doc, value, imported)
        elif knob == "padding":
            if value == "padding_free":
                raise cannot(imported, knob, value, "axolotl packs (sample_packing) or pads")
            doc["sample_packing"] = value == "packed"
        elif knob == "optimizer":
            if value not in HF_OPTIM_NAME:
                raise cannot(imported, knob, value)
            doc["optimizer"] = HF_OPTIM_NAME[value]
        elif knob == "loss":
            _write_loss(doc, value, imported)
        elif knob in ds.KNOBS or knob == "engine":
            continue  # the DeepSpeed file's business (write_files)
        else:
            raise cannot(imported, knob, value, "axolotl has no such setting")
    return doc


def write_files(imported: ImportedConfig, knobs: dict, folder: Path | None = None) -> list[WrittenFile]:
    """The YAML, and the DeepSpeed JSON it names when an engine knob changed (edited, or a new file beside the YAML
    or in `folder`), named as HF Trainer opens it: from the working directory."""
    changes = changed_knobs(imported, knobs)
    if changes.get("engine") == "fsdp" or (imported.knobs.get("engine") == "fsdp" and changes):
        knob = "engine" if "engine" in changes else next(iter(changes))
        raise cannot(imported, knob, changes[knob], "memfit writes axolotl's DeepSpeed runs, not its fsdp_config")
    doc = apply(imported.doc, changes, imported)
    out, files = deepspeed_files(imported, changes, doc, folder)
    text = yamltext.edit(imported.text, imported.doc, doc, imported.name, anchors=ANCHORS)
    again = read(text, gpus=imported.world.get("num_gpus"), files=files, path=imported.path)
    verify_written(imported, again, engine_free(imported, changes))
    return [WrittenFile(imported.path, imported.text, text)] + out


def export(knobs: dict, model_name: str | None = None, deepspeed_path: str | None = None) -> str:
    """A new training YAML with the keys memfit reads (datasets and the rest left to the user)."""
    base = {"base_model": model_name or "MODEL"}
    placeholder = ImportedConfig(format=FORMAT, profile=PROFILES["sft"], knobs={}, text="", doc=base)
    fields = {k: v for k, v in knobs.items() if k not in ds.KNOBS and k not in ("engine", "method")}
    doc = apply(base, {"tuning": knobs.get("tuning", "full"), **fields}, placeholder)
    if deepspeed_path:
        doc["deepspeed"] = deepspeed_path
    text = "".join(f"{k}: {yamltext.scalar(v)}\n" if not isinstance(v, (list, dict)) else
                   f"{k}:\n" + "".join(f"  - {x}\n" for x in v) if isinstance(v, list) else
                   f"{k}:\n" + "".join(f"  {a}: {yamltext.scalar(b)}\n" for a, b in v.items()) for k, v in doc.items())
    read(text, path=Path.cwd() / "new.yaml", files={Path.cwd() / deepspeed_path: "{}"} if deepspeed_path else None)
    return text


def write(imported: ImportedConfig, knobs: dict) -> str:
    return write_files(imported, knobs)[0].new_text

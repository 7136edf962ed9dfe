"""Qwen-1's own fine-tuning script (QwenLM/Qwen finetune.py): its arguments beyond transformers' TrainingArguments,
read as memfit knobs (tables/qwen_finetune.json names the commit read and what train() does with each one).

launch_script.py hands a launch of it here when the script is named finetune.py and passes at least one flag only
that script has (--use_lora, --q_lora, --model_max_length): another project's finetune.py without them stays a plain
TrainingArguments script, its unknown flags named. What changes memory:
- every row is padded to --model_max_length (default 8192) and truncated there: seq_len, padded;
- --use_lora: PEFT LoRA (r 64, alpha 16, dropout 0.05 on c_attn, c_proj, w1, w2 unless given); a model whose name
  has no "chat" (and no --q_lora) also trains copies of wte and lm_head (modules_to_save);
- --q_lora (with --use_lora): LoRA over a GPTQ 4-bit base; PEFT's kbit preparation does not upcast a GPTQ model;
- its TrainingArguments default optim is adamw_torch (transformers': adamw_torch_fused);
- ZeRO-3 with LoRA on a base model is refused by the script itself.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from memfit.interfaces.formats.base import (ImportedConfig, as_bool, as_choice, as_float, as_int, bad,
                                            optimizer_from_hf, shown)
from memfit.interfaces.formats.tables import check_type, table

TABLE = "qwen_finetune"


def facts() -> dict:
    return table(TABLE)


def matches(script: str, flags: dict) -> bool:
    """Is the launched script Qwen's finetune.py? Its name and one of the flags only it has."""
    return Path(script).name == facts()["script"] and bool(set(flags) & set(facts()["detect"]))


def take(flags: dict) -> dict:
    """Remove finetune.py's own arguments from `flags` (what is left are transformers' TrainingArguments; the model
    name stays, the launch reader reads it)."""
    own = facts()["arguments"]
    return {k: flags.pop(k) for k in list(flags) if k in own and k != "model_name_or_path"}


def _values(own: dict, label: str) -> dict:
    """Each argument as given, else finetune.py's default; types checked as HfArgumentParser would."""
    out = {}
    for key, spec in facts()["arguments"].items():
        value = own.get(key, spec["default"])
        check_type(label, f"--{key}", value, {k: v for k, v in spec.items() if k != "choices"})
        out[key] = value
    return out


def _model(model: str | None) -> str:
    """The model finetune.py loads: the flag's, else ModelArguments' default."""
    return model or facts()["arguments"]["model_name_or_path"]["default"]


def _is_chat(model: str | None) -> bool:
    """finetune.py's own test (`'chat' in model_name_or_path.lower()`): the name as typed, not the catalog's id."""
    return "chat" in _model(model).lower()


def _targets(value) -> tuple[str, ...]:
    """PEFT target names as memfit's Qwen-1 architecture names them (c_proj is the attention's and the MLP's)."""
    names = [value] if isinstance(value, str) else list(value)
    mapped = facts()["target_names"]
    return tuple(n for name in names for n in mapped.get(str(name), [str(name)]))


def knobs(own: dict, model: str | None, label: str, notes: list[str]) -> dict:
    """The knobs finetune.py's arguments set, with notes (a "!" note is a warning) on what they imply."""
    v = _values(own, label)
    seq = as_int(label, "--model_max_length", v["model_max_length"], minimum=1)
    k: dict = {"seq_len": seq, "padding": "padded"}
    said = "" if "model_max_length" in own else " (finetune.py's default)"
    notes.append(f"{label}: finetune.py pads every row to --model_max_length {seq}{said}: {seq} tokens, padded")
    use_lora, q_lora = as_bool(label, "--use_lora", v["use_lora"]), as_bool(label, "--q_lora", v["q_lora"])
    if not use_lora:
        k["tuning"] = "full"
        if q_lora:
            notes.append(f"!{label}: --q_lora without --use_lora: finetune.py passes no 4-bit config and adds no "
                         "adapters (only places the model on the local GPU): read as a full fine-tune")
        return k
    k["tuning"] = "qlora" if q_lora else "lora"
    k["lora_rank"] = as_int(label, "--lora_r", v["lora_r"], minimum=1)
    k["lora_alpha"] = as_int(label, "--lora_alpha", v["lora_alpha"])
    k["lora_dropout"] = as_float(label, "--lora_dropout", v["lora_dropout"])
    k["lora_targets"] = _targets(v["lora_target_modules"])
    defaulted = [f"--{a}" for a in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules") if a not in own]
    if defaulted:
        notes.append(f"{label}: finetune.py's LoraArguments defaults for {', '.join(defaulted)}: r {k['lora_rank']}, "
                     f"alpha {k['lora_alpha']}, dropout {k['lora_dropout']}, targets {', '.join(k['lora_targets'])}")
    if not q_lora and not _is_chat(model):
        k["modules_to_save"] = tuple(facts()["modules_to_save"]["knob"])
        notes.append(f"{label}: LoRA on a model whose name has no 'chat' ({_model(model)}): finetune.py also trains "
                     "copies of wte and lm_head (PEFT modules_to_save)")
    if q_lora:
        k["kbit_upcast"] = bool(facts()["q_lora_kbit_upcast"])
        notes.append(f"{label}: --q_lora: LoRA over a GPTQ 4-bit checkpoint (finetune.py's GPTQConfig(bits=4)); "
                     f"PEFT {facts()['versions']['peft']} keeps a GPTQ model's other weights in their dtype (no fp32 "
                     "upcast). Qwen's README: use an Int4 checkpoint with --q_lora")
    bias = as_choice(label, "--lora_bias", v["lora_bias"], facts()["arguments"]["lora_bias"]["choices"])
    if bias != "none":
        notes.append(f"~{label}: --lora_bias {bias}: not modelled: {facts()['arguments']['lora_bias']['does']}")
    return k


def apply(part: ImportedConfig, own: dict, label: str, notes: list[str]) -> ImportedConfig:
    """The TrainingArguments part of the launch with finetune.py's own knobs over it."""
    model = part.model_name
    k = knobs(own, model, label, notes)
    zero3 = part.knobs.get("engine") == "deepspeed" and part.knobs.get("zero_stage") == 3
    if zero3 and k["tuning"] == "lora" and not _is_chat(model):
        raise bad(label, "--use_lora", f"finetune.py refuses ZeRO-3 with LoRA on a base model ({_model(model)}: no "
                  "'chat' in its name): 'ZeRO3 is incompatible with LoRA when finetuning on base model'")
    if k["tuning"] == "qlora" and (zero3 or part.knobs.get("engine") == "fsdp"):
        notes.append(f"!{label}: --q_lora under {'ZeRO-3' if zero3 else 'FSDP'}: finetune.py only logs 'FSDP or "
                     "ZeRO3 are incompatible with QLoRA' and goes on; memfit estimates it as configured")
    ds = part.companions.get("deepspeed")
    ds_optimizer = ds is not None and isinstance(ds.doc, dict) and "optimizer" in ds.doc
    if "optim" not in part.doc and not ds_optimizer:  # the script's own default, not transformers'
        default = facts()["defaults_over_transformers"]["optim"]
        k["optimizer"] = optimizer_from_hf(label, "optim", default)
        notes.append(f"{label}: optim={shown(default)} (finetune.py's TrainingArguments default)")
    return replace(part, knobs={**part.knobs, **k})


__all__ = ["matches", "take", "apply", "knobs", "facts"]

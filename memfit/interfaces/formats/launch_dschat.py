"""DeepSpeed-Chat's step-1 SFT script (DeepSpeedExamples applications/DeepSpeed-Chat/training/
step1_supervised_finetuning/main.py): its own argparse flags read as memfit knobs, and written back as those flags
(tables/deepspeed_chat.json names the commit read and what main() does with each one).

launch_script.py hands a launch of it here when the script is named main.py and passes one of the flags only it
has (--max_seq_len, --zero_stage, --data_split, ...). main.py takes no TrainingArguments: it builds its DeepSpeed
config in code (get_train_ds_config), read here through the DeepSpeed reader as that JSON. What changes memory:
- every row is padded to --max_seq_len (default 512): seq_len, padded;
- --zero_stage (default 0) and --offload (optimizer and parameters to the CPU: DeepSpeed honours the parameter
  offload only under ZeRO-3) and --dtype fp16|bf16 (default fp16): the DeepSpeed engine's;
- --per_device_train_batch_size (default 16, not transformers' 8), --gradient_accumulation_steps (default 1),
  --gradient_checkpointing (a switch: transformers' checkpointing of every layer);
- --lora_dim > 0 (DeepSpeed-Chat's own LoRA layer, not PEFT) and --dropout are not modelled: not read.
The run takes the hf-trainer profile's defaults (transformers' model code under DeepSpeed, as main.py runs it);
`memfit fit` writes a plan back as these flags (Flags), refusing what they cannot say (FSDP, Liger, buckets).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from memfit.errors import MemfitError
from memfit.interfaces.formats.base import ImportedConfig, bad, shown
from memfit.interfaces.formats.tables import check_type, table

TABLE = "deepspeed_chat"


def facts() -> dict:
    return table(TABLE)


def matches(script: str, flags: dict) -> bool:
    """Is the launched script DeepSpeed-Chat's step-1 main.py? Its name and one of the flags only it has."""
    return Path(script).name == facts()["script"] and bool(set(flags) & set(facts()["detect"]))


def values(flags: dict, label: str) -> dict:
    """Every argument as given, else main.py's default, typed as its argparse types it."""
    spec = facts()["arguments"]
    out = {}
    for key, arg in spec.items():
        value = flags.get(key, arg["default"])
        if arg.get("action") == "store_true":
            if value not in (True, False):
                raise bad(label, f"--{key}", f"is a switch in main.py (argparse store_true): write --{key} alone, "
                          f"not --{key} {shown(value)}")
        elif arg["type"] == "list":
            value = value if isinstance(value, list) else [value]
        else:
            check_type(label, f"--{key}", value, arg)
        out[key] = value
    if out["model_name_or_path"] is None:
        raise bad(label, "--model_name_or_path", "main.py requires it (argparse required=True)")
    for key in ("deepspeed_config", "deepscale_config"):
        if out[key] is not None:
            raise bad(label, f"--{key}", f"main.py builds its own DeepSpeed config: {spec[key]['refused']}")
    return out


def ds_config(v: dict) -> dict:
    """The DeepSpeed config main.py hands to deepspeed.initialize (train_batch_size left out: it is the launcher's
    world size x micro-batch x accumulation, which the launch reader checks)."""
    spec = facts()["ds_config"]
    device = spec["offload_device"][str(v["offload"]).lower()]
    doc = json.loads(json.dumps(spec["template"]))
    zero = doc["zero_optimization"]
    zero["stage"] = v["zero_stage"]
    zero["offload_param"]["device"] = zero["offload_optimizer"]["device"] = device
    doc["tensorboard"].update(enabled=v["enable_tensorboard"], output_path=f"{v['tensorboard_path']}/ds_tensorboard_logs/")
    doc.update(spec["precision"][v["dtype"]])
    doc["train_micro_batch_size_per_gpu"] = v["per_device_train_batch_size"]
    doc["gradient_accumulation_steps"] = v["gradient_accumulation_steps"]
    return doc


def read(flags: dict, label: str, gpus) -> tuple[ImportedConfig, list[str]]:
    """The run main.py's flags say, as its DeepSpeed config with the script's own knobs over it, and the notes
    ("~": a memory setting not read, "!": a warning)."""
    from memfit.interfaces.formats import deepspeed

    v = values(flags, label)
    doc = ds_config(v)
    where = Path(f"{label}: {facts()['script']} flags")
    part = deepspeed.from_doc(doc, json.dumps(doc, indent=2) + "\n", where, label, gpus=gpus)
    notes = [f"{label}: DeepSpeed-Chat's main.py: its DeepSpeed config built as get_train_ds_config does "
             f"(ZeRO-{v['zero_stage']}, offload {'cpu' if v['offload'] else 'none'}, {v['dtype']})"]
    model = facts()["model"]
    k = {"seq_len": v["max_seq_len"], "padding": "padded", "tuning": model["tuning"],
         "checkpointing": "full" if v["gradient_checkpointing"] else "off", "reentrant": model["reentrant"],
         "optimizer": facts()["optimizer"]["knob"], "attention": model["attention"], "loss": model["loss"],
         **{key: value for key, value in facts()["deepspeed_defaults"].items() if key != "why"}}
    notes.append(f"{label}: main.py pads every row to --max_seq_len {v['max_seq_len']}"
                 + ("" if "max_seq_len" in flags else " (its default)") + ": that many tokens, padded")
    defaulted = [f"--{key} {v[key]}" for key in ("per_device_train_batch_size", "gradient_accumulation_steps",
                                                   "zero_stage", "dtype") if key not in flags]
    if defaulted:
        notes.append(f"{label}: main.py's defaults: {', '.join(defaulted)}")
    if v["zero_stage"] != 3 and v["offload"]:
        k["offload_param"] = "none"
        notes.append(f"{label}: --offload under ZeRO-{v['zero_stage']}: {facts()['offload_param_below_zero3']}")
    notes += _unread(v, flags, label)
    return replace(part, knobs={**part.knobs, **k}, model_name=v["model_name_or_path"]), notes


def _unread(v: dict, flags: dict, label: str) -> list[str]:
    spec = facts()["arguments"]
    out = []
    if v["lora_dim"] > 0:
        out.append(f"~{label}: --lora_dim {v['lora_dim']}: {spec['lora_dim']['does']}: not modelled, the estimate is "
                   "of the full fine-tune")
    for key in (k for k in flags if spec.get(k, {}).get("unread_when_given") and v[k] is not None):
        out.append(f"~{label}: --{key} {v[key]}: {spec[key]['does']}: not modelled")
    unknown = [f"--{k}" for k in flags if k not in spec]
    if unknown:  # main.py's argparse would stop on them
        out.append(f"!{label}: flags main.py does not have (its argparse stops on them): {', '.join(unknown)}")
    return out


@dataclass(frozen=True)
class Flags:
    """main.py's flags as a launch states them, for `memfit fit` to say knobs in them."""

    values: dict  # every argument, given or defaulted (values())
    label: str

    @property
    def says(self) -> frozenset[str]:
        return frozenset(facts()["writes"]) | {"engine"}

    def changes(self, knobs: dict) -> dict:
        """flag -> new value (True / False: the switch on / off) for the knobs, only where it differs from now;
        a knob the flags cannot say is one MemfitError."""
        writes = facts()["writes"]
        out = {}
        for knob, value in knobs.items():
            if knob == "engine":
                if value != "deepspeed":
                    raise MemfitError(f"{self.label}: main.py always runs the DeepSpeed engine (--zero_stage 0 for "
                                      f"plain data parallel); it cannot say engine={shown(value)}")
                continue
            if knob not in writes:
                raise MemfitError(f"{self.label}: main.py has no flag for {knob}={shown(value)} (its DeepSpeed config "
                                  "is built in code: get_train_ds_config)")
            out[writes[knob]] = self._value(knob, value, knobs)
        return {flag: value for flag, value in out.items() if self.values[flag] != value}

    def _value(self, knob: str, value, knobs: dict):
        if knob == "checkpointing":
            if value not in ("full", "off"):
                raise MemfitError(f"{self.label}: main.py's --gradient_checkpointing is transformers' checkpointing "
                                  f"of every layer; checkpointing={shown(value)} needs a code edit")
            return value == "full"
        if knob == "precision":
            dtype = {"fp16-mixed": "fp16", "bf16-mixed": "bf16"}.get(value)
            if dtype is None:
                raise MemfitError(f"{self.label}: main.py's --dtype fp16|bf16 is DeepSpeed's mixed precision; it "
                                  f"cannot say precision={shown(value)}")
            return dtype
        if knob in ("offload_optimizer", "offload_param"):
            return self._offload(knobs)
        return value

    def _offload(self, knobs: dict) -> bool:
        """--offload moves the optimizer and (under ZeRO-3) the parameters to the CPU together."""
        stage = knobs.get("zero_stage", self.values["zero_stage"])
        optimizer = knobs.get("offload_optimizer", "cpu" if self.values["offload"] else "none")
        param = knobs.get("offload_param", "cpu" if self.values["offload"] and stage == 3 else "none")
        wanted = {optimizer, param} if stage == 3 else {optimizer}
        if wanted not in ({"cpu"}, {"none"}):
            raise MemfitError(f"{self.label}: main.py's --offload moves the optimizer and the parameters to the CPU "
                              f"together; it cannot say offload_optimizer={optimizer} with offload_param={param}")
        return wanted == {"cpu"}


__all__ = ["matches", "read", "values", "ds_config", "Flags", "facts"]

"""The knobs of an OpenRLHF command's DeepSpeed side (ZeRO stage, offload, checkpointing, attention, precision, LoRA,
packing, the global batch), shared by train_sft / train_dpo / train_rm (openrlhf.py) and train_ppo_ray
(openrlhf_ppo.py). Each flag's name in a release comes from openrlhf_command.flag_name."""
from __future__ import annotations

from memfit.interfaces.formats.base import attention_from_hf, bad
from memfit.interfaces.formats.openrlhf_command import METHODS, RELEASES, Command, flag_name, flags_of


def _value(cmd: Command, version: str, name: str, assumed: list[str] | None = None):
    flag = flag_name(version, cmd.script, name)
    if flag is None:
        return None
    if flag in cmd.flags:
        return cmd.flags[flag]
    spec = flags_of(version, cmd.script)[flag]
    if spec.get("action") == "store_true":
        return False
    default = spec.get("default")
    if assumed is not None and default is not None:
        assumed.append(f"{flag} {default} (OpenRLHF {RELEASES[version]} default)")
    return default


def knobs_of(cmd: Command, version: str, where: str, world: dict) -> tuple[dict, list[str], list[str]]:
    assumed: list[str] = []
    warnings: list[str] = []
    v = lambda name, note=False: _value(cmd, version, name, assumed if note else None)  # noqa: E731
    k: dict = {"engine": "deepspeed", "method": "pt" if v("pretrain_mode") else METHODS[cmd.script]}
    k["zero_stage"] = v("zero_stage", True)
    if k["zero_stage"] not in (0, 1, 2, 3):
        raise bad(where, flag_name(version, cmd.script, "zero_stage"), f"ZeRO stage {k['zero_stage']} does not exist")
    k["offload_optimizer"] = "cpu" if v("adam_offload") else "none"
    k["offload_param"] = "none"  # the trained model's params stay on the GPU (get_train_ds_config offload=False)
    if flag_name(version, cmd.script, "ref_offload"):
        k["ref_offload"] = bool(v("ref_offload"))
    k["pin_memory"] = True  # get_train_ds_config hard-codes pin_memory: true
    k["checkpointing"] = "full" if v("checkpointing") else "off"
    if v("reentrant"):
        k["reentrant"] = True
    if version == "0.8.9":
        k["attention"] = "flash" if v("attention") else "eager"
    else:
        k["attention"] = attention_from_hf(where, flag_name(version, cmd.script, "attention"), v("attention", True))
    if version in ("0.8.9", "0.9.1"):
        if v("param_dtype"):
            k["precision"] = "bf16-mixed"
        else:
            warnings.append(f"{where}: no --bf16: OpenRLHF {RELEASES[version]} then trains in the checkpoint's "
                            "dtype without DeepSpeed mixed precision; pass --bf16")
    else:
        k["precision"] = {"bf16": "bf16-mixed", "fp16": "fp16-mixed"}[v("param_dtype")]
    k["micro_batch"] = v("micro_batch", True)
    k["seq_len"] = v("seq_len", True)
    rank = v("lora_rank") or 0
    if rank > 0:
        k["tuning"] = "qlora" if v("load_in_4bit") else "lora"
        k["lora_rank"], k["lora_alpha"] = rank, v("lora_alpha")
        targets = v("lora_targets")
        k["lora_targets"] = ("all-linear",) if targets in ("all-linear", ["all-linear"], []) else tuple(targets)
        if v("lora_dropout"):
            k["lora_dropout"] = float(v("lora_dropout"))
    else:
        if v("load_in_4bit"):
            raise bad(where, flag_name(version, cmd.script, "load_in_4bit"), "4-bit loading needs LoRA (--lora_rank > 0)")
        k["tuning"] = "full"
    k["padding"] = "padding_free" if v("packing") else "padded"
    if v("liger"):
        k["loss"] = "liger"
    k["overlap_comm"] = True if v("overlap_comm") else k["zero_stage"] == 3  # DeepSpeed's rule when not forced
    if v("grad_accum_dtype"):
        k["grad_accum_dtype"] = v("grad_accum_dtype")
    split = (v("ring") or 1) * (v("tensor_parallel") or 1)
    for name in ("ring", "tensor_parallel"):
        if (v(name) or 1) > 1:
            warnings.append(f"{where}: {flag_name(version, cmd.script, name)} {v(name)}: not modelled "
                            "(memfit assumes plain data parallelism)")
    if (v("zpg") or 1) > 1:
        warnings.append(f"{where}: {flag_name(version, cmd.script, 'zpg')} {v('zpg')}: ZeRO++ hpZ not modelled: a "
                        "secondary copy of the parameters per node group; memfit estimates plain ZeRO: TOO LOW")
    global_batch = v("global_batch", True)
    world["global_batch"] = global_batch
    gpus = world.get("num_gpus")
    if gpus:
        data_parallel = gpus // split
        flag = flag_name(version, cmd.script, "global_batch")
        if global_batch % (k["micro_batch"] * data_parallel):
            raise bad(where, flag, f"{global_batch} is not micro batch {k['micro_batch']} x {data_parallel} "
                      "data-parallel GPUs x a whole number of accumulation steps (DeepSpeed refuses it)")
        k["grad_accum"] = global_batch // (k["micro_batch"] * data_parallel)
    return k, assumed, warnings

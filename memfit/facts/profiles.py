"""Framework profiles: fill the knobs a user left unset with what that framework really does.

Facts live in catalog/frameworks.toml; this module only applies them and records each default it
took, so the output can say which assumptions the estimate rests on.
"""
from __future__ import annotations

import tomllib
from functools import cache

from memfit.facts.catalog import HERE, ModelSpec
from memfit.errors import MemfitError
from memfit.facts.scenario import DeepSpeedConfig, FsdpConfig, Hardware, LoraConfig, Scenario, rl_from_knobs

SCENARIO_KEYS = ("checkpointing", "reentrant", "attention", "precision", "adapter_dtype", "autocast", "optimizer",
                 "loss", "padding", "low_cpu_mem_usage", "kbit_upcast")


@cache
def profiles() -> dict[str, dict]:
    with open(HERE / "frameworks.toml", "rb") as f:
        return tomllib.load(f)


def get_profile(name: str) -> dict:
    table = profiles()
    if name not in table:
        raise MemfitError(f"unknown framework profile {name!r}; choose one of: {', '.join(table)}")
    return table[name]


def _zero_buckets(profile: dict, model: ModelSpec, stage: int) -> dict:
    """DeepSpeed values for keys a framework writes as "auto" (knobs.md A.3)."""
    if profile.get("zero_auto") != "hf":
        return {}
    h = model.hidden_size
    filled = {"reduce_bucket_size": h * h}
    if stage == 3:
        filled |= {"prefetch_bucket_size": int(0.9 * h * h), "param_persistence_threshold": 10 * h}
    return filled


def _engine(knobs: dict, profile: dict, hardware: Hardware, assumed: list[str], name: str) -> str:
    if knobs.get("engine"):
        return knobs["engine"]
    if knobs.get("zero_stage") is not None:
        return "deepspeed"
    if knobs.get("fsdp_strategy"):
        return "fsdp"
    if "zero_stage" in profile:
        assumed.append(f"engine=deepspeed ZeRO-{profile['zero_stage']} ({name} default)")
        knobs["zero_stage"] = profile["zero_stage"]
        return "deepspeed"
    if hardware.world_size > 1:
        assumed.append("engine=ddp (several GPUs, no ZeRO/FSDP given)")
        return "ddp"
    return "single"


def build_scenario(model: ModelSpec, hardware: Hardware, knobs: dict, profile_name: str = "hf-trainer") -> Scenario:
    """`knobs` holds what the user said (None or absent = not said); the profile fills the rest."""
    knobs = {k: v for k, v in knobs.items() if v is not None}
    profile = get_profile(profile_name)
    assumed: list[str] = []
    values = {}
    for key in SCENARIO_KEYS:
        if key in knobs:
            values[key] = knobs[key]
        elif key in profile:
            values[key] = profile[key]
            if key not in ("low_cpu_mem_usage", "autocast", "kbit_upcast"):
                assumed.append(f"{key}={profile[key]} ({profile_name} default)")
    engine = _engine(knobs, profile, hardware, assumed, profile_name)
    if engine == "fsdp" and "kbit_upcast" not in knobs:
        values["kbit_upcast"] = False  # TRL skips prepare_model_for_kbit_training for sharded (FSDP) QLoRA
    tuning = knobs.get("tuning", "full")
    lora = None
    if tuning in ("lora", "qlora"):
        lora = LoraConfig(rank=knobs.get("lora_rank", 8), alpha=knobs.get("lora_alpha"),
                          targets=tuple(knobs.get("lora_targets", ("all-linear",))), dora=knobs.get("dora", False),
                          dropout=knobs.get("lora_dropout", 0.0))
        if "lora_rank" not in knobs:
            assumed.append("lora rank=8, targets=all-linear")
    deepspeed = fsdp = None
    if engine == "deepspeed":
        stage = knobs.get("zero_stage", 0)
        ds_knobs = {k: knobs[k] for k in DS_KEYS if k in knobs}
        deepspeed = DeepSpeedConfig(stage=stage, **(_zero_buckets(profile, model, stage) | ds_knobs))
    elif engine == "fsdp":
        fsdp = FsdpConfig(strategy=knobs.get("fsdp_strategy", "full_shard"),
                          cpu_offload=knobs.get("fsdp_cpu_offload", False))
    return Scenario(
        model=model, hardware=hardware, tuning=tuning, lora=lora, engine=engine, deepspeed=deepspeed, fsdp=fsdp,
        micro_batch=knobs.get("micro_batch", 1), seq_len=knobs.get("seq_len", 2048),
        grad_accum=knobs.get("grad_accum", 1), checkpoint_every_n=knobs.get("checkpoint_every_n", 1),
        optimizer_in_backward=knobs.get("optimizer_in_backward", False),
        bnb_saves_input=knobs.get("bnb_saves_input", False),
        double_quant=knobs.get("double_quant", True), 
        freeze_trainable_layers=knobs.get("freeze_trainable_layers", 2), method=knobs.get("method", "sft"),
        profile=profile_name, assumed=tuple(assumed), **values,
        rl=rl_from_knobs(knobs, knobs.get("method", "sft")),  # issue 6: preference / RL knobs (roles.py)
    )


DS_KEYS = ("offload_optimizer", "offload_param", "ratio", "pin_memory", "reduce_bucket_size", "overlap_comm",
           "contiguous_gradients", "prefetch_bucket_size", "param_persistence_threshold", "max_live_parameters",
           "sub_group_size", "grad_accum_dtype", "zero3_init")

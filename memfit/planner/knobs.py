"""The planner's knobs: what a candidate changes, as records whose fields are the knob table's axes
(memfit/facts/data/knobs.toml [axis.*]), and how a record becomes a Scenario derived from the user's.

- model-state knobs (`StateKnobs`): tuning, optimizer, sharding (engine and ZeRO stage / FSDP strategy),
  offload (optimizer offload, or FSDP CPU offload) with ratio and pin_memory, parameter offload; for runs with
  several models also where the frozen models, vLLM and the sleeping states live;
- activation knobs (`ActKnobs`): checkpointing, micro-batch (gradient accumulation keeps the global batch),
  attention, loss, padding.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache

from memfit.facts import methods
from memfit.facts.engines import Sharding, engine_of
from memfit.facts.engines.deepspeed import STAGE_SHARDING
from memfit.facts.engines.fsdp import STRATEGY_SHARDING
from memfit.facts.frameworks import framework
from memfit.facts.knobs import acting_when, axes, knob
from memfit.facts.profiles import zero_buckets
from memfit.facts.scenario import Scenario
from memfit.planner.speed import param_counts

RATIO_SUB_GROUPS = 10  # sub-groups a ratio needs to act on: ratio r keeps floor((1-r) x groups) on the GPU
NICE_SUB_GROUP_SIZES = (1_000_000_000, 500_000_000, 200_000_000, 100_000_000, 50_000_000, 20_000_000,
                        10_000_000, 5_000_000, 2_000_000, 1_000_000)
EVERY_N = 2  # every_n checkpointing tries every 2nd layer
# where the other models of a several-model run live: the several-model knobs the planner varies
ROLE_KNOBS = tuple(name for name in acting_when("several") if name in axes())
DEEPSPEED_KNOBS = acting_when("deepspeed")
FSDP_KNOBS = acting_when("fsdp")


@dataclass(frozen=True)
class Layout:
    """How the weights are laid out across GPUs: the `sharding` axis (engine, zero_stage, fsdp_strategy)."""

    engine: str
    zero_stage: int | None = None
    fsdp_strategy: str | None = None

    @property
    def level(self) -> Sharding:
        if self.engine == "deepspeed":
            assert self.zero_stage is not None, "a DeepSpeed layout has its ZeRO stage"
            return STAGE_SHARDING[self.zero_stage]
        if self.engine == "fsdp":
            assert self.fsdp_strategy is not None, "an FSDP layout has its sharding strategy"
            return STRATEGY_SHARDING[self.fsdp_strategy]
        return Sharding.NONE

    def __str__(self) -> str:
        if self.engine == "deepspeed":
            return f"zero{self.zero_stage}"
        return f"fsdp:{self.fsdp_strategy}" if self.engine == "fsdp" else self.engine


ZERO3 = Layout("deepspeed", 3)


@dataclass(frozen=True)
class StateKnobs:
    tuning: str
    optimizer: str
    sharding: Layout
    offload: str  # optimizer offload (DeepSpeed) or CPU offload (FSDP): none | cpu | nvme
    pin_memory: bool  # DeepSpeed offload pin_memory (only meaningful with offload)
    ratio: float  # DeepSpeed offload_optimizer.ratio (only ZeRO-3 + offload)
    offload_param: str  # DeepSpeed ZeRO-3 parameter offload
    # several-model runs (ROLE_KNOBS): where the frozen models, vLLM and the sleeping states live
    ref_offload: bool = False
    reward_offload: bool = False
    vllm_gpu_memory_utilization: float = 0.0
    vllm_sleep: bool = False
    deepspeed_sleep: bool = False


@dataclass(frozen=True)
class ActKnobs:
    checkpointing: str
    micro_batch: int
    attention: str
    loss: str
    padding: str


def several_models(s: Scenario) -> bool:
    return methods.several_models(s.method)


@cache
def names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def changed(bk: object, k: object) -> list[str]:
    """The knobs (axes) of k that differ from bk."""
    axes = names(type(k))  # type: ignore[arg-type]  # mypy does not count a class object as Hashable
    return [n for n in axes if getattr(bk, n) != getattr(k, n)]


def config_of(s: Scenario) -> dict:
    """The searched knobs of a scenario, flat (for JSON and for `memfit fit`'s writers)."""
    ds, fsdp = s.engine == "deepspeed", s.engine == "fsdp"
    out = {"tuning": s.tuning, "lora_rank": s.lora_rank if s.uses_adapters else None, "optimizer": s.optimizer,
           "engine": s.engine, "zero_stage": s.zero_stage, "fsdp_strategy": s.fsdp_strategy,
           "fsdp_cpu_offload": s.fsdp_cpu_offload if fsdp else None,
           "checkpointing": s.checkpointing, "checkpoint_every_n": s.checkpoint_every_n,
           "micro_batch": s.micro_batch, "grad_accum": s.grad_accum,
           "global_batch": s.micro_batch * s.grad_accum * s.world_size,
           "attention": s.attention, "loss": s.loss, "padding": s.padding}
    out |= {k: getattr(s, k) if ds else None
            for k in ("offload_optimizer", "pin_memory", "ratio", "sub_group_size", "offload_param")}
    return out | ({k: getattr(s, k) for k in ROLE_KNOBS} if several_models(s) else {})


def layout_of(s: Scenario) -> Layout:
    return Layout(s.engine, s.zero_stage, s.fsdp_strategy)


def state_of(s: Scenario) -> StateKnobs:
    offload = engine_of(s).optimizer_offload(s)
    roles = {k: getattr(s, k) for k in ROLE_KNOBS} if several_models(s) else {}
    return StateKnobs(s.tuning, s.optimizer, layout_of(s), offload, s.pin_memory, s.ratio, s.offload_param,
                       **roles)


def act_of(s: Scenario) -> ActKnobs:
    return ActKnobs(s.checkpointing, s.micro_batch, s.attention, s.loss, s.padding)


DEEPSPEED_KNOBS = acting_when("deepspeed")
FSDP_KNOBS = acting_when("fsdp")


class Builder:
    """Turns knobs into scenarios derived from the user's one (everything else kept)."""

    def __init__(self, base: Scenario, per_gpu_batch: int):
        self.base = base
        self.per_gpu = per_gpu_batch
        self.profile = framework(base.profile)
        self._engines: dict[StateKnobs, dict] = {}

    def sub_group_size(self, tuning: str, ratio: float) -> int:
        """A sub_group_size that splits the rank's partition finely enough for `ratio` to keep at least one
        sub-group on the GPU (DeepSpeed stage3.py: sub-group i goes to the CPU iff i >= int((1 - ratio) * S))."""
        psi = param_counts(self.base.with_changes(tuning=tuning)).trainable
        part = -(-psi // self.base.world_size)
        for size in NICE_SUB_GROUP_SIZES:
            groups = -(-part // size)
            if groups >= RATIO_SUB_GROUPS and int((1 - ratio) * groups) >= 1:
                return size
        return NICE_SUB_GROUP_SIZES[-1]

    def _deepspeed(self, k: StateKnobs) -> dict:
        """The DeepSpeed knobs of a ZeRO layout: the user's where they have DeepSpeed, else the defaults the
        framework's "auto" gives; offload, ratio and pin_memory from the planned knobs."""
        b, stage = self.base, k.sharding.zero_stage
        assert stage is not None, "a ZeRO layout has its stage"
        if b.engine == "deepspeed":
            ds = {name: getattr(b, name) for name in DEEPSPEED_KNOBS}
            ds |= {"offload_optimizer": "none", "offload_param": "none", "ratio": 1.0}
            if stage == 3 and b.zero_stage != 3:
                ds |= zero_buckets(self.profile, b.model, 3)
        else:
            ds = {name: knob(name).default for name in DEEPSPEED_KNOBS} | zero_buckets(self.profile, b.model, stage)
        offload = k.offload if stage >= 1 else "none"
        ratio = k.ratio if stage == 3 and offload != "none" else 1.0
        keep_users = b.engine == "deepspeed" and b.ratio == ratio  # the user's own ratio and sub-groups
        sub = self.sub_group_size(k.tuning, ratio) if ratio < 1.0 and not keep_users else ds["sub_group_size"]
        return ds | {"zero_stage": stage, "offload_optimizer": offload, "pin_memory": k.pin_memory, "ratio": ratio,
                     "sub_group_size": sub, "offload_param": k.offload_param if stage == 3 else "none"}

    def _fsdp(self, k: StateKnobs) -> dict:
        b = self.base
        fsdp = {name: getattr(b, name) if b.engine == "fsdp" else knob(name).default for name in FSDP_KNOBS}
        return fsdp | {"fsdp_strategy": k.sharding.fsdp_strategy, "fsdp_cpu_offload": k.offload == "cpu"}

    def _state_fields(self, k: StateKnobs) -> dict:
        """Scenario fields set by the model-state knobs (built once per setting: the configs validate)."""
        if k in self._engines:
            return self._engines[k]
        out: dict = {"tuning": k.tuning, "optimizer": k.optimizer, "engine": k.sharding.engine}
        out |= {name: knob(name).default for name in (*DEEPSPEED_KNOBS, *FSDP_KNOBS)}
        if k.sharding.engine == "deepspeed":
            out |= self._deepspeed(k)
        elif k.sharding.engine == "fsdp":
            out |= self._fsdp(k)
        if several_models(self.base):
            out |= {name: getattr(k, name) for name in ROLE_KNOBS}
        self._engines[k] = out
        return out

    def scenario(self, k: StateKnobs, a: ActKnobs) -> Scenario:
        b = self.base
        changes = dict(self._state_fields(k), checkpointing=a.checkpointing, micro_batch=a.micro_batch,
                       attention=a.attention, loss=a.loss, padding=a.padding)
        if a.checkpointing == "every_n" and b.checkpointing != "every_n":
            changes["checkpoint_every_n"] = EVERY_N
        if self.per_gpu % a.micro_batch == 0:
            changes["grad_accum"] = self.per_gpu // a.micro_batch
        if b.dynamic_bsz and b.ppo_max_token_len and a.micro_batch != b.micro_batch:
            # verl's use_dynamic_bsz packs a micro-batch up to its token budget: fewer rows is a smaller budget
            # (what memfit/interfaces/formats/verl_write.py writes for the new micro-batch)
            changes["ppo_max_token_len"] = a.micro_batch * b.seq_len
        return b.with_changes(**changes)


# ---------------------------------------------------------------- the option space

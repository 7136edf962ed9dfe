"""Search the training knobs for the fastest configurations that fit, and say what each change buys.

A candidate is the user's scenario with some knobs changed. The knobs split in two groups:
- model-state knobs (`_StateKnobs`): tuning, optimizer, engine and ZeRO stage / FSDP strategy, optimizer
  offload with ratio and pin_memory, parameter offload;
- activation knobs (`_ActKnobs`): checkpointing, micro-batch (gradient accumulation keeps the global
  batch), attention, loss, packing.
Only values the framework of the user's profile exposes are tried (catalog/plan.toml), and only
combinations the frameworks accept (ratio: ZeRO-3 with optimizer offload, with a sub_group_size that lets
it act; offload_param: ZeRO-3; flash: compute capability >= 8.0; 8-bit optimizers and LoRA/QLoRA only
when allowed). Every candidate is judged by estimate() (device and host) and ranked by step_time.step_time().

Knobs a framework has no flag for but that one documented edit of its code reaches (plan.toml code_edits:
OpenRLHF's pin_memory and ratio live in get_train_ds_config) are tried too, unless Options(code_edits=
False); each such change carries its CodeEdit (file, function, the assignments). Host RAM is judged over
every phase, a resume from a checkpoint included, unless Options(resume=False).

Several-model methods (DPO and its relatives, RM, PPO, GRPO: memfit/roles/estimate.py) are judged by
estimate() and step_time(); their model-state knobs add where the other
models live (reference / reward offload under ZeRO-3, vLLM gpu_memory_utilization and sleep, DeepSpeed
sleep; `_role_variants`), and the loss and packing stay the user's.

The search (a few thousand candidates; estimate() ~0.2-1 ms, step_time() ~20 us; well under 2 s):
1. Activation settings beaten in memory and speed by another (sdpa where flash runs, padded rows where
   packing is possible) are dropped up front.
2. Model-state settings are visited best-first by an upper bound on their speed (their fastest
   activation setting). Each is first estimated with its least-memory activation setting: if that does
   not fit, nothing with it fits. Otherwise its activation settings are tried fastest first, skipping any
   that needs at least as much device memory in every knob as one already out of memory; the first
   that fits (or, within 1% of its speed, the one with fewer changes) is the setting's candidate.
3. Candidates group into approaches (`_family`: tuning, weight layout, what is offloaded); each approach
   gets one row, its fastest (fewest changes within 1%). A row is dropped when another candidate makes a
   subset of its changes, is as fast, and needs about as much memory (its extra changes buy nothing).
   The visit stops when the next upper bound cannot reach the k-th row.
Each change of a row is then measured: its memory saving applied alone to the user's scenario (or, when
it cannot stand alone, e.g. pin_memory without offload, removed from the plan), and in the plan; its
speed cost and whether it is needed to fit, by removing it from the plan.

This module never prints; memfit/interfaces/cli/plan.py presents the rows.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields, replace
from functools import cache

from memfit.errors import MemfitError
from memfit.memory.phases import verdict_of
from memfit.roles.estimate import estimate
from memfit.facts.engines import Sharding, engine_of
from memfit.facts.engines.deepspeed import STAGE_SHARDING
from memfit.facts.engines.fsdp import STRATEGY_SHARDING
from memfit.facts import methods
from memfit.facts.knobs import acting_when, knob
from memfit.facts.frameworks import framework, frameworks
from memfit.facts.profiles import zero_buckets
from memfit.facts.scenario import Scenario
from memfit.planner.speed import StepTime, param_counts
from memfit.planner.step_time import step_time

ALLOW = ("lora", "qlora", "8bit")
FITTING = ("fits", "tight")
RATIOS = (1.0, 0.9, 0.8, 0.7, 0.5)  # DeepSpeed offload_optimizer.ratio values tried (ZeRO-3 + optimizer offload)
RATIO_SUB_GROUPS = 10  # sub-groups a ratio needs to act on: ratio r keeps floor((1-r) x groups) on the GPU
NICE_SUB_GROUP_SIZES = (1_000_000_000, 500_000_000, 200_000_000, 100_000_000, 50_000_000, 20_000_000,
                        10_000_000, 5_000_000, 2_000_000, 1_000_000)
# with adapters, sharding only the optimizer or the gradients shards tiny adapter states: no row of their own
ADAPTER_SKIP_LEVELS = (Sharding.OPTIMIZER, Sharding.GRADIENTS)
EVERY_N = 2  # every_n checkpointing tries every 2nd layer
DEADLINE_SECONDS = 1.8  # safety stop for the search; the rows found so far are returned
SPEED_TOLERANCE = 0.01  # speeds within 1% count as equal: the row with fewer changes wins
MEMORY_TOLERANCE = 0.02  # of GPU memory (host RAM): smaller savings do not justify an extra change

# Device-memory order of the activation knobs (lower = less memory); values of equal rank are not compared.
_CKPT_RANK = {"offload": 0, "unsloth": 0, "full": 1, "every_n": 2, "off": 3}
_ATTN_RANK = {"flash": 0, "sdpa": 1, "eager": 2}
# Losses are not ranked: Liger's fused loss holds a V x h fp32 weight gradient when lm_head trains, which
# exceeds the standard loss's logits at small micro-batches; the search tries each loss instead.
_PAD_RANK = {"padding_free": 0, "packed": 0, "padded": 1}
_SPEED_RANK_CKPT = {"off": 0, "every_n": 1, "full": 2, "offload": 3, "unsloth": 3}  # recompute + transfers


def framework_options() -> dict[str, dict]:
    """What `memfit plan` may change under each framework (data/frameworks/NAME.toml [plan])."""
    return {name: fw.plan for name, fw in frameworks().items()}


@dataclass(frozen=True)
class Layout:
    """How the weights are laid out across GPUs: the `sharding` axis (engine, zero_stage, fsdp_strategy)."""

    engine: str
    zero_stage: int | None = None
    fsdp_strategy: str | None = None

    @property
    def level(self) -> Sharding:
        if self.engine == "deepspeed":
            return STAGE_SHARDING[self.zero_stage]
        if self.engine == "fsdp":
            return STRATEGY_SHARDING[self.fsdp_strategy]
        return Sharding.NONE

    def __str__(self) -> str:
        if self.engine == "deepspeed":
            return f"zero{self.zero_stage}"
        return f"fsdp:{self.fsdp_strategy}" if self.engine == "fsdp" else self.engine


ZERO3 = Layout("deepspeed", 3)


@dataclass(frozen=True)
class _StateKnobs:
    tuning: str
    optimizer: str
    sharding: Layout
    offload: str  # optimizer offload (DeepSpeed) or CPU offload (FSDP): none | cpu | nvme
    pin_memory: bool  # DeepSpeed offload pin_memory (only meaningful with offload)
    ratio: float  # DeepSpeed offload_optimizer.ratio (only ZeRO-3 + offload)
    offload_param: str  # DeepSpeed ZeRO-3 parameter offload
    # several-model runs (RlConfig fields): where the frozen models, vLLM and the sleeping states live
    ref_offload: bool = False
    reward_offload: bool = False
    vllm_gpu_memory_utilization: float = 0.0
    vllm_sleep: bool = False
    deepspeed_sleep: bool = False


ROLE_KNOBS = ("ref_offload", "reward_offload", "vllm_gpu_memory_utilization", "vllm_sleep", "deepspeed_sleep")


@dataclass(frozen=True)
class _ActKnobs:
    checkpointing: str
    micro_batch: int
    attention: str
    loss: str
    padding: str


@dataclass(frozen=True)
class CodeEdit:
    """A knob the framework has no flag for, reached by editing one function of its code
    (catalog/plan.toml code_edits): assign each target inside `function` before it returns."""

    file: str
    function: str
    assignments: tuple[tuple[str, object], ...]  # (Python target inside the function, value)

    def lines(self) -> list[str]:
        return [f"{target} = {value!r}" for target, value in self.assignments]

    def __str__(self) -> str:
        return f"{self.file}::{self.function}(): " + "; ".join(self.lines())

    def to_json(self) -> dict:
        return {"file": self.file, "function": self.function, "lines": self.lines()}


def _json_value(v):
    return str(v) if isinstance(v, Layout) else v


@dataclass(frozen=True)
class Change:
    """One knob changed from the user's scenario, with what it saves and what it costs."""

    knob: str  # tuning | optimizer | sharding | offload | pin_memory | ratio | offload_param | checkpointing |
    #            micro_batch | attention | loss | padding
    before: object
    after: object
    device_saving_bytes: int  # device-total peak per GPU: without the change minus with it
    host_saving_bytes: int  # host RAM peak per node: without minus with
    speed_cost_pct: float  # tokens/s this change costs the plan, in % (negative = it makes the plan faster)
    measured: str  # memory saving: "alone" = applied alone to the user's scenario; "in_plan" = removed from the plan
    needed_to_fit: bool  # the plan without this change does not fit (else it is there for speed or headroom)
    in_plan_device_saving_bytes: int = 0  # the plan without it minus the plan (changes interact)
    in_plan_host_saving_bytes: int = 0
    code_edit: CodeEdit | None = None  # the framework has no flag for it: the edit of its code that sets it

    def to_json(self) -> dict:
        return {"knob": self.knob, "before": _json_value(self.before), "after": _json_value(self.after),
                "device_saving_bytes": self.device_saving_bytes, "host_saving_bytes": self.host_saving_bytes,
                "speed_cost_pct": round(self.speed_cost_pct, 2), "measured": self.measured,
                "needed_to_fit": self.needed_to_fit, "in_plan_device_saving_bytes": self.in_plan_device_saving_bytes,
                "in_plan_host_saving_bytes": self.in_plan_host_saving_bytes,
                "code_edit": self.code_edit.to_json() if self.code_edit else None}


@dataclass(frozen=True)
class PlanRow:
    scenario: Scenario
    verdict: str
    device_peak_bytes: int  # device total (what nvidia-smi shows) at the peak phase, per GPU
    headroom_bytes: int  # usable GPU memory minus the device peak
    host_peak_bytes: int  # per node
    host_headroom_bytes: int | None  # None when host RAM is unknown
    tokens_per_second: float
    step_seconds: float
    changes: tuple[Change, ...]

    def to_json(self) -> dict:
        return {
            "verdict": self.verdict, "device_peak_bytes": self.device_peak_bytes,
            "headroom_bytes": self.headroom_bytes, "host_peak_bytes": self.host_peak_bytes,
            "host_headroom_bytes": self.host_headroom_bytes,
            "tokens_per_second": round(self.tokens_per_second, 1), "step_seconds": round(self.step_seconds, 4),
            "config": config_of(self.scenario),
            "changes": [c.to_json() for c in self.changes],
        }


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


# ---------------------------------------------------------------- knobs <-> scenario


def _layout_of(s: Scenario) -> Layout:
    return Layout(s.engine, s.zero_stage, s.fsdp_strategy)


def _state_of(s: Scenario) -> _StateKnobs:
    offload = engine_of(s).optimizer_offload(s)
    roles = {k: getattr(s, k) for k in ROLE_KNOBS} if several_models(s) else {}
    return _StateKnobs(s.tuning, s.optimizer, _layout_of(s), offload, s.pin_memory, s.ratio, s.offload_param,
                       **roles)


def _act_of(s: Scenario) -> _ActKnobs:
    return _ActKnobs(s.checkpointing, s.micro_batch, s.attention, s.loss, s.padding)


DEEPSPEED_KNOBS = acting_when("deepspeed")
FSDP_KNOBS = acting_when("fsdp")


class _Builder:
    """Turns knobs into scenarios derived from the user's one (everything else kept)."""

    def __init__(self, base: Scenario, per_gpu_batch: int):
        self.base = base
        self.per_gpu = per_gpu_batch
        self.profile = framework(base.profile)
        self._engines: dict[_StateKnobs, dict] = {}

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

    def _deepspeed(self, k: _StateKnobs) -> dict:
        """The DeepSpeed knobs of a ZeRO layout: the user's where they have DeepSpeed, else the defaults the
        framework's "auto" gives; offload, ratio and pin_memory from the planned knobs."""
        b, stage = self.base, k.sharding.zero_stage
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

    def _fsdp(self, k: _StateKnobs) -> dict:
        b = self.base
        fsdp = {name: getattr(b, name) if b.engine == "fsdp" else knob(name).default for name in FSDP_KNOBS}
        return fsdp | {"fsdp_strategy": k.sharding.fsdp_strategy, "fsdp_cpu_offload": k.offload == "cpu"}

    def _state_fields(self, k: _StateKnobs) -> dict:
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

    def scenario(self, k: _StateKnobs, a: _ActKnobs) -> Scenario:
        b = self.base
        changes = dict(self._state_fields(k), checkpointing=a.checkpointing, micro_batch=a.micro_batch,
                       attention=a.attention, loss=a.loss, padding=a.padding)
        if a.checkpointing == "every_n" and b.checkpointing != "every_n":
            changes["checkpoint_every_n"] = EVERY_N
        if self.per_gpu % a.micro_batch == 0:
            changes["grad_accum"] = self.per_gpu // a.micro_batch
        return b.with_changes(**changes)


# ---------------------------------------------------------------- the option space


def _unique(items) -> list:
    return list(dict.fromkeys(items))


def _state_options(base: Scenario, bk: _StateKnobs, opts: dict, allow: set[str],
                   facts: dict | None = None) -> list[_StateKnobs]:
    world = base.world_size
    tunings = _unique([bk.tuning] + [t for t in ("lora", "qlora") if t in allow])
    low_bit = opts.get("low_bit_optimizer", "")
    optimizers = _unique([bk.optimizer] + ([low_bit] if "8bit" in allow and low_bit else []))
    engines = opts["engines"]
    shardings = [bk.sharding]
    if world == 1 and "single" in engines:
        shardings.append(Layout("single"))
    if world > 1 and "ddp" in engines:
        shardings.append(Layout("ddp"))
    if "deepspeed" in engines:
        shardings += [Layout("deepspeed", i) for i in range(4)]
    if world > 1 and "fsdp" in engines:
        shardings += [Layout("fsdp", fsdp_strategy=x) for x in opts["fsdp"]]
    out = []
    for tuning in tunings:
        adapters = tuning in ("lora", "qlora")
        for sharding in _unique(shardings):
            if adapters and sharding.level in ADAPTER_SKIP_LEVELS and sharding != bk.sharding:
                continue
            for optimizer in optimizers:
                if optimizer != bk.optimizer and (sharding.engine == "deepspeed" or adapters):
                    continue  # ZeRO is modeled with fp32 Adam only; adapters' states are too small to matter
                for offload, pin, ratio, param in _offloads(sharding, bk, opts, adapters, tuning):
                    out.append(replace(bk, tuning=tuning, optimizer=optimizer, sharding=sharding, offload=offload,
                                       pin_memory=pin, ratio=ratio, offload_param=param))
    out = _unique([bk] + out)
    if facts is None:
        return out
    return _unique(v for k in out for v in _role_variants(k, bk, opts, facts, base))


def _role_variants(k: _StateKnobs, bk: _StateKnobs, opts: dict, facts: dict, s: Scenario) -> list[_StateKnobs]:
    """The several-model knobs tried with these model-state knobs, each only where it acts (knobs.md E):
    reference / reward offload under ZeRO-3, vLLM memory and sleep with a generator (sleep only when all
    models are colocated), DeepSpeed sleep without Adam offload (OpenRLHF makes it a no-op then)."""
    def both(name: str, acts: bool) -> list:
        return _unique([getattr(bk, name), not getattr(bk, name)]) if acts else [getattr(bk, name)]

    zero3, gen = k.sharding == ZERO3, bool(facts.get("generator"))
    refs = both("ref_offload", zero3 and opts.get("ref_offload") and facts.get("reference"))
    rewards = both("reward_offload", zero3 and opts.get("ref_offload") and facts.get("reward") and not s.remote_reward)
    utils = _unique([bk.vllm_gpu_memory_utilization] + (list(opts.get("vllm_gpu_memory_utilization", ())) if gen else []))
    colocated = s.colocate == "all" or not opts.get("vllm_sleep_needs_colocate_all")
    vsleeps = both("vllm_sleep", gen and opts.get("vllm_sleep") and colocated)
    dsleeps = both("deepspeed_sleep", gen and opts.get("deepspeed_sleep") and k.offload == "none")
    return [replace(k, ref_offload=r, reward_offload=w, vllm_gpu_memory_utilization=u, vllm_sleep=v,
                    deepspeed_sleep=d)
            for r in refs for w in rewards for u in utils for v in vsleeps for d in dsleeps]


def _offloads(sharding: Layout, bk: _StateKnobs, opts: dict, adapters: bool, tuning: str):
    """(offload, pin_memory, ratio, offload_param) tuples valid for this sharding. Knobs that do not
    apply carry the user's value, so they never show up as changes. Parameter offload is tried with
    optimizer offload only (the combination memfit's ZeRO-3 model covers); the user's own setting is
    always among the candidates."""
    keep = (bk.pin_memory, bk.ratio, bk.offload_param)
    if sharding.engine == "fsdp":
        yield "none", *keep
        if not adapters:
            yield "cpu", *keep
        return
    stage = sharding.zero_stage if sharding.engine == "deepspeed" else 0
    yield "none", bk.pin_memory, bk.ratio, "none" if stage == 3 else bk.offload_param
    if stage == 0 or adapters:
        return  # adapters' optimizer states are small: offloading them only slows the step
    params = [bk.offload_param]
    ratios = [bk.ratio]
    if stage == 3:
        params = ["none"] + (["cpu"] if tuning != "qlora" and opts["offload_param"] else [])
        ratios = _unique(([bk.ratio] if bk.sharding == ZERO3 and bk.offload != "none" else []) + list(RATIOS))
    if not opts.get("offload_ratio", True):
        ratios = [bk.ratio]
    pins = _unique([bk.pin_memory, True, False]) if opts.get("pin_memory", True) else [bk.pin_memory]
    for pin in pins:
        for ratio in ratios:
            for param in params:
                yield "cpu", pin, ratio, param


def _micro_batches(base: Scenario, per_gpu: int) -> list[int]:
    """Halvings of the user's micro-batch, and the powers of two up to the per-GPU share of the global
    batch (a larger micro-batch with less accumulation is the same global batch); each must divide it."""
    options, m = {1}, base.micro_batch
    while m >= 1:
        options.add(m)
        m //= 2
    m = 1
    while m <= per_gpu:
        options.add(m)
        m *= 2
    return sorted((m for m in options if per_gpu % m == 0), reverse=True)


def _act_options(base: Scenario, ak: _ActKnobs, opts: dict, per_gpu: int, several: bool = False) -> list[_ActKnobs]:
    """Activation settings; with several models the loss and packing stay the user's (memfit/roles/estimate.py computes
    the log-probs the framework's way whatever --loss says, and does not model packed preference rows)."""
    flash_ok = base.hardware.gpu.compute_capability >= 8.0
    ckpts = _unique([ak.checkpointing, *opts["checkpointing"]])
    attentions = _unique([ak.attention] + [x for x in opts["attention"] if x != "flash" or flash_ok])
    losses = _unique([ak.loss] + (["liger"] if opts["liger"] and not several else []))
    paddings = _unique([ak.padding] + ([opts["packing"]] if opts["packing"] and not several else []))
    out = []
    for c in ckpts:
        for m in _micro_batches(base, per_gpu):
            for at in attentions:
                for lo in losses:
                    for pad in paddings:
                        if pad == "padding_free" and at != "flash" and (pad, at) != (ak.padding, ak.attention):
                            continue  # varlen batches need flash attention kernels
                        out.append(_ActKnobs(c, m, at, lo, pad))
    return out


def _le(a: _ActKnobs, b: _ActKnobs) -> bool:
    """a needs no more device memory than b in every activation knob."""

    def ok(x, y, rank) -> bool:
        return x == y or rank.get(x, 9) < rank.get(y, 9)

    return (a.micro_batch <= b.micro_batch and ok(a.checkpointing, b.checkpointing, _CKPT_RANK)
            and ok(a.attention, b.attention, _ATTN_RANK) and a.loss == b.loss
            and ok(a.padding, b.padding, _PAD_RANK))


def _least_memory(acts: list[_ActKnobs], loss: str, host: bool = False) -> _ActKnobs | None:
    """The activation setting with this loss that needs the least device memory (host=True: among those
    without offloaded checkpoints, which cost host RAM)."""
    pool = [a for a in acts if a.loss == loss and (not host or a.checkpointing not in ("offload", "unsloth"))]
    return min(pool, key=lambda a: (a.micro_batch, _CKPT_RANK.get(a.checkpointing, 9), _ATTN_RANK[a.attention],
                                    _PAD_RANK[a.padding]), default=None)


def _fastest(acts: list[_ActKnobs], loss: str) -> _ActKnobs | None:
    """The activation setting with this loss the speed model rates fastest (it is monotone in each knob)."""
    pool = [a for a in acts if a.loss == loss]
    return min(pool, key=lambda a: (-a.micro_batch, _SPEED_RANK_CKPT.get(a.checkpointing, 9),
                                    _ATTN_RANK[a.attention], _PAD_RANK[a.padding]), default=None)


def _pareto(acts: list[_ActKnobs], keep: _ActKnobs) -> list[_ActKnobs]:
    """Drop settings beaten in both memory and speed by one that differs only in attention or packing
    (flash < sdpa < eager, packed < padded for several rows); the user's own setting stays."""
    def beats(x: _ActKnobs, y: _ActKnobs) -> bool:
        if (x.checkpointing, x.micro_batch, x.loss) != (y.checkpointing, y.micro_batch, y.loss) or x == y:
            return False
        pad_ok = x.padding == y.padding or (y.micro_batch > 1 and _PAD_RANK[x.padding] < _PAD_RANK[y.padding])
        return pad_ok and _ATTN_RANK[x.attention] <= _ATTN_RANK[y.attention]

    return [a for a in acts if a == keep or not any(beats(o, a) for o in acts)]


# ---------------------------------------------------------------- the search


@dataclass(frozen=True)
class Judged:
    """An estimate against the hardware: host RAM over the phases the run goes through (a run that never
    resumes from a checkpoint skips the resume phase's load of the optimizer files, knobs.md A.8)."""

    verdict: str
    device_peak: int  # device total per GPU at its peak
    margin: int
    host_peak: int  # per node
    host_margin: int | None


def judge(e, resume: bool = True) -> Judged:
    hw = e.scenario.hardware
    host_peak = max(b.total for phase, b in e.host.phases.items() if resume or phase != "resume")
    host_margin = None if hw.host_ram is None else hw.host_ram - host_peak
    return Judged(verdict_of(e.margin_bytes, hw.gpu.memory_bytes, host_margin), e.device_total.peak.total,
                   e.margin_bytes, host_peak, host_margin)


@dataclass
class _Candidate:
    state: _StateKnobs
    act: _ActKnobs
    scenario: Scenario
    speed: StepTime
    judged: Judged | None = None


def _fits(e: Judged) -> bool:
    return e.verdict in FITTING


def several_models(s: Scenario) -> bool:
    return methods.several_models(s.method)


def estimate_any(s: Scenario):
    """estimate() for one model, memfit.roles.estimate.estimate() for several (the same top-level fields)."""
    if several_models(s):
        
        return estimate(s)
    return estimate(s)


def speed_of(s: Scenario) -> StepTime:
    """The step-time model of any run (memfit/planner/step_time.py)."""
    return step_time(s)


def per_gpu_batch(base: Scenario, global_batch: int | None) -> int:
    world = base.world_size
    if global_batch is None:
        return base.micro_batch * base.grad_accum
    if global_batch <= 0 or global_batch % world:
        raise MemfitError(f"--global-batch {global_batch} must be a positive multiple of the {world} GPUs "
                          f"(global batch = micro-batch x gradient accumulation x GPUs)")
    return global_batch // world


def _check_allow(allow) -> set[str]:
    allow = {a.strip().lower() for a in (allow or ()) if a.strip()}
    unknown = allow - set(ALLOW)
    if unknown:
        raise MemfitError(f"--allow {','.join(sorted(unknown))} is not known; choose from: {', '.join(ALLOW)}")
    return allow


@cache
def _names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _changed(bk, k) -> list[str]:
    return [n for n in _names(type(k)) if getattr(bk, n) != getattr(k, n)]


@dataclass(frozen=True)
class Options:
    """What the user lets the search do beyond the knobs: `code_edits` = knobs the framework has no flag for
    but a documented edit of its code reaches (catalog/plan.toml code_edits); `resume` = judge host RAM at a
    resume from a checkpoint too (False: a run that always starts fresh)."""

    code_edits: bool = True
    resume: bool = True


# plan knob -> the plan.toml flag option that a code edit stands in for
_EDITED_OPTION = {"pin_memory": "pin_memory", "ratio": "offload_ratio"}


def _search_options(profile: str, options: Options) -> dict:
    opts = framework_options().get(profile)
    if opts is None:
        raise MemfitError(f"memfit plan has no search space for profile {profile!r}")
    edits = [k for k in _EDITED_OPTION if k in opts.get("code_edits", {})] if options.code_edits else []
    return {**opts, **{_EDITED_OPTION[k]: True for k in edits}, "edited": tuple(edits)}


def _method_facts(base: Scenario) -> dict | None:
    """catalog/methods.toml facts of a several-model method (Scenario has checked the name), else None."""
    if not several_models(base):
        return None
    return methods.method_facts(base.method)


class _Search:
    def __init__(self, base: Scenario, allow: set[str], global_batch: int | None, options: Options = Options()):
        self.per_gpu = per_gpu_batch(base, global_batch)
        self.builder = _Builder(base, self.per_gpu)
        self.base = base
        self.options = options
        self.opts = _search_options(base.profile, options)
        self.facts = _method_facts(base)
        self.bk, self.ak = _state_of(base), _act_of(base)
        self.states = _state_options(base, self.bk, self.opts, allow, self.facts)
        acts = _act_options(base, self.ak, self.opts, self.per_gpu, self.facts is not None)
        self.acts = _pareto(acts, self.ak)
        self.losses = _unique(a.loss for a in self.acts)
        self.built: dict[tuple[_StateKnobs, _ActKnobs], _Candidate | None] = {}
        self.started = time.perf_counter()
        self.estimates = 0

    def build(self, k: _StateKnobs, a: _ActKnobs) -> _Candidate | None:
        """The candidate for these knobs (built once: bounds, feasibility, rows and changes ask again)."""
        if (k, a) not in self.built:
            self.built[(k, a)] = self._build(k, a)
        return self.built[(k, a)]

    def _build(self, k: _StateKnobs, a: _ActKnobs, runnable: bool = True) -> _Candidate | None:
        try:
            s = self.builder.scenario(k, a)
            speed = speed_of(s)
        except MemfitError:
            return None  # a combination the frameworks reject (the scenario says which)
        if runnable and speed.tokens_per_second <= 0:
            return None  # it cannot run (vLLM without room for one sequence's KV cache)
        return _Candidate(k, a, s, speed)

    def estimate(self, c: _Candidate) -> Judged:
        if c.judged is None:
            c.judged = judge(estimate_any(c.scenario), self.options.resume)
            self.estimates += 1
        return c.judged

    def edited(self, k: _StateKnobs) -> tuple[str, ...]:
        """The knobs of k that differ from the user's and need a code edit of the framework."""
        return tuple(n for n in self.opts["edited"] if getattr(k, n) != getattr(self.bk, n))

    def family(self, k: _StateKnobs) -> tuple:
        return _family(k) + (bool(self.edited(k)), k.ref_offload or k.reward_offload, k.vllm_sleep,
                             k.deepspeed_sleep)

    def feasible(self, k: _StateKnobs) -> bool:
        """Could anything fit with these model-state knobs? (tried with the least-memory activations)"""
        for loss in self.losses:
            tried = []
            for host in (False, True):
                act = _least_memory(self.acts, loss, host)
                low = self.build(k, act) if act and act not in tried else None
                if low is None:
                    continue
                tried.append(act)
                verdict = self.estimate(low).verdict
                if verdict in FITTING:
                    return True
                if verdict == "oom":
                    break  # the host-friendly setting needs more device memory still
        return False

    def upper_bound(self, k: _StateKnobs) -> float:
        """tokens/s of the fastest activation setting: nothing with these model-state knobs is faster."""
        speeds = [c.speed.tokens_per_second for c in (self.build(k, _fastest(self.acts, loss))
                                                      for loss in self.losses) if c is not None]
        return max(speeds, default=0.0)

    def best_for(self, k: _StateKnobs, floor: float = 0.0) -> _Candidate | None:
        """The fastest fitting activation setting for these model-state knobs (None below `floor` tokens/s);
        among those within SPEED_TOLERANCE of it, the one with the fewest changes."""
        cands = [c for c in (self.build(k, a) for a in self.acts) if c is not None]
        n_state = len(_changed(self.bk, k))

        def n_changes(c: _Candidate) -> int:
            return n_state + len(_changed(self.ak, c.act))

        cands.sort(key=lambda c: (-c.speed.tokens_per_second, n_changes(c)))
        out_of_memory: list[_ActKnobs] = []
        best: _Candidate | None = None
        for c in cands:
            speed = c.speed.tokens_per_second
            if speed < floor or (best is not None and speed < best.speed.tokens_per_second * (1 - SPEED_TOLERANCE)):
                break
            if best is not None and n_changes(c) >= n_changes(best):
                continue
            if any(_le(o, c.act) for o in out_of_memory):
                continue
            e = self.estimate(c)
            if e.verdict == "oom":
                out_of_memory.append(c.act)
            elif _fits(e):
                best = c  # the first fit, or one within tolerance with fewer changes
        return best

    def late(self) -> bool:
        return time.perf_counter() - self.started > DEADLINE_SECONDS


def _family(k: _StateKnobs) -> tuple:
    """Rows are one per approach: tuning, how the weights are laid out, what is offloaded. Optimizer,
    pin_memory and ratio variants of one approach compete for its row."""
    adapters = k.tuning in ("lora", "qlora")
    if k.sharding.level == Sharding.NONE:
        layout = "replicated"
    elif adapters:  # adapter states are tiny: only sharding the frozen weights makes a difference
        layout = "sharded" if k.sharding.level == Sharding.PARAMETERS else "replicated"
    else:
        layout = str(k.sharding)
    return k.tuning, layout, k.offload != "none", k.offload_param != "none"


class _Ranking:
    """Candidates (the best of each model-state setting) -> rows."""

    def __init__(self, bk: _StateKnobs, ak: _ActKnobs, top_k: int, family=_family):
        self.bk, self.ak, self.top_k, self.family = bk, ak, top_k, family
        self.found: list[_Candidate] = []
        self.rows: list[_Candidate] = []

    def changes(self, c: _Candidate) -> frozenset:
        return frozenset((n, getattr(c.state, n)) for n in _changed(self.bk, c.state)) | frozenset(
            (n, getattr(c.act, n)) for n in _changed(self.ak, c.act))

    def add(self, c: _Candidate) -> None:
        self.found.append(c)
        self.rows = self._rank()

    def _rank(self) -> list[_Candidate]:
        families: dict[tuple, list[_Candidate]] = {}
        for c in self.found:
            families.setdefault(self.family(c.state), []).append(c)
        best = [self._simplest(members) for members in families.values()]
        sets = {id(c): self.changes(c) for c in self.found}
        kept = [c for c in best if not any(self._redundant(c, sets[id(c)], o, sets[id(o)])
                                           for o in self.found if o is not c)]
        return sorted(kept, key=lambda c: (-c.speed.tokens_per_second, len(sets[id(c)])))[: self.top_k]

    def _simplest(self, members: list[_Candidate]) -> _Candidate:
        """The fewest changes among the members within SPEED_TOLERANCE of the fastest."""
        fastest = max(c.speed.tokens_per_second for c in members)
        close = [c for c in members if c.speed.tokens_per_second >= fastest * (1 - SPEED_TOLERANCE)]
        return min(close, key=lambda c: (len(self.changes(c)), -c.speed.tokens_per_second))

    @staticmethod
    def _redundant(c: _Candidate, mine: frozenset, other: _Candidate, theirs: frozenset) -> bool:
        """c makes all of `other`'s changes and more, and the extra ones buy neither speed nor memory."""
        if not theirs < mine or other.speed.tokens_per_second < c.speed.tokens_per_second * (1 - SPEED_TOLERANCE):
            return False
        hw = c.scenario.hardware
        e, o = c.judged, other.judged
        device_gain = o.device_peak - e.device_peak
        host_gain = o.host_peak - e.host_peak
        return device_gain < MEMORY_TOLERANCE * hw.gpu.memory_bytes and (
            hw.host_ram is None or host_gain < MEMORY_TOLERANCE * hw.host_ram)

    def floor(self, k: _StateKnobs) -> float:
        """Below this many tokens/s a candidate with these knobs can change no row: its approach already
        has a faster one, or k rows are faster."""
        mine = self.family(k)
        family = max((c.speed.tokens_per_second for c in self.found if self.family(c.state) == mine), default=0.0)
        last = self.rows[-1].speed.tokens_per_second if len(self.rows) >= self.top_k else 0.0
        return max(family, last) * (1 - SPEED_TOLERANCE)

    def done(self, bound: float) -> bool:
        """No candidate at most `bound` tokens/s can still enter the rows."""
        if len(self.rows) < self.top_k:
            return False
        return bound < self.rows[-1].speed.tokens_per_second * (1 - SPEED_TOLERANCE)


def _search(base: Scenario, allow: set[str], global_batch: int | None, top_k: int,
            options: Options) -> tuple[_Search, list]:
    search = _Search(base, allow, global_batch, options)
    bounded = sorted(((search.upper_bound(k), k) for k in search.states), key=lambda x: -x[0])
    ranking = _Ranking(search.bk, search.ak, top_k, search.family)
    for bound, k in bounded:
        if ranking.done(bound) or search.late():
            break
        floor = ranking.floor(k)
        if bound < floor or not search.feasible(k):
            continue
        best = search.best_for(k, floor)
        if best is not None:
            ranking.add(best)
    return search, ranking.rows


# ---------------------------------------------------------------- changes, measured one by one


def _row(c: _Candidate, changes: tuple[Change, ...]) -> PlanRow:
    e = c.judged
    return PlanRow(scenario=c.scenario, verdict=e.verdict, device_peak_bytes=e.device_peak,
                   headroom_bytes=e.margin, host_peak_bytes=e.host_peak, host_headroom_bytes=e.host_margin,
                   tokens_per_second=c.speed.tokens_per_second, step_seconds=c.speed.seconds, changes=changes)


def _code_edit(search: _Search, name: str, s: Scenario) -> CodeEdit | None:
    """The exact edit for a knob the framework has no flag for (catalog/plan.toml code_edits)."""
    if name not in search.opts["edited"]:
        return None
    where = search.opts["code_edits"]
    values = {"pin_memory": [("pin_memory", s.pin_memory)],
              "ratio": [("ratio", s.ratio), ("sub_group_size", s.sub_group_size)]}[name]
    return CodeEdit(where["file"], where["function"], tuple((where[key], value) for key, value in values))


def _measure(search: _Search, c: _Candidate, cache: dict) -> tuple[Change, ...]:
    """Memory: the change applied alone to the user's scenario (when it stands alone: valid, and not a
    no-op there, like pin_memory without offload), else removed from the plan; also, always, removed from
    the plan. Speed: the plan against the plan without it (changes interact: a larger micro-batch pays
    off only once rows are packed)."""
    bk, ak = search.bk, search.ak
    base_c = search.build(bk, ak)
    out = []
    for group, mine, theirs in (("state", c.state, bk), ("act", c.act, ak)):
        for name in _changed(theirs, mine):
            before, after = getattr(theirs, name), getattr(mine, name)
            if (name, after) not in cache:
                k2 = replace(bk, **{name: after}) if group == "state" else bk
                a2 = replace(ak, **{name: after}) if group == "act" else ak
                cache[(name, after)] = search.build(k2, a2)
            alone = cache[(name, after)]
            if alone is not None and (base_c is None or alone.scenario == base_c.scenario):
                alone = None
            k3 = replace(c.state, **{name: before}) if group == "state" else c.state
            a3 = replace(c.act, **{name: before}) if group == "act" else c.act
            without = search.build(k3, a3)  # the plan without this change
            in_plan = _savings(search, c, without)
            memory = _savings(search, alone, base_c) if alone is not None else in_plan
            faster, slower = (c, without) if without is not None else (alone, base_c)
            cost = 0.0
            if faster is not None and slower is not None:
                cost = (1.0 - faster.speed.tokens_per_second / slower.speed.tokens_per_second) * 100.0
            out.append(Change(name, before, after, memory[0], memory[1], cost,
                              "alone" if alone is not None else "in_plan",
                              without is None or not _fits(search.estimate(without)), *in_plan,
                              code_edit=_code_edit(search, name, c.scenario)))
    return tuple(out)


def _savings(search: _Search, with_c: _Candidate | None, without_c: _Candidate | None) -> tuple[int, int]:
    """(device, host) peak bytes that `with_c` saves against `without_c`."""
    if with_c is None or without_c is None:
        return 0, 0
    w, wo = search.estimate(with_c), search.estimate(without_c)
    return wo.device_peak - w.device_peak, wo.host_peak - w.host_peak


# ---------------------------------------------------------------- public


def plan(base: Scenario, allow: set[str] | None = None, global_batch: int | None = None,
         top_k: int = 5, options: Options = Options()) -> list[PlanRow]:
    """The `top_k` fastest configurations that fit (device and host), derived from `base`.

    `allow` may contain "lora", "qlora" (tuning changes) and "8bit" (8-bit optimizer states). The global
    batch (micro-batch x gradient accumulation x GPUs) is kept: `global_batch`, or the base's own.
    Several-model methods (DPO, PPO, ...) place every model the way their framework does (memfit/roles/).
    """
    search, rows = _search(base, _check_allow(allow), global_batch, top_k, options)
    cache: dict = {}
    return [_row(c, _measure(search, c, cache)) for c in rows]


def baseline(base: Scenario, global_batch: int | None = None, options: Options = Options()) -> PlanRow:
    """The user's own scenario as a row (with the global batch applied), whatever its verdict."""
    search = _Search(base, set(), global_batch, options)
    c = search._build(search.bk, search.ak, runnable=False)  # shown even when it cannot run (0 tokens/s)
    if c is None:
        raise MemfitError("the starting scenario is not valid with this global batch")
    search.estimate(c)
    return _row(c, ())


def closest_miss(base: Scenario, allow: set[str] | None = None, global_batch: int | None = None,
                 options: Options = Options()) -> PlanRow | None:
    """When nothing fits: the least-memory setting of each approach, the one short by the smallest share
    of its capacity (device or host), with its changes measured like a plan row's."""
    search = _Search(base, _check_allow(allow), global_batch, options)
    best, best_short = None, None
    hw = base.hardware
    for k in sorted(search.states, key=_role_memory_order):  # least memory first: the time cap cuts the rest
        if search.late():
            break
        for loss in search.losses:
            for host in (False, True):
                act = _least_memory(search.acts, loss, host)
                c = search.build(k, act) if act else None
                if c is None:
                    continue
                e = search.estimate(c)
                short = max(-e.margin / hw.gpu.memory_bytes,
                            -e.host_margin / hw.host_ram if e.host_margin is not None else 0.0)
                if best_short is None or short < best_short:
                    best, best_short = c, short
    return _row(best, _measure(search, best, {})) if best else None


def _role_memory_order(k: _StateKnobs) -> tuple:
    """Several-model knobs that need the least device memory first (offloaded, asleep, least vLLM memory)."""
    return (not k.ref_offload, not k.reward_offload, k.vllm_gpu_memory_utilization, not k.vllm_sleep,
            not k.deepspeed_sleep)


def choose_for_fit(rows: list[PlanRow], tolerance: float = 0.03) -> PlanRow | None:
    """The row `memfit fit` writes back: a row the user's file can say alone (no edit of the framework's
    code) when there is one; among those within `tolerance` of the fastest, the fewest changes (a plan a
    few % slower but with one change less is the smaller edit to the user's file)."""
    flags_only = [r for r in rows if not any(c.code_edit for c in r.changes)]
    rows = flags_only or rows
    if not rows:
        return None
    fastest = rows[0].tokens_per_second
    close = [r for r in rows if r.tokens_per_second >= fastest * (1.0 - tolerance)]
    return min(close, key=lambda r: (sum(bool(c.code_edit) for c in r.changes), len(r.changes),
                                     -r.tokens_per_second))

"""The option space: which model-state and activation settings `memfit plan` tries for a run, only values
the framework exposes (data/frameworks/NAME.toml [plan]) and combinations the frameworks accept (ratio: ZeRO-3
with optimizer offload; offload_param: ZeRO-3; flash: compute capability >= 8.0; 8-bit optimizers and
LoRA / QLoRA only when allowed)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from memfit.errors import MemfitError
from memfit.facts.adapters import trains_adapters
from memfit.facts.engines import Sharding
from memfit.facts.frameworks import frameworks
from memfit.facts.remote_code import ignored_checkpointing
from memfit.facts.recompute import MODES, Recompute
from memfit.facts.scenario import Scenario
from memfit.planner.data import DataShapes
from memfit.planner.knobs import ZERO3, ActKnobs, Layout, StateKnobs

RATIOS = (1.0, 0.9, 0.8, 0.7, 0.5)  # DeepSpeed offload_optimizer.ratio values tried (ZeRO-3 + optimizer offload)
# with adapters, sharding only the optimizer or the gradients shards tiny adapter states: no row of their own
ADAPTER_SKIP_LEVELS = (Sharding.OPTIMIZER, Sharding.GRADIENTS)
# Device-memory order of the activation knobs (lower = less memory); values of equal rank are not compared.
ATTN_RANK = {"flash": 0, "sdpa": 1, "eager": 2}
# Losses are not ranked: Liger's fused loss holds a V x h fp32 weight gradient when lm_head trains, which
# exceeds the standard loss's logits at small micro-batches; the search tries each loss instead.
PAD_RANK = {"padding_free": 0, "packed": 0, "padded": 1}


def framework_options() -> dict[str, dict]:
    """What `memfit plan` may change under each framework (data/frameworks/NAME.toml [plan])."""
    return {name: fw.plan for name, fw in frameworks().items()}


# the search's budget in estimates; the largest search of the tests spends a few hundred, so this stops only a
# runaway space (a several-model run at about 6 ms an estimate: ~12 s)
BUDGET = 2000


@dataclass(frozen=True)
class Options:
    """What the user lets the search do beyond the knobs: `code_edits` = knobs the framework has no flag for
    but a documented edit of its code reaches (data/frameworks/NAME.toml [plan.code_edits]); `resume` = judge host RAM at a
    resume from a checkpoint too (False: a run that always starts fresh); `data` = the user's data lengths."""

    code_edits: bool = True
    resume: bool = True
    data: DataShapes | None = None  # --lengths: judge each candidate at its data's worst micro-batch (data.py)
    budget: int | None = None  # estimates the search may spend (None: BUDGET); past it, it returns what it found

    def estimates_allowed(self) -> int:
        return self.budget or BUDGET  # read at search time: a test may lower BUDGET for a whole run


# axes a code edit can reach (data/frameworks/NAME.toml [plan.code_edits]); the edit stands in for the flag
EDITABLE = ("pin_memory", "ratio")


def search_options(profile: str, options: Options) -> dict:
    opts = framework_options().get(profile)
    if opts is None:
        raise MemfitError(f"memfit plan has no search space for profile {profile!r}")
    edits = [k for k in EDITABLE if k in opts.get("code_edits", {})] if options.code_edits else []
    return {**opts, **{k: True for k in edits}, "edited": tuple(edits)}


def unique(items) -> list:
    return list(dict.fromkeys(items))


def state_options(base: Scenario, bk: StateKnobs, opts: dict, allow: set[str],
                   facts: dict | None = None) -> list[StateKnobs]:
    world = base.world_size
    tunings = unique([bk.tuning] + [t for t in ("lora", "qlora") if t in allow])
    low_bit = opts.get("low_bit_optimizer", "")
    optimizers = unique([bk.optimizer] + ([low_bit] if "8bit" in allow and low_bit else []))
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
        adapters = trains_adapters(tuning)
        for sharding in unique(shardings):
            if adapters and sharding.level in ADAPTER_SKIP_LEVELS and sharding != bk.sharding:
                continue
            for optimizer in optimizers:
                if optimizer != bk.optimizer and (sharding.engine == "deepspeed" or adapters):
                    continue  # ZeRO is modeled with fp32 Adam only; adapters' states are too small to matter
                for offload, pin, ratio, param in offloads(sharding, bk, opts, adapters, tuning):
                    out.append(replace(bk, tuning=tuning, optimizer=optimizer, sharding=sharding, offload=offload,
                                       pin_memory=pin, ratio=ratio, offload_param=param))
    out = unique([bk] + out)
    if facts is None:
        return out
    return unique(v for k in out for v in role_variants(k, bk, opts, facts, base))


def role_variants(k: StateKnobs, bk: StateKnobs, opts: dict, facts: dict, s: Scenario) -> list[StateKnobs]:
    """The several-model knobs tried with these model-state knobs, each only where it acts (docs/knobs.md E):
    reference / reward offload under ZeRO-3, vLLM memory and sleep with a generator (sleep only when all
    models are colocated), DeepSpeed sleep without Adam offload (OpenRLHF makes it a no-op then)."""
    def both(name: str, acts: object) -> list:  # acts: anything truthy (an option's value)
        return unique([getattr(bk, name), not getattr(bk, name)]) if acts else [getattr(bk, name)]

    zero3, gen = k.sharding == ZERO3, bool(facts.get("generator"))
    refs = both("ref_offload", zero3 and opts.get("ref_offload") and facts.get("reference"))
    rewards = both("reward_offload", zero3 and opts.get("ref_offload") and facts.get("reward") and not s.remote_reward)
    utils = unique([bk.vllm_gpu_memory_utilization] + (list(opts.get("vllm_gpu_memory_utilization", ())) if gen else []))
    colocated = s.colocate == "all" or not opts.get("vllm_sleep_needs_colocate_all")
    vsleeps = both("vllm_sleep", gen and opts.get("vllm_sleep") and colocated)
    dsleeps = both("deepspeed_sleep", gen and opts.get("deepspeed_sleep") and k.offload == "none")
    return [replace(k, ref_offload=r, reward_offload=w, vllm_gpu_memory_utilization=u, vllm_sleep=v,
                    deepspeed_sleep=d)
            for r in refs for w in rewards for u in utils for v in vsleeps for d in dsleeps]


def offloads(sharding: Layout, bk: StateKnobs, opts: dict, adapters: bool, tuning: str):
    """(offload, pin_memory, ratio, offload_param) tuples valid for this sharding. Knobs that do not
    apply carry the user's value, so they never show up as changes. Parameter offload is tried with
    optimizer offload only (the combination memfit's ZeRO-3 model covers); the user's own setting is
    always among the candidates. With adapters only what moves the frozen weights is tried: FSDP's CPU offload
    (it offloads the parameters: the well-known 70B QLoRA on two 24 GB cards) and ZeRO-3's parameter offload;
    an adapter's optimizer states alone are too small for their offload to pay."""
    keep = (bk.pin_memory, bk.ratio, bk.offload_param)
    if sharding.engine == "fsdp":
        yield "none", *keep
        yield "cpu", *keep
        return
    stage = sharding.zero_stage if sharding.engine == "deepspeed" else 0
    yield "none", bk.pin_memory, bk.ratio, "none" if stage == 3 else bk.offload_param
    if stage == 0 or (adapters and stage != 3):
        return
    params = [bk.offload_param]
    ratios = [bk.ratio]
    if stage == 3:
        params = ["none"] + (["cpu"] if tuning != "qlora" and opts["offload_param"] else [])
        ratios = unique(([bk.ratio] if bk.sharding == ZERO3 and bk.offload != "none" else []) + list(RATIOS))
        if adapters:  # only the frozen weights' offload is worth a slower step
            params, ratios = [p for p in params if p == "cpu"], [1.0]
    if not opts.get("ratio", True):
        ratios = [bk.ratio]
    pins = unique([bk.pin_memory, True, False]) if opts.get("pin_memory", True) else [bk.pin_memory]
    for pin in pins:
        for ratio in ratios:
            for param in params:
                yield "cpu", pin, ratio, param


def micro_batches(base: Scenario, per_gpu: int) -> list[int]:
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


def act_options(base: Scenario, ak: ActKnobs, opts: dict, per_gpu: int, several: bool = False) -> list[ActKnobs]:
    """Activation settings; with several models the loss and packing stay the user's (memfit/roles/estimate.py computes
    the log-probs the framework's way whatever --loss says, and does not model packed preference rows)."""
    has = {"flash": base.model.has_flash and base.hardware.gpu.compute_capability >= 8.0,
           "sdpa": base.model.has_sdpa}  # kernels the GPU and the family's transformers code have
    ckpts = unique([ak.checkpointing, *opts["checkpointing"]])
    if ignored_checkpointing(base.model.arch, base.profile):  # the model's own file never turns it on (facts)
        ckpts = ["off"]
    attentions = unique([ak.attention] + [x for x in opts["attention"] if has.get(x, True)])
    losses = unique([ak.loss] + (["liger"] if opts["liger"] and not several else []))
    paddings = unique([ak.padding] + ([opts["packing"]] if opts["packing"] and not several else []))
    out = []
    for c in ckpts:
        for m in micro_batches(base, per_gpu):
            for at in attentions:
                for lo in losses:
                    for pad in paddings:
                        if pad == "padding_free" and at != "flash" and (pad, at) != (ak.padding, ak.attention):
                            continue  # varlen batches need flash attention kernels
                        out.append(ActKnobs(c, m, at, lo, pad))
    return out


def le(a: ActKnobs, b: ActKnobs) -> bool:
    """a needs no more device memory than b in every activation knob."""

    def ok(x, y, rank) -> bool:
        return x == y or rank.get(x, 9) < rank.get(y, 9)

    # more recompute needs less device memory
    recompute = {mode: -level for mode, level in MODES.items()}
    return (a.micro_batch <= b.micro_batch and ok(a.checkpointing, b.checkpointing, recompute)
            and ok(a.attention, b.attention, ATTN_RANK) and a.loss == b.loss
            and ok(a.padding, b.padding, PAD_RANK))


def least_memory(acts: list[ActKnobs], loss: str, host: bool = False) -> ActKnobs | None:
    """The activation setting with this loss that needs the least device memory (host=True: among those
    without offloaded checkpoints, which cost host RAM)."""
    pool = [a for a in acts if a.loss == loss and (not host or not Recompute.of(a.checkpointing).on_host)]
    return min(pool, key=lambda a: (a.micro_batch, -Recompute.of(a.checkpointing), ATTN_RANK[a.attention],
                                    PAD_RANK[a.padding]), default=None)


def fastest(acts: list[ActKnobs], loss: str) -> ActKnobs | None:
    """The activation setting with this loss the speed model rates fastest (it is monotone in each knob)."""
    pool = [a for a in acts if a.loss == loss]
    return min(pool, key=lambda a: (-a.micro_batch, Recompute.of(a.checkpointing),
                                    ATTN_RANK[a.attention], PAD_RANK[a.padding]), default=None)


def pareto(acts: list[ActKnobs], keep: ActKnobs) -> list[ActKnobs]:
    """Drop settings beaten in both memory and speed by one that differs only in attention or packing
    (flash < sdpa < eager, packed < padded for several rows); the user's own setting stays."""
    def beats(x: ActKnobs, y: ActKnobs) -> bool:
        if (x.checkpointing, x.micro_batch, x.loss) != (y.checkpointing, y.micro_batch, y.loss) or x == y:
            return False
        pad_ok = x.padding == y.padding or (y.micro_batch > 1 and PAD_RANK[x.padding] < PAD_RANK[y.padding])
        return pad_ok and ATTN_RANK[x.attention] <= ATTN_RANK[y.attention]

    return [a for a in acts if a == keep or not any(beats(o, a) for o in acts)]

"""Runs with several models: DPO and its relatives, reward models, PPO and GRPO (issue 6).

`estimate_roles(s)` splits the run into roles (policy/actor, reference, critic, reward, generator), gives each
its own Scenario and memory (`role_memory.py`), places them in processes and GPU groups the way the framework
does (catalog/methods.toml; OpenRLHF colocation flags), walks the moments of one training step, and sums what
every process on a GPU holds at each moment. The result has the Estimate's top-level fields (allocated /
reserved / device_total of the worst GPU, host per node, verdict, margin, to_json) plus per-role and
per-GPU-group detail, so the CLI and JSON treat it like a single-model Estimate.

Moments map onto the shared phases: load -> load; generation, experience (no-grad forwards) and the train
forward -> forward; train backward -> backward; optimizer step and the weight sync to vLLM -> optimizer_step.
Sources: ../shared/reference/knobs.md E (multi-model), C.3/C.4 (logits, rows), H.1 (per-process costs).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memfit.memory import overheads
from memfit.memory.activations import _attention_per_token
from memfit.breakdown import PHASES, Breakdown, PhaseProfile
from memfit.facts.catalog import find_model
from memfit.errors import MemfitError
from memfit.memory.estimate import reserved_profile, verdict_of
from memfit.facts.methods import framework_facts, generator_facts, method_facts, reference, several_models
from memfit.roles.memory import FrozenRole, Generator, TrainedRole, frozen_host, frozen_role, trained_role
from memfit.facts.engines import engine_of
from memfit.facts.scenario import Hardware, Scenario

TRAIN_PHASES = ("forward", "backward", "optimizer_step")


def _sum(*parts: Breakdown) -> Breakdown:
    out: dict[str, int] = {}
    for b in parts:
        for c, n in b.parts.items():
            out[c] = out.get(c, 0) + int(n)
    return Breakdown(out)


def _phase_of(moment: str) -> str:
    if moment.startswith("load"):
        return "load"
    for phase in ("backward", "optimizer_step", "checkpoint_save", "resume"):
        if moment.endswith(phase):
            return phase
    return "optimizer_step" if moment == "weight_sync" else "forward"


# ---------------------------------------------------------------------------------------------- holdings
@dataclass
class Holding:
    """What one role holds in one process on one GPU at one moment."""

    process: str
    role: str
    allocated: Breakdown
    cache: int = 0  # caching-allocator slack its churn leaves (reserved - allocated)
    outside: int = 0  # non-torch bytes of this role (paged optimizer states)


@dataclass
class Process:
    name: str
    group: str
    world: int  # GPUs its collectives span (NCCL when > 1)
    nodes: int = 1


@dataclass
class GpuGroup:
    """GPUs that run the same processes; every number is per GPU of the group."""

    name: str
    gpus: int
    processes: tuple[str, ...]
    roles: tuple[str, ...]
    capacity: int
    moments: dict[str, dict[str, Breakdown]]  # moment -> role -> device bytes by category
    allocated: PhaseProfile
    reserved: PhaseProfile
    device_total: PhaseProfile
    peak_moment: str

    @property
    def peak(self) -> int:
        return self.device_total.peak.total

    @property
    def margin_bytes(self) -> int:
        return self.capacity - self.peak

    def by_role(self, moment: str | None = None) -> dict[str, int]:
        return {r: b.total for r, b in self.moments[moment or self.peak_moment].items()}

    def to_json(self) -> dict:
        return {
            "name": self.name, "gpus": self.gpus, "processes_per_gpu": len(self.processes),
            "processes": list(self.processes), "roles": list(self.roles), "peak_moment": self.peak_moment,
            "peak_bytes": self.peak, "margin_bytes": self.margin_bytes,
            "verdict": verdict_of(self.margin_bytes, self.capacity, None),
            "moments": {m: {r: b.to_json() for r, b in roles.items()} for m, roles in self.moments.items()},
            "device_total": self.device_total.to_json(),
        }


@dataclass
class RoleEstimate:
    role: str  # policy | reference | critic | reward | generator
    model: str
    process: str
    group: str
    gpus: int
    trains: bool
    engine: str
    params: int
    trainable: int
    rows: int  # rows of its largest batch (chosen + rejected counted)
    seq_len: int
    idle: Breakdown  # per GPU between its own work (allocated)
    active: Breakdown  # per GPU at its own peak (allocated)
    host_per_node: int  # at its host peak
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"role": self.role, "model": self.model, "process": self.process, "group": self.group,
                "gpus": self.gpus, "trains": self.trains, "engine": self.engine, "params": self.params,
                "trainable_params": self.trainable, "rows": self.rows, "seq_len": self.seq_len,
                "idle": self.idle.to_json(), "active": self.active.to_json(), "host_per_node": self.host_per_node,
                "notes": list(self.notes)}


@dataclass
class MultiEstimate:
    """The Estimate of a multi-model run: the worst GPU's profiles at the top level, detail per role / group."""

    scenario: Scenario
    method: str
    total_params: int  # the policy's
    trainable_params: int
    allocated: PhaseProfile  # worst GPU group
    reserved: PhaseProfile
    device_total: PhaseProfile
    host: PhaseProfile  # per node, every role's processes
    verdict: str
    margin_bytes: int
    host_margin_bytes: int | None
    roles: list[RoleEstimate]
    groups: list[GpuGroup]
    worst_group: str
    drivers: dict[str, int] = field(default_factory=dict)  # named bytes that explain the peak
    gpus_needed: int = 0
    assumptions: list[str] = field(default_factory=list)

    @property
    def peak_phase(self) -> str:
        return self.device_total.peak_phase

    def group(self, name: str | None = None) -> GpuGroup:
        return next(g for g in self.groups if g.name == (name or self.worst_group))

    def to_json(self) -> dict:
        s = self.scenario
        return {
            "schema": "memfit.memory.estimate/1",
            "model": s.model.id,
            "method": self.method,
            "gpu": s.hardware.gpu.name,
            "gpu_memory_bytes": s.hardware.gpu.memory_bytes,
            "gpus_per_node": s.hardware.gpus_per_node,
            "nodes": s.hardware.nodes,
            "params": {"total": self.total_params, "trainable": self.trainable_params},
            "per_rank": {"allocated": self.allocated.to_json(), "reserved": self.reserved.to_json(),
                         "device_total": self.device_total.to_json()},
            "host_per_node": self.host.to_json(),
            "host_ram_bytes": s.hardware.host_ram,
            "verdict": self.verdict,
            "margin_bytes": self.margin_bytes,
            "host_margin_bytes": self.host_margin_bytes,
            "worst_gpu_group": self.worst_group,
            "gpus_needed": self.gpus_needed,
            "roles": [r.to_json() for r in self.roles],
            "gpu_groups": [g.to_json() for g in self.groups],
            "drivers": dict(self.drivers),
            "assumptions": list(self.assumptions),
        }


# ---------------------------------------------------------------------------------------------- settle
def _add(into: dict[str, int], parts: dict[str, int], **extra: int) -> dict[str, int]:
    for c, n in (*parts.items(), *extra.items()):
        into[c] = into.get(c, 0) + int(n)
    return into


def _settle(holdings: list[Holding], processes: dict[str, Process]) -> tuple[dict[str, Breakdown], Breakdown,
                                                                                 Breakdown, Breakdown]:
    """Per-role device bytes and the group's allocated / reserved / device total at one moment. Each process
    pays its own CUDA context and NCCL communicators (knobs.md H.1) and keeps its own allocator cache;
    those land on the first role the process holds. (Plain dicts inside: planning settles thousands of moments.)"""
    by_role: dict[str, dict[str, int]] = {}
    first_role: dict[str, str] = {}
    alloc: dict[str, int] = {}
    reserved: dict[str, int] = {}
    for h in holdings:
        first_role.setdefault(h.process, h.role)
        _add(alloc, h.allocated.parts)
        _add(reserved, h.allocated.parts, runtime_overhead=h.cache)
        _add(by_role.setdefault(h.role, {}), h.allocated.parts, runtime_overhead=h.cache, optimizer_states=h.outside)
    for name, role in first_role.items():
        p = processes[name]
        context, nccl = overheads.non_torch_device_bytes(p.world, p.nodes)
        _add(by_role[role], {}, runtime_overhead=context + nccl)
    device: dict[str, int] = {}
    for parts in by_role.values():
        _add(device, parts)
    return ({r: Breakdown(parts) for r, parts in by_role.items()}, Breakdown(alloc), Breakdown(reserved),
            Breakdown(device))


def _group(name: str, gpus: int, capacity: int, moments: dict[str, list[Holding]],
           processes: dict[str, Process]) -> GpuGroup:
    settled = {m: _settle(hs, processes) for m, hs in moments.items()}
    best: dict[str, str] = {}
    for m, (_, alloc, _, device) in settled.items():
        phase = _phase_of(m)
        # equal on the card: the moment holding more tensors is the phase's peak (DPO's reference forward
        # fills the slack the policy's forward left in the allocator)
        if phase not in best or (device.total, alloc.total) > (settled[best[phase]][3].total,
                                                                 settled[best[phase]][1].total):
            best[phase] = m
    steady = best.get("checkpoint_save") or best.get("forward")
    for phase in PHASES:  # every phase present, as the shared vocabulary expects
        best.setdefault(phase, steady)
    profile = {i: PhaseProfile({p: settled[m][i] for p, m in best.items()}) for i in (1, 2, 3)}
    peak_moment = best[profile[3].peak_phase]
    procs = tuple(dict.fromkeys(h.process for hs in moments.values() for h in hs))
    roles = tuple(dict.fromkeys(h.role for hs in moments.values() for h in hs))
    return GpuGroup(name, gpus, procs, roles, capacity, {m: s[0] for m, s in settled.items()}, profile[1],
                    profile[2], profile[3], peak_moment)


def _trained_holding(process: str, role: str, tr: TrainedRole, phase: str, reserved: PhaseProfile) -> Holding:
    b = tr.allocated.phases[phase]
    return Holding(process, role, b, reserved.phases[phase].total - b.total, tr.states.paged_optimizer)


def _frozen_cache(b: Breakdown) -> int:
    return overheads.allocator_cache(b.get("activations") + b.get("logits_loss"))


# ---------------------------------------------------------------------------------------------- shared pieces
def _model(name: str | None, default):
    return default if not name else find_model(name)


def _role(role: str, model, process: str, group: str, gpus: int, trains: bool, engine: str, params: int,
          trainable: int, rows: int, seq: int, idle: Breakdown, active: Breakdown, host: int,
          notes=()) -> RoleEstimate:
    return RoleEstimate(role, model.id if hasattr(model, "id") else str(model), process, group, gpus, trains, engine,
                        params, trainable, rows, seq, idle, active, host, list(notes))


def _reference_needed(s: Scenario, notes: list[str]) -> str:
    kind, why = reference(s)
    notes.extend(why)
    return kind


# ---------------------------------------------------------------------------------------------- one process
def _single_process(s: Scenario, facts: dict, fw: dict, notes: list[str]) -> tuple[list[RoleEstimate],
                                                                                   list[GpuGroup], dict]:
    """DPO / IPO / KTO / ORPO / SimPO / RM: the policy and its reference share one process per GPU. The
    policy runs its forward first, then the reference's no-grad forward while the policy's saved activations
    and log-prob logits are alive (OpenRLHF dpo_trainer.py, TRL dpo_trainer.py _compute_loss, LLaMA-Factory)."""
    rows = s.micro_batch * facts.get("rows_per_example", 1)
    value_head = bool(facts.get("value_head"))
    kind = fw["logits"]
    policy = trained_role(s, rows, kind, value_head)
    reserved = reserved_profile(policy.allocated, policy.states)
    need_ref = _reference_needed(s, notes)
    ref = None
    if need_ref != "none":
        ref_model = _model(s.ref_model, s.model)
        ref = frozen_role(s, ref_model, s.micro_batch * facts.get("rows_per_example", 1), kind, False,
                          s.ref_offload, shares_policy=need_ref == "shared")
        notes.extend(ref.notes)
    if facts.get("kl_rows"):
        notes.append("KTO's mismatched KL rows run as separate no-grad forwards of the same size (not on top)")
    moments: dict[str, list[Holding]] = {}
    ref_idle = Breakdown({"weights": ref.resident}) if ref else None
    for phase in PHASES:
        hs = [_trained_holding("trainer", "policy", policy, phase, reserved)]
        if ref:
            hs.append(Holding("trainer", "reference", ref_idle))
        moments[phase] = hs
    if ref:
        # the policy's forward is over: its saved activations and log-prob logits wait for backward
        fwd = policy.allocated.phases["forward"].parts
        kept = Breakdown({**fwd, "activations": policy.act.saved_total, "logits_loss": policy.logits.saved})
        ref_work = ref.forward  # gathered params included where they are at its peak
        ref_cache = _frozen_cache(ref.forward)
        # the caching allocator keeps what the policy's forward reserved: the reference's forward allocates
        # into that slack before it reserves more, so this moment never reserves less than the forward did
        slack = reserved.phases["forward"].total - kept.total - ref_work.total - ref_cache
        moments["reference_forward"] = [
            Holding("trainer", "policy", kept, max(_policy_cache(policy, kept), slack), policy.states.paged_optimizer),
            Holding("trainer", "reference", _sum(ref_idle, ref_work), ref_cache)]
    hw = s.hardware
    processes = {"trainer": Process("trainer", "all", s.world_size, hw.nodes)}
    group = _group(f"all {s.world_size} GPUs", s.world_size, hw.gpu.memory_bytes, moments, processes)
    roles = [_role("policy", s.model, "trainer", group.name, s.world_size, True, engine_of(s).describe(s), policy.params,
                   policy.trainable, rows, s.seq_len, policy.allocated.phases["checkpoint_save"],
                   policy.allocated.peak, policy.host.peak.total,
                   [f"{rows} rows per micro-batch ({facts.get('rows_per_example', 1)} per example), log-probs: "
                    f"{kind}" + (", value head instead of lm_head" if value_head else "")])]
    host = policy.host
    if ref:
        roles.append(_role("reference", ref.scenario.model, "trainer", group.name, s.world_size, False, ref.engine,
                           ref.params if need_ref == "separate" else 0, 0, ref.scenario.micro_batch, s.seq_len,
                           ref_idle, ref.active(), 0, ref.notes))
        ref_host = frozen_host(ref, hw.gpus_per_node)
        extra = {p: b.plus("runtime_overhead", -ref_host.phases[p].get("runtime_overhead"))
                 for p, b in ref_host.phases.items()}  # same process: no second baseline
        host = PhaseProfile({p: _sum(host.phases[p], extra[p]) for p in PHASES})
        roles[-1].host_per_node = max(b.total for b in extra.values())
    drivers = _drivers(s, policy, ref, group)
    return roles, [group], {"host": host, "policy": policy, "drivers": drivers}


def _policy_cache(policy: TrainedRole, b: Breakdown) -> int:
    ms = policy.states
    return overheads.allocator_cache(b.get("activations") + b.get("logits_loss") + ms.gathered_forward)


def _drivers(s: Scenario, policy: TrainedRole, ref: FrozenRole | None, group: GpuGroup) -> dict[str, int]:
    """Named bytes behind the peak, each from the same formulas the estimate used."""
    ps = policy.scenario
    rows, t = ps.micro_batch, ps.seq_len
    out: dict[str, int] = {}
    _, per_key_saved, per_key_transient = _attention_per_token(ps, ps.compute_bytes)
    if per_key_saved or per_key_transient:
        # the larger of: forward's scores in flight, or the saved scores plus their fp32 gradient in backward
        per_key = max(per_key_transient, per_key_saved + 4 * ps.model.num_heads)
        out[f"eager attention scores of one recomputed layer ({rows} rows x {ps.model.num_heads} heads x "
            f"{t}^2)"] = rows * t * t * per_key
    out[f"policy log-prob logits saved for backward ({rows} rows x {t} x vocab {ps.model.vocab_size})"] = \
        policy.logits.saved
    out["policy log-prob logits, backward peak"] = policy.logits.backward
    if ref is not None:
        out["reference no-grad forward peak (on top of the policy's saved tensors)"] = ref.forward.total
        out["reference weights per GPU"] = ref.resident
    out["policy checkpoints + saved activations"] = policy.act.saved_total
    peak = group.device_total.peak
    out["model states at the peak (weights + gradients + optimizer)"] = (
        peak.get("weights") + peak.get("gradients") + peak.get("optimizer_states"))
    return out


# ---------------------------------------------------------------------------------------------- Ray layout
def _layout(s: Scenario, present: list[str]) -> tuple[dict[str, str], dict[str, int]]:
    """process -> GPU group, and GPUs per group (OpenRLHF placement groups, knobs.md E.2)."""
    world = s.world_size
    asked = dict(s.role_gpus)
    groups: dict[str, str] = {}
    for proc in present:
        if s.colocate == "all":
            groups[proc] = "all"
        elif proc in ("actor", "ref") and "actor-ref" in s.colocate:
            groups[proc] = "actor+ref"
        elif proc in ("critic", "reward") and "critic-reward" in s.colocate:
            groups[proc] = "critic+reward"
        else:
            groups[proc] = proc
    sizes: dict[str, int] = {}
    for proc, g in groups.items():
        n = asked.get(proc, asked.get("actor", world)) if proc != "vllm" else None
        if proc == "vllm":
            engines = s.vllm_engines if s.vllm_engines else max(1, asked.get("actor", world) // s.vllm_tp)
            n = engines * s.vllm_tp
        sizes[g] = max(sizes.get(g, 0), n)
    if s.colocate == "all" and "vllm" in groups:
        actor = asked.get("actor", world)
        engines = s.vllm_engines or actor // s.vllm_tp
        if engines * s.vllm_tp != actor:
            raise MemfitError(f"--colocate all needs actor GPUs ({actor}) == vLLM engines x tensor parallel "
                              f"({engines} x {s.vllm_tp}) (OpenRLHF train_ppo_ray.py assertion)")
    return groups, sizes


def _role_scenario(s: Scenario, gpus: int, model=None) -> Scenario:
    hw = s.hardware
    per_node = min(gpus, hw.gpus_per_node)
    hardware = Hardware(gpu=hw.gpu, gpus_per_node=per_node, nodes=-(-gpus // per_node),
                        host_ram=hw.host_ram)
    engine = s.engine if gpus > 1 or s.engine != "ddp" else "single"
    if engine == "single" and gpus > 1:
        engine = "ddp"
    return s.with_changes(hardware=hardware, engine=engine, model=model or s.model, method="sft")


def _ray_processes(s: Scenario, facts: dict, fw: dict, notes: list[str]):
    """PPO / GRPO in the OpenRLHF layout: one Ray actor process per role per GPU, vLLM workers beside them."""
    kind = fw["logits"]
    rollout = s.rollout_micro_batch or 1
    need_ref = _reference_needed(s, notes) != "none"
    present = ["actor"] + (["ref"] if need_ref else []) + (["critic"] if facts.get("critic") else [])
    if facts.get("reward") and not s.remote_reward:
        present.append("reward")
    if facts.get("generator") and s.vllm_engines != 0:
        present.append("vllm")
    groups, sizes = _layout(s, present)
    hw = s.hardware
    cap = hw.gpu.memory_bytes
    roles: list[RoleEstimate] = []
    actor_s = _role_scenario(s, sizes[groups["actor"]])
    actor = trained_role(actor_s, s.micro_batch, kind)
    actor_reserved = reserved_profile(actor.allocated, actor.states)
    reward_model = _model(s.reward_model, s.model)
    critic = ref = reward = gen = None
    if "critic" in groups:
        critic_s = _role_scenario(s, sizes[groups["critic"]], _model(s.critic_model, reward_model))
        critic = trained_role(critic_s, s.micro_batch, kind, value_head=True)
        critic_reserved = reserved_profile(critic.allocated, critic.states)
    if "ref" in groups:
        ref_s = _role_scenario(s, sizes[groups["ref"]])
        ref = frozen_role(ref_s, _model(s.ref_model, s.model), rollout, kind, False, s.ref_offload)
        notes.extend(ref.notes)
    if "reward" in groups:
        reward_s = _role_scenario(s, sizes[groups["reward"]])
        reward = frozen_role(reward_s, reward_model, rollout, kind, True, s.reward_offload)
        notes.extend(n for n in reward.notes if n not in notes)
    if "vllm" in groups:
        gen = Generator(s.model, s.vllm_tp, s.vllm_gpu_memory_utilization, s.vllm_sleep, cap, generator_facts())
        if gen.kv_cache <= gen.kv_bytes_per_token() * s.seq_len:
            notes.append(f"vLLM: weights {gen.weights / 2**30:.1f} GiB per GPU leave no KV cache for one "
                         f"{s.seq_len}-token sequence inside gpu_memory_utilization {gen.utilization}")
    ds_sleep = s.deepspeed_sleep
    if ds_sleep and engine_of(s).optimizer_offload(s) != "none":
        notes.append("DeepSpeed sleep is a no-op with Adam offload (OpenRLHF offload_deepspeed_states)")
        ds_sleep = False
    vllm_rest = (gen.asleep() if s.vllm_sleep else gen.awake()) if gen else None

    def idle(proc: str) -> Holding:
        if proc == "actor":
            return Holding("actor", "policy", actor.idle(ds_sleep))
        if proc == "critic":
            return Holding("critic", "critic", critic.idle(ds_sleep))
        if proc == "ref":
            return Holding("ref", "reference", ref.idle())
        if proc == "reward":
            return Holding("reward", "reward", reward.idle())
        return Holding("vllm", "generator", vllm_rest)

    def others(busy: set[str], vllm: Holding | None = None) -> list[Holding]:
        hs = [idle(p) for p in present if p not in busy and p != "vllm"]
        if "vllm" in groups:
            hs.append(vllm or idle("vllm"))
        return hs

    moments: dict[str, list[Holding]] = {}
    load = [_trained_holding("actor", "policy", actor, "load", actor_reserved)]
    if critic:
        load.append(_trained_holding("critic", "critic", critic, "load", critic_reserved))
    moments["load"] = load + others({"actor", "critic"})
    if gen:
        moments["load:vllm"] = [Holding("vllm", "generator", gen.awake())]  # engines start before the models
        moments["generate"] = others(set(), Holding("vllm", "generator", gen.awake()))
    forwards = {"actor": ("policy", actor), "critic": ("critic", critic), "ref": ("reference", ref),
                "reward": ("reward", reward)}
    for proc, (role, model) in forwards.items():
        if proc not in groups:
            continue
        if isinstance(model, TrainedRole):
            fwd = model.nograd_forward(rollout)
            b = _sum(model.idle(ds_sleep), fwd, Breakdown({"weights": model.states.gathered_forward}))
        else:
            fwd, b = model.forward, model.active()
        moments[f"experience:{role}"] = [Holding(proc, role, b, _frozen_cache(fwd))] + others({proc})
    trainers = [("actor", "policy", actor, actor_reserved)] + (
        [("critic", "critic", critic, critic_reserved)] if critic else [])
    for phase in TRAIN_PHASES + ("checkpoint_save", "resume"):
        if ds_sleep and phase in TRAIN_PHASES:  # OpenRLHF ppo_train: reload -> fit -> offload, critic then actor
            for proc, role, tr, res in trainers:
                moments[f"train_{role}:{phase}"] = [_trained_holding(proc, role, tr, phase, res)] + others({proc})
        else:  # both fit() calls run at once
            busy = {proc for proc, *_ in trainers}
            moments[f"train:{phase}" if phase in TRAIN_PHASES else phase] = [
                _trained_holding(proc, role, tr, phase, res) for proc, role, tr, res in trainers] + others(busy)
    if gen:
        sync = gen.weights_only() if s.vllm_sleep else gen.awake()
        moments["weight_sync"] = others(set(), Holding("vllm", "generator", sync))
    # one GpuGroup per distinct group, from the holdings of its processes
    processes = {p: Process(p, g, sizes[g] if p != "vllm" else s.vllm_tp, -(-sizes[g] // hw.gpus_per_node))
                 for p, g in groups.items()}
    out_groups = []
    for g in dict.fromkeys(groups.values()):
        mine = {m: [h for h in hs if groups[h.process] == g] for m, hs in moments.items()}
        mine = {m: hs for m, hs in mine.items() if hs}
        label = {"all": "all models colocated"}.get(g, g)
        out_groups.append(_group(label, sizes[g], cap, mine, processes))
    group_of = {p: next(x.name for x in out_groups if p in x.processes) for p in groups}
    # roles
    a_peak = actor.allocated.peak
    roles.append(_role("policy", s.model, "actor", group_of["actor"], sizes[groups["actor"]], True,
                       engine_of(actor_s).describe(actor_s), actor.params, actor.trainable, s.micro_batch, s.seq_len,
                       actor.idle(ds_sleep), a_peak, actor.host.peak.total,
                       [f"train micro-batch {s.micro_batch}, rollout micro-batch {rollout}, log-probs {kind}"]
                       + (["DeepSpeed sleep: optimizer states, fp32 master and grads on host between fits"]
                          if ds_sleep else [])))
    if critic:
        roles.append(_role("critic", critic.scenario.model, "critic", group_of["critic"], sizes[groups["critic"]],
                           True, engine_of(critic.scenario).describe(critic.scenario), critic.params, critic.trainable, s.micro_batch,
                           s.seq_len, critic.idle(ds_sleep), critic.allocated.peak, critic.host.peak.total,
                           ["value head instead of lm_head"]))
    for proc, role, fr in (("ref", "reference", ref), ("reward", "reward", reward)):
        if fr:
            roles.append(_role(role, fr.scenario.model, proc, group_of[proc], sizes[groups[proc]], False, fr.engine,
                               fr.params, 0, rollout, s.seq_len, fr.idle(), fr.active(),
                               frozen_host(fr, min(sizes[groups[proc]], hw.gpus_per_node)).peak.total, fr.notes))
    if gen:
        roles.append(_role("generator", s.model, "vllm", group_of["vllm"], sizes[groups["vllm"]], False,
                           f"vLLM tp={gen.tp}, gpu_memory_utilization {gen.utilization}"
                           + (", sleep level 1" if gen.sleep else ""), actor.params, 0, 0, s.seq_len,
                           vllm_rest, gen.awake(), _vllm_host(gen, sizes[groups["vllm"]], hw.gpus_per_node),
                           [f"KV cache {max(0, gen.kv_cache) / 2**30:.1f} GiB per GPU"]))
    host = _ray_host(s, actor, critic, ref, reward, gen, ds_sleep, groups, sizes)
    needed = sum(sizes.values())
    if needed > s.world_size:
        notes.append(f"this placement needs {needed} GPUs; the hardware has {s.world_size}")
    drivers = {f"{r.role} per GPU at its own peak": r.active.total for r in roles}
    return roles, out_groups, {"host": host, "policy": actor, "drivers": drivers, "needed": needed}


def _vllm_host(gen: Generator, gpus: int, per_node: int) -> int:
    return (gen.host_per_gpu() + overheads.PROCESS_HOST_BASELINE) * min(gpus, per_node)


def _ray_host(s, actor, critic, ref, reward, gen, ds_sleep, groups, sizes) -> PhaseProfile:
    """Host RAM per node: every process's baseline and load copies, pinned offloads, slept weights."""
    per_node = s.hardware.gpus_per_node
    parts = [actor.host]
    if critic:
        parts.append(critic.host)
    for fr, proc in ((ref, "ref"), (reward, "reward")):
        if fr:
            parts.append(frozen_host(fr, min(sizes[groups[proc]], per_node)))
    total = {p: _sum(*(x.phases[p] for x in parts)) for p in PHASES}
    extra = 0
    if ds_sleep:
        for tr in [actor] + ([critic] if critic else []):
            extra += tr.sleep_host_bytes() * min(tr.scenario.world_size, per_node)
    if gen:
        extra += _vllm_host(gen, sizes[groups["vllm"]], per_node)
    return PhaseProfile({p: b.plus("weights", extra) for p, b in total.items()})


# ---------------------------------------------------------------------------------------------- entry point
def estimate_roles(s: Scenario) -> MultiEstimate:
    if not several_models(s.method):
        raise MemfitError(f"estimate_roles handles several-model methods; use estimate() for {s.method}")
    facts = method_facts(s.method)
    fw = framework_facts(s.profile)
    notes: list[str] = []
    if facts.get("generator"):
        roles, groups, extra = _ray_processes(s, facts, fw, notes)
    else:
        roles, groups, extra = _single_process(s, facts, fw, notes)
    worst = min(groups, key=lambda g: g.margin_bytes)
    host: PhaseProfile = extra["host"]
    capacity = s.hardware.gpu.memory_bytes
    host_margin = None if s.hardware.host_ram is None else s.hardware.host_ram - host.peak.total
    policy: TrainedRole = extra["policy"]
    return MultiEstimate(
        scenario=s, method=s.method, total_params=policy.params, trainable_params=policy.trainable,
        allocated=worst.allocated, reserved=worst.reserved, device_total=worst.device_total, host=host,
        verdict=verdict_of(worst.margin_bytes, capacity, host_margin), margin_bytes=worst.margin_bytes,
        host_margin_bytes=host_margin, roles=roles, groups=groups, worst_group=worst.name,
        drivers=extra["drivers"], gpus_needed=extra.get("needed", s.world_size),
        assumptions=[f"method {s.method}: {facts['description']}", f"framework facts: {fw['source']}",
                     f"log-probs computed as '{fw['logits']}' (catalog/methods.toml); the --loss setting does not apply"]
        + list(s.assumed) + notes + policy.states.notes,
    )

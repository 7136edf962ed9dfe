"""PPO and GRPO in OpenRLHF's Ray layout: one process per role per GPU (actor, critic, reference, reward),
vLLM workers beside them, placed in GPU groups by the colocation flags (docs/knobs.md E.2).

One rollout cycle's moments: the models load (vLLM first), vLLM generates, every model scores the rollouts
without gradients (experience), actor and critic train (one after the other under DeepSpeed sleep), the
actor's weights go to vLLM (weight sync), and a checkpoint is saved and resumed.
"""
from __future__ import annotations

from dataclasses import dataclass

from memfit.breakdown import PHASES, Breakdown, PhaseProfile
from memfit.errors import MemfitError
from memfit.facts.catalog import find_model
from memfit.facts.engines import engine_of
from memfit.facts.methods import generator_facts, method_facts, reference, run_methods
from memfit.facts.scenario import Hardware, Scenario
from memfit.facts.runtime import Runtime
from memfit.memory import overheads
from memfit.memory.phases import reserved_profile
from memfit.roles.frozen import FrozenRole, frozen_host, frozen_role, nograd_forward
from memfit.roles.generator import Generator
from memfit.roles.groups import Holding, Moment, Process, add_parts, frozen_cache, gpu_group, trained_holding
from memfit.roles.result import Placement, RoleEstimate
from memfit.roles.trained import TrainedRole, trained_role

TRAIN_PHASES = ("forward", "backward", "optimizer_step")
ROLE_OF = {"actor": "policy", "critic": "critic", "ref": "reference", "reward": "reward", "vllm": "generator"}


@dataclass
class RayRun:
    """The models of one run, where they sit (process -> GPU group, GPUs per group), and its settings."""

    s: Scenario
    kind: str  # the framework's log-prob handling
    rollout: int  # rollout micro-batch
    present: list[str]  # processes, in OpenRLHF's order
    groups: dict[str, str]
    sizes: dict[str, int]
    actor: TrainedRole
    critic: TrainedRole | None
    ref: FrozenRole | None
    reward: FrozenRole | None
    gen: Generator | None
    ds_sleep: bool

    def trainers(self) -> list[tuple[str, TrainedRole]]:
        return [("actor", self.actor)] + ([("critic", self.critic)] if self.critic else [])

    def gpus(self, proc: str) -> int:
        return self.sizes[self.groups[proc]]

    def vllm_rest(self) -> Breakdown:
        return self.gen.asleep() if self.s.vllm_sleep else self.gen.awake()


def place(s: Scenario, notes: list[str]) -> Placement:
    run = _models(s, notes)
    moments = _moments(run)
    hw, per_node = s.hardware, s.hardware.gpus_per_node
    processes = {p: Process(p, run.sizes[g] if p != "vllm" else s.vllm_tp, s.hardware.runtime, -(-run.sizes[g] // per_node))
                 for p, g in run.groups.items()}
    groups = []
    for g in dict.fromkeys(run.groups.values()):  # one GpuGroup per distinct group, from its processes' holdings
        mine = {m: [h for h in hs if run.groups[h.process] == g] for m, hs in moments.items()}
        mine = {m: hs for m, hs in mine.items() if hs}
        groups.append(gpu_group({"all": "all models colocated"}.get(g, g), run.sizes[g], hw.gpu.memory_bytes, mine,
                                processes))
    group_of = {p: next(x.name for x in groups if p in x.processes) for p in run.groups}
    roles = _roles(run, group_of)
    needed = sum(run.sizes.values())
    if needed > s.world_size:
        notes.append(f"this placement needs {needed} GPUs; the hardware has {s.world_size}")
    drivers = {f"{r.role} per GPU at its own peak": r.active.total for r in roles}
    return Placement(roles, groups, _host(run), run.actor.params, run.actor.trainable, drivers, needed,
                     run.actor.states.notes)


# ---------------------------------------------------------------------------------------------- the models
def _layout(s: Scenario, present: list[str]) -> tuple[dict[str, str], dict[str, int]]:
    """process -> GPU group, and GPUs per group (OpenRLHF placement groups)."""
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
        if proc == "vllm":
            engines = s.vllm_engines if s.vllm_engines else max(1, asked.get("actor", world) // s.vllm_tp)
            n = engines * s.vllm_tp
        else:
            n = asked.get(proc, asked.get("actor", world))
        sizes[g] = max(sizes.get(g, 0), n)
    if s.colocate == "all" and "vllm" in groups:
        actor = asked.get("actor", world)
        engines = s.vllm_engines or actor // s.vllm_tp
        if engines * s.vllm_tp != actor:
            raise MemfitError(f"--colocate all needs actor GPUs ({actor}) == vLLM engines x tensor parallel "
                              f"({engines} x {s.vllm_tp}) (OpenRLHF train_ppo_ray.py assertion)")
    return groups, sizes


def _role_scenario(s: Scenario, gpus: int, model=None) -> Scenario:
    """A role's own run: its GPUs (a one-GPU group trains without DDP) and model."""
    hw = s.hardware
    per_node = min(gpus, hw.gpus_per_node)
    hardware = Hardware(gpu=hw.gpu, gpus_per_node=per_node, nodes=-(-gpus // per_node), host_ram=hw.host_ram)
    return s.with_changes(hardware=hardware, engine=engine_of(s).name_for(s, gpus), model=model or s.model,
                          method="sft")


def reward_and_critic(s: Scenario):
    """The reward and critic models a run names (the reward defaults to the actor, the critic to the reward)."""
    reward = named_model(s.reward_model, "reward") if s.reward_model else s.model
    return reward, named_model(s.critic_model, "critic") if s.critic_model else reward


def named_model(name: str, role: str):
    """A role's model by name; the error says how to give another."""
    try:
        return find_model(name)
    except MemfitError as e:  # the run's file names it: say how to give another
        raise MemfitError(f"the {role} model: {e}; or give one memfit knows with --{role}-model") from None


def _models(s: Scenario, notes: list[str]) -> RayRun:
    facts = method_facts(s.method)
    kind = run_methods(s)["logits"]
    rollout = s.rollout_micro_batch or 1
    ref_kind, why = reference(s)
    notes.extend(why)
    present = ["actor"] + (["ref"] if ref_kind != "none" else []) + (["critic"] if facts.get("critic") else [])
    if facts.get("reward") and not s.remote_reward:
        present.append("reward")
    if facts.get("generator") and s.vllm_engines != 0:
        present.append("vllm")
    groups, sizes = _layout(s, present)
    reward_model, critic_model = reward_and_critic(s)
    actor = trained_role(_role_scenario(s, sizes[groups["actor"]]), s.micro_batch, kind)
    critic = ref = reward = gen = None
    if "critic" in groups:
        critic = trained_role(_role_scenario(s, sizes[groups["critic"]], critic_model), s.micro_batch, kind,
                              value_head=True)
    if "ref" in groups:
        ref_model = named_model(s.ref_model, "ref") if s.ref_model else s.model
        ref = frozen_role(_role_scenario(s, sizes[groups["ref"]]), ref_model, rollout, kind, False, s.ref_offload)
        notes.extend(ref.notes)
    if "reward" in groups:
        reward = frozen_role(_role_scenario(s, sizes[groups["reward"]]), reward_model, rollout, kind, True,
                             s.reward_offload)
        notes.extend(n for n in reward.notes if n not in notes)
    if "vllm" in groups:
        gen = Generator(s.model, s.vllm_tp, s.vllm_gpu_memory_utilization, s.vllm_sleep, s.hardware.gpu.memory_bytes,
                        generator_facts())
        if gen.kv_cache <= gen.kv_bytes_per_token() * s.seq_len:
            notes.append(f"vLLM: weights {gen.weights / 2**30:.1f} GiB per GPU leave no KV cache for one "
                         f"{s.seq_len}-token sequence inside gpu_memory_utilization {gen.utilization}")
    ds_sleep = s.deepspeed_sleep
    if ds_sleep and engine_of(s).optimizer_offload(s) != "none":
        notes.append("DeepSpeed sleep is a no-op with Adam offload (OpenRLHF offload_deepspeed_states)")
        ds_sleep = False
    return RayRun(s, kind, rollout, present, groups, sizes, actor, critic, ref, reward, gen, ds_sleep)


# ---------------------------------------------------------------------------------------------- the moments
def _idle(run: RayRun, proc: str) -> Holding:
    role = ROLE_OF[proc]
    if proc == "vllm":
        return Holding(proc, role, run.vllm_rest())
    model = {"actor": run.actor, "critic": run.critic, "ref": run.ref, "reward": run.reward}[proc]
    return Holding(proc, role, model.idle(run.ds_sleep) if isinstance(model, TrainedRole) else model.idle())


def _others(run: RayRun, busy: set[str], vllm: Holding | None = None) -> list[Holding]:
    """What every process not busy at this moment holds (vLLM as given, else at rest)."""
    hs = [_idle(run, p) for p in run.present if p not in busy and p != "vllm"]
    if "vllm" in run.groups:
        hs.append(vllm or _idle(run, "vllm"))
    return hs


def _moments(run: RayRun) -> dict[Moment, list[Holding]]:
    moments: dict[Moment, list[Holding]] = {}
    reserved = {proc: reserved_profile(tr.allocated, tr.states, tr.scenario.hardware.runtime, tr.scenario.tuning)
                for proc, tr in run.trainers()}
    moments[Moment("load", "load")] = [trained_holding(proc, ROLE_OF[proc], tr, "load", reserved[proc])
                                       for proc, tr in run.trainers()] + _others(run, {"actor", "critic"})
    if run.gen:
        awake = Holding("vllm", "generator", run.gen.awake())
        moments[Moment("load:vllm", "load")] = [awake]  # the engines start before the models
        moments[Moment("generate", "forward")] = _others(run, set(), awake)
    moments |= _experience(run)
    moments |= _training(run, reserved)
    if run.gen:
        sync = run.gen.weights_only() if run.s.vllm_sleep else run.gen.awake()
        moments[Moment("weight_sync", "optimizer_step")] = _others(run, set(), Holding("vllm", "generator", sync))
    return moments


def _experience(run: RayRun) -> dict[Moment, list[Holding]]:
    """Each model's no-grad forward over the rollouts, the others at rest."""
    out = {}
    for proc, model in (("actor", run.actor), ("critic", run.critic), ("ref", run.ref), ("reward", run.reward)):
        if proc not in run.groups:
            continue
        if isinstance(model, TrainedRole):
            fwd = nograd_forward(model, run.rollout)
            b = add_parts(model.idle(run.ds_sleep), fwd, Breakdown({"weights": model.states.gathered_forward}))
        else:
            fwd, b = model.forward, model.active()
        role = ROLE_OF[proc]
        out[Moment(f"experience:{role}", "forward")] = [Holding(proc, role, b, frozen_cache(fwd, run.s.hardware.runtime))] + _others(run, {proc})
    return out


def _training(run: RayRun, reserved: dict[str, PhaseProfile]) -> dict[Moment, list[Holding]]:
    """Actor and critic train at once; under DeepSpeed sleep one after the other (OpenRLHF ppo_train: reload ->
    fit -> offload, critic then actor). Then a checkpoint is saved and resumed."""
    out = {}
    trainers = run.trainers()
    for phase in TRAIN_PHASES + ("checkpoint_save", "resume"):
        if run.ds_sleep and phase in TRAIN_PHASES:
            for proc, tr in trainers:
                out[Moment(f"train_{ROLE_OF[proc]}:{phase}", phase)] = [
                    trained_holding(proc, ROLE_OF[proc], tr, phase, reserved[proc])] + _others(run, {proc})
        else:
            name = f"train:{phase}" if phase in TRAIN_PHASES else phase
            out[Moment(name, phase)] = [trained_holding(proc, ROLE_OF[proc], tr, phase, reserved[proc])
                                        for proc, tr in trainers] + _others(run, {proc for proc, _ in trainers})
    return out


# ---------------------------------------------------------------------------------------------- roles and host
def _roles(run: RayRun, group_of: dict[str, str]) -> list[RoleEstimate]:
    s, per_node = run.s, run.s.hardware.gpus_per_node
    out = []
    for proc, tr in run.trainers():
        rs = tr.scenario
        notes = ["value head instead of lm_head"] if proc == "critic" else (
            [f"train micro-batch {s.micro_batch}, rollout micro-batch {run.rollout}, log-probs {run.kind}"]
            + (["DeepSpeed sleep: optimizer states, fp32 master and grads on host between fits"] if run.ds_sleep
               else []))
        out.append(RoleEstimate(role=ROLE_OF[proc], model=rs.model.id, process=proc, group=group_of[proc],
                                gpus=run.gpus(proc), trains=True, engine=engine_of(rs).describe(rs), params=tr.params,
                                trainable=tr.trainable, rows=s.micro_batch, seq_len=s.seq_len,
                                idle=tr.idle(run.ds_sleep), active=tr.allocated.peak,
                                host_per_node=tr.host.peak.total, notes=notes))
    for proc, fr in (("ref", run.ref), ("reward", run.reward)):
        if fr:
            out.append(RoleEstimate(role=ROLE_OF[proc], model=fr.scenario.model.id, process=proc,
                                    group=group_of[proc], gpus=run.gpus(proc), trains=False, engine=fr.engine,
                                    params=fr.params, trainable=0, rows=run.rollout, seq_len=s.seq_len,
                                    idle=fr.idle(), active=fr.active(),
                                    host_per_node=frozen_host(fr, min(run.gpus(proc), per_node)).peak.total,
                                    notes=fr.notes))
    if run.gen:
        gen = run.gen
        out.append(RoleEstimate(role="generator", model=s.model.id, process="vllm", group=group_of["vllm"],
                                gpus=run.gpus("vllm"), trains=False,
                                engine=f"vLLM tp={gen.tp}, gpu_memory_utilization {gen.utilization}"
                                + (", sleep level 1" if gen.sleep else ""),
                                params=run.actor.params, trainable=0, rows=0, seq_len=s.seq_len,
                                idle=run.vllm_rest(), active=gen.awake(),
                                host_per_node=_vllm_host(gen, run.gpus("vllm"), per_node, s.hardware.runtime),
                                notes=[f"KV cache {max(0, gen.kv_cache) / 2**30:.1f} GiB per GPU"]))
    return out


def _vllm_host(gen: Generator, gpus: int, per_node: int, rt: Runtime) -> int:
    return (gen.host_per_gpu() + overheads.host_baseline(rt)) * min(gpus, per_node)


def _host(run: RayRun) -> PhaseProfile:
    """Host RAM per node: every process's baseline and load copies, pinned offloads, slept weights."""
    per_node = run.s.hardware.gpus_per_node
    parts = [tr.host for _, tr in run.trainers()]
    for proc, fr in (("ref", run.ref), ("reward", run.reward)):
        if fr:
            parts.append(frozen_host(fr, min(run.gpus(proc), per_node)))
    total = {p: add_parts(*(x.phases[p] for x in parts)) for p in PHASES}
    extra = 0
    if run.ds_sleep:
        for _, tr in run.trainers():
            extra += tr.sleep_host_bytes() * min(tr.scenario.world_size, per_node)
    if run.gen:
        extra += _vllm_host(run.gen, run.gpus("vllm"), per_node, run.s.hardware.runtime)
    return PhaseProfile({p: b.plus("weights", extra) for p, b in total.items()})

"""The RL placement interface: a framework *declares* its workers and the steps of one iteration; the generic
code here turns a declaration into the moments, GPU groups, roles and host profile of a `Placement`.

To add a framework, write one module (memfit/roles/openrlhf.py, memfit/roles/verl.py) with a function
`declare(s, notes) -> Declaration`, add its row to data/placements.toml, and name the module in
memfit/roles/estimate.py's DECLARATIONS. A declaration says:
- `pools`: GPU groups (Ray placement groups / resource pools) and how many GPUs each spans;
- `workers`: one per role (policy, reference, critic, reward, generator): the process it lives in (several roles
  may share a process: verl's hybrid engine), its pool, the model it holds (a TrainedRole, FrozenRole or
  Generator from trained.py / frozen.py / generator.py) and what it keeps on the GPU while it rests;
- `steps`: the moments of one iteration in order (load, generate, experience, update, weight sync, checkpoint
  save / resume), each naming the workers busy in it and in which state; every other worker rests.

States a worker can be in (what `holding` turns into device bytes):
  rest             between its own work (a sleeping trainer / engine keeps only what `Worker.rest` says)
  load, forward, backward, optimizer_step, checkpoint_save, resume   a trained model's phase peak
  score            a no-grad forward over `score_rows` rollouts (log-probs, values, rewards)
  sync             a trained model sending its weights to the engine: its params on the GPU plus `sync_bytes`
  awake            the generator with its weights and KV cache
  weights          the generator woken for the weight sync only (its weights, no KV cache when it sleeps)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

from memfit.breakdown import PHASES, Breakdown, PhaseProfile
from memfit.errors import MemfitError
from memfit.facts.catalog import ModelSpec, find_model
from memfit.facts.engines import engine_of
from memfit.facts.runtime import Runtime
from memfit.facts.scenario import Hardware, Scenario
from memfit.memory import overheads
from memfit.memory.phases import reserved_profile
from memfit.roles.frozen import FrozenRole, frozen_host, nograd_forward
from memfit.roles.generator import Generator, full_params
from memfit.roles.groups import Holding, Moment, Process, add_parts, frozen_cache, gpu_group, trained_holding
from memfit.roles.result import Placement, RoleEstimate
from memfit.roles.trained import TrainedRole

TRAIN_STATES = ("load",) + tuple(p for p in PHASES if p != "load")


@dataclass(frozen=True)
class Parking:
    """Where a trained worker's steady states (its checkpoint_save breakdown: weights, optimizer states, ...) sit
    between its phases, for a framework that moves them itself (verl's param_offload / optimizer_offload: moved to
    the host on leaving each phase, back for compute). Categories not named on the GPU or the host are freed."""

    rest_gpu: tuple[str, ...]  # on the GPU while it rests (runtime overhead always stays)
    rest_host: tuple[str, ...]  # in host RAM while it rests
    score_gpu: tuple[str, ...]  # on the GPU while it scores (a no-grad forward brings its params back)


@dataclass
class Worker:
    """One role in one process of an RL run, on every GPU of its pool."""

    role: str  # policy | reference | critic | reward | generator
    process: str  # the process it lives in; roles sharing one pay one CUDA context
    pool: str  # the GPU group its process sits in (a key of Declaration.pools)
    model: TrainedRole | FrozenRole | Generator
    sleeps: bool = False  # rests with its states on the host (DeepSpeed sleep, vLLM sleep)
    world: int | None = None  # GPUs its collectives span (None: the pool's; a vLLM engine: its tensor parallel)
    train_rows: int = 0  # rows of a training micro-batch (trained models)
    score_rows: int = 0  # rows of a no-grad scoring micro-batch
    engine: str = ""  # how it is placed, in words ("": the engine's own description)
    notes: list[str] = field(default_factory=list)
    parking: Parking | None = None  # None: the trained model's own idle (TrainedRole.idle with `sleeps`)
    sync_bytes: int = 0  # transient of sending its weights to the engine in state "sync" (buckets, a gathered tensor)

    @property
    def trains(self) -> bool:
        return isinstance(self.model, TrainedRole)

    def trained(self) -> TrainedRole:
        """Its model, which trains (a declaration that gives this role a frozen model or an engine is wrong)."""
        if not isinstance(self.model, TrainedRole):
            raise MemfitError(f"placement: the {self.role} worker holds a {type(self.model).__name__}, "
                              f"not a model that trains; declare it with a TrainedRole")
        return self.model

    def rest_bytes(self) -> Breakdown:
        """What a trained worker keeps on each GPU between its phases."""
        if self.parking is None:
            return self.trained().idle(self.sleeps)
        return _steady_parts(self.trained(), self.parking.rest_gpu)

    def score_base(self) -> Breakdown:
        """What a trained worker holds under a no-grad forward's transient."""
        if self.parking is None:
            return self.trained().idle(self.sleeps)
        return _steady_parts(self.trained(), self.parking.score_gpu)

    def parked_host_bytes(self) -> int:
        """Host bytes per rank its parked states (or DeepSpeed sleep) hold while it rests."""
        if self.parking is None:
            return self.trained().sleep_host_bytes() if self.sleeps else 0
        tr = self.trained()
        return _steady_parts(tr, self.parking.rest_host).total - _steady_parts(tr, ()).total


def _steady_parts(tr: TrainedRole, categories: tuple[str, ...]) -> Breakdown:
    steady = tr.allocated.phases["checkpoint_save"]
    return Breakdown({c: steady.get(c) for c in (*categories, "runtime_overhead")})


@dataclass(frozen=True)
class Step:
    """One moment of an iteration: the workers busy in it, each in a state (module docstring); the rest rest."""

    moment: str
    phase: str  # the shared phase it counts toward (memfit/breakdown.py PHASES)
    busy: tuple[tuple[str, str], ...]  # (role, state), in the order they are listed
    alone: bool = False  # only the busy workers exist yet (an engine that starts before the models)


@dataclass
class Declaration:
    """What a framework declares about one run (module docstring)."""

    scenario: Scenario
    pools: dict[str, int]  # GPU group name -> GPUs
    workers: list[Worker]
    steps: list[Step]
    notes: list[str] = field(default_factory=list)

    def worker(self, role: str) -> Worker | None:
        return next((w for w in self.workers if w.role == role), None)

    def require(self, role: str) -> Worker:
        """The worker of `role`, which the placement cannot do without."""
        w = self.worker(role)
        if w is None:
            raise MemfitError(f"placement: no {role} worker is declared; roles declared: "
                              f"{', '.join(x.role for x in self.workers)}")
        return w

    def gpus(self, w: Worker) -> int:
        return self.pools[w.pool]


def busy(*pairs: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(pairs)


# ---------------------------------------------------------------------------------------------- shared helpers
def role_scenario(s: Scenario, gpus: int, model: ModelSpec | None = None) -> Scenario:
    """A role's own run: its GPUs (a one-GPU group trains without DDP) and model."""
    hw = s.hardware
    per_node = min(gpus, hw.gpus_per_node)
    hardware = Hardware(gpu=hw.gpu, gpus_per_node=per_node, nodes=-(-gpus // per_node), host_ram=hw.host_ram)
    return s.with_changes(hardware=hardware, engine=engine_of(s).name_for(s, gpus), model=model or s.model,
                          method="sft")


def named_model(name: str, role: str) -> ModelSpec:
    """A role's model by name; the error says how to give another."""
    try:
        return find_model(name)
    except MemfitError as e:  # the run's file names it: say how to give another
        raise MemfitError(f"the {role} model: {e}; or give one memfit knows with --{role}-model") from None


def reward_and_critic(s: Scenario) -> tuple[ModelSpec, ModelSpec]:
    """The reward and critic models a run names (the reward defaults to the actor, the critic to the reward)."""
    reward = named_model(s.reward_model, "reward") if s.reward_model else s.model
    return reward, named_model(s.critic_model, "critic") if s.critic_model else reward


# ---------------------------------------------------------------------------------------------- declaration -> placement
def place(d: Declaration) -> Placement:
    s, notes = d.scenario, list(d.notes)
    per_node = s.hardware.gpus_per_node
    processes = {w.process: Process(w.process, w.world or d.gpus(w), s.hardware.runtime, -(-d.gpus(w) // per_node))
                 for w in d.workers}
    moments = _moments(d)
    groups = []
    for pool in dict.fromkeys(w.pool for w in d.workers):
        mine = {m: [h for h in hs if _pool_of(d, h.role) == pool] for m, hs in moments.items()}
        mine = {m: hs for m, hs in mine.items() if hs}
        groups.append(gpu_group(pool, d.pools[pool], s.hardware.gpu.memory_bytes, mine, processes))
    group_of = {w.role: next(g.name for g in groups if w.process in g.processes) for w in d.workers}
    roles = [_role(d, w, group_of[w.role]) for w in _by_kind(d.workers)]
    needed = sum(d.pools.values())
    if needed > s.world_size:
        notes.append(f"this placement needs {needed} GPUs; the hardware has {s.world_size}")
    drivers = {f"{r.role} per GPU at its own peak": r.active.total for r in roles}
    policy = d.require("policy").trained()
    return Placement(roles, groups, _host(d), policy.params, policy.trainable, drivers, needed,
                     notes + policy.states.notes, scenario=d.scenario)


def _pool_of(d: Declaration, role: str) -> str:
    return d.require(role).pool


def _by_kind(workers: list[Worker]) -> list[Worker]:
    """Trained models first, then frozen ones, then generators (each in declaration order)."""
    rank = {TrainedRole: 0, FrozenRole: 1, Generator: 2}
    return sorted(workers, key=lambda w: rank[type(w.model)])


def _moments(d: Declaration) -> dict[Moment, list[Holding]]:
    reserved = {w.role: reserved_profile(m.allocated, m.states, m.scenario.hardware.runtime, m.scenario.tuning)
                for w in d.workers if isinstance(m := w.model, TrainedRole)}
    out = {}
    for step in d.steps:
        states = dict(step.busy)
        found = [d.worker(role) for role, _ in step.busy]
        busy_workers = [w for w in found if w is not None]
        if len(busy_workers) < len(found):
            raise MemfitError(f"placement step {step.moment!r} names a role with no worker: {step.busy}")
        rest = [] if step.alone else [w for w in d.workers if w.role not in states]
        ordered = ([w for w in busy_workers if not isinstance(w.model, Generator)]
                   + [w for w in rest if not isinstance(w.model, Generator)]
                   + [w for w in busy_workers + rest if isinstance(w.model, Generator)])  # engines sit beside
        out[Moment(step.moment, step.phase)] = [holding(w, states.get(w.role, "rest"), reserved.get(w.role), d.scenario)
                                                for w in ordered]
    return out


def holding(w: Worker, state: str, reserved: PhaseProfile | None, s: Scenario) -> Holding:
    """What worker `w` holds on each of its GPUs in `state` (module docstring)."""
    m = w.model
    if isinstance(m, Generator):
        return Holding(w.process, w.role, _generator_bytes(m, state, w.sleeps))
    if isinstance(m, FrozenRole):
        if state == "score":
            return Holding(w.process, w.role, m.active(), frozen_cache(m.forward, s.hardware.runtime))
        _expect(w, state, ("rest",))
        return Holding(w.process, w.role, m.idle())
    if state == "rest":
        return Holding(w.process, w.role, w.rest_bytes())
    if state == "score":
        fwd = nograd_forward(m, w.score_rows)
        b = add_parts(w.score_base(), fwd, Breakdown({"weights": m.states.gathered_forward}))
        return Holding(w.process, w.role, b, frozen_cache(fwd, s.hardware.runtime))
    if state == "sync":
        return Holding(w.process, w.role, add_parts(w.score_base(), Breakdown({"engine_buffers": w.sync_bytes})))
    _expect(w, state, TRAIN_STATES + ("sync",))
    if reserved is None:
        raise MemfitError(f"placement: the {w.role} trains but its reserved profile is missing")
    return trained_holding(w.process, w.role, m, state, reserved)


def _generator_bytes(gen: Generator, state: str, sleeps: bool) -> Breakdown:
    if state == "awake":
        return gen.awake()
    if state == "weights":
        return gen.weights_only() if sleeps else gen.awake()
    _expect_state("generator", state, ("rest", "awake", "weights"))
    return gen.asleep() if sleeps else gen.awake()


def _expect(w: Worker, state: str, valid: tuple[str, ...]) -> None:
    _expect_state(w.role, state, valid + ("score",))


def _expect_state(role: str, state: str, valid: tuple[str, ...]) -> None:
    if state not in valid:
        raise MemfitError(f"placement: the {role} cannot be in state {state!r}; valid: {', '.join(valid)}")


# ---------------------------------------------------------------------------------------------- roles and host
class _Common(TypedDict):
    """What every role's estimate says whatever its model."""

    role: str
    process: str
    group: str
    gpus: int
    seq_len: int
    notes: list[str]


def _role(d: Declaration, w: Worker, group: str) -> RoleEstimate:
    s, m, gpus = d.scenario, w.model, d.gpus(w)
    per_node = s.hardware.gpus_per_node
    common = _Common(role=w.role, process=w.process, group=group, gpus=gpus, seq_len=s.seq_len, notes=list(w.notes))
    if isinstance(m, TrainedRole):
        rs = m.scenario
        return RoleEstimate(model=rs.model.id, trains=True, engine=w.engine or engine_of(rs).describe(rs),
                            params=m.params, trainable=m.trainable, rows=w.train_rows, idle=w.rest_bytes(),
                            active=m.allocated.peak, host_per_node=m.host.peak.total, **common)
    if isinstance(m, FrozenRole):
        return RoleEstimate(model=m.scenario.model.id, trains=False, engine=w.engine or m.engine, params=m.params,
                            trainable=0, rows=w.score_rows, idle=m.idle(), active=m.active(),
                            host_per_node=frozen_host(m, min(gpus, per_node)).peak.total, **common)
    params = d.require("policy").trained().params if w.role == "generator" else full_params(m.model)
    return RoleEstimate(model=m.model.id, trains=False, engine=w.engine, params=params, trainable=0, rows=0,
                        idle=_generator_bytes(m, "rest", w.sleeps), active=m.awake(),
                        host_per_node=generator_host(m, gpus, per_node, s.hardware.runtime), **common)


def generator_host(gen: Generator, gpus: int, per_node: int, rt: Runtime) -> int:
    return (gen.host_per_gpu() + overheads.host_baseline(rt)) * min(gpus, per_node)


def _host(d: Declaration) -> PhaseProfile:
    """Host RAM per node: every process's baseline and load copies, pinned offloads, slept states and weights."""
    per_node = d.scenario.hardware.gpus_per_node
    trained = [(w, w.model) for w in d.workers if isinstance(w.model, TrainedRole)]
    parts = [tr.host for _, tr in trained]
    parts += [frozen_host(w.model, min(d.gpus(w), per_node)) for w in d.workers if isinstance(w.model, FrozenRole)]
    total = {p: add_parts(*(x.phases[p] for x in parts)) for p in PHASES}
    extra = sum(w.parked_host_bytes() * min(tr.scenario.world_size, per_node) for w, tr in trained)
    extra += sum(generator_host(w.model, d.gpus(w), per_node, d.scenario.hardware.runtime)
                 for w in d.workers if isinstance(w.model, Generator))
    return PhaseProfile({p: b.plus("weights", extra) for p, b in total.items()})

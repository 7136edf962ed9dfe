"""GPUs that run the same processes, and what they hold at each moment of a step.

A moment is a named instant of the step (a phase's peak, the reference's forward, a rollout) in one of the
shared phases. At each moment every role in every process on a GPU holds a breakdown; the group's profile
per phase is its largest moment in that phase. Each process pays its own CUDA context, NCCL communicators
and allocator cache (docs/knobs.md H.1).
"""
from __future__ import annotations

from dataclasses import dataclass

from memfit.breakdown import PHASES, Breakdown, PhaseProfile
from memfit.errors import MemfitError
from memfit.facts.runtime import Runtime
from memfit.memory import overheads
from memfit.memory.phases import verdict_of
from memfit.roles.trained import TrainedRole


@dataclass(frozen=True)
class Moment:
    name: str  # what happens, e.g. "reference_forward", "experience:reward", "train:backward"
    phase: str  # the shared phase it belongs to (memfit/breakdown.py PHASES)


def phase_moments(prefix: str = "") -> dict[str, Moment]:
    """One moment per phase, named `prefix + phase` (the peak of each phase of a trained model)."""
    return {p: Moment(prefix + p, p) for p in PHASES}


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
    world: int  # GPUs its collectives span (NCCL when > 1)
    runtime: Runtime  # its machine's constants: CUDA context and NCCL
    nodes: int = 1


@dataclass
class GpuGroup:
    """GPUs that run the same processes; every number is per GPU of the group."""

    name: str
    gpus: int
    processes: tuple[str, ...]
    roles: tuple[str, ...]
    capacity: int
    moments: dict[str, dict[str, Breakdown]]  # moment name -> role -> device bytes by category
    allocated: PhaseProfile
    reserved: PhaseProfile
    device_total: PhaseProfile
    peak_moment: str
    # of the peak, bytes the driver may page out to host RAM when the card fills: bitsandbytes' paged optimizer
    # states are CUDA unified memory (functional.py get_paged: cudaMallocManaged), evicted instead of an OOM
    evictable: int = 0

    @property
    def peak(self) -> int:
        return self.device_total.peak.total

    @property
    def margin_bytes(self) -> int:
        """Capacity minus what must stay on the card at the peak."""
        return self.capacity - self.peak + self.evictable

    def by_role(self, moment: str | None = None) -> dict[str, int]:
        return {r: b.total for r, b in self.moments[moment or self.peak_moment].items()}

    def to_json(self, band: float) -> dict:
        """`band`: the run's error band (every group of a run is judged by the same one)."""
        return {
            "name": self.name, "gpus": self.gpus, "processes_per_gpu": len(self.processes),
            "processes": list(self.processes), "roles": list(self.roles), "peak_moment": self.peak_moment,
            "peak_bytes": self.peak, "evictable_bytes": self.evictable, "margin_bytes": self.margin_bytes,
            "verdict": verdict_of(self.margin_bytes, self.capacity, None, band),
            "moments": {m: {r: b.to_json() for r, b in roles.items()} for m, roles in self.moments.items()},
            "device_total": self.device_total.to_json(),
        }


def add_parts(*parts: Breakdown) -> Breakdown:
    out: dict[str, int] = {}
    for b in parts:
        _add(out, b.parts)
    return Breakdown(out)


def _add(into: dict[str, int], parts: dict[str, int], **extra: int) -> dict[str, int]:
    for c, n in (*parts.items(), *extra.items()):
        into[c] = into.get(c, 0) + int(n)
    return into


def _settle(holdings: list[Holding], processes: dict[str, Process]) -> tuple[dict[str, Breakdown], Breakdown,
                                                                                 Breakdown, Breakdown]:
    """Per-role device bytes and the group's allocated / reserved / device total at one moment. A process's
    context and NCCL land on the first role it holds. (Plain dicts inside: planning settles thousands of
    moments.)"""
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
        context, nccl = overheads.non_torch_device_bytes(p.world, p.nodes, p.runtime)
        _add(by_role[role], {}, runtime_overhead=context + nccl)
    device: dict[str, int] = {}
    for parts in by_role.values():
        _add(device, parts)
    return ({r: Breakdown(parts) for r, parts in by_role.items()}, Breakdown(alloc), Breakdown(reserved),
            Breakdown(device))


def gpu_group(name: str, gpus: int, capacity: int, moments: dict[Moment, list[Holding]],
              processes: dict[str, Process]) -> GpuGroup:
    settled = {m: _settle(hs, processes) for m, hs in moments.items()}
    best: dict[str, Moment] = {}
    for m, (_, alloc, _, device) in settled.items():
        # equal on the card: the moment holding more tensors is the phase's peak (DPO's reference forward
        # fills the slack the policy's forward left in the allocator)
        if m.phase not in best or (device.total, alloc.total) > (settled[best[m.phase]][3].total,
                                                                   settled[best[m.phase]][1].total):
            best[m.phase] = m
    steady = best.get("checkpoint_save") or best.get("forward")
    if steady is None:
        raise MemfitError(f"GPU group {name}: no moment in phase checkpoint_save or forward, so no steady state "
                          f"to stand for the phases it does not name; moments: {', '.join(m.name for m in moments)}")
    for phase in PHASES:  # every phase present, as the shared vocabulary expects
        best.setdefault(phase, steady)
    allocated = PhaseProfile({p: settled[m][1] for p, m in best.items()})
    reserved = PhaseProfile({p: settled[m][2] for p, m in best.items()})
    device_total = PhaseProfile({p: settled[m][3] for p, m in best.items()})
    peak = best[device_total.peak_phase]
    procs = tuple(dict.fromkeys(h.process for hs in moments.values() for h in hs))
    roles = tuple(dict.fromkeys(h.role for hs in moments.values() for h in hs))
    return GpuGroup(name, gpus, procs, roles, capacity, {m.name: s[0] for m, s in settled.items()}, allocated,
                    reserved, device_total, peak.name, sum(h.outside for h in moments[peak]))


def trained_holding(process: str, role: str, tr: TrainedRole, phase: str, reserved: PhaseProfile) -> Holding:
    b = tr.allocated.phases[phase]
    return Holding(process, role, b, reserved.phases[phase].total - b.total, tr.states.paged_optimizer)


def frozen_cache(b: Breakdown, rt: Runtime) -> int:
    return overheads.allocator_cache(b.get("activations") + b.get("logits_loss"), rt)

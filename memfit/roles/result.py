"""The answer for any run: the worst GPU's profiles per rank, host RAM per node, the verdict, and the detail
per role and per GPU group (a single-model run is one role in one group)."""
from __future__ import annotations

from dataclasses import dataclass, field

from memfit.breakdown import Breakdown, PhaseProfile
from memfit.facts.assumptions import Assumption, records
from memfit.facts.scenario import Scenario
from memfit.roles.groups import GpuGroup

SCHEMA = "memfit.estimate/1"


@dataclass
class RoleEstimate:
    role: str  # policy | reference | critic | reward | generator
    model: str
    process: str
    group: str
    gpus: int
    trains: bool
    engine: str  # how it is placed, in words
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
class Placement:
    """Where a run's roles sit and what they hold: what a layout (one process per GPU, or OpenRLHF's Ray
    processes) hands to the estimate."""

    roles: list[RoleEstimate]
    groups: list[GpuGroup]
    host: PhaseProfile  # per node, every role's processes
    total_params: int  # the trained policy's
    trainable_params: int
    drivers: dict[str, int]  # named bytes that explain the peak
    gpus_needed: int
    notes: list[str] = field(default_factory=list)
    scenario: Scenario | None = None  # the run as its framework runs it, where the placement changed it (verl: FSDP)


@dataclass
class Estimate:
    scenario: Scenario
    total_params: int  # the trained policy's
    trainable_params: int
    allocated: PhaseProfile  # per rank of the worst GPU group
    reserved: PhaseProfile
    device_total: PhaseProfile
    host: PhaseProfile  # per node
    verdict: str
    margin_bytes: int
    host_margin_bytes: int | None
    roles: list[RoleEstimate]
    groups: list[GpuGroup]
    worst_group: str
    drivers: dict[str, int] = field(default_factory=dict)
    gpus_needed: int = 0
    band_kind: str = ""  # the kind of run whose error band judged it (memfit/facts/error_bands.py)
    band_fraction: float = 0.0  # that band: the share of the device total a real run may add to the estimate
    oom_chance: float = 0.0  # the chance, from the benches' errors, that the margin does not hold
    assumptions: list[Assumption] = field(default_factory=list)

    @property
    def peak_phase(self) -> str:
        return self.device_total.peak_phase

    def group(self, name: str | None = None) -> GpuGroup:
        return next(g for g in self.groups if g.name == (name or self.worst_group))

    def to_json(self) -> dict:
        s = self.scenario
        return {
            "schema": SCHEMA,
            "model": s.model.id,
            "method": s.method,
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
            "band_kind": self.band_kind,
            "band_fraction": round(self.band_fraction, 4),
            "oom_chance": round(self.oom_chance, 4),
            "host_margin_bytes": self.host_margin_bytes,
            "worst_gpu_group": self.worst_group,
            "gpus_needed": self.gpus_needed,
            "roles": [r.to_json() for r in self.roles],
            "gpu_groups": [g.to_json(self.band_fraction) for g in self.groups],
            "drivers": dict(self.drivers),
            "assumptions": list(self.assumptions),
            "assumption_records": records(self.assumptions),  # the same, each with its knob, value and source
        }

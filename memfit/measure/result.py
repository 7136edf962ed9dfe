"""What `memfit measure` returns: per-rank device and host profiles, RSS samples, the engine's buffers.

Plain data, no torch: the CLI, the bench and the estimator comparison read it without importing torch.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from memfit.breakdown import CATEGORIES, Breakdown, PhaseProfile

SIDES = ("device", "host")


@dataclass
class NamedBuffer:
    """One engine object (or group of same-named objects) after the last training step.

    `bytes` sums the tensors' own sizes (views counted at their view size); `storage_bytes` counts each
    underlying storage once, which is what memory holds.
    """

    name: str
    category: str
    side: str  # "device" = would be on the GPU; "host" = host RAM
    bytes: int
    storage_bytes: int
    count: int = 1
    pinned: bool = False
    dtype: str = ""


@dataclass
class RankMeasurement:
    rank: int
    device: PhaseProfile  # what would sit on this rank's GPU, by category, at each phase's peak
    host: PhaseProfile  # what this rank keeps in host RAM (offloaded states, pinned buffers, model build)
    rss_bytes: dict[str, int] = field(default_factory=dict)  # process RSS sampled at the end of each point
    rss_peak_bytes: dict[str, int] = field(default_factory=dict)  # VmHWM within each phase
    pinned_host_bytes: int = 0  # peak bytes the engine asked to pin (page-locked on CUDA; a no-op on CPU)
    buffers: list[NamedBuffer] = field(default_factory=list)
    peak_sites: dict[str, dict[str, list[dict]]] = field(default_factory=dict)  # side -> phase -> biggest sites at the peak
    step_peaks: list[dict] = field(default_factory=list)  # per step and phase: device and host totals
    cuda: dict | None = None  # on CUDA: max_memory_allocated / max_memory_reserved / NVML used, per phase

    def to_json(self) -> dict:
        return {
            "rank": self.rank,
            "device": self.device.to_json(),
            "host": self.host.to_json(),
            "rss_bytes": self.rss_bytes,
            "rss_peak_bytes": self.rss_peak_bytes,
            "pinned_host_bytes": self.pinned_host_bytes,
            "buffers": [asdict(b) for b in self.buffers],
            "peak_sites": self.peak_sites,
            "step_peaks": self.step_peaks,
            "cuda": self.cuda,
        }

    @classmethod
    def from_json(cls, data: dict) -> RankMeasurement:
        return cls(
            rank=data["rank"],
            device=_profile_from_json(data["device"]),
            host=_profile_from_json(data["host"]),
            rss_bytes=data.get("rss_bytes", {}),
            rss_peak_bytes=data.get("rss_peak_bytes", {}),
            pinned_host_bytes=data.get("pinned_host_bytes", 0),
            buffers=[NamedBuffer(**b) for b in data.get("buffers", [])],
            peak_sites=data.get("peak_sites", {}),
            step_peaks=data.get("step_peaks", []),
            cuda=data.get("cuda"),
        )

    def buffer(self, name: str) -> NamedBuffer | None:
        return next((b for b in self.buffers if b.name == name), None)


def _profile_from_json(data: dict) -> PhaseProfile:
    return PhaseProfile({p: Breakdown({c: v for c, v in parts.items() if c in CATEGORIES and v})
                         for p, parts in data.get("phases", {}).items()})


@dataclass
class MeasureResult:
    engine: str  # e.g. "deepspeed zero-3 (offload optimizer cpu, pin_memory)"
    world_size: int
    device_kind: str  # "cpu" (gloo, tensors classified by engine objects) or "cuda"
    steps: int
    ranks: list[RankMeasurement]
    used_instead: list[str] = field(default_factory=list)  # what the run changed because of this hardware
    params_total: int = 0
    params_trainable: int = 0
    wall_seconds: float = 0.0
    versions: dict[str, str | None] = field(default_factory=dict)  # package -> installed release (None: not installed)
    scenario: dict = field(default_factory=dict)  # the knobs that matter, for the record

    @property
    def host_peak_per_node(self) -> int:
        """Host RAM the engine's objects need on one node: the sum over ranks of each rank's host peak."""
        return sum(r.host.peak.total for r in self.ranks) if self.ranks else 0

    @property
    def rss_peak_per_node(self) -> int:
        return sum(max(r.rss_peak_bytes.values(), default=0) for r in self.ranks)

    def to_json(self) -> dict:
        return {
            "engine": self.engine,
            "world_size": self.world_size,
            "device_kind": self.device_kind,
            "steps": self.steps,
            "used_instead": self.used_instead,
            "params_total": self.params_total,
            "params_trainable": self.params_trainable,
            "wall_seconds": round(self.wall_seconds, 2),
            "versions": self.versions,
            "scenario": self.scenario,
            "host_peak_per_node": self.host_peak_per_node,
            "rss_peak_per_node": self.rss_peak_per_node,
            "ranks": [r.to_json() for r in self.ranks],
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1)

    @classmethod
    def from_json(cls, data: dict) -> MeasureResult:
        return cls(
            engine=data["engine"],
            world_size=data["world_size"],
            device_kind=data["device_kind"],
            steps=data["steps"],
            ranks=[RankMeasurement.from_json(r) for r in data["ranks"]],
            used_instead=data.get("used_instead", []),
            params_total=data.get("params_total", 0),
            params_trainable=data.get("params_trainable", 0),
            wall_seconds=data.get("wall_seconds", 0.0),
            versions=data.get("versions", {}),
            scenario=data.get("scenario", {}),
        )

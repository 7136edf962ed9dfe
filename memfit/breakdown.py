"""The shared vocabulary of memory: categories, phases, and a per-phase breakdown.

Estimates, traces and measurements all speak this structure, so any two of them diff directly.
Bytes are plain ints everywhere; conversion to GiB happens only in presentation.
"""
from __future__ import annotations

from dataclasses import dataclass, field

CATEGORIES = (
    "weights",
    "gradients",
    "optimizer_states",
    "activations",
    "logits_loss",
    "engine_buffers",
    "runtime_overhead",
)

PHASES = ("load", "forward", "backward", "optimizer_step", "checkpoint_save", "resume")


@dataclass
class Breakdown:
    """Bytes by category at one moment (the peak moment of some phase)."""

    parts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.parts) - set(CATEGORIES)
        if unknown:
            raise ValueError(f"unknown memory categories {sorted(unknown)}; valid: {CATEGORIES}")

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    def get(self, category: str) -> int:
        return self.parts.get(category, 0)

    def plus(self, category: str, nbytes: int) -> "Breakdown":
        parts = dict(self.parts)
        parts[category] = parts.get(category, 0) + int(nbytes)
        return Breakdown(parts)

    def to_json(self) -> dict:
        return {c: int(self.parts.get(c, 0)) for c in CATEGORIES} | {"total": self.total}


@dataclass
class PhaseProfile:
    """For each phase, the breakdown at that phase's own peak; the overall peak is the largest."""

    phases: dict[str, Breakdown] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.phases) - set(PHASES)
        if unknown:
            raise ValueError(f"unknown phases {sorted(unknown)}; valid: {PHASES}")

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: (self.phases[p].total, -PHASES.index(p)))

    @property
    def peak(self) -> Breakdown:
        return self.phases[self.peak_phase]

    def to_json(self) -> dict:
        return {
            "peak_phase": self.peak_phase,
            "peak_bytes": self.peak.total,
            "phases": {p: self.phases[p].to_json() for p in PHASES if p in self.phases},
        }

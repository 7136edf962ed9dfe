"""Gradient checkpointing as an ordered scale: each level saves more device memory than the one before and costs
more time (recomputed layers, host transfers). The `checkpointing` knob's modes map onto it
(docs/knobs.md C.2)."""
from __future__ import annotations

from enum import IntEnum


class Recompute(IntEnum):
    OFF = 0  # every layer keeps its activations for backward
    EVERY_N = 1  # every n-th layer checkpointed
    FULL = 2  # every layer checkpointed: its input kept, the rest recomputed in backward
    OFFLOAD = 3  # checkpointed, the layer inputs kept in host RAM ("offload"; unsloth's offloaded checkpointing)

    @classmethod
    def of(cls, checkpointing: str) -> "Recompute":
        return MODES[checkpointing]

    @property
    def on_host(self) -> bool:
        return self is Recompute.OFFLOAD


MODES = {"off": Recompute.OFF, "every_n": Recompute.EVERY_N, "full": Recompute.FULL, "offload": Recompute.OFFLOAD,
         "unsloth": Recompute.OFFLOAD}

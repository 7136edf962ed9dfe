"""The machine a run uses: its GPU kind, how many per node, how many nodes, host RAM, runtime constants."""
from __future__ import annotations

from dataclasses import dataclass, field

from memfit.errors import MemfitError
from memfit.facts.catalog import GpuSpec
from memfit.facts.knobs import hardware
from memfit.facts.runtime import Runtime, default_runtime


@dataclass(frozen=True)
class Hardware:
    gpu: GpuSpec
    gpus_per_node: int = 1
    nodes: int = 1
    host_ram: int | None = None  # bytes per node; None = unknown, no host verdict
    runtime: Runtime = field(default_factory=default_runtime)  # a machine profile's constants, or the defaults

    def __post_init__(self) -> None:
        table = hardware()
        for name in ("gpus_per_node", "nodes"):
            table[name].check(getattr(self, name))
        if self.gpu.memory_bytes <= 0:
            raise MemfitError(f"GPU memory must be positive, got {self.gpu.memory_bytes}")
        if self.host_ram is not None and self.host_ram <= 0:
            raise MemfitError(f"{table['host_ram'].label} must be positive, got {self.host_ram}")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

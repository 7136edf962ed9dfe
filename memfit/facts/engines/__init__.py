"""The engines a run can use, one module each: `engine_of(s)` answers what the scenario's engine shards,
offloads, pins and casts (base.py names the questions)."""
from __future__ import annotations

from memfit.facts.engines.base import Engine, Sharding, Traffic
from memfit.facts.engines.deepspeed import DeepSpeed
from memfit.facts.engines.fsdp import Fsdp

ENGINES: dict[str, Engine] = {"single": Engine(), "ddp": Engine(), "deepspeed": DeepSpeed(), "fsdp": Fsdp()}

__all__ = ["ENGINES", "Engine", "Sharding", "Traffic", "engine_of"]


def engine_of(s) -> Engine:
    return ENGINES[s.engine]

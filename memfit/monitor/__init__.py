"""Monitor a live training run: one JSON line per rank and step (schema memfit.monitor/1), read back by
`memfit watch`. A checker beside trace and measure: torch is used when present, never imported here.

    from memfit.monitor import MemoryMonitor            # any loop: plain PyTorch, DeepSpeed, Accelerate
    from memfit.monitor import MemoryMonitorCallback    # transformers.Trainer(callbacks=[...])
    from memfit.monitor import lightning_callback       # Lightning: lightning_callback("run.jsonl")
"""
from __future__ import annotations

from memfit.monitor.core import SCHEMA, MemoryMonitor, rank_path

__all__ = ["SCHEMA", "MemoryMonitor", "MemoryMonitorCallback", "lightning_callback", "rank_path"]


def __getattr__(name: str):
    # the callbacks subclass transformers' / Lightning's classes: defined on first use so that importing
    # memfit.monitor needs neither library
    if name == "MemoryMonitorCallback":
        from memfit.monitor.hf import MemoryMonitorCallback

        return MemoryMonitorCallback
    if name == "lightning_callback":
        from memfit.monitor.lightning import lightning_callback

        return lightning_callback
    raise AttributeError(f"module 'memfit.monitor' has no attribute {name!r}")

"""Training logs and pasted errors read back into facts memfit can explain (`memfit doctor`).

parse.py finds the memory failures (every form of PyTorch's CUDA OOM message since 1.0, host-side kills,
NCCL memory failures) and DeepSpeed's see_memory_usage timeline; sites.py names the phase and component from
the traceback (memfit/facts/data/failure_sites.toml); diagnose.py turns them into findings and, with a
config, into memfit's estimate beside the log and the planner's ranked fixes. No torch here.
"""
from memfit.interfaces.logs.parse import (
    Failure,
    LogReport,
    TimelinePoint,
    parse_log,
    read_log,
)

__all__ = ["Failure", "LogReport", "TimelinePoint", "parse_log", "read_log"]

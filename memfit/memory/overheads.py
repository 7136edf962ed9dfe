"""Memory outside the model's tensors: cuBLAS workspace, allocator cache, CUDA context, NCCL, process RSS.

Sources: docs/knobs.md H.1-H.3 (CublasHandlePool.cpp, CUDACachingAllocator.cpp, NCCL issues); the allocator's
cache from replaying traced runs through c10's rules (memfit/trace/allocator_reserve.py). The constants a GPU run
calibrates are the machine's Runtime (memfit/facts/runtime.py: defaults, or a `memfit calibrate` profile); each is
used in one place here.
"""
from __future__ import annotations

from memfit.facts.catalog import GpuSpec
from memfit.facts.runtime import Runtime

MiB = 2**20

# cuBLAS workspace per (handle, stream), allocated through the caching allocator (so it is in
# max_memory_allocated): 4096*1024*2 + 16*1024*8 bytes below sm90, 32 MiB on sm90; plus 1 MiB cuBLASLt.
CUBLAS_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_SM90 = 32 * MiB
CUBLASLT_WORKSPACE = 1 * MiB


def cublas_workspace(gpu: GpuSpec) -> int:
    big = CUBLAS_WORKSPACE_SM90 if gpu.compute_capability >= 9.0 else CUBLAS_WORKSPACE
    return big + CUBLASLT_WORKSPACE


def allocator_cache(churn_bytes: int, rt: Runtime, tuning: str | None = None) -> int:
    """What the caching allocator holds beyond allocated, and cannot give back, at a moment that churns
    `churn_bytes` (activations, logits, temporaries): the share the replay derived for runs of `tuning`
    (data/allocator_reserve.toml fit_share), or a machine profile's measured one."""
    return int(rt.slack_share(tuning) * churn_bytes)


def non_torch_device_bytes(world_size: int, nodes: int, rt: Runtime) -> tuple[int, int]:
    """(CUDA context, NCCL) bytes per GPU process: in nvidia-smi, not in torch's counters."""
    nccl = 0 if world_size == 1 else (rt.nccl_multi_node if nodes > 1 else rt.nccl_one_node)
    return rt.cuda_context, nccl


def host_baseline(rt: Runtime) -> int:
    """Host RSS of one training process before any model bytes."""
    return rt.process_host_baseline

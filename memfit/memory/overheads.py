"""Memory outside the model's tensors: cuBLAS workspace, allocator cache, CUDA context, NCCL, process RSS.

Sources: docs/knobs.md H.1-H.3 (CublasHandlePool.cpp, CUDACachingAllocator.cpp, NCCL
issues). These are the constants a GPU run should calibrate; each is named and used in one place.
"""
from __future__ import annotations

from memfit.facts.catalog import GpuSpec

MiB = 2**20
GiB = 2**30

# cuBLAS workspace per (handle, stream), allocated through the caching allocator (so it is in
# max_memory_allocated): 4096*1024*2 + 16*1024*8 bytes below sm90, 32 MiB on sm90; plus 1 MiB cuBLASLt.
CUBLAS_WORKSPACE = 4096 * 1024 * 2 + 16 * 1024 * 8
CUBLAS_WORKSPACE_SM90 = 32 * MiB
CUBLASLT_WORKSPACE = 1 * MiB

# CUDA context with lazy module loading: 287 MB measured, "~400MB" per PyTorch maintainers (H.1).
CUDA_CONTEXT = 400 * 10**6
# NCCL buffers: NCCL_BUFFSIZE 4 MiB per channel and peer; DeepSpeed/FSDP create several communicators.
# docs/knobs.md H.1 budgets 0.5-2 GB per GPU; we assume the low end for one node, more across nodes.
NCCL_ONE_NODE = 512 * MiB
NCCL_MULTI_NODE = 1 * GiB
# Allocator cache and fragmentation: reserved exceeds allocated by 5-30% in training (H.3); we assume a
# tenth of the bytes that are allocated and freed within each step (activations, logits, temporaries).
FRAGMENTATION_OF_CHURN = 0.10
# Host RSS of one training process before any model bytes: Python, torch and CUDA libraries mapped.
PROCESS_HOST_BASELINE = 3 * GiB


def cublas_workspace(gpu: GpuSpec) -> int:
    big = CUBLAS_WORKSPACE_SM90 if gpu.compute_capability >= 9.0 else CUBLAS_WORKSPACE
    return big + CUBLASLT_WORKSPACE


def allocator_cache(churn_bytes: int) -> int:
    return int(FRAGMENTATION_OF_CHURN * churn_bytes)


def non_torch_device_bytes(world_size: int, nodes: int) -> tuple[int, int]:
    """(CUDA context, NCCL) bytes per GPU process: in nvidia-smi, not in torch's counters."""
    nccl = 0 if world_size == 1 else (NCCL_MULTI_NODE if nodes > 1 else NCCL_ONE_NODE)
    return CUDA_CONTEXT, nccl

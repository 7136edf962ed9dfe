"""What every engine says about a run: what is sharded, offloaded, pinned, cast, and when.

An engine is one object (memfit/facts/engines/__init__.py picks it by `s.engine`). The memory model, the
step-time model, the roles, the formats and the real-engine measurement all ask it instead of testing the
engine's name. The base class is plain data parallelism: every rank holds everything, nothing offloaded.
Sources: docs/knobs.md A (DeepSpeed), B (FSDP), H.4 (autocast).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Sharding(IntEnum):
    """What each rank holds only a part of; every level also shards what the levels below it shard."""

    NONE = 0  # single GPU, DDP, ZeRO-0, FSDP no_shard: everything replicated
    OPTIMIZER = 1  # ZeRO-1
    GRADIENTS = 2  # ZeRO-2, FSDP shard_grad_op
    PARAMETERS = 3  # ZeRO-3, FSDP full_shard / hybrid_shard


@dataclass(frozen=True)
class Traffic:
    """Collective traffic of a step as multiples of the weight and gradient bytes (the ring's payload)."""

    weights_per_micro: float = 0.0  # parameter all-gathers in each micro-step
    grads_per_micro: float = 0.0  # gradient reduce(-scatter)s in each micro-step
    grads_per_step: float = 0.0  # once per optimizer step (all-reduce = 2, reduce-scatter + all-gather = 2)


@dataclass(frozen=True)
class OffloadTraffic:
    """Host-link traffic of offloading, as bytes per trainable parameter (gradients down, updated weights up)
    and as fetches of the rank's weight partition from the host in each micro-step."""

    grad_bytes_down: float = 0.0  # each micro-step
    param_bytes_up: float = 0.0  # each optimizer step
    weight_fetches: float = 0.0  # each micro-step (forward and backward gathers)


class Engine:
    """Plain data parallelism (one GPU, or DDP): the defaults every other engine departs from."""

    name = "plain"

    def sharding(self, s) -> Sharding:
        return Sharding.NONE

    def partition_ranks(self, s) -> int:
        """Ranks one partition spans (a parameter's shards, an optimizer partition)."""
        return s.world_size

    def casts_module(self, s) -> bool:
        """The engine casts the module itself to the 16-bit compute dtype (no fp32 weight inside it)."""
        return False

    def runs_autocast(self, s) -> bool:
        """Forward runs under torch.autocast: plain torch does for mixed precision, or when the trainer asks
        (HF Trainer bf16=True); DeepSpeed and FSDP cast the module instead (docs/knobs.md A.1, B)."""
        if s.precision == "fp32":
            return False
        return s.autocast or s.precision.endswith("mixed")

    def fp32_grads(self, s) -> bool:
        """Gradients are fp32: plain torch trains fp32 weights under mixed precision."""
        return s.precision == "fp32" or s.precision.endswith("mixed")

    def optimizer_offload(self, s) -> str:
        """Where the optimizer states live: none (the GPU), cpu or nvme."""
        return "none"

    def param_offload(self, s) -> str:
        return "none"

    def pinned(self, s) -> bool:
        """Offloaded host buffers are page-locked (pinned)."""
        return False

    def optimizer_gpu_share(self, s, partition_sizes: list[int]) -> float:
        """Share of the optimizer partition stepped on the GPU (the rest is offloaded). `partition_sizes`: each
        trainable parameter's per-rank share in module order (the unit some engines offload by)."""
        return 1.0 if self.optimizer_offload(s) == "none" else 0.0

    def offload_traffic(self, s) -> OffloadTraffic:
        return OffloadTraffic()

    def cpu_optimizer(self, s) -> str:
        """The step-time model's rate for an offloaded optimizer step (catalog speed.toml [offload])."""
        return "torch_cpu_adam_params_per_second"

    def master_at_load(self, s) -> bool:
        """The fp32 master copy exists when the engine starts (DeepSpeed), before the optimizer states do."""
        return False

    def loads_once_per_node(self, s) -> bool:
        """Rank 0 reads the checkpoint and the other ranks build on meta (else every rank loads a copy)."""
        return False

    def frozen_loads_once_per_node(self, s) -> bool:
        """A frozen model (reference, reward) is built partitioned, so the node reads it once."""
        return False

    def sharded_checkpoint(self, s) -> bool:
        """Each rank saves and loads its own partitions (else one full optimizer file per rank)."""
        return False

    def head_grads_held(self, s, nbytes: int) -> int:
        """Bytes of the output head's gradient a rank holds right after the head's backward."""
        return nbytes

    def frozen_sharded(self, s) -> bool:
        """A frozen model is sharded like the trained one (else a full 16-bit replica on every GPU)."""
        return False

    def traffic(self, s) -> Traffic:
        """DDP all-reduces the gradients once per step."""
        return Traffic(grads_per_step=2.0)

    def speed_key(self, s) -> str:
        """The name the step-time assumptions use (speed.toml [comm.exposed])."""
        return s.engine

    def describe(self, s) -> str:
        return {"single": "single GPU", "ddp": "DDP"}.get(s.engine, s.engine)

    def name_for(self, s, gpus: int) -> str:
        """The engine a part of the run on `gpus` GPUs uses: plain torch is DDP on several GPUs, one GPU alone."""
        return "ddp" if gpus > 1 else "single"

    def kbit_upcast_default(self) -> bool | None:
        """None: the framework profile decides whether QLoRA upcasts the non-4-bit params."""
        return None

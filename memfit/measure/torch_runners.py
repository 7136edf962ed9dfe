"""One GPU, DDP and FSDP2 as `memfit measure` runs them: plain torch optimizers around the model, and which
objects hold which memory."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

import torch
import torch.distributed as dist

from memfit.errors import MemfitError
from memfit.facts.frameworks import framework
from memfit.measure.model import upcast_trainable

from memfit.measure.patches import claim_loaded
from memfit.measure.runner import LR, Runner, compute_dtype

if TYPE_CHECKING:
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy


class TorchRunner(Runner):
    """single GPU, DDP and FSDP2: a torch optimizer, autocast for mixed precision, torch.save checkpoints."""

    optimizer: torch.optim.Optimizer | None

    def build(self):
        s = self.s
        model = self._build()
        if self.device != "cpu" and s.engine != "fsdp":  # fully_shard moves the shards to the mesh device
            model.to(self.device)
        self.model = model
        self.module = self.wrap(model)
        params = [p for p in self.module.parameters() if p.requires_grad]
        if s.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=LR)
        else:
            self.optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0, fused=s.optimizer == "adamw-fused",
                                               foreach=s.optimizer == "adamw-foreach" or None)

    def built_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer build() made; none before it or after close()."""
        if self.optimizer is None:
            raise MemfitError("the measure runner has no optimizer: build() it first (close() drops it)")
        return self.optimizer

    def wrap(self, model):
        return model

    def engine_forward(self, batch):
        if self.autocast is not None:
            with torch.autocast(self.device, dtype=self.autocast):
                return self.module(**batch)
        return self.module(**batch)

    def backward(self, loss):
        self.begin_backward()
        (loss / self.s.grad_accum).backward()
        self.tk.context = None

    def step(self, boundary: bool):
        if boundary:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), 1.0)
            optimizer = self.built_optimizer()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    def walk(self):
        self.claim_params(self.module)
        self.claim_grads(self.module)
        self.claim_state(self.optimizer)

    def _ckpt_file(self, path: Path) -> Path:
        return path / f"rank{dist.get_rank() if dist.is_initialized() else 0}.pt"

    def save(self, path: Path):
        path.mkdir(parents=True, exist_ok=True)
        if not dist.is_initialized() or dist.get_rank() == 0 or self.s.engine == "fsdp":
            torch.save({"model": self.module.state_dict(), "optimizer": self.built_optimizer().state_dict()},
                       self._ckpt_file(path))
        if dist.is_initialized():
            dist.barrier()

    def load(self, path: Path):
        file = self._ckpt_file(path) if self.s.engine == "fsdp" else path / "rank0.pt"
        self.tk.context = "checkpoint_load"
        try:
            state = torch.load(file, map_location="cpu", weights_only=False)
        finally:
            self.tk.context = None
        claim_loaded(self.tk, state)
        self.module.load_state_dict(state["model"])
        self.built_optimizer().load_state_dict(state["optimizer"])
        del state


class DdpRunner(TorchRunner):
    def wrap(self, model):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if self.device == "cuda" else None)


class _ShardPolicies(TypedDict, total=False):
    """The policies every fully_shard call of a run gets (unset: torch's defaults)."""

    mp_policy: MixedPrecisionPolicy
    offload_policy: OffloadPolicy


def _accelerate_units(base, reshard: bool, kwargs: _ShardPolicies) -> None:
    """The units accelerate >= 1.14's fsdp2_prepare_model carves beside the layers, as the HF Trainer runs FSDP2: the
    embedding (unless tied), and [final norm, head] (with a tied embedding) kept gathered after forward."""
    from torch.distributed.fsdp import fully_shard

    embed, head = base.get_input_embeddings(), base.get_output_embeddings()
    tied = head is not None and embed.weight is head.weight
    if not tied:
        fully_shard(embed, reshard_after_forward=reshard, **kwargs)
    tail = [m for m in (base.model.norm, *((embed, head) if tied else (head,))) if m is not None]
    fully_shard(tail, reshard_after_forward=False, **kwargs)


class FsdpRunner(TorchRunner):
    def wrap(self, model):
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            fully_shard,
        )

        s = self.s
        kwargs: _ShardPolicies = {}
        if s.precision.endswith("-mixed"):
            upcast_trainable(model)
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype(s), reduce_dtype=torch.float32)
        if s.fsdp_cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        reshard = s.fsdp_strategy != "shard_grad_op"
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        for layer in base.model.layers:
            fully_shard(layer, reshard_after_forward=reshard, **kwargs)
        if framework(s.profile).fsdp.get("wrapping") == "accelerate":
            _accelerate_units(base, reshard, kwargs)
            fully_shard(model, **kwargs)  # the root: torch's own reshard rule, as accelerate leaves it
        else:
            fully_shard(model, reshard_after_forward=reshard, **kwargs)
        return model

    def walk(self):
        side = "host" if self.s.fsdp_cpu_offload else "device"
        self.claim_params(self.module, side=side)
        self.claim_grads(self.module, side=side)
        self.claim_state(self.optimizer, side_of=lambda p: side)

    def load(self, path: Path):
        from torch.distributed.tensor import DTensor

        self.tk.context = "checkpoint_load"
        try:
            state = torch.load(self._ckpt_file(path), map_location="cpu", weights_only=False)
        finally:
            self.tk.context = None
        claim_loaded(self.tk, state)
        self.module.load_state_dict(state["model"])
        self.built_optimizer().load_state_dict(state["optimizer"])
        del state, DTensor

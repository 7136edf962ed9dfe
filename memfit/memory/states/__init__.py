"""Model states per rank (weights, gradients, optimizer states, engine buffers, host buffers), one byte model
per engine: plain.py (one GPU, DDP), deepspeed.py (ZeRO 0-3, offload, ratio), fsdp.py (FSDP2)."""
from __future__ import annotations

from memfit.facts.adapters import adapter_methods, method_info
from memfit.memory.inventory import ParamTensor
from memfit.memory.states import deepspeed, fsdp, plain
from memfit.memory.states.common import HostBuffer, ModelStates, trainable_dtype_bytes

BY_ENGINE = {"single": plain, "ddp": plain, "deepspeed": deepspeed, "fsdp": fsdp}

__all__ = ["HostBuffer", "ModelStates", "frozen_copy", "model_states", "trainable_dtype_bytes"]


def model_states(s, tensors: list[ParamTensor]) -> ModelStates:
    ms = BY_ENGINE[s.engine].states(s, tensors)
    copies = method_info(s.tuning).get("state_copies", 0) if s.tuning in adapter_methods() else 0
    if copies:
        # AdaLoRA's rank allocator keeps full-size importance scores of every adapter tensor once the training
        # loop calls update_and_allocate (trainers do not; the scripts PEFT documents do): counted, to err high
        ms.optimizer += copies * sum(t.total for t in tensors if t.trainable) * s.adapter_bytes
        ms.notes.append(f"{s.tuning}: {copies} importance copies of the adapters (RankAllocator, update_and_allocate)")
    return ms


def frozen_copy(s, tensors: list[ParamTensor], offload: bool) -> tuple[str, int, int, int, list[str]]:
    """How a frozen model (reference, reward) sits beside the trained one under this engine: (placement in
    words, resident bytes per GPU, bytes gathered while a layer runs, offloaded host bytes per rank, notes)."""
    return BY_ENGINE[s.engine].frozen_copy(s, tensors, offload)

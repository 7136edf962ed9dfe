"""Model states per rank (weights, gradients, optimizer states, engine buffers, host buffers), one byte model
per engine: plain.py (one GPU, DDP), deepspeed.py (ZeRO 0-3, offload, ratio), fsdp.py (FSDP2)."""
from __future__ import annotations

from memfit.memory.inventory import ParamTensor
from memfit.memory.states import deepspeed, fsdp, plain
from memfit.memory.states.common import HostBuffer, ModelStates, trainable_dtype_bytes

BY_ENGINE = {"single": plain, "ddp": plain, "deepspeed": deepspeed, "fsdp": fsdp}

__all__ = ["HostBuffer", "ModelStates", "frozen_copy", "model_states", "trainable_dtype_bytes"]


def model_states(s, tensors: list[ParamTensor]) -> ModelStates:
    return BY_ENGINE[s.engine].states(s, tensors)


def frozen_copy(s, tensors: list[ParamTensor], offload: bool) -> tuple[str, int, int, int, list[str]]:
    """How a frozen model (reference, reward) sits beside the trained one under this engine: (placement in
    words, resident bytes per GPU, bytes gathered while a layer runs, offloaded host bytes per rank, notes)."""
    return BY_ENGINE[s.engine].frozen_copy(s, tensors, offload)

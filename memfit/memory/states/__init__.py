"""Model states per rank (weights, gradients, optimizer states, engine buffers, host buffers), one byte model
per engine: plain.py (one GPU, DDP), deepspeed.py (ZeRO 0-3, offload, ratio), fsdp.py (FSDP2)."""
from __future__ import annotations

from memfit.facts.adapters import adapter_methods, method_info
from memfit.facts.frameworks import model_code, torchtune_builder
from memfit.facts.scenario import Scenario
from memfit.memory.inventory import ParamTensor
from memfit.memory.states import deepspeed, fsdp, plain
from memfit.memory.states.common import HostBuffer, ModelStates, trainable_dtype_bytes

BY_ENGINE = {"single": plain, "ddp": plain, "deepspeed": deepspeed, "fsdp": fsdp}

__all__ = ["HostBuffer", "ModelStates", "frozen_copy", "model_states", "trainable_dtype_bytes"]


def model_states(s: Scenario, tensors: list[ParamTensor]) -> ModelStates:
    ms = BY_ENGINE[s.engine].states(s, tensors)
    ms.weights += rope_cache_bytes(s)
    copies = method_info(s.tuning).get("state_copies", 0) if s.tuning in adapter_methods() else 0
    if copies:
        # AdaLoRA's rank allocator keeps full-size importance scores of every adapter tensor once the training
        # loop calls update_and_allocate (trainers do not; the scripts PEFT documents do): counted, to err high
        ms.optimizer += copies * sum(t.total for t in tensors if t.trainable) * s.adapter_bytes
        ms.notes.append(f"{s.tuning}: {copies} importance copies of the adapters (RankAllocator, update_and_allocate)")
    return ms


def rope_cache_bytes(s: Scenario) -> int:
    """A framework whose model keeps a RoPE cos/sin table as a buffer (torchtune: max_seq_len positions, fp32; its
    profile's [model_code]); no engine shards buffers."""
    code = model_code(s.profile)
    per_position = code.get("rope_cache_bytes", {}).get(s.model.arch)
    if not per_position or s.model.position != "rope":
        return 0
    positions = s.model.max_position_embeddings or code["rope_positions"]
    lora_per_layer = (s.tuning in ("lora", "qlora")
                      and torchtune_builder(s.model) in code.get("rope_cache_per_layer_lora", ()))
    return positions * s.model.head_dim * per_position * (s.model.num_layers if lora_per_layer else 1)


def frozen_copy(s: Scenario, tensors: list[ParamTensor], offload: bool) -> tuple[str, int, int, int, list[str]]:
    """How a frozen model (reference, reward) sits beside the trained one under this engine: (placement in
    words, resident bytes per GPU, bytes gathered while a layer runs, offloaded host bytes per rank, notes)."""
    return BY_ENGINE[s.engine].frozen_copy(s, tensors, offload)

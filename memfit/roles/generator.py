"""The generator of PPO / GRPO runs: vLLM engine workers and the memory budget they reserve
(data/methods.toml [generator.vllm]; docs/knobs.md E.2)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from memfit.breakdown import Breakdown
from memfit.facts.catalog import ModelSpec
from memfit.memory.inventory import tuned_tensors


@dataclass
class Generator:
    """vLLM engine workers: each GPU of an engine runs one worker process."""

    model: ModelSpec
    tp: int
    utilization: float
    sleep: bool
    capacity: int
    facts: dict
    # vLLM sleep level: 1 offloads the weights to host RAM (OpenRLHF), 2 discards them, the next weight sync
    # refills them (verl 0.9.1 vllm_async_server.py _resolve_sleep_level: 2 for full weights, 1 for LoRA adapters)
    sleep_level: int = 1

    @property
    def weights(self) -> int:  # bf16 weights per GPU (tensor parallel shards)
        return full_params(self.model) * 2 // self.tp

    @property
    def budget(self) -> int:
        """gpu_memory_utilization x total memory: weights + activations + KV cache of this worker."""
        return int(self.utilization * self.capacity)

    @property
    def kv_cache(self) -> int:
        return self.budget - self.weights - self.facts["activation_reserve_bytes"]

    def kv_bytes_per_token(self) -> int:
        m = self.model
        return 2 * m.num_layers * max(1, m.num_kv_heads // self.tp) * m.head_dim * 2

    def awake(self) -> Breakdown:
        return Breakdown({"weights": self.weights, "engine_buffers": max(0, self.budget - self.weights)})

    def asleep(self) -> Breakdown:
        """Sleep level 1: weights to host, KV cache dropped; CUDA graphs and NCCL remain."""
        return Breakdown({"engine_buffers": self.facts["sleep_residual_bytes"]})

    def weights_only(self) -> Breakdown:
        """Woken with tags=["weights"] for the weight sync (OpenRLHF broadcast_to_vllm): no KV cache yet."""
        return Breakdown({"weights": self.weights, "engine_buffers": self.facts["sleep_residual_bytes"]})

    def host_per_gpu(self) -> int:
        return self.weights if self.sleep and self.sleep_level == 1 else 0


@cache
def full_params(model: ModelSpec) -> int:
    """Every parameter of the model (the inventory is rebuilt on each call; planning asks often)."""
    return sum(t.total for t in tuned_tensors(model, "full"))

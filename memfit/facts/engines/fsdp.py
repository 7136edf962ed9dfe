"""PyTorch FSDP (FSDP2 fully_shard, as accelerate and torchtune drive it): what each strategy shards and
what CPU offload moves to the host (docs/knobs.md B, memfit/measure/FINDINGS.md).
"""
from __future__ import annotations

from memfit.facts.engines.base import Engine, OffloadTraffic, Sharding, Traffic
from memfit.facts.frameworks import autocast_over_fp32_gathers

STRATEGY_SHARDING = {"no_shard": Sharding.NONE, "shard_grad_op": Sharding.GRADIENTS,
                     "full_shard": Sharding.PARAMETERS, "hybrid_shard": Sharding.PARAMETERS}


class Fsdp(Engine):
    name = "fsdp"

    def name_for(self, s, gpus: int) -> str:
        return self.name

    def sharding(self, s) -> Sharding:
        return STRATEGY_SHARDING[s.fsdp_strategy]

    def partition_ranks(self, s) -> int:
        # hybrid_shard shards within a node and replicates across nodes
        return s.hardware.gpus_per_node if s.fsdp_strategy == "hybrid_shard" else s.world_size

    def runs_autocast(self, s) -> bool:
        # MixedPrecisionPolicy casts the gathered params instead; a framework's FSDP2 without one (LitGPT lora.py)
        # gathers fp32 params under Fabric's autocast forward
        return autocast_over_fp32_gathers(s)

    def fp32_grads(self, s) -> bool:
        return s.precision == "fp32"

    def optimizer_offload(self, s) -> str:
        return "cpu" if s.fsdp_cpu_offload else "none"

    def param_offload(self, s) -> str:
        return "cpu" if s.fsdp_cpu_offload else "none"

    def pinned(self, s) -> bool:
        return True  # CPUOffloadPolicy(pin_memory=True)

    def offload_traffic(self, s) -> OffloadTraffic:
        """CPU offload: fp32 gradients down each micro-step, the weight shards fetched for both gathers; torch's
        AdamW steps the fp32 shards in place on the host (nothing goes back up)."""
        if not s.fsdp_cpu_offload:
            return OffloadTraffic()
        return OffloadTraffic(grad_bytes_down=4.0, weight_fetches=2.0)

    def loads_once_per_node(self, s) -> bool:
        return s.fsdp_cpu_ram_efficient_loading

    def sharded_checkpoint(self, s) -> bool:
        return True

    def head_grads_held(self, s, nbytes: int) -> int:
        # the head's gradient is made on its unsharded parameter, in the param dtype (MixedPrecisionPolicy's
        # param_dtype: half an fp32 master's bytes), and reduce-scattered only in the root group's post-backward at
        # backward's end (_fsdp_param_group.py::post_backward; measured: bench/torchtune_distributed.py)
        return nbytes // 2 if s.precision.endswith("mixed") else nbytes

    def frozen_sharded(self, s) -> bool:
        return s.fsdp_strategy != "no_shard"

    def traffic(self, s) -> Traffic:
        if s.fsdp_strategy in ("full_shard", "hybrid_shard"):
            return Traffic(weights_per_micro=2.0, grads_per_micro=1.0)
        if s.fsdp_strategy == "shard_grad_op":
            return Traffic(weights_per_micro=1.0, grads_per_micro=1.0)
        return Traffic(grads_per_step=2.0)

    def speed_key(self, s) -> str:
        return s.fsdp_strategy

    def describe(self, s) -> str:
        return f"FSDP {s.fsdp_strategy}" + (" + CPU offload" if s.fsdp_cpu_offload else "")

    def kbit_upcast_default(self) -> bool | None:
        return False  # TRL skips prepare_model_for_kbit_training for sharded (FSDP) QLoRA

"""DeepSpeed ZeRO 0-3 (0.19): what each stage shards, what offload and ratio move to the host, how the
config file says it. Read from the engine's code and measured on it (docs/knobs.md A,
memfit/measure/FINDINGS.md).
"""
from __future__ import annotations

from memfit.facts.engines.base import Engine, OffloadTraffic, Sharding, Traffic

STAGE_SHARDING = {0: Sharding.NONE, 1: Sharding.OPTIMIZER, 2: Sharding.GRADIENTS, 3: Sharding.PARAMETERS}


def overlap(s) -> bool:
    """overlap_comm unset follows DeepSpeed's rule: on under ZeRO-3 only (docs/knobs.md A.3)."""
    return s.zero_stage == 3 if s.overlap_comm is None else s.overlap_comm


def subgroups(partition_sizes: list[int], sub_group_size: int) -> list[int]:
    """Elements of each optimizer sub-group: stage3.py cuts the rank's partition at parameter boundaries
    once a group holds sub_group_size elements (_create_fp16_sub_groups). `partition_sizes`: each
    parameter's per-rank share, in module order."""
    groups, current = [], 0
    for numel in partition_sizes:
        current += numel
        if current >= sub_group_size:
            groups.append(current)
            current = 0
    if current:
        groups.append(current)
    return groups


def gpu_share(groups: list[int], ratio: float) -> float:
    """Share of the optimizer partition `ratio` keeps on the GPU: the first int((1 - ratio) x S) of S
    sub-groups (stage3.py _create_fp32_partitions)."""
    on_gpu = int((1 - ratio) * len(groups))
    return sum(groups[:on_gpu]) / max(sum(groups), 1)


def zero_section(s) -> dict:
    """The zero_optimization section this scenario means (the keys as DeepSpeed's config reads them)."""
    zero: dict = {"stage": s.zero_stage, "contiguous_gradients": s.contiguous_gradients, "overlap_comm": overlap(s),
                  "reduce_bucket_size": s.reduce_bucket_size}
    if s.zero_stage == 3:
        zero.update(stage3_prefetch_bucket_size=s.prefetch_bucket_size,
                    stage3_param_persistence_threshold=s.param_persistence_threshold,
                    stage3_max_live_parameters=s.max_live_parameters, sub_group_size=s.sub_group_size)
    if s.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": s.offload_optimizer, "pin_memory": s.pin_memory, "ratio": s.ratio}
    if s.offload_param != "none":
        zero["offload_param"] = {"device": s.offload_param, "pin_memory": s.pin_memory}
    return zero


def precision_sections(precision: str) -> dict:
    if precision.startswith("bf16"):
        return {"bf16": {"enabled": True}}
    if precision.startswith("fp16"):
        return {"fp16": {"enabled": True, "initial_scale_power": 8}}
    return {}


def config(s) -> dict:
    """The whole DeepSpeed JSON of a training engine for this scenario (what a user's file would say)."""
    out = {"train_micro_batch_size_per_gpu": s.micro_batch, "gradient_accumulation_steps": s.grad_accum,
           "gradient_clipping": 1.0,  # HF Trainer max_grad_norm default
           "zero_optimization": zero_section(s), **precision_sections(s.precision)}
    if s.grad_accum_dtype:
        out["data_types"] = {"grad_accum_dtype": s.grad_accum_dtype}
    return out


def eval_config(s, offload: bool) -> dict:
    """OpenRLHF's get_eval_ds_config for a frozen model (reference, reward): ZeRO-3 sharded like the policy
    under stage 3, else stage 0 (a full replica); offload_param only under stage 3. Its stage-3 sizes say
    "auto" as the policy's do, so both engines get the same values: the scenario's."""
    zero = {"stage": 3 if s.zero_stage == 3 else 0,
            "offload_param": {"device": "cpu" if offload else "none", "pin_memory": True}}
    if s.zero_stage == 3:
        zero.update(stage3_prefetch_bucket_size=s.prefetch_bucket_size,
                    stage3_param_persistence_threshold=s.param_persistence_threshold,
                    stage3_max_live_parameters=s.max_live_parameters)
    return {"train_micro_batch_size_per_gpu": s.micro_batch, "gradient_accumulation_steps": s.grad_accum,
            "zero_optimization": zero, "bf16": {"enabled": s.precision.startswith("bf16")},
            "gradient_clipping": 1.0, "prescale_gradients": False}


def hf_auto_buckets(hidden_size: int, stage: int) -> dict:
    """What HF Trainer / accelerate write for "auto" bucket keys (integrations/deepspeed.py): reduce bucket
    h*h; under ZeRO-3 prefetch 0.9*h*h and persistence 10*h (docs/knobs.md A.3)."""
    filled = {"reduce_bucket_size": hidden_size * hidden_size}
    if stage == 3:
        filled |= {"prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
                   "param_persistence_threshold": 10 * hidden_size}
    return filled


class DeepSpeed(Engine):
    name = "deepspeed"

    def name_for(self, s, gpus: int) -> str:
        return self.name

    def sharding(self, s) -> Sharding:
        return STAGE_SHARDING[s.zero_stage]

    def casts_module(self, s) -> bool:
        return True  # _configure_distributed_model -> _cast_module_mixed_precision (adapters included)

    def runs_autocast(self, s) -> bool:
        return False

    def fp32_grads(self, s) -> bool:
        return s.precision == "fp32"

    def optimizer_offload(self, s) -> str:
        return s.offload_optimizer

    def param_offload(self, s) -> str:
        return s.offload_param

    def pinned(self, s) -> bool:
        return s.pin_memory

    def optimizer_gpu_share(self, s, partition_sizes: list[int]) -> float:
        if s.offload_optimizer == "none":
            return 1.0
        if s.zero_stage != 3:
            return 0.0  # ratio acts under ZeRO-3 only
        return gpu_share(subgroups(partition_sizes, s.sub_group_size), s.ratio)

    def offload_traffic(self, s) -> OffloadTraffic:
        """bf16 gradients down to DeepSpeedCPUAdam, the updated bf16 weights back up; offload_param fetches the
        partition for the forward and the backward gathers."""
        opt = 2.0 if s.offload_optimizer != "none" else 0.0
        return OffloadTraffic(grad_bytes_down=opt, param_bytes_up=opt,
                              weight_fetches=2.0 if s.offload_param != "none" else 0.0)

    def cpu_optimizer(self, s) -> str:
        return "cpu_adam_params_per_second"  # DeepSpeedCPUAdam

    def master_at_load(self, s) -> bool:
        return True

    def loads_once_per_node(self, s) -> bool:
        return s.zero_stage == 3 and s.zero3_init

    def frozen_loads_once_per_node(self, s) -> bool:
        return s.zero_stage == 3

    def sharded_checkpoint(self, s) -> bool:
        return True

    def head_grads_held(self, s, nbytes: int) -> int:
        # ZeRO-2/3 reduce each gradient into the partition buffer as it lands (counted with the partition)
        return 0 if s.zero_stage >= 2 else nbytes

    def frozen_sharded(self, s) -> bool:
        return s.zero_stage == 3

    def traffic(self, s) -> Traffic:
        if s.zero_stage == 2:
            return Traffic(grads_per_micro=1.0, grads_per_step=1.0)
        if s.zero_stage == 3:
            return Traffic(weights_per_micro=2.0, grads_per_micro=1.0)
        return Traffic(grads_per_step=2.0)  # ZeRO-0 all-reduce; ZeRO-1 reduce-scatter + all-gather

    def speed_key(self, s) -> str:
        return f"zero{s.zero_stage}"

    def describe(self, s) -> str:
        text = f"DeepSpeed ZeRO-{s.zero_stage}"
        if s.offload_optimizer != "none":
            text += f", optimizer->{s.offload_optimizer} (ratio {s.ratio:g}, pin_memory {str(s.pin_memory).lower()})"
        if s.offload_param != "none":
            text += f", params->{s.offload_param}"
        return text

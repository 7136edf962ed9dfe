"""DeepSpeed ZeRO 0-3 (with CPU offload and ratio) as `memfit measure` runs it: the engine of the scenario's
DeepSpeed JSON (memfit/facts/engines/deepspeed.py), and which of its objects hold which memory."""
from __future__ import annotations

from pathlib import Path

import torch

from memfit.facts.scenario import Scenario

from memfit.facts.engines import deepspeed as deepspeed_facts
from memfit.measure.runner import LR, Runner, compute_dtype, tensors_of


def deepspeed_config(s: Scenario) -> dict:
    """The DeepSpeed JSON this scenario means, with the optimizer the engine builds (HF Trainer's AdamW)."""
    config = deepspeed_facts.config(s)
    if s.precision.startswith("fp16"):
        config["fp16"]["initial_scale_power"] = 8
    return config | {"optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
                     "steps_per_print": 10**9, "zero_allow_untested_optimizer": True}


class DeepSpeedRunner(Runner):
    def build(self):
        import deepspeed

        s = self.s
        self.config = deepspeed_config(s)
        offload = "host" if s.offload_optimizer != "none" else "device"
        self.tk.rules[:0] = [
            # fp32 grad scratch of the largest sub-group, made on the optimizer's device at init (freed at
            # the end of init without offload; with offload each sub-group then gets its own buffer)
            ("stage3.py:initialize_optimizer_states", "gradients", offload),
            ("stage_1_and_2.py:initialize_optimizer_states", "gradients", offload),
        ]
        if s.zero_stage == 3 and s.offload_optimizer != "none" and s.ratio == 1.0:
            # the fp32 master of each sub-group is converted on its own device and cloned (_create_fp32_partitions):
            # with every sub-group offloaded, that transient is a host copy (under ratio some stay on the GPU)
            self.tk.rules.insert(0, ("stage3.py:_create_fp32_partitions", "optimizer_states", "host"))
        init_context = None
        if s.zero_stage == 3 and s.zero3_init:
            init_context = deepspeed.zero.Init(config_dict_or_path=self.config, dtype=compute_dtype(s))
        # zero.Init takes offload_param's device as its remote_device: each partition is made there, pinned
        # (partition_parameters.py _partition_param), and only the module being built is ever whole on the device
        on_device = init_context is not None and s.offload_param == "none"
        model = self._build(init_context, side="device" if on_device else "host")
        self.model = model
        if s.zero_stage == 3:
            self.notes += set_moe_leaf_modules(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=params,
                                                                 config=self.config)
        if self.device == "cpu":
            self._emulate_accelerator_subgroups(self.engine.optimizer)

    def _emulate_accelerator_subgroups(self, opt):
        """Under `ratio` a CUDA run steps the sub-groups kept on the GPU with a backup torch AdamW whose state
        stage3.py::_rigid_state_dict never saves. On a CPU accelerator subgroup_to_device names them 'cpu'
        (the accelerator's name), so CPUAdam would step and save them: relabel them and drop CPUAdam's state
        for them, and the run takes the CUDA path (stage3.py::_optimizer_step)."""
        if getattr(opt, "backup_optimizer", None) is None:
            return
        for i, t in enumerate(opt.fp32_partitioned_groups_flat):
            if self._zero3_subgroup_side(opt, i) == "device":
                opt.subgroup_to_device[i] = "emulated-accelerator"
                opt.optimizer.state.pop(t, None)

    def engine_forward(self, batch):
        return self.engine(**batch)

    def backward(self, loss):
        self.begin_backward()
        self.engine.backward(loss)
        self.tk.context = None

    def step(self, boundary: bool):
        self.engine.step()

    def check_trained(self):
        """A run whose every step overflowed never built the optimizer's states (torch Adam makes m and v at
        its first step): its peak would be short by them, so it is not a measurement of this scenario."""
        if self.engine.global_steps and self.engine.skipped_steps >= self.engine.global_steps:
            raise RuntimeError(f"DeepSpeed skipped all {self.engine.global_steps} steps (loss or gradients not "
                               "finite): the optimizer never stepped, so the measured peak lacks its states")

    def save(self, path: Path):
        self.engine.save_checkpoint(str(path), tag="memfit")

    def load(self, path: Path):
        self.engine.load_checkpoint(str(path), tag="memfit")

    def close(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.destroy()
            # ZeRO-3 pushes the top module on parameter_offload.FWD_MODULE_STACK at setup and destroy()
            # never pops it: without this, every engine built in a process stays alive (DeepSpeed 0.19.8).
            from deepspeed.runtime.zero import parameter_offload

            parameter_offload.FWD_MODULE_STACK[:] = [m for m in parameter_offload.FWD_MODULE_STACK
                                                     if m is not engine.module]
            clear_zero3_release_cache()
        self.engine = None
        super().close()

    # ------------------------------------------------------------ naming DeepSpeed's memory
    def walk(self):
        opt = self.engine.optimizer
        kind = type(opt).__name__
        if kind == "DeepSpeedZeroOptimizer_Stage3":
            self._walk_zero3(opt)
        elif kind == "DeepSpeedZeroOptimizer":
            self._walk_zero12(opt)
        elif kind in ("FP16_Optimizer", "BF16_Optimizer"):
            self._walk_fp16(opt)
        else:  # fp32 stage 0: the torch/DeepSpeed optimizer directly
            self.claim_params(self.engine.module)
            self.claim_grads(self.engine.module)
            self.claim_state(opt, name="optimizer.state")

    def _walk_zero12(self, opt):
        tk = self.tk
        host = "host" if opt.cpu_offload else "device"
        self.claim_params(self.engine.module)  # frozen params live unflattened in the module
        self.claim_grads(self.engine.module)
        for t in opt.bit16_groups_flat:
            tk.claim(t, "weights", "device", "zero.bit16_groups_flat")
        for t in opt.single_partition_of_fp32_groups:
            tk.claim(t, "optimizer_states", host, "zero.single_partition_of_fp32_groups")
            tk.claim(t.grad, "gradients", host, "zero.fp32_partition.grad")
        self.claim_state(opt.optimizer, side_of=lambda p: host, name="zero.optimizer.state")
        for t in getattr(opt, "param_buffer_of_bit16_for_cpu_offload_groups", []):
            tk.claim(t, "engine_buffers", "host", "zero.param_buffer_of_bit16_for_cpu_offload")
        if opt.cpu_offload:
            tk.claim(opt.temp_grad_buffer_for_cpu_offload, "engine_buffers", "host", "zero.temp_grad_buffer_for_cpu_offload")
            tk.claim(opt.temp_grad_buffer_for_gpu_offload, "engine_buffers", "device", "zero.temp_grad_buffer_for_gpu_offload")
            for t in opt.accumulated_grads_in_cpu.values():
                tk.claim(t, "gradients", "host", "zero.accumulated_grads_in_cpu")
        for group in (opt.averaged_gradients or {}).values():
            for t in tensors_of(group):
                tk.claim(t, "gradients", "device", "zero.averaged_gradients")
        for group in (opt.all_grad_tensors or {}).values():
            for t in tensors_of(group):
                tk.claim(t, "gradients", "device", "zero.all_grad_tensors")
        if getattr(opt, "grads_in_partition", None) is not None:
            tk.claim(opt.grads_in_partition, "gradients", "device", "zero.grads_in_partition")
        for bucket in opt.ipg_buckets.values():
            for t in bucket.buffer:
                tk.claim(t, "engine_buffers", "device", "zero.ipg_bucket")

    def _zero3_subgroup_side(self, opt, i: int) -> str:
        if not opt.offload_optimizer:
            return "device"
        groups = len(opt.fp16_partitioned_groups_flat)
        return "host" if i >= int((1 - opt.partial_offload) * groups) else "device"  # stage3._create_fp32_partitions

    def _walk_zero3(self, opt):
        tk = self.tk
        param_side = "host" if getattr(opt, "offload_param", False) else "device"
        module = self.engine.module
        for p in module.parameters():
            if p.data.numel() > 0:  # gathered (in use / prefetched / retained) or persistent
                name = "zero3.persistent_params" if getattr(p, "ds_persist", False) else "zero3.gathered_params"
                tk.claim(p.data, "weights", "device", name)
            if getattr(p, "ds_tensor", None) is not None:
                tk.claim(p.ds_tensor, "weights", param_side, "zero3.param_partitions")
        for b in module.buffers():
            tk.claim(b, "weights", "device", "module.buffers")
        for t in opt.fp16_partitioned_groups_flat:
            tk.claim(t, "weights", param_side, "zero3.fp16_partitioned_groups_flat")
        for i, t in enumerate(opt.fp32_partitioned_groups_flat):
            side = self._zero3_subgroup_side(opt, i)
            tk.claim(t, "optimizer_states", side, "zero3.fp32_partitioned_groups_flat")
            tk.claim(t.grad, "gradients", side, "zero3.fp32_partition.grad")
            for opt_ in (opt.optimizer, getattr(opt, "backup_optimizer", None)):
                if opt_ is not None and t in opt_.state:
                    for k, v in opt_.state[t].items():
                        if isinstance(v, torch.Tensor):
                            tk.claim(v, "optimizer_states", side, f"zero3.optimizer.state.{k}")
        grad_side = "host" if opt.offload_optimizer else "device"
        tk.claim(opt.grad_partitions_flat_buffer, "gradients", grad_side, "zero3.grad_partitions_flat_buffer")
        for bucket in opt.ipg_buckets.values():
            tk.claim(bucket.buffer, "engine_buffers", "device", "zero3.ipg_bucket")
        for group in (opt.averaged_gradients or {}).values():
            for t in tensors_of(group):
                tk.claim(t, "gradients", grad_side, "zero3.averaged_gradients")
        for p in module.parameters():
            if p.grad is not None:
                tk.claim(p.grad, "gradients", "device", "param.grad")

    def _walk_fp16(self, opt):
        tk = self.tk
        self.claim_params(self.engine.module)
        self.claim_grads(self.engine.module)
        for name in ("fp16_groups_flat", "bf16_groups_flat"):
            for t in getattr(opt, name, []) or []:
                tk.claim(t, "weights", "device", f"{type(opt).__name__}.{name}")
        for name in ("fp32_groups_flat", "fp32_groups_flat_partition"):
            for t in getattr(opt, name, []) or []:
                tk.claim(t, "optimizer_states", "device", f"{type(opt).__name__}.{name}")
                tk.claim(getattr(t, "grad", None), "gradients", "device", f"{type(opt).__name__}.{name}.grad")
        for t in getattr(opt, "fp32_groups_gradients_flat", []) or []:
            tk.claim(t, "gradients", "device", "BF16_Optimizer.fp32_groups_gradients_flat")
        self.claim_state(opt.optimizer, name=f"{type(opt).__name__}.optimizer.state")


# LLaMA-Factory model_utils/moe.py::add_z3_leaf_module: under ZeRO-3 the sparse MoE block is a leaf module
# (deepspeed.utils.set_z3_leaf_modules), fetched and released as one unit with all its experts.
Z3_LEAF_MOE_BLOCKS = {
    "mixtral": "MixtralSparseMoeBlock",
    "qwen2_moe": "Qwen2MoeSparseMoeBlock",
    "qwen3_moe": "Qwen3MoeSparseMoeBlock",
    "deepseek_v3": "DeepseekV3MoE",
    "olmoe": "OlmoeSparseMoeBlock",
}


def set_moe_leaf_modules(model) -> list[str]:
    """Mark the model's sparse MoE blocks as ZeRO-3 leaf modules, as LLaMA-Factory does (before
    deepspeed.initialize). Returns a note, or nothing for a dense model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    block = Z3_LEAF_MOE_BLOCKS.get(getattr(base.config, "model_type", ""))
    if block is None:
        return []
    classes = {type(m) for m in base.modules() if type(m).__name__ == block}
    if not classes:
        return []
    from deepspeed.utils import set_z3_leaf_modules

    set_z3_leaf_modules(base, list(classes))
    return [f"ZeRO-3 leaf modules: {block} (as LLaMA-Factory's add_z3_leaf_module)"]


def clear_zero3_release_cache() -> None:
    """PartitionedParameterCoordinator.__params_to_release is a class-level functools.lru_cache keyed by
    (coordinator, module, step): it keeps every ZeRO-3 coordinator, and through it the model and its
    partitions, alive after engine.destroy() (DeepSpeed 0.19.8)."""
    from deepspeed.runtime.zero.partitioned_param_coordinator import (
        PartitionedParameterCoordinator,
    )

    fn = PartitionedParameterCoordinator.__dict__.get("_PartitionedParameterCoordinator__params_to_release")
    while fn is not None:
        if hasattr(fn, "cache_clear"):
            fn.cache_clear()
            return
        inner = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ()) if callable(c.cell_contents)]
        fn = getattr(fn, "__wrapped__", None) or (inner[0] if inner else None)

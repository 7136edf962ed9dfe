"""Wrap a model in the scenario's engine and name the engine's own memory.

Each runner builds model + engine, runs forward/backward/step, saves and loads a checkpoint, and `walk`s
the engine's objects to claim their storages in the tracker: which are weights, gradients, optimizer
states or engine buffers, and which would sit on the GPU ("device") vs in host RAM ("host").
The device/host decision mirrors the engine's configuration (offload, ratio), never `tensor.device`:
on a CPU run every tensor is in RAM.
"""
from __future__ import annotations

import gc
import os
from pathlib import Path

import torch
import torch.distributed as dist

from memfit.errors import MemfitError
from memfit.facts.engines import deepspeed as deepspeed_facts
from memfit.measure.model import build_model, lm_head_of, upcast_trainable
from memfit.measure.tracker import MemoryTracker
from memfit.facts.scenario import Scenario

LR = 1e-5


def compute_dtype(s: Scenario) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[s.precision.split("-")[0]]


# ==================================================================== DeepSpeed
def deepspeed_config(s: Scenario) -> dict:
    """The DeepSpeed JSON this scenario means, with the optimizer the engine builds (HF Trainer's AdamW)."""
    config = deepspeed_facts.config(s)
    if s.precision.startswith("fp16"):
        config["fp16"]["initial_scale_power"] = 8
    return config | {"optimizer": {"type": "AdamW", "params": {"lr": LR, "weight_decay": 0.0}},
                     "steps_per_print": 10**9, "zero_allow_untested_optimizer": True}


class Runner:
    """One engine around one model. Subclasses fill in the engine-specific parts."""

    def __init__(self, scenario: Scenario, tracker: MemoryTracker, model_dir: str | None = None, device: str = "cpu"):
        self.s = scenario  # already adjusted to this machine (attention substituted by launch.plan)
        self.tk = tracker
        self.model_dir = model_dir
        self.device = device
        self.model = None
        self.optimizer = None
        self.autocast = None

    # model construction shared by all engines
    def _build(self, init_context=None, side="host"):
        """Build the model; while building, its tensors are host RAM (a GPU run builds on the CPU and
        then moves it) unless `init_context` (zero.Init) places them on the device directly."""
        self.tk.context = "build" if side == "host" else None
        # A real run's from_pretrained builds on the meta device and materializes each weight once; a
        # random-init build allocates every module for real first (Qwen2's lm_head before tie_weights drops
        # it: +2 B x vocab x hidden). The host load of a random-init build is the built model, so peaks
        # inside it are not recorded; the level it leaves is. (With model_dir the real loader is measured.)
        recording = self.tk.record
        self.tk.record = recording and (side != "host" or self.model_dir is not None)
        try:
            # built on the CPU like a training script does (zero.Init places partitions itself); the
            # engine (or wrap) moves it to the device
            model, self.autocast, self.notes = build_model(self.s, "cpu", init_context, self.model_dir)
        finally:
            self.tk.context = None
            self.tk.record = recording
            self.tk.set_phase(self.tk.phase)  # record the level the build leaves
        self._install_hooks(model)
        return model

    def _install_hooks(self, model) -> None:
        """Logits/loss context (LM head forward until the loss; backward until the head's input grad)
        and gradient labelling of trainable params."""
        tk = self.tk
        head = lm_head_of(model)

        def head_pre(module, args):
            tk.context = "logits"
            x = args[0] if args else None
            if isinstance(x, torch.Tensor) and x.requires_grad:
                x.register_hook(lambda g: setattr(tk, "context", None))

        head.register_forward_pre_hook(head_pre)
        model.register_forward_hook(lambda *a: setattr(tk, "context", None))
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda q: tk.soft_claim(q.grad, "gradients", "device"))

    def forward(self, batch):
        return self.engine_forward(batch).loss

    def begin_backward(self):
        self.tk.context = "logits"  # backward starts at the loss and the logits

    def claim_params(self, module, side="device", skip=()):
        for name, p in module.named_parameters():
            if id(p) in skip:
                continue
            self.tk.claim(p.data if not hasattr(p, "_local_tensor") else p, "weights", side, "module.params")
        for name, b in module.named_buffers():
            self.tk.claim(b, "weights", side, "module.buffers")

    def claim_grads(self, module, side="device", name="param.grad"):
        for p in module.parameters():
            if p.grad is not None:
                self.tk.claim(p.grad, "gradients", side, name)

    def claim_state(self, optimizer, side_of=lambda p: "device", name="optimizer.state"):
        if optimizer is None:
            return
        for p, state in optimizer.state.items():
            side = side_of(p)
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    self.tk.claim(v, "optimizer_states", side, f"{name}.{k}")

    def close(self):
        self.model = self.optimizer = None
        gc.collect()


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
        init_context = None
        if s.zero_stage == 3 and s.zero3_init:
            init_context = deepspeed.zero.Init(config_dict_or_path=self.config, dtype=compute_dtype(s))
        self.model = self._build(init_context, side="device" if init_context else "host")
        if s.zero_stage == 3:
            self.notes += set_moe_leaf_modules(self.model)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=self.model, model_parameters=params,
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
            _clear_zero3_release_cache()
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
            for t in _tensors(group):
                tk.claim(t, "gradients", "device", "zero.averaged_gradients")
        for group in (opt.all_grad_tensors or {}).values():
            for t in _tensors(group):
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
        for name, b in module.named_buffers():
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
            for t in _tensors(group):
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
    block = Z3_LEAF_MOE_BLOCKS.get(getattr(base.config, "model_type", None))
    if block is None:
        return []
    classes = {type(m) for m in base.modules() if type(m).__name__ == block}
    if not classes:
        return []
    from deepspeed.utils import set_z3_leaf_modules

    set_z3_leaf_modules(base, list(classes))
    return [f"ZeRO-3 leaf modules: {block} (as LLaMA-Factory's add_z3_leaf_module)"]


def _clear_zero3_release_cache() -> None:
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


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from _tensors(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from _tensors(x)
    elif obj is not None and hasattr(obj, "flat_partition"):  # GradPartitionBufferGroup (fp32 accumulation)
        yield obj.flat_partition


# ==================================================================== torch engines: single / DDP / FSDP2
class TorchRunner(Runner):
    """single GPU, DDP and FSDP2: a torch optimizer, autocast for mixed precision, torch.save checkpoints."""

    def build(self):
        s = self.s
        self.model = self._build()
        if self.device != "cpu" and s.engine != "fsdp":  # fully_shard moves the shards to the mesh device
            self.model.to(self.device)
        self.module = self.wrap(self.model)
        params = [p for p in self.module.parameters() if p.requires_grad]
        if s.optimizer == "sgd":
            self.optimizer = torch.optim.SGD(params, lr=LR)
        else:
            self.optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.0, fused=s.optimizer == "adamw-fused",
                                               foreach=s.optimizer == "adamw-foreach" or None)

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
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def walk(self):
        self.claim_params(self.module)
        self.claim_grads(self.module)
        self.claim_state(self.optimizer)

    def _ckpt_file(self, path: Path) -> Path:
        return path / f"rank{dist.get_rank() if dist.is_initialized() else 0}.pt"

    def save(self, path: Path):
        path.mkdir(parents=True, exist_ok=True)
        if not dist.is_initialized() or dist.get_rank() == 0 or self.s.engine == "fsdp":
            torch.save({"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}, self._ckpt_file(path))
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
        self.optimizer.load_state_dict(state["optimizer"])
        del state


class DdpRunner(TorchRunner):
    def wrap(self, model):
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[torch.cuda.current_device()] if self.device == "cuda" else None)


class FsdpRunner(TorchRunner):
    def wrap(self, model):
        from torch.distributed.fsdp import (
            CPUOffloadPolicy,
            MixedPrecisionPolicy,
            fully_shard,
        )

        s = self.s
        kwargs = {}
        if s.precision.endswith("-mixed"):
            upcast_trainable(model)
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype(s), reduce_dtype=torch.float32)
        if s.fsdp_cpu_offload:
            kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
        reshard = s.fsdp_strategy != "shard_grad_op"
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        for layer in base.model.layers:
            fully_shard(layer, reshard_after_forward=reshard, **kwargs)
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
        self.optimizer.load_state_dict(state["optimizer"])
        del state, DTensor


RUNNERS = {"deepspeed": DeepSpeedRunner, "ddp": DdpRunner, "fsdp": FsdpRunner, "single": TorchRunner}


# ==================================================================== checkpoint loading
def claim_loaded(tk: MemoryTracker, obj, path: str = "") -> None:
    """Tensors `torch.load` made (outside the dispatcher) are host RAM; name them by where they sit."""
    if isinstance(obj, torch.Tensor):
        category = "optimizer_states" if "optim" in path else "weights" if ("module" in path or "model" in path) else "engine_buffers"
        local = obj._local_tensor if hasattr(obj, "_local_tensor") else obj
        tk.claim(local, category, "host", f"checkpoint_load.{category}", learn=False)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            claim_loaded(tk, v, f"{path}/{k}")
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            claim_loaded(tk, v, path)


def _patch_fsdp(get_tracker) -> None:
    """FSDP2 frees and re-allocates unsharded parameters with `storage.resize_`, which the dispatcher
    does not see; re-read the size after each call."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    def wrap(fn):
        def resized(tensor):
            fn(tensor)
            tracker = get_tracker()
            if tracker is not None:
                tracker.refresh(tensor)
        return resized

    for module in (_fsdp_param, _fsdp_param_group):
        for name in ("alloc_storage", "free_storage"):
            if hasattr(module, name):
                setattr(module, name, wrap(getattr(_fsdp_param, name)))


def install_patches(get_tracker) -> None:
    """Once per process: mark what DeepSpeed pins, claim what its checkpoint engine loads, see FSDP2 resizes."""
    try:
        _patch_fsdp(get_tracker)
    except ImportError:
        pass
    try:
        from deepspeed.accelerator import get_accelerator
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import (
            TorchCheckpointEngine,
        )
    except ImportError:
        return
    acc = get_accelerator()
    if getattr(acc, "_memfit_patched", False):
        return
    original_pin, original_pin_empty = acc.pin_memory, acc.pin_empty_like

    def pin_memory(tensor, *args, **kwargs):
        out = original_pin(tensor, *args, **kwargs)
        tracker = get_tracker()
        if tracker is not None:
            tracker.mark_pinned(out)
        return out

    def pin_empty_like(tensor, *args, **kwargs):
        out = original_pin_empty(tensor, *args, **kwargs)
        tracker = get_tracker()
        if tracker is not None:
            tracker.mark_pinned(out)
        return out

    acc.pin_memory, acc.pin_empty_like = pin_memory, pin_empty_like
    acc._memfit_patched = True
    original_load = TorchCheckpointEngine.load

    def load(self, path, map_location=None):
        tracker = get_tracker()
        if tracker is None:
            return original_load(self, path, map_location=map_location)
        previous, tracker.context = tracker.context, "checkpoint_load"
        try:
            out = original_load(self, path, map_location=map_location)
        finally:
            tracker.context = previous
        claim_loaded(tracker, out, os.path.basename(str(path)))
        return out

    TorchCheckpointEngine.load = load

    # DeepSpeed moves the client module to the accelerator in _configure_distributed_model
    # (`self.module.to(self.device)`): from then on the module's params are device memory. On a CPU run
    # that move is a no-op, so the tracker relabels them here.
    from deepspeed.runtime.engine import DeepSpeedEngine

    original_configure = DeepSpeedEngine._configure_distributed_model

    def configure(engine, model):
        original_configure(engine, model)
        tracker = get_tracker()
        if tracker is not None:
            for p in engine.module.parameters():
                tracker.claim(p.data, "weights", "device", "module.params", learn=False)
            for b in engine.module.buffers():
                tracker.claim(b, "weights", "device", "module.buffers", learn=False)

    DeepSpeedEngine._configure_distributed_model = configure


def runner_for(scenario: Scenario, tracker: MemoryTracker, model_dir: str | None = None, device: str = "cpu") -> Runner:
    if scenario.engine not in RUNNERS:
        raise MemfitError(f"memfit measure cannot run engine {scenario.engine!r}")
    if scenario.method in ("dpo", "ipo"):  # issue 6: OpenRLHF's policy + reference engines
        from memfit.measure.dpo import DpoRunner

        return DpoRunner(scenario, tracker, model_dir, device)
    return RUNNERS[scenario.engine](scenario, tracker, model_dir, device)

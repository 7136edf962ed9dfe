"""Once per worker process: mark what DeepSpeed pins, claim what a checkpoint load reads, see FSDP2 resizes."""
from __future__ import annotations

import os

import torch

from memfit.measure.tracker import MemoryTracker


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

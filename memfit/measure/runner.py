"""What every measured engine shares: build the model, run steps, save and resume, and name the engine's
own memory.

Each runner builds model + engine, runs forward/backward/step, saves and loads a checkpoint, and `walk`s
the engine's objects to claim their storages in the tracker: which are weights, gradients, optimizer
states or engine buffers, and which would sit on the GPU ("device") vs in host RAM ("host").
The device/host decision mirrors the engine's configuration (offload, ratio), never `tensor.device`:
on a CPU run every tensor is in RAM.
"""
from __future__ import annotations

import gc
from pathlib import Path

import torch

from memfit.facts.scenario import Scenario
from memfit.measure.model import build_model, lm_head_of
from memfit.measure.tracker import MemoryTracker

LR = 1e-5


def compute_dtype(s: Scenario) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[s.precision.split("-")[0]]


class Runner:
    """One engine around one model. Subclasses fill in the engine-specific parts."""

    def __init__(self, scenario: Scenario, tracker: MemoryTracker, model_dir: str | None = None, device: str = "cpu"):
        self.s = scenario  # already adjusted to this machine (attention substituted by launch.plan)
        self.tk = tracker
        self.model_dir = model_dir
        self.device = device
        self.model: torch.nn.Module | None = None  # as _build made it (an engine or wrap may wrap it)
        self.optimizer: object | None = None  # the engine's: a torch optimizer or DeepSpeed's ZeRO wrapper of one
        self.autocast: torch.dtype | None = None

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

    # what each engine says for itself (memfit.measure.worker.run_job calls them in this order)
    def build(self) -> None:
        """Build the model and the engine around it."""
        raise NotImplementedError

    def engine_forward(self, batch):
        """The engine's own forward of a batch (an output with .loss): each subclass says it."""
        raise NotImplementedError

    def backward(self, loss) -> None:
        raise NotImplementedError

    def step(self, boundary: bool) -> None:
        """The optimizer step, at an accumulation boundary (`boundary`) or the engine's own accounting."""
        raise NotImplementedError

    def walk(self) -> None:
        """Claim the engine's objects in the tracker (weights, gradients, optimizer states, buffers)."""
        raise NotImplementedError

    def save(self, path: Path) -> None:
        raise NotImplementedError

    def load(self, path: Path) -> None:
        raise NotImplementedError

    def forward(self, batch):
        return self.engine_forward(batch).loss

    def begin_backward(self):
        self.tk.context = "logits"  # backward starts at the loss and the logits

    def claim_params(self, module, side="device", skip=()):
        for p in module.parameters():
            if id(p) in skip:
                continue
            self.tk.claim(p.data if not hasattr(p, "_local_tensor") else p, "weights", side, "module.params")
        for b in module.buffers():
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

    def check_trained(self):
        """Raise when the steps did not train (see DeepSpeedRunner.check_trained)."""

    def close(self):
        self.model = self.optimizer = None
        gc.collect()


def tensors_of(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            yield from tensors_of(x)
    elif isinstance(obj, dict):
        for x in obj.values():
            yield from tensors_of(x)
    elif obj is not None and hasattr(obj, "flat_partition"):  # GradPartitionBufferGroup (fp32 accumulation)
        yield obj.flat_partition


# ==================================================================== torch engines: single / DDP / FSDP2

"""transformers.Trainer callback built on MemoryMonitor (imports transformers: memfit.monitor loads this module
only when MemoryMonitorCallback is asked for).

Trainer does not hand the batch to callbacks, so the callback counts tokens with a forward pre-hook on the
model: the element count of input_ids of every forward between on_step_begin and on_step_end (all
micro-batches of a gradient-accumulation step). Shapes only, so no device sync.

Phases (the step's line gets "phase_peaks"), from what Trainer lets a callback see (transformers 5.x has no event
between forward and backward, so hooks on the model's top module mark them):
- forward: from the model's forward (pre-hook) to its return; the loss when the model computes it (labels given);
- backward: from the model's return to on_pre_optimizer_step: a loss computed outside the model, backward,
  gradient clipping and the gradient norm; with gradient accumulation each micro-batch's forward and backward
  count in their phases, the highest kept;
- optimizer_step: on_pre_optimizer_step to on_optimizer_step (optimizer.step() alone; the scheduler and
  zero_grad after it count only in the step's peak).
Evaluation forwards (the model in eval mode) mark nothing."""
from __future__ import annotations

from transformers import TrainerCallback

from memfit.monitor.batches import batch_tokens
from memfit.monitor.core import MemoryMonitor


class MemoryMonitorCallback(TrainerCallback):
    def __init__(self, path, rank: int | None = None, every: int = 1):
        self.monitor = MemoryMonitor(path, rank=rank, every=every)
        self._tokens: int | None = None
        self._hook = None
        self._end_hook = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.monitor.rank is None:
            self.monitor.rank = args.process_index  # Trainer's global rank, set before any process group
        if model is not None and self._hook is None:
            try:
                self._hook = model.register_forward_pre_hook(self._count, with_kwargs=True)
                self._end_hook = model.register_forward_hook(self._forward_done)
            except Exception:  # no hook, no tokens nor forward/backward phases: the memory lines still come
                self._remove_hooks()
        self.monitor.start()

    def _count(self, module, args, kwargs):
        if getattr(module, "training", False):
            self.monitor.phase("forward")  # contained: never raises
        try:
            n = batch_tokens(kwargs) if kwargs and "input_ids" in kwargs else batch_tokens(args)
            if n is not None:
                self._tokens = (self._tokens or 0) + n
        except Exception:  # counting must never break the forward it watches
            pass
        return None

    def _forward_done(self, module, args, output):
        if getattr(module, "training", False):
            self.monitor.phase("backward")
        return None

    def on_step_begin(self, args, state, control, **kwargs):
        self._tokens = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.monitor.phase("optimizer_step")

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.monitor.end_phase()

    def on_step_end(self, args, state, control, **kwargs):
        self.monitor.step(tokens=self._tokens)

    def on_train_end(self, args, state, control, **kwargs):
        self._remove_hooks()
        self.monitor.close()

    def _remove_hooks(self) -> None:
        for hook in (self._hook, self._end_hook):
            if hook is not None:
                hook.remove()
        self._hook = self._end_hook = None

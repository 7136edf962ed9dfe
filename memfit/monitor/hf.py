"""transformers.Trainer callback built on MemoryMonitor (imports transformers: memfit.monitor loads this module
only when MemoryMonitorCallback is asked for).

Trainer does not hand the batch to callbacks, so the callback counts tokens with a forward pre-hook on the
model: the element count of input_ids of every forward between on_step_begin and on_step_end (all
micro-batches of a gradient-accumulation step). Shapes only, so no device sync."""
from __future__ import annotations

from transformers import TrainerCallback

from memfit.monitor.batches import batch_tokens
from memfit.monitor.core import MemoryMonitor


class MemoryMonitorCallback(TrainerCallback):
    def __init__(self, path, rank: int | None = None, every: int = 1):
        self.monitor = MemoryMonitor(path, rank=rank, every=every)
        self._tokens = None
        self._hook = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.monitor.rank is None:
            self.monitor.rank = args.process_index  # Trainer's global rank, set before any process group
        if model is not None and self._hook is None:
            try:
                self._hook = model.register_forward_pre_hook(self._count, with_kwargs=True)
            except Exception:  # no hook, no tokens: the memory lines still come
                self._hook = None
        self.monitor.start()

    def _count(self, module, args, kwargs):
        try:
            n = batch_tokens(kwargs) if kwargs and "input_ids" in kwargs else batch_tokens(args)
            if n is not None:
                self._tokens = (self._tokens or 0) + n
        except Exception:  # counting must never break the forward it watches
            pass
        return None

    def on_step_begin(self, args, state, control, **kwargs):
        self._tokens = None

    def on_step_end(self, args, state, control, **kwargs):
        self.monitor.step(tokens=self._tokens)

    def on_train_end(self, args, state, control, **kwargs):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.monitor.close()

"""Lightning callback built on MemoryMonitor. The class subclasses Lightning's Callback, so it is made inside
lightning_callback(): importing memfit.monitor never needs Lightning.

Phases (the step's line gets "phase_peaks"), from the hooks Lightning 2.6 calls around a training batch
(loops/optimization/automatic.py, plugins/precision/precision.py):
- forward: on_train_batch_start to on_before_backward: training_step (forward and loss), and zero_grad, which
  automatic optimization runs between training_step and backward;
- backward: on_before_backward to on_after_backward (the strategy's backward alone);
- optimizer_step: on_before_optimizer_step, which Lightning calls inside optimizer.step() once the closure
  (forward, backward) has run, to the torch optimizer's step post-hook: gradient clipping (Lightning clips
  after that hook) and the update. The LR scheduler runs after it: in the step's peak only.
With gradient accumulation each micro-batch's forward and backward mark their phases (the highest kept) and the
line is written when trainer.global_step moves. Manual optimization (automatic_optimization = False) calls the
same hooks from manual_backward and opt.step(): forward runs from the batch start to the first
manual_backward, and what training_step does after a backward other than opt.step() (a second forward, say)
counts in the step's peak only. An optimizer without torch's step hooks (a strategy's own) leaves
optimizer_step running to the next mark or the line."""
from __future__ import annotations

from memfit.monitor.batches import batch_tokens
from memfit.monitor.core import MemoryMonitor


def _callback_base() -> type:
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback as StandaloneCallback  # the standalone package, before `lightning`
        except ImportError:
            raise ImportError("memfit's Lightning callback needs lightning (or pytorch_lightning) installed") from None
        return StandaloneCallback
    return Callback


def _step_post_hooks(optimizers, hook) -> list:
    """torch's Optimizer.register_step_post_hook on each optimizer that has it; the handles."""
    handles = []
    for opt in optimizers or ():
        register = getattr(opt, "register_step_post_hook", None)
        if register is not None:
            handles.append(register(hook))
    return handles


def lightning_callback(path, rank: int | None = None, every: int = 1):
    """A Lightning Callback writing one memfit.monitor/1 line per optimizer step, with its phases' peaks."""
    base = _callback_base()

    # a base known only at call time (whichever Lightning package is installed), which mypy cannot check
    class LightningMemoryMonitor(base):  # type: ignore[valid-type, misc]
        def __init__(self):
            super().__init__()
            self.monitor = MemoryMonitor(path, rank=rank, every=every)
            self._tokens = None
            self._global_step = None
            self._hooks = []

        def on_train_start(self, trainer, pl_module):
            if self.monitor.rank is None:
                self.monitor.rank = trainer.global_rank
            self.monitor.start()
            self._global_step = trainer.global_step
            try:
                self._hooks = _step_post_hooks(getattr(trainer, "optimizers", None), self._step_done)
            except Exception:  # no hook: optimizer_step then runs to the next mark; the lines still come
                self._remove_hooks()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.monitor.phase("forward")  # contained: never raises

        def on_before_backward(self, trainer, pl_module, loss):
            self.monitor.phase("backward")

        def on_after_backward(self, trainer, pl_module):
            self.monitor.end_phase()

        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            self.monitor.phase("optimizer_step")

        def _step_done(self, optimizer, args, kwargs):
            self.monitor.end_phase()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            try:
                n = batch_tokens(batch)
            except Exception:
                n = None
            if n is not None:
                self._tokens = (self._tokens or 0) + n
            if trainer.global_step != self._global_step:  # an optimizer step ended (after accumulation)
                self._global_step = trainer.global_step
                self.monitor.step(tokens=self._tokens)
                self._tokens = None
            else:
                self.monitor.end_phase()  # a micro-batch without a step: what follows is in no phase

        def on_train_end(self, trainer, pl_module):
            self._remove_hooks()
            self.monitor.close()

        def _remove_hooks(self) -> None:
            for handle in self._hooks:
                handle.remove()
            self._hooks = []

    return LightningMemoryMonitor()

"""Lightning callback built on MemoryMonitor. The class subclasses Lightning's Callback, so it is made inside
lightning_callback(): importing memfit.monitor never needs Lightning."""
from __future__ import annotations

from memfit.monitor.batches import batch_tokens
from memfit.monitor.core import MemoryMonitor


def _callback_base():
    try:
        from lightning.pytorch import Callback
    except ImportError:
        try:
            from pytorch_lightning import Callback
        except ImportError:
            raise ImportError("memfit's Lightning callback needs lightning (or pytorch_lightning) installed") from None
    return Callback


def lightning_callback(path, rank: int | None = None, every: int = 1):
    """A Lightning Callback writing one memfit.monitor/1 line per optimizer step."""
    base = _callback_base()

    class LightningMemoryMonitor(base):
        def __init__(self):
            super().__init__()
            self.monitor = MemoryMonitor(path, rank=rank, every=every)
            self._tokens = None
            self._global_step = None

        def on_train_start(self, trainer, pl_module):
            if self.monitor.rank is None:
                self.monitor.rank = trainer.global_rank
            self.monitor.start()
            self._global_step = trainer.global_step

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

        def on_train_end(self, trainer, pl_module):
            self.monitor.close()

    return LightningMemoryMonitor()

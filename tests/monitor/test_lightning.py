"""The Lightning callback on a real lightning.Trainer on the CPU: one line per optimizer step, with the peak of
each phase its hooks bracket; a temporary held inside one phase shows in that phase's peak alone."""
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[monitor])")
L = pytest.importorskip("lightning", reason="lightning is not installed (an optional extra: memfit[monitor])")
import torch.nn as nn  # noqa: E402

from memfit.monitor import lightning_callback  # noqa: E402

MiB = 2**20
TEMP = 256 * MiB  # one phase's temporary: allocated, every page written, freed
VOCAB, SEQ, BATCH = 500, 32, 4


def touch_temporary():
    scratch = torch.ones(TEMP // 4)  # float32: TEMP bytes
    del scratch


class ScratchAdamW(torch.optim.AdamW):
    """AdamW whose update also holds a temporary when asked (after the closure: in optimizer_step)."""
    scratch = False

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        if self.scratch:
            touch_temporary()
        super().step()
        return loss


class Tiny(L.LightningModule):
    """Odd optimizer steps hold the temporary in training_step (forward), even ones in the optimizer."""

    def __init__(self, manual=False):
        super().__init__()
        self.automatic_optimization = not manual
        self.net = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, VOCAB))

    def _in_forward(self):
        return self.trainer.global_step % 2 == 0  # global_step counts the steps done: 0 during the first

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        self.optimizers().optimizer.scratch = not self._in_forward()
        if self._in_forward():
            touch_temporary()
        loss = nn.functional.cross_entropy(self.net(ids).view(-1, VOCAB), ids.view(-1))
        if self.automatic_optimization:
            return loss
        opt = self.optimizers()
        self.manual_backward(loss)
        opt.step()
        opt.zero_grad()
        return None

    def configure_optimizers(self):
        return ScratchAdamW(self.parameters(), lr=1e-3)


def fit(tmp_path, steps, accumulate=1, manual=False, path="run.jsonl"):
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (steps * accumulate * BATCH, SEQ))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=BATCH)
    cb = lightning_callback(tmp_path / path)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=accumulate,
                        callbacks=[cb], logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Tiny(manual), loader)
    out = Path(tmp_path / path)
    return cb, [json.loads(x) for x in out.read_text().splitlines()] if out.exists() else None


def assert_temporary_in_its_phase_only(line, phase):
    p = line["phase_peaks"]
    assert set(p) == {"forward", "backward", "optimizer_step"}
    others = max(v for k, v in p.items() if k != phase)
    assert p[phase] - others > 0.9 * TEMP, (phase, p)


def test_a_real_trainer_with_accumulation_marks_each_phase_and_steps_once_per_update(tmp_path):
    cb, lines = fit(tmp_path, steps=4, accumulate=2)
    assert cb.monitor.errors == 0 and [x["step"] for x in lines] == [1, 2, 3, 4]
    assert all(x["tokens"] == 2 * BATCH * SEQ for x in lines)  # both micro-batches counted
    for x in lines:
        assert_temporary_in_its_phase_only(x, "forward" if x["step"] % 2 else "optimizer_step")
        # the marks reset the high-water mark: the step's peak must still be its highest phase's
        assert x["host_peak_rss_bytes"] >= max(x["phase_peaks"].values())
    assert cb._hooks == []  # the optimizer's post-hook removed at the end of training


def test_manual_optimization_marks_the_same_phases(tmp_path):
    cb, lines = fit(tmp_path, steps=2, manual=True)
    assert cb.monitor.errors == 0 and [x["step"] for x in lines] == [1, 2]
    assert_temporary_in_its_phase_only(lines[0], "forward")
    assert_temporary_in_its_phase_only(lines[1], "optimizer_step")


def test_a_monitor_that_cannot_write_leaves_the_training_alone(tmp_path, capsys):
    cb, lines = fit(tmp_path, steps=2, path="missing/run.jsonl")  # no such folder: the file cannot be opened
    assert lines is None and cb.monitor.disabled and cb.monitor.errors == 1
    assert cb._global_step == 2  # both optimizer steps ran to their end
    assert "memfit monitor: off after an error of its own" in capsys.readouterr().err

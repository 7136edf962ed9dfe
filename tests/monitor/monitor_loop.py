"""A small real training loop on the CPU, monitored: `python tests/monitor/monitor_loop.py PATH RANK STEPS SEQ LEAK`.
Run as its own process so each rank's RSS and malloc figures are its own (as on a real multi-rank run).

LEAK: none (history of loss.mean().item()), graph (per-token loss tensors kept with their autograd graph),
rows (the per-token loss rows, detached: a known BATCH * SEQ * 4 bytes per step), logits (the step's logits)."""
from __future__ import annotations

import subprocess
import sys

import torch
import torch.nn as nn

from memfit.monitor import MemoryMonitor

BATCH, VOCAB, HIDDEN = 8, 1000, 64


def train(path: str, rank: int | None, steps: int, seq: int, leak: str) -> MemoryMonitor:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, 4 * HIDDEN), nn.ReLU(),
                          nn.Linear(4 * HIDDEN, VOCAB))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    history = []
    with MemoryMonitor(path, rank=rank) as mon:
        for _ in range(steps):
            x = torch.randint(0, VOCAB, (BATCH, seq))
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.view(-1, VOCAB), x.view(-1), reduction="none")
            loss.mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            history.append({"graph": loss, "rows": loss.detach(), "logits": logits}.get(leak)
                           if leak != "none" else loss.mean().item())
            mon.step(tokens=x.numel())
    return mon


def run_loops(jobs: list[tuple]) -> None:
    """Each (path, rank, steps, seq, leak) as its own process, all at once (as ranks of one run would)."""
    procs = [subprocess.Popen([sys.executable, __file__, *map(str, job)], stderr=subprocess.PIPE, text=True)
             for job in jobs]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err


if __name__ == "__main__":
    path, rank, steps, seq, leak = sys.argv[1:6]
    train(path, int(rank), int(steps), int(seq), leak)

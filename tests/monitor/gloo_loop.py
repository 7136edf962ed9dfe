"""A 2-rank DDP run over gloo on the CPU, monitored: `python tests/monitor/gloo_loop.py PATH CASE PORT`.

CASE long: rank 1 is fed rows 4x longer than rank 0's (long samples on one rank, as the GLM-4 DPO report);
CASE leak: equal rows, rank 1 keeps each step's logits (a rank-specific leak). MemoryMonitor reads its rank and
world size from torch.distributed and writes PATH.rank{N}.jsonl."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from memfit.monitor import MemoryMonitor

BATCH, VOCAB, HIDDEN, STEPS = 8, 1000, 64, 16


def run(rank: int, path: str, case: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(
        nn.Embedding(VOCAB, HIDDEN), nn.Linear(HIDDEN, 4 * HIDDEN), nn.ReLU(), nn.Linear(4 * HIDDEN, VOCAB)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seq = 1024 if case == "long" and rank == 1 else 256
    kept = []
    with MemoryMonitor(path) as mon:
        for _ in range(STEPS):
            x = torch.randint(0, VOCAB, (BATCH, seq))
            logits = model(x)
            nn.functional.cross_entropy(logits.view(-1, VOCAB), x.view(-1)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if case == "leak" and rank == 1:
                kept.append(logits.detach())
            mon.step(tokens=x.numel())
    dist.destroy_process_group()


if __name__ == "__main__":
    path, case, port = sys.argv[1:4]
    mp.spawn(run, args=(path, case, int(port)), nprocs=2)

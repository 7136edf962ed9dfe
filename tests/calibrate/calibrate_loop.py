"""A monitored CPU run of a tiny Llama built by transformers from a config.json:
`python tests/calibrate/calibrate_loop.py MODEL_DIR PATH STEPS HELD_MIB`. Its own process, so its RSS is its own.

HELD_MIB: a host buffer the process holds for the whole run (written, so its pages are resident) - the kind of
host memory a machine or a launcher adds outside the model (a CPU copy of the weights, a data cache)."""
from __future__ import annotations

import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from memfit.monitor import MemoryMonitor

BATCH, SEQ = 2, 64


def train(model_dir: str, path: str, steps: int, held_mib: int) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)
    held = torch.full((held_mib * 2**20 // 4,), 1.0) if held_mib else None
    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=False, foreach=False)
    with MemoryMonitor(path, rank=0) as mon:
        for _ in range(steps):
            x = torch.randint(0, config.vocab_size, (BATCH, SEQ))
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mon.step(tokens=x.numel())
    del held


if __name__ == "__main__":
    model_dir, path, steps, held = sys.argv[1:5]
    train(model_dir, path, int(steps), int(held))

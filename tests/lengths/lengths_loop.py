"""One rank of a real 2-rank CPU run (gloo) over data of given token lengths, monitored:
`python tests/lengths/lengths_loop.py MODEL_DIR LENGTHS_FILE OUT_PATH MICRO_BATCH SEED MAX_LEN` with RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT in the environment. Samples cut at MAX_LEN (a tokenizer's truncation); a DataLoader over a DistributedSampler (shuffle, seed), rows padded
to the longest of each micro-batch (labels -100 there), a tiny Llama that transformers builds from a config.json
under DDP; MemoryMonitor writes each step's padded tokens and its own RSS peak (cpu_step_peaks). OUT_PATH.base
gets the process RSS before the model is built (python, torch and transformers imported)."""
from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler
from transformers import AutoConfig, AutoModelForCausalLM

from memfit.monitor import MemoryMonitor


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def collate(rows: list[torch.Tensor]) -> dict:
    longest = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), longest), dtype=torch.long)
    labels = torch.full((len(rows), longest), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)], labels[i, :len(r)], mask[i, :len(r)] = r, r, 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def main(model_dir: str, lengths_file: str, out: str, micro: int, seed: int, max_len: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lengths = [int(x) for x in open(lengths_file).read().split()]
    gen = torch.Generator().manual_seed(0)
    data = [torch.randint(1, 1000, (min(n, max_len),), generator=gen) for n in lengths]
    with open(f"{out}.base{rank}", "w") as f:
        f.write(str(rss()))
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=False, foreach=False)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=seed)
    sampler.set_epoch(0)
    loader = DataLoader(data, batch_size=micro, sampler=sampler, collate_fn=collate)
    with MemoryMonitor(out, rank=rank, cpu_step_peaks=True) as mon:
        for batch in loader:
            ddp(**batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            mon.step(tokens=batch["input_ids"].numel())
    dist.destroy_process_group()


if __name__ == "__main__":
    model_dir, lengths_file, out, micro, seed, max_len = sys.argv[1:7]
    main(model_dir, lengths_file, out, int(micro), int(seed), int(max_len))

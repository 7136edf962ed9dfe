"""Which samples each rank trains on at each step, the way the data loaders deal them out.

Two samplers:
- "distributed": torch's DistributedSampler under a DataLoader (plain DDP / DeepSpeed loops, OpenRLHF): one
  permutation of seed + epoch, padded (repeating its head) to a multiple of the world size or cut
  (drop_last), rank r takes every world-th index from r, then micro-batches of micro_batch.
- "accelerate": HF Trainer through accelerate (TRL, LLaMA-Factory): a seeded RandomSampler's permutation cut
  into micro-batches, batch i to rank i % world; without drop_last the last round is completed from the first
  batches' samples so every rank gets the same number of full batches (even_batches).
group_by_length (HF's LengthGroupedSampler) sorts megabatches of (up to) 50 x batch x grad_accum by length,
longest first, with the longest sample of all swapped to the very front: it lands in rank 0's first micro-batch
of the epoch's first step, whatever the random order (transformers trainer_pt_utils.get_length_grouped_indices).

The permutation is torch.randperm under a seeded torch.Generator, the same call the samplers make, when torch
is importable; otherwise a seeded Python shuffle stands in (a random order, not the run's)."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

MEGABATCH_MULT = 50  # transformers trainer_pt_utils.get_length_grouped_indices: min(n // (4 x batch), 50)


@dataclass(frozen=True)
class Batching:
    world: int
    micro_batch: int
    grad_accum: int = 1
    seed: int = 42
    epochs: int = 1
    drop_last: bool = False
    sampler: str = "distributed"  # or "accelerate"
    group_by_length: bool = False


@dataclass(frozen=True)
class Step:
    epoch: int
    index: int  # optimizer step, from 1, counted across epochs
    ranks: tuple[tuple[tuple[int, ...], ...], ...]  # per rank: its micro-batches of sample indices


def permutation(n: int, seed: int, exact: bool = True) -> tuple[list[int], bool]:
    """A random order of n samples, and whether it is torch's (the real loader's) order."""
    if exact:
        try:
            import torch
        except ImportError:
            pass
        else:
            g = torch.Generator()
            g.manual_seed(seed)
            return torch.randperm(n, generator=g).tolist(), True
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return order, False


def distributed_indices(order: list[int], world: int, rank: int, drop_last: bool) -> list[int]:
    """DistributedSampler's share of one rank: the list evened to a multiple of world, every world-th item."""
    n = len(order)
    per_rank = math.ceil((n - world) / world) if drop_last and n % world else math.ceil(n / world)
    total = per_rank * world
    if total <= n:
        evened = order[:total]
    else:  # repeat the head as often as needed (a dataset smaller than the world repeats whole)
        evened = (order * math.ceil(total / n))[:total]
    return evened[rank:total:world]


def chunks(items: list[int], size: int, drop_last: bool) -> list[tuple[int, ...]]:
    out = [tuple(items[i:i + size]) for i in range(0, len(items), size)]
    return out[:-1] if drop_last and out and len(out[-1]) < size else out


def accelerate_shards(order: list[int], world: int, size: int, drop_last: bool) -> list[list[tuple[int, ...]]]:
    """accelerate's BatchSamplerShard (split_batches=False, even_batches=True): batch i to rank i % world; a round
    is dealt only when its last batch is full; without drop_last the unfinished round is completed with samples
    taken in order from the first world batches (repeated when too few)."""
    batches = chunks(order, size, drop_last)
    if world == 1:  # one process: accelerate leaves the batch sampler as it is
        return [batches]
    ranks: list[list[tuple[int, ...]]] = [[] for _ in range(world)]
    done = 0
    for start in range(0, len(batches), world):
        round_ = batches[start:start + world]
        if len(round_) == world and len(round_[-1]) == size:
            for r, b in enumerate(round_):
                ranks[r].append(b)
            done = start + world
    rest = batches[done:]
    if drop_last or not rest:
        return ranks
    first = [i for b in batches[:world] for i in b]
    while len(first) < world * size:
        first += first
    cursor = 0
    for r in range(world):
        batch = list(rest[r]) if r < len(rest) else []
        need = size - len(batch)
        batch += first[cursor:cursor + need]
        cursor += need
        ranks[r].append(tuple(batch))
    return ranks


def length_grouped(order: list[int], tokens: tuple[int, ...], batch: int) -> list[int]:
    """HF's grouping of a permutation: megabatches sorted longest first, the longest one's head moved first."""
    mult = max(1, min(len(order) // (batch * 4), MEGABATCH_MULT))
    size = mult * batch
    megas = [sorted(order[i:i + size], key=lambda j: tokens[j], reverse=True) for i in range(0, len(order), size)]
    top = max(range(len(megas)), key=lambda m: (tokens[megas[m][0]], -m))  # argmax: the first of equal maxima
    megas[0][0], megas[top][0] = megas[top][0], megas[0][0]
    return [i for m in megas for i in m]


def epoch_batches(tokens: tuple[int, ...], b: Batching, epoch: int) -> tuple[list[list[tuple[int, ...]]], bool]:
    """Per rank, the epoch's micro-batches; and whether the order is torch's own."""
    # LengthGroupedSampler draws from torch's global generator (no seed of its own): its order is not reproducible
    order, exact = permutation(len(tokens), b.seed + epoch, exact=not b.group_by_length)
    if b.group_by_length:
        # Trainer._get_train_sampler groups by train_batch_size x grad_accum, train_batch_size being the per-device
        # batch under DDP (TrainingArguments.n_gpu is 1 per process); accelerate shards the batches after
        order = length_grouped(order, tokens, b.micro_batch * b.grad_accum)
    if b.sampler == "accelerate":
        return accelerate_shards(order, b.world, b.micro_batch, b.drop_last), exact
    return [chunks(distributed_indices(order, b.world, r, b.drop_last), b.micro_batch, b.drop_last)
            for r in range(b.world)], exact


def steps(tokens: tuple[int, ...], b: Batching) -> tuple[list[Step], bool]:
    """Every optimizer step of every epoch: grad_accum micro-batches per rank (the epoch's last step may have
    fewer, as HF Trainer steps at an epoch's end); and whether the order is exact."""
    out: list[Step] = []
    exact = True
    for epoch in range(b.epochs):
        per_rank, exact_epoch = epoch_batches(tokens, b, epoch)
        exact = exact and exact_epoch
        count = min(len(r) for r in per_rank)  # ranks stop together (DDP hangs otherwise)
        for start in range(0, count, b.grad_accum):
            ranks = tuple(tuple(r[start:min(start + b.grad_accum, count)]) for r in per_rank)
            out.append(Step(epoch, len(out) + 1, ranks))
    return out, exact

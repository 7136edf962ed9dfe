"""The sample order of the lengths core against the real samplers: torch's DistributedSampler under a DataLoader,
accelerate's prepared DataLoader (HF Trainer's path: a seedable RandomSampler, batches sharded across ranks), and
transformers' length grouping. Each rank's batches at each step must be the real loader's, index for index."""
import itertools

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[measure])")
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from memfit.interfaces.lengths.batches import Batching, epoch_batches, length_grouped, permutation, steps  # noqa: E402

SIZES = (3, 10, 37, 64)
WORLDS = (1, 2, 3, 4)


def _real_distributed(n, world, seed, drop_last, batch, epoch):
    out = []
    for rank in range(world):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed,
                                     drop_last=drop_last)
        sampler.set_epoch(epoch)
        loader = DataLoader(list(range(n)), batch_size=batch, sampler=sampler, drop_last=drop_last)
        out.append([tuple(b.tolist()) for b in loader])
    return out


@pytest.mark.parametrize("n,world", itertools.product(SIZES, WORLDS))
def test_distributed_sampler_order_is_the_real_one(n, world):
    for seed, drop_last, batch, epoch in itertools.product((0, 42, 1234), (False, True), (1, 3), (0, 1)):
        b = Batching(world=world, micro_batch=batch, seed=seed, drop_last=drop_last)
        ours, exact = epoch_batches((5,) * n, b, epoch)
        assert exact
        assert ours == _real_distributed(n, world, seed, drop_last, batch, epoch), (seed, drop_last, batch, epoch)


def _real_accelerate(n, world, seed, drop_last, batch, epochs):
    from accelerate.data_loader import prepare_data_loader

    out = []
    for rank in range(world):
        loader = DataLoader(list(range(n)), batch_size=batch, shuffle=True, drop_last=drop_last)
        prepared = prepare_data_loader(loader, device=torch.device("cpu"), num_processes=world, process_index=rank,
                                       put_on_device=False, use_seedable_sampler=True, data_seed=seed)
        per_epoch = []
        for epoch in range(epochs):
            prepared.set_epoch(epoch)
            per_epoch.append([tuple(b.tolist()) for b in prepared])
        out.append(per_epoch)
    return out


@pytest.mark.parametrize("n,world", itertools.product(SIZES, WORLDS))
def test_accelerate_order_is_the_real_one(n, world):
    for seed, drop_last, batch in itertools.product((0, 42), (False, True), (1, 4)):
        real = _real_accelerate(n, world, seed, drop_last, batch, epochs=2)
        b = Batching(world=world, micro_batch=batch, seed=seed, drop_last=drop_last, sampler="accelerate")
        for epoch in range(2):
            ours, _ = epoch_batches((5,) * n, b, epoch)
            assert ours == [real[r][epoch] for r in range(world)], (seed, drop_last, batch, epoch)


def test_length_grouping_is_transformers_own():
    from transformers.trainer_pt_utils import get_length_grouped_indices

    lengths = [int(x) for x in torch.randint(1, 2000, (997,), generator=torch.Generator().manual_seed(3))]
    for batch, seed in itertools.product((1, 4, 16), (0, 42)):
        real = get_length_grouped_indices(lengths, batch, generator=torch.Generator().manual_seed(seed))
        assert length_grouped(permutation(len(lengths), seed)[0], tuple(lengths), batch) == real


def test_grad_accum_groups_micro_batches_and_ranks_stop_together():
    b = Batching(world=2, micro_batch=2, grad_accum=3, seed=1)
    run, _ = steps((1,) * 25, b)
    per_rank, _ = epoch_batches((1,) * 25, b, 0)
    assert [len(s.ranks[0]) for s in run] == [3, 3, 1]  # 13 samples on a rank: 7 micro-batches
    assert [mb for s in run for mb in s.ranks[1]] == per_rank[1]

"""group_by_length: transformers' LengthGroupedSampler draws its permutation from torch's global generator, so the
order is unknowable before the run, except that get_length_grouped_indices swaps the longest sample to the very
front. Checked against the real Trainer sampler and accelerate's sharding: the grouping's batch size, the order
for a given global seed, and that the worst step is step 1 on rank 0 whatever the seed."""
import json

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[measure])")
from torch.utils.data import DataLoader  # noqa: E402

from memfit.interfaces.cli.main import main  # noqa: E402
from memfit.interfaces.lengths.batches import length_grouped, permutation  # noqa: E402

LENGTHS = [int(x) for x in torch.randint(20, 3000, (301,), generator=torch.Generator().manual_seed(7))]
BASE = ["estimate", "qwen2-7b-instruct", "--gpu", "a100-80gb", "--gpus", "2", "--micro-batch", "2", "--seq", "4096",
        "--tuning", "lora", "--ckpt", "--grad-accum", "3"]


def _trainer_sampler(tmp_path, micro, accum):
    from types import SimpleNamespace

    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=micro, use_cpu=True,
                             gradient_accumulation_steps=accum, train_sampling_strategy="group_by_length",
                             report_to=[])
    data = [{"input_ids": [0] * n} for n in LENGTHS]
    return Trainer._get_train_sampler(SimpleNamespace(args=args, train_dataset=data, processing_class=None), data)


def test_the_trainer_groups_by_micro_batch_times_accumulation_in_our_order(tmp_path):
    sampler = _trainer_sampler(tmp_path, micro=2, accum=3)
    assert sampler.batch_size == 2 * 3  # per device: no world size in it (n_gpu is 1 per DDP process)
    for seed in (0, 5, 42):
        torch.manual_seed(seed)  # the global generator the sampler draws from (Trainer's set_seed)
        assert list(sampler) == length_grouped(permutation(len(LENGTHS), seed)[0], tuple(LENGTHS), 6)


def test_the_longest_sample_is_in_rank_0s_first_batch_whatever_the_seed(tmp_path):
    from accelerate.data_loader import prepare_data_loader

    sampler = _trainer_sampler(tmp_path, micro=2, accum=3)
    for seed in range(8):
        firsts = []
        for rank in range(2):
            torch.manual_seed(seed)  # every rank seeds alike, as Trainer does
            loader = DataLoader(list(range(len(LENGTHS))), batch_size=2, sampler=sampler)
            prepared = prepare_data_loader(loader, device=torch.device("cpu"), num_processes=2, process_index=rank,
                                           put_on_device=False)
            firsts.append(next(iter(prepared)).tolist())
        assert max(LENGTHS[i] for i in firsts[0]) == max(LENGTHS)
        assert LENGTHS.index(max(LENGTHS)) in firsts[0] and LENGTHS.index(max(LENGTHS)) not in firsts[1]


def test_the_worst_step_is_reported_exact_under_grouping_padded_only(tmp_path, capsys):
    path = tmp_path / "l.txt"
    path.write_text("\n".join(map(str, LENGTHS)))
    for seed in ("1", "2"):  # another seed moves every batch but the first
        assert main([*BASE, "--lengths", str(path), "--group-by-length", "--seed", seed, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)["lengths"]
        w = doc["worst"]
        assert (w["step"], w["rank"], w["seq_len"], w["where"]) == (1, 0, max(LENGTHS), "exact")
        assert doc["order"].startswith("assumed random") and "exact" in doc["order"]
    assert main([*BASE, "--lengths", str(path), "--group-by-length", "--padding", "padding_free", "--attention",
                 "flash", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lengths"]["worst"]["where"] == "assumed"

"""The --lengths options of `memfit estimate` and what they add to its output (the JSON `lengths` section, a few
printed lines). Registered by memfit/interfaces/cli/main.py."""
from __future__ import annotations

import argparse

from memfit.errors import MemfitError

GiB = 2**30
# frameworks whose loader is HF Trainer's (accelerate shards its batches); the rest use DistributedSampler
ACCELERATE_PROFILES = ("hf-trainer", "trl", "llamafactory", "unsloth")


def add_lengths_arguments(p: argparse.ArgumentParser) -> None:
    from memfit.interfaces.cli.args import positive_int, whole_number

    g = p.add_argument_group("data lengths (per-step, per-rank peaks)")
    g.add_argument("--lengths", metavar="DATA", help="the training data's token lengths: integers, a JSON list, or "
                   "rows with length / input_ids (chosen_/rejected_ for DPO) or text / prompt+completion / messages "
                   "(counted with the model folder's tokenizer) as JSONL, Parquet, a save_to_disk folder or a "
                   "dataset name (org/name[:split]); under `plan`, plans are judged at the data's worst micro-batch")
    g.add_argument("--seed", type=whole_number, default=None, help="the sampler's seed (default 42, HF's)")
    g.add_argument("--epochs", type=positive_int, default=None, help="epochs to walk (default 1)")
    g.add_argument("--group-by-length", action="store_true", default=None,
                   help="HF's LengthGroupedSampler (megabatches sorted by length, the longest batch first)")
    g.add_argument("--drop-last", action="store_true", default=None,
                   help="drop the last incomplete batch (and DistributedSampler's uneven tail)")
    g.add_argument("--sampler", choices=("distributed", "accelerate"), default=None,
                   help="how ranks get samples: torch DistributedSampler, or accelerate's batch sharding under HF "
                        "Trainer (default: by the framework profile)")


def lengths_report(a: argparse.Namespace, s, data=None):
    """The report, or None without --lengths (its options alone are an error: they would do nothing). `data`: the
    --lengths data the caller already read (read here otherwise)."""
    if not getattr(a, "lengths", None):
        _refuse_loader_options(a)
        return None
    from memfit.interfaces.lengths.predict import predict
    from memfit.interfaces.lengths.read import read_lengths

    batching = batching_of(a, s)
    data = data or read_lengths(a.lengths, s.model)
    report = predict(s, data, batching)
    if data.tokenizer:
        report.notes.insert(0, f"raw text counted with the tokenizer of {data.tokenizer} the way TRL's SFT counts "
                               "it (special tokens included; text: EOS appended; conversations: the chat template)")
    report.notes.insert(0, f"sampler: {batching.sampler} ({'--sampler' if a.sampler else f'profile {s.profile}'}), "
                           f"micro-batch {s.micro_batch} x grad accum {s.grad_accum} on {s.world_size} ranks, "
                           f"padding {s.padding}")
    return report


def batching_of(a: argparse.Namespace, s):
    from memfit.interfaces.lengths.batches import Batching

    sampler = a.sampler or ("accelerate" if s.profile in ACCELERATE_PROFILES else "distributed")
    return Batching(world=s.world_size, micro_batch=s.micro_batch, grad_accum=s.grad_accum,
                    seed=42 if a.seed is None else a.seed, epochs=a.epochs or 1, drop_last=bool(a.drop_last),
                    sampler=sampler, group_by_length=bool(a.group_by_length))


def plan_data(a: argparse.Namespace, s, global_batch: int | None):
    """`memfit plan --lengths`: the data's deciding micro-batch shapes for the planner (None without --lengths)."""
    if not getattr(a, "lengths", None):
        _refuse_loader_options(a)
        return None
    from memfit.interfaces.lengths.plan import data_shapes
    from memfit.interfaces.lengths.read import read_lengths
    from memfit.planner.search import per_gpu_batch

    return data_shapes(s, read_lengths(a.lengths, s.model), batching_of(a, s), per_gpu_batch(s, global_batch))


def _refuse_loader_options(a: argparse.Namespace) -> None:
    """The loader options alone are an error: without --lengths they would do nothing."""
    given = [f for f, v in (("--seed", a.seed), ("--epochs", a.epochs), ("--group-by-length", a.group_by_length),
                            ("--drop-last", a.drop_last), ("--sampler", a.sampler)) if v is not None]
    if given:
        raise MemfitError(f"{', '.join(given)} describe the data loader of --lengths DATA; add --lengths")


def print_lengths(report) -> None:
    from memfit.interfaces.render.common import console

    con = console()
    doc = report.to_json()
    w, first, imb = doc["worst"], doc["first_oom"] or doc["first_tight"], doc["imbalance"]
    con.print(f"[bold]data lengths[/]: {doc['steps']} steps x {doc['ranks']} ranks, order {doc['order']}")
    con.print(f"  worst step {w['step']} on rank {w['rank']}: {w['tokens']:,} tokens (padded to {w['seq_len']}), "
              f"peak {w['peak_bytes'] / GiB:.2f} GiB of {report.capacity / GiB:.2f} GiB ({w['verdict']})")
    if first:
        con.print(f"  first {first['verdict']} step: {first['step']} on rank {first['rank']} "
                  f"({first['tokens']:,} tokens, {first['peak_bytes'] / GiB:.2f} GiB)")
    else:
        con.print("  no step goes over the card or into the error band")
    ranks = ", ".join(f"r{r['rank']} {r['max_peak_bytes'] / GiB:.2f}/{r['mean_peak_bytes'] / GiB:.2f}"
                      for r in doc["per_rank"][:8])
    con.print(f"  per rank max/mean GiB: {ranks}{' ...' if len(doc['per_rank']) > 8 else ''}")
    con.print(f"  imbalance across ranks (max/min peak): worst {imb['max_step_ratio']:.2f}x at step {imb['at_step']}, "
              f"mean {imb['mean_step_ratio']:.2f}x; tokens up to {imb['max_step_tokens_ratio']:.2f}x")
    bars = "  ".join(f"{h['peak_bytes_to'] / GiB:.2f}:{h['count']}" for h in doc["histogram"])
    con.print(f"  peaks (GiB up to : step-ranks): {bars}")
    for note in report.notes:
        con.print(f"  [dim]{note}[/]")

"""`memfit plan --lengths DATA`: the data's deciding micro-batch shapes per micro-batch size the search can try,
handed to the planner as plain data (memfit/planner/data.py). The loader's order is walked once per
(micro-batch, padding), not once per candidate: the sharding, offload and attention knobs do not change which
samples meet in a micro-batch; the micro-batch size and the padding do."""
from __future__ import annotations

from dataclasses import replace

from memfit.errors import MemfitError
from memfit.facts.methods import method_facts
from memfit.facts.scenario import Scenario
from memfit.interfaces.lengths.batches import Batching, steps
from memfit.interfaces.lengths.predict import epoch_starts, grouped_head, loader_rows, micro_shape
from memfit.interfaces.lengths.read import Lengths
from memfit.planner.data import Batch, DataShapes, frontier
from memfit.planner.space import micro_batches

PADDINGS = ("padded", "packed", "padding_free")  # the search may switch the user's padding to packing


def data_shapes(s: Scenario, data: Lengths, b: Batching, per_gpu: int) -> DataShapes:
    """Per micro-batch size (the planner's options and the user's own) and padding, the deciding shapes.
    The global batch stays: grad_accum = per_gpu // micro_batch (group_by_length's megabatch does not move)."""
    pair_rows = method_facts(s.method).get("rows_per_example", 1)
    sizes = sorted(set(micro_batches(s, per_gpu)) | {s.micro_batch})
    out = []
    for m in sizes:
        bm = replace(b, micro_batch=m, grad_accum=max(1, per_gpu // m))
        for padding in PADDINGS:
            out.append(((m, padding), _deciding(s, data, bm, padding, pair_rows)))
    return DataShapes(data.source, tuple(out))


def _deciding(s: Scenario, data: Lengths, b: Batching, padding: str, pair_rows: int) -> tuple[Batch, ...]:
    tokens = loader_rows(data.tokens, padding, s.seq_len)
    order_steps, exact = steps(tokens, b)
    if not order_steps:
        raise MemfitError(f"{data.source}: {len(tokens)} samples make no full step on {b.world} ranks of "
                          f"micro-batch {b.micro_batch} (drop_last); give more samples or leave out --drop-last")
    starts = epoch_starts(order_steps)
    best: dict[int, Batch] = {}  # per row count, the longest micro-batch's first occurrence
    for st in order_steps:
        for rank, micro in enumerate(st.ranks):
            for mb in micro:
                rows, length, count = micro_shape(padding, [tokens[i] for i in mb])
                if rows not in best or length > best[rows].seq_len:
                    certain = exact or grouped_head(b, padding, st.index, rank, starts)
                    best[rows] = Batch(rows, length, st.index, rank, pair_rows * count, certain)
    return frontier(list(best.values()))

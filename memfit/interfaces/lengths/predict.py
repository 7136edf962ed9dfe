"""The run before it runs: per step and rank, the padded length each micro-batch reaches and the estimate's
device total at it; the worst batch, the first step over the card, and how uneven the ranks are.

A micro-batch's shape by the padding knob: "padded" pads to its longest row (cut at --seq); "packed" fills
every row to --seq (the samples concatenated first); "padding_free" runs the rows' own tokens as one row.
Tokens are counted as the monitor counts them (input_ids' element count, padding included), two rows per
preference pair. Each distinct (rows, length) is estimated once; with many distinct lengths they are rounded
UP to a bucket so the prediction never falls below the run."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from memfit.facts.methods import method_facts
from memfit.facts.scenario import Scenario
from memfit.interfaces.lengths.batches import Batching, Step, permutation, steps
from memfit.interfaces.lengths.read import Lengths
from memfit.memory.phases import verdict_of

MAX_SHAPES = 256  # distinct lengths estimated before they are bucketed (an estimate takes milliseconds)
OTHER_ORDERS = 4  # without torch: this many more random orders for the spread of the worst step


@dataclass(frozen=True)
class Cell:
    """One rank at one step: its largest micro-batch's padded length and the step's tokens and peak."""
    step: int
    rank: int
    tokens: int
    seq_len: int
    peak_bytes: int
    verdict: str

    def to_json(self) -> dict:
        return {"step": self.step, "rank": self.rank, "tokens": self.tokens, "seq_len": self.seq_len,
                "peak_bytes": self.peak_bytes, "verdict": self.verdict}


@dataclass
class LengthsReport:
    cells: list[list[Cell]]  # per step, per rank
    order: str
    capacity: int
    notes: list[str] = field(default_factory=list)
    spread: dict | None = None  # without torch: the worst peak and first OOM over other random orders
    worst_exact: bool = False  # the worst cell is certainly where it says (a seeded order, or the grouping's head)

    @property
    def worst(self) -> Cell:
        return max((c for row in self.cells for c in row), key=lambda c: (c.peak_bytes, c.tokens, -c.step, -c.rank))

    def first(self, verdict: str) -> Cell | None:
        return next((c for row in self.cells for c in row if c.verdict == verdict), None)

    def per_rank(self) -> list[dict]:
        out = []
        for r in range(len(self.cells[0])):
            col = [row[r] for row in self.cells]
            out.append({"rank": r, "max_peak_bytes": max(c.peak_bytes for c in col),
                        "mean_peak_bytes": round(sum(c.peak_bytes for c in col) / len(col)),
                        "max_tokens": max(c.tokens for c in col), "tokens": sum(c.tokens for c in col)})
        return out

    def imbalance(self) -> dict:
        """max/min across ranks: per step (the worst and the mean), and of the ranks' own maxima."""
        ratios = [max(c.peak_bytes for c in row) / min(c.peak_bytes for c in row) for row in self.cells]
        tok = [max(c.tokens for c in row) / min(c.tokens for c in row) for row in self.cells]
        worst = max(range(len(ratios)), key=lambda i: (ratios[i], -i))
        maxima = [r["max_peak_bytes"] for r in self.per_rank()]
        return {"max_step_ratio": round(ratios[worst], 4), "at_step": self.cells[worst][0].step,
                "mean_step_ratio": round(sum(ratios) / len(ratios), 4),
                "max_step_tokens_ratio": round(max(tok), 4), "rank_max_ratio": round(max(maxima) / min(maxima), 4)}

    def histogram(self, bins: int = 8) -> list[dict]:
        peaks = sorted(c.peak_bytes for row in self.cells for c in row)
        lo, hi = peaks[0], peaks[-1]
        width = max(1, math.ceil((hi - lo + 1) / bins))
        counts = [0] * bins
        for p in peaks:
            counts[min(bins - 1, (p - lo) // width)] += 1
        return [{"peak_bytes_from": lo + i * width, "peak_bytes_to": min(hi, lo + (i + 1) * width - 1), "count": n}
                for i, n in enumerate(counts) if n]

    def to_json(self) -> dict:
        first, tight = self.first("oom"), self.first("tight")
        return {"steps": len(self.cells), "ranks": len(self.cells[0]), "order": self.order,
                "worst": self.worst.to_json() | {"where": "exact" if self.worst_exact else "assumed"},
                "first_oom": first.to_json() if first else None,
                "first_tight": tight.to_json() if tight else None, "per_rank": self.per_rank(),
                "imbalance": self.imbalance(), "histogram": self.histogram(), "capacity_bytes": self.capacity,
                "other_orders": self.spread, "notes": list(self.notes)}


def predict(s: Scenario, data: Lengths, b: Batching) -> LengthsReport:
    notes: list[str] = []
    pair_rows = method_facts(s.method).get("rows_per_example", 1)
    if data.pairs and pair_rows == 1:
        notes.append(f"{data.source} holds chosen/rejected pairs but --method {s.method} trains single rows: each "
                     "pair is taken as one row of the longer length")
    tokens = _samples(s, data, notes)
    order_steps, exact = steps(tokens, b)
    if not order_steps:
        from memfit.errors import MemfitError

        raise MemfitError(f"{data.source}: {len(tokens)} samples make no full step on {b.world} ranks of "
                          f"micro-batch {b.micro_batch} (drop_last); give more samples or leave out --drop-last")
    shape = _shaper(s, tokens, order_steps, notes)
    cells = _cells(s, tokens, order_steps, shape, pair_rows)
    report = LengthsReport(cells, _order_name(b, exact), s.hardware.gpu.memory_bytes, notes)
    report.worst_exact = exact or grouped_head(b, s.padding, report.worst.step, report.worst.rank,
                                                    epoch_starts(order_steps))
    if not exact and not b.group_by_length:
        report.spread = _spread(s, tokens, b, shape, pair_rows)
    return report


def _order_name(b: Batching, exact: bool) -> str:
    if exact:
        return f"exact (torch.randperm, seed {b.seed})"
    if b.group_by_length:
        return ("assumed random (group_by_length draws from torch's global generator), except that rank 0's first "
                "micro-batch of each epoch holds the longest sample (exact)")
    return "assumed random (torch is not importable)"


def epoch_starts(order_steps: list[Step]) -> set[int]:
    """The index of each epoch's first optimizer step."""
    return {st.index for k, st in enumerate(order_steps) if k == 0 or order_steps[k - 1].epoch != st.epoch}


def grouped_head(b: Batching, padding: str, step: int, rank: int, starts: set[int]) -> bool:
    """Under group_by_length, rank 0's first micro-batch of an epoch holds the longest sample whatever the random
    order (get_length_grouped_indices swaps it to the front): padded, no micro-batch is longer or has more rows,
    so a worst batch found there is exact. Packed or padding-free rows depend on the other samples: not exact."""
    return b.group_by_length and padding == "padded" and rank == 0 and step in starts


def _samples(s: Scenario, data: Lengths, notes: list[str]) -> tuple[int, ...]:
    longer = sum(t > s.seq_len for t in data.tokens)
    if longer:
        notes.append(f"{longer} of {len(data.tokens)} samples are longer than --seq {s.seq_len} and are cut to it")
    if s.padding == "packed":
        total = sum(data.tokens)
        notes.append(f"packed: {total:,} tokens make {math.ceil(total / s.seq_len)} full rows of {s.seq_len}")
    return loader_rows(data.tokens, s.padding, s.seq_len)


def loader_rows(tokens: tuple[int, ...], padding: str, seq_len: int) -> tuple[int, ...]:
    """Lengths as the loader sees them: cut at --seq; packed, the samples concatenated into full rows."""
    if padding == "packed":
        return (seq_len,) * math.ceil(sum(tokens) / seq_len)
    return tuple(min(t, seq_len) for t in tokens)


def micro_shape(padding: str, rows: list[int]) -> tuple[int, int, int]:
    """(rows, padded length, tokens) of one micro-batch of these samples' lengths."""
    if padding == "padding_free":
        return len(rows), math.ceil(sum(rows) / len(rows)), sum(rows)
    length = max(rows)
    return len(rows), length, len(rows) * length


def _shaper(s: Scenario, tokens, order_steps: list[Step], notes: list[str]):
    """Rounds a padded length up to a bucket when the run has more distinct lengths than MAX_SHAPES."""
    seen = {micro_shape(s.padding, [tokens[i] for i in mb])[1] for st in order_steps for r in st.ranks for mb in r}
    bucket = 1
    while len({min(s.seq_len, -(-x // bucket) * bucket) for x in seen}) > MAX_SHAPES:
        bucket *= 2
    if bucket > 1:
        notes.append(f"{len(seen)} distinct padded lengths: estimated at the next multiple of {bucket} (rounded up, "
                     "so a peak is never under-predicted by the bucketing)")
    return lambda length: min(s.seq_len, -(-length // bucket) * bucket)  # lengths are cut at seq_len already


def _cells(s: Scenario, tokens, order_steps: list[Step], shape, pair_rows: int) -> list[list[Cell]]:
    from memfit.roles.estimate import estimate

    cache: dict[tuple[int, int], tuple[int, str]] = {}

    def peak(rows: int, length: int) -> tuple[int, str]:
        key = (rows, shape(length))
        if key not in cache:
            e = estimate(s.with_changes(micro_batch=rows, seq_len=key[1]))
            cache[key] = (e.device_total.peak.total,
                          verdict_of(e.margin_bytes, s.hardware.gpu.memory_bytes, None, e.band_fraction))
        return cache[key]

    out = []
    for st in order_steps:
        row = []
        for r, micro in enumerate(st.ranks):
            shapes = [micro_shape(s.padding, [tokens[i] for i in mb]) for mb in micro]
            worst = max(shapes, key=lambda x: peak(x[0], x[1])[0])
            p, verdict = peak(worst[0], worst[1])
            row.append(Cell(st.index, r, pair_rows * sum(x[2] for x in shapes), worst[1], p, verdict))
        out.append(row)
    return out


def _spread(s: Scenario, tokens, b: Batching, shape, pair_rows: int) -> dict:
    """Without torch's generator: the worst peak and first OOM step over a few other random orders."""
    from dataclasses import replace

    worst, first = [], []
    for k in range(1, OTHER_ORDERS + 1):
        other = replace(b, seed=b.seed + 1000 * k)
        cells = _cells(s, tokens, steps(tokens, other)[0], shape, pair_rows)
        rep = LengthsReport(cells, "", s.hardware.gpu.memory_bytes)
        worst.append(rep.worst.peak_bytes)
        oom = rep.first("oom")
        first.append(oom.step if oom else None)
    return {"orders": OTHER_ORDERS, "worst_peak_bytes": worst, "first_oom_step": first}


__all__ = ["Batching", "LengthsReport", "predict", "permutation"]

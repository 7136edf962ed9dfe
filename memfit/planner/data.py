"""`memfit plan --lengths DATA`: plans judged by the worst micro-batch of the user's data, not by --seq.

The interface layer reads the data and walks the loader's order once per micro-batch size the search may try
(memfit/interfaces/lengths/plan.py). What comes down here is plain data: per (micro-batch, padding), the few
micro-batch shapes that could decide the peak. A step's peak is its largest micro-batch's (activations are freed
between accumulation steps), and the estimate grows with both rows and padded length, so only shapes no other
shape beats in both matter: usually one (the full batch holding the longest sample), two when a short last batch
holds a longer sample. Each candidate is estimated at those shapes only, never at every step."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Batch:
    """A micro-batch shape of the data and where it first occurs (optimizer step from 1, rank from 0)."""

    rows: int
    seq_len: int  # its padded length (the longest row; padding_free: the rows' mean, as one row)
    step: int
    rank: int
    tokens: int  # input_ids elements, padding included (two rows per preference pair)
    exact: bool  # the loader puts it there for certain (a seeded order, or the length grouping's first batch)

    def to_json(self) -> dict:
        return {"rows": self.rows, "seq_len": self.seq_len, "step": self.step, "rank": self.rank,
                "tokens": self.tokens, "where": "exact" if self.exact else "assumed"}


@dataclass(frozen=True)
class DataShapes:
    """Per (micro_batch, padding) the deciding shapes of the data; `source` names the file for messages."""

    source: str
    shapes: tuple[tuple[tuple[int, str], tuple[Batch, ...]], ...]

    def batches(self, micro_batch: int, padding: str) -> tuple[Batch, ...]:
        for key, found in self.shapes:
            if key == (micro_batch, padding):
                return found
        raise KeyError((micro_batch, padding))  # the interface covers every micro-batch the search can try


def frontier(shapes: list[Batch]) -> tuple[Batch, ...]:
    """The shapes no other beats in both rows and length (the first occurrence of each kept)."""
    best: dict[int, Batch] = {}
    for b in shapes:
        if b.rows not in best or b.seq_len > best[b.rows].seq_len:
            best[b.rows] = b
    out, longest = [], 0
    for rows in sorted(best, reverse=True):
        if best[rows].seq_len > longest:
            out.append(best[rows])
            longest = best[rows].seq_len
    return tuple(out)

"""The runtime constants of a machine: memory outside the model's tensors (CUDA context, NCCL buffers,
allocator slack, the host baseline of a process). Defaults come from data/runtime.toml, the allocator's slack per
tuning from data/allocator_reserve.toml (derived by replaying traced runs through the caching allocator: python -m
memfit.trace.allocator_reserve); a machine profile written by `memfit calibrate` replaces them with what the user's
own runs showed, and says so in `source`."""
from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache

from memfit.errors import MemfitError
from memfit.facts.data_table import data_table

RESERVE_TABLE = "allocator_reserve.toml"
# the share the estimate reads: the least reserve a run fits in (what decides a verdict); a card with room to spare
# shows more reserved ("reserve_share"), cache the allocator frees before it would fail
RESERVE_SHARE = "fit_share"
ANY_TUNING = "any"  # the table's row over every traced run: for the tunings it has no row of their own


@dataclass(frozen=True)
class Runtime:
    cuda_context: int
    nccl_one_node: int
    nccl_multi_node: int
    fragmentation_of_churn: float  # reserved - allocated as a share of a phase's churn, where no tuning has its own
    process_host_baseline: int
    slack_by_tuning: tuple[tuple[str, float], ...] = ()  # (tuning, share) derived by the replay
    source: str = "defaults (data/runtime.toml)"

    def slack_share(self, tuning: str | None = None) -> float:
        """The allocator's reserve beyond allocated, as a share of the bytes a phase churns, for a run of `tuning`."""
        return dict(self.slack_by_tuning).get(tuning or "", self.fragmentation_of_churn)

    def with_values(self, values: dict, source: str) -> "Runtime":
        """These constants with `values` replaced (each checked: bytes are whole and >= 0, the slack a share). A
        measured fragmentation_of_churn holds for every tuning: the derived per-tuning shares give way to it."""
        names = [f.name for f in fields(self) if f.name not in ("source", "slack_by_tuning")]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise MemfitError(f"{source}: unknown runtime constant {unknown[0]!r}; known: {', '.join(names)}")
        for name, value in values.items():
            share = name == "fragmentation_of_churn"
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            if not ok or (share and value > 1) or (not share and value != int(value)):
                raise MemfitError(f"{source}: {name} must be {'a share from 0 to 1' if share else 'whole bytes >= 0'}"
                                  f", got {value!r}")
        typed = {k: (float(v) if k == "fragmentation_of_churn" else int(v)) for k, v in values.items()}
        by_tuning = () if "fragmentation_of_churn" in typed else self.slack_by_tuning
        return Runtime(**{**{n: getattr(self, n) for n in names}, **typed, "slack_by_tuning": by_tuning,
                          "source": source})


def reserve_shares() -> dict[str, float]:
    """Tuning -> the replay-derived share the estimate reads (data/allocator_reserve.toml [tuning.*] RESERVE_SHARE),
    "any" included."""
    table = data_table(RESERVE_TABLE)
    rows = table.get("tuning")
    if not isinstance(rows, dict) or ANY_TUNING not in rows or not all(k in table for k in ("torch", "transformers")):
        raise MemfitError(f"data/{RESERVE_TABLE} needs torch, transformers and a [tuning.{ANY_TUNING}] row; "
                          f"re-derive it: python -m memfit.trace.allocator_reserve")
    out = {}
    for name, row in rows.items():
        share = row.get(RESERVE_SHARE) if isinstance(row, dict) else None
        if not isinstance(share, float) or not 0 <= share <= 4:
            raise MemfitError(f"data/{RESERVE_TABLE} [tuning.{name}] {RESERVE_SHARE} must be a share from 0 to 4, "
                              f"got {share!r}")
        out[name] = share
    return out


@cache
def default_runtime() -> Runtime:
    shares = reserve_shares()
    derived = tuple(sorted((k, v) for k, v in shares.items() if k != ANY_TUNING))
    return Runtime(**data_table("runtime.toml"), fragmentation_of_churn=shares[ANY_TUNING], slack_by_tuning=derived)

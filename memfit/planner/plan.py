"""`memfit plan`: the fastest configurations that fit (device and host RAM), and what each change buys.

Only values the framework of the user's profile exposes are tried (data/frameworks/NAME.toml [plan]).
Knobs a framework has no flag for but that one documented edit of its code reaches ([plan.code_edits]:
OpenRLHF's pin_memory and ratio live in get_train_ds_config) are tried too, unless Options(code_edits=False);
each such change carries its CodeEdit. Host RAM is judged over every phase, a resume from a checkpoint
included, unless Options(resume=False). Several-model methods (DPO and its relatives, RM, PPO, GRPO) also vary
where the other models live (reference / reward offload under ZeRO-3, vLLM gpu_memory_utilization and sleep,
DeepSpeed sleep); their loss and packing stay the user's.

This module never prints; memfit/interfaces/cli/plan.py presents the rows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from memfit.errors import MemfitError
from memfit.facts.scenario import Scenario
from memfit.planner.changes import Change, measure
from memfit.planner.data import Batch
from memfit.planner.knobs import StateKnobs, config_of
from memfit.planner.search import Candidate, Keep, Search, check_allow, run_search, tie_groups
from memfit.planner.space import Options, least_memory
from memfit.planner.throughput import band, tie_band


@dataclass(frozen=True)
class PlanRow:
    scenario: Scenario
    verdict: str
    device_peak_bytes: int  # device total (what nvidia-smi shows) at the peak phase, per GPU
    headroom_bytes: int  # usable GPU memory minus the device peak
    host_peak_bytes: int  # per node
    host_headroom_bytes: int | None  # None when host RAM is unknown
    tokens_per_second: float
    step_seconds: float
    changes: tuple[Change, ...]
    decided_by: Batch | None = None  # --lengths: the data's micro-batch that decides the verdict
    ties_with: tuple[int, ...] = ()  # numbers (1-based) of the other rows whose speed this one ties with

    def to_json(self) -> dict:
        data = {"decided_by": self.decided_by.to_json()} if self.decided_by else {}
        b = band()
        return {
            "verdict": self.verdict, "device_peak_bytes": self.device_peak_bytes,
            "headroom_bytes": self.headroom_bytes, "host_peak_bytes": self.host_peak_bytes,
            "host_headroom_bytes": self.host_headroom_bytes,
            "tokens_per_second": round(self.tokens_per_second, 1), "step_seconds": round(self.step_seconds, 4),
            "speed": {"tokens_per_s": round(self.tokens_per_second, 1), "step_s": round(self.step_seconds, 4),
                      "band": b.to_json()},
            "ties_with": list(self.ties_with),
            "config": config_of(self.scenario),
            "changes": [c.to_json() for c in self.changes],
        } | data


def row(c: Candidate, changes: tuple[Change, ...]) -> PlanRow:
    e = c.judged
    assert e is not None, "a row is made of an estimated candidate"
    return PlanRow(scenario=c.scenario, verdict=e.verdict, device_peak_bytes=e.device_peak,
                   headroom_bytes=e.margin, host_peak_bytes=e.host_peak, host_headroom_bytes=e.host_margin,
                   tokens_per_second=c.speed.tokens_per_second, step_seconds=c.speed.seconds, changes=changes,
                   decided_by=e.decided_by)


@dataclass(frozen=True)
class Searched:
    """The plan rows and what the search spent on them: `cut_short` when the budget of estimates ran out first."""

    rows: list[PlanRow]
    estimates: int
    budget: int
    cut_short: bool

    def to_json(self) -> dict:
        return {"estimates": self.estimates, "budget": self.budget, "cut_short": self.cut_short}


def search_plans(base: Scenario, allow: set[str] | None = None, global_batch: int | None = None,
                 top_k: int = 5, options: Options = Options(), keep: Keep = Keep()) -> Searched:
    """The `top_k` fastest configurations that fit (device and host), derived from `base`.

    `allow` may contain "lora", "qlora" (tuning changes) and "8bit" (8-bit optimizer states). The global
    batch (micro-batch x gradient accumulation x GPUs) is kept: `global_batch`, or the base's own.
    `keep` (memfit fit): axes left as the user has them, and only settings the user's file can say.
    Several-model methods (DPO, PPO, ...) place every model the way their framework does (memfit/roles/).
    """
    search, rows = run_search(base, check_allow(allow), global_batch, top_k, options, keep)
    cache: dict = {}
    ties = _ties(rows)
    found = [replace(row(c, measure(search, c, cache)), ties_with=ties[i]) for i, c in enumerate(rows)]
    return Searched(found, search.estimates, options.estimates_allowed(), search.cut_short)


def plan(base: Scenario, allow: set[str] | None = None, global_batch: int | None = None,
         top_k: int = 5, options: Options = Options(), keep: Keep = Keep()) -> list[PlanRow]:
    """search_plans' rows."""
    return search_plans(base, allow, global_batch, top_k, options, keep).rows


def _ties(rows: list[Candidate]) -> list[tuple[int, ...]]:
    """For each row, the other rows (1-based) in its tie group: speeds the model cannot tell apart."""
    order = sorted(range(len(rows)), key=lambda i: -rows[i].speed.tokens_per_second)
    groups = dict(zip(order, tie_groups([rows[i].speed.tokens_per_second for i in order])))
    return [tuple(j + 1 for j in range(len(rows)) if j != i and groups[j] == groups[i]) for i in range(len(rows))]


def baseline(base: Scenario, global_batch: int | None = None, options: Options = Options()) -> PlanRow:
    """The user's own scenario as a row (with the global batch applied), whatever its verdict."""
    search = Search(base, set(), global_batch, options)
    c = search.make(search.bk, search.ak, runnable=False)  # shown even when it cannot run (0 tokens/s)
    if c is None:
        raise MemfitError(search.refused or "the starting scenario is not valid with this global batch")
    search.estimate(c)
    return row(c, ())


def closest_miss(base: Scenario, allow: set[str] | None = None, global_batch: int | None = None,
                 options: Options = Options()) -> PlanRow | None:
    """When nothing fits: the least-memory setting of each approach, the one short by the smallest share
    of its capacity (device or host), with its changes measured like a plan row's."""
    search = Search(base, check_allow(allow), global_batch, options)
    best, best_short = None, None
    hw = base.hardware
    for k in sorted(search.states, key=role_memory_order):  # least memory first: the budget cuts the rest
        if search.late():
            break
        for loss in search.losses:
            for host in (False, True):
                act = least_memory(search.acts, loss, host)
                c = search.build(k, act) if act else None
                if c is None:
                    continue
                e = search.estimate(c)
                short = max(-e.margin / hw.gpu.memory_bytes,
                            -e.host_margin / hw.host_ram if e.host_margin is not None and hw.host_ram else 0.0)
                if best_short is None or short < best_short:
                    best, best_short = c, short
    return row(best, measure(search, best, {})) if best else None


def role_memory_order(k: StateKnobs) -> tuple:
    """Several-model knobs that need the least device memory first (offloaded, asleep, least vLLM memory)."""
    return (not k.ref_offload, not k.reward_offload, k.vllm_gpu_memory_utilization, not k.vllm_sleep,
            not k.deepspeed_sleep)


def choose_for_fit(rows: list[PlanRow], tolerance: float | None = None) -> PlanRow | None:
    """The row `memfit fit` writes back: a row the user's file can say alone (no edit of the framework's
    code) when there is one; among those that tie with the fastest (`tolerance`, default the measured tie band),
    the fewest changes, then the most memory margin (a plan the model cannot tell from the fastest, with one
    change less, is the smaller edit to the user's file)."""
    tolerance = tie_band() if tolerance is None else tolerance
    flags_only = [r for r in rows if not any(c.code_edit for c in r.changes)]
    rows = flags_only or rows
    if not rows:
        return None
    fastest = max(r.tokens_per_second for r in rows)  # rows[0] is the simplest of the first tie, not the fastest
    close = [r for r in rows if r.tokens_per_second >= fastest * (1.0 - tolerance)]
    return min(close, key=lambda r: (sum(bool(c.code_edit) for c in r.changes), len(r.changes), -r.headroom_bytes,
                                     -r.tokens_per_second))

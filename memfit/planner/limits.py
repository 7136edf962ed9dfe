"""The longest sequence and the largest micro-batch that fit, everything else fixed (`memfit plan --max-seq /
--max-batch`), on the user's GPU or on every GPU of the catalog.

"Fits" is the estimate's own verdict "fits" (memfit/roles/estimate.py: outside the error band, host RAM
included), never a threshold of our own, so a change of that rule changes these answers with it. A run whose
vLLM cannot hold one sequence's KV cache does not fit either (the planner's rule: it has no step time).
Memory grows with the sequence and the batch, so the search probes by doubling from a hint, then bisects.

This module never prints; memfit/interfaces/render/limits.py presents the rows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from memfit.errors import MemfitError
from memfit.facts.catalog import GpuSpec
from memfit.facts.methods import method_facts
from memfit.facts.scenario import Scenario
from memfit.planner.search import judge
from memfit.planner.step_time import step_time
from memfit.roles.estimate import estimate

KNOBS = ("seq_len", "micro_batch")
# beyond these the answer is no longer about memory: 16M tokens per row, 65,536 rows per GPU
SEARCH_CAP = {"seq_len": 2**24, "micro_batch": 2**16}
# why the search stopped where it did
STOPS = ("gpu_memory", "host_ram", "vllm_kv_cache", "position_limit", "search_cap", "none_fits", "refused")


@dataclass(frozen=True)
class Probe:
    """The run at one value of the searched knob."""

    value: int
    verdict: str  # the estimate's, or "refused" when the scenario is not valid at this value
    runnable: bool  # False: vLLM has no room for one sequence's KV cache
    device_peak_bytes: int = 0
    margin_bytes: int = 0
    host_peak_bytes: int = 0
    host_margin_bytes: int | None = None
    message: str = ""  # why the scenario was refused

    @property
    def fits(self) -> bool:
        return self.verdict == "fits" and self.runnable


@dataclass(frozen=True)
class Limit:
    """One GPU's answer: the largest `value` that fits (None: none does), the run at that value (at the
    smallest value when none fits), and why the search stopped."""

    gpu: GpuSpec
    knob: str
    value: int | None
    at: Probe  # the run at `value`, or at 1 when nothing fits
    stop: str  # one of STOPS
    next: Probe | None  # the run at value + 1 (None when a cap stopped the search)
    cap: int

    @property
    def cause(self) -> str:
        """What stops it, also when nothing fits (then: what the run at 1 runs out of)."""
        return _stop(self.at) if self.stop == "none_fits" else self.stop

    def to_json(self) -> dict:
        a = self.at
        return {"gpu": self.gpu.id, "gpu_name": self.gpu.name, "gpu_memory_bytes": self.gpu.memory_bytes,
                "knob": self.knob, "value": self.value, "verdict": a.verdict,
                "device_peak_bytes": a.device_peak_bytes, "margin_bytes": a.margin_bytes,
                "host_peak_bytes": a.host_peak_bytes, "host_margin_bytes": a.host_margin_bytes,
                "stop": self.stop, "cause": self.cause, "next_verdict": self.next.verdict if self.next else None,
                "cap": self.cap, "message": a.message or (self.next.message if self.next else "")}


def cap_of(s: Scenario, knob: str) -> int:
    """The largest value searched: the model's position limit for the sequence when memfit knows it."""
    positions = s.model.max_position_embeddings if knob == "seq_len" else 0
    return min(SEARCH_CAP[knob], positions) if positions else SEARCH_CAP[knob]


def probe(s: Scenario, knob: str, value: int, resume: bool = True) -> Probe:
    try:
        run = s.with_changes(**{knob: value})
        e = estimate(run)
    except MemfitError as err:  # a value the scenario's rules refuse counts as not fitting, with the reason
        return Probe(value, "refused", False, message=str(err))
    runnable = not method_facts(s.method).get("generator") or step_time(run).tokens_per_second > 0
    if resume:
        return Probe(value, e.verdict, runnable, e.device_total.peak.total, e.margin_bytes, e.host.peak.total,
                     e.host_margin_bytes)
    j = judge(e, resume=False)  # --no-resume: host RAM without the resume phase, as the plan judges it
    return Probe(value, j.verdict, runnable, j.device_peak, j.margin, j.host_peak, j.host_margin)


def largest(fits, hint: int, cap: int) -> tuple[int | None, int | None]:
    """(largest v in 1..cap with fits(v), the smallest v that does not; None when there is none), for a
    `fits` that holds up to some value and never after: double (or halve) from `hint`, then bisect."""
    lo, hi = None, None
    v = min(max(hint, 1), cap)
    if fits(v):
        lo = v
        while hi is None:
            if lo == cap:
                return cap, None
            nxt = min(lo * 2, cap)
            lo, hi = (nxt, None) if fits(nxt) else (lo, nxt)
    else:
        hi = v
        while lo is None:
            if hi == 1:
                return None, 1
            nxt = hi // 2
            lo, hi = (nxt, hi) if fits(nxt) else (None, nxt)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo, hi


def limit(s: Scenario, knob: str, hint: int | None = None, resume: bool = True) -> Limit:
    """The largest `knob` ("seq_len" or "micro_batch") that fits on `s`'s hardware, the rest of `s` fixed."""
    if knob not in KNOBS:
        raise MemfitError(f"cannot search {knob!r}; choose one of: {', '.join(KNOBS)}")
    seen: dict[int, Probe] = {}

    def fits(v: int) -> bool:
        if v not in seen:
            seen[v] = probe(s, knob, v, resume)
        return seen[v].fits

    cap = cap_of(s, knob)
    value, first_miss = largest(fits, hint or getattr(s, knob), cap)
    if value is None:
        stop = "refused" if seen[1].verdict == "refused" else "none_fits"
        return Limit(s.hardware.gpu, knob, None, seen[1], stop, None, cap)
    if first_miss is None:
        stop = "position_limit" if cap < SEARCH_CAP[knob] else "search_cap"
        return Limit(s.hardware.gpu, knob, value, seen[value], stop, None, cap)
    return Limit(s.hardware.gpu, knob, value, seen[value], _stop(seen[first_miss]), seen[first_miss], cap)


def _stop(miss: Probe) -> str:
    """Why the value after the limit does not fit."""
    if miss.verdict == "refused":
        return "refused"
    if miss.verdict == "host_oom":
        return "host_ram"
    return "gpu_memory" if miss.verdict != "fits" else "vllm_kv_cache"


def max_seq_len(s: Scenario, resume: bool = True) -> Limit:
    return limit(s, "seq_len", resume=resume)


def max_micro_batch(s: Scenario, resume: bool = True) -> Limit:
    return limit(s, "micro_batch", resume=resume)


def on_gpu(s: Scenario, gpu: GpuSpec) -> Scenario:
    """`s` on another GPU kind; the scenario's rules judge the knobs again (flash attention needs Ampere)."""
    return replace(s, hardware=replace(s.hardware, gpu=gpu))


def limits_per_gpu(s: Scenario, knob: str, gpus: tuple[GpuSpec, ...], resume: bool = True) -> list[Limit]:
    """One Limit per GPU, smallest memory first. Each search starts from the previous card's answer: a
    bigger card's limit is usually near it, so few probes are spent getting there."""
    rows, hint = [], None
    for gpu in sorted(gpus, key=lambda g: (g.memory_bytes, g.id)):
        try:
            run = on_gpu(s, gpu)
        except MemfitError as err:  # this GPU refuses the knobs (bf16 or flash attention before Ampere)
            refused = Probe(1, "refused", False, message=str(err))
            rows.append(Limit(gpu, knob, None, refused, "refused", None, cap_of(s, knob)))
            continue
        rows.append(limit(run, knob, hint, resume))
        hint = rows[-1].value or hint
    return rows

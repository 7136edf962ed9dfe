"""The device total of one scenario as the micro-batch or the sequence length changes, everything else fixed:
the numbers behind the HTML report's "device total against micro-batch / sequence length" charts.

Each point is memfit's own estimate of the scenario at that value (memfit/roles/estimate.py), and the largest
value that fits is planner/limits.py's answer, so the chart and `memfit plan --max-batch / --max-seq` agree.
The values are powers of two (a ladder the eye reads on a log axis), running a few steps past the largest that
fits so the crossing of the capacity line is on the chart. This module never prints.
"""
from __future__ import annotations

from dataclasses import dataclass

from memfit.errors import MemfitError
from memfit.facts.scenario import Scenario
from memfit.planner.limits import limit
from memfit.roles.estimate import estimate

FIRST = {"micro_batch": 1, "seq_len": 256}  # the ladder's first rung
PAST = 2  # rungs drawn beyond the larger of the largest fitting value and the scenario's own


@dataclass(frozen=True)
class SweepPoint:
    value: int
    verdict: str  # the estimate's, or "refused" when the scenario's rules refuse this value
    device_peak_bytes: int | None  # None when refused
    message: str = ""

    def to_json(self) -> dict:
        return {"value": self.value, "verdict": self.verdict, "device_peak_bytes": self.device_peak_bytes,
                "message": self.message}


@dataclass(frozen=True)
class Sweep:
    knob: str
    current: int  # the scenario's own value
    points: list[SweepPoint]
    largest_fitting: int | None  # limit()'s value; None: no value fits
    stop: str  # limit()'s reason the search stopped
    cap: int

    def to_json(self) -> dict:
        return {"knob": self.knob, "current": self.current, "points": [p.to_json() for p in self.points],
                "largest_fitting": self.largest_fitting, "stop": self.stop, "cap": self.cap}


def ladder(knob: str, current: int, largest_fitting: int | None, cap: int) -> list[int]:
    """Powers of two from the knob's first rung to PAST rungs beyond max(largest fitting, current), within cap."""
    reach = max(largest_fitting or 1, current, FIRST[knob])
    values, v, beyond = [], FIRST[knob], 0
    while v <= cap and beyond < PAST:
        values.append(v)
        beyond += v > reach
        v *= 2
    return values


def point(s: Scenario, knob: str, value: int) -> SweepPoint:
    try:
        e = estimate(s.with_changes(**{knob: value}))
    except MemfitError as err:  # the scenario's rules refuse this value: a gap in the line, with the reason
        return SweepPoint(value, "refused", None, str(err))
    return SweepPoint(value, e.verdict, e.device_total.peak.total)


def sweep(s: Scenario, knob: str) -> Sweep:
    lim = limit(s, knob)
    current = getattr(s, knob)
    values = ladder(knob, current, lim.value, lim.cap)
    return Sweep(knob, current, [point(s, knob, v) for v in values], lim.value, lim.stop, lim.cap)


def sweeps(s: Scenario) -> dict:
    """Both sweeps as the `sweep` section of the document the HTML report draws (not part of `--json`)."""
    return {knob: sweep(s, knob).to_json() for knob in ("micro_batch", "seq_len")}


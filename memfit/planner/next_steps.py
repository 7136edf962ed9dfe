"""The next step of an estimate that does not fit: the cheapest small changes of the planner's knobs that fit.

Small: one planner axis (docs/knobs.md; data/knobs.toml [axis.*]: checkpointing, micro-batch with the global batch
kept, attention, loss, padding, sharding, offload, ...), or two when no single one fits. The method and the tuning
stay the user's (no --allow: a switch to LoRA / QLoRA / 8-bit states is `memfit plan --allow`'s to offer).
Candidates are visited fastest first by the step-time model (~20 us each) and estimated (~1-6 ms each) until
`wanted` fit or `MAX_ESTIMATES` are spent, so `memfit estimate` stays well under a second.

This module never prints and never reads arguments: memfit/interfaces/cli/next_steps.py turns each change into
flags, re-reads them as the command line would and keeps those that still fit.
"""
from __future__ import annotations

from dataclasses import dataclass

from memfit.errors import MemfitError
from memfit.facts.knobs import axes
from memfit.facts.scenario import Scenario
from memfit.planner.knobs import changed
from memfit.planner.search import Candidate, Search, fits
from memfit.planner.space import Options, le

MAX_ESTIMATES = 120  # a bound on the work an estimate adds for its next steps (~0.1-0.7 s at worst)
MAX_CHANGES = 2  # single changes first; pairs only when no single change fits


@dataclass(frozen=True)
class Change:
    """A small change that fits: the scenario fields it sets (knob name -> value, the flags to add)."""

    fields: dict
    axes: tuple[str, ...]  # the planner axes it changes
    scenario: Scenario
    speed_cost: float  # share of the start's tokens/s it costs (negative: faster); 0 when the start cannot run


def cheapest_changes(base: Scenario, wanted: int = 6) -> list[Change]:
    """Up to `wanted` changes that fit, fewest axes first, then the least speed cost."""
    try:
        search = Search(base, set(), None, Options(resume=True))
    except MemfitError:  # a profile without a search space (no [plan] table): nothing to propose
        return []
    start = search.make(search.bk, search.ak, runnable=False)
    start_speed = start.speed.tokens_per_second if start else 0.0
    budget = MAX_ESTIMATES
    short: list[Candidate] = []  # estimated and not fitting: what needs as much memory as one of them is skipped
    for n in range(1, MAX_CHANGES + 1):
        found: list[Change] = []
        for c in sorted(_candidates(search, n), key=lambda c: -c.speed.tokens_per_second):
            if budget <= 0 or len(found) >= wanted:
                break
            if any(o.state == c.state and le(o.act, c.act) for o in short):
                continue  # as much memory in every activation knob as a setting already short of it
            budget -= 1
            if fits(search.estimate(c)):
                found.append(_change(search, c, start_speed))
            elif search.estimate(c).verdict in ("oom", "tight"):  # short of the card (not of host RAM)
                short.append(c)
        if found:
            return sorted(found, key=lambda ch: ch.speed_cost)
    return []


def _candidates(search: Search, n: int) -> list[Candidate]:
    """Every buildable setting that changes exactly `n` planner axes from the user's."""
    bk, ak = search.bk, search.ak
    out = []
    for k in search.states:
        ns = len(changed(bk, k))
        if ns > n:
            continue
        for a in search.acts:
            if ns + len(changed(ak, a)) != n:
                continue
            c = search.build(k, a)
            if c is not None:
                out.append(c)
    return out


def _change(search: Search, c: Candidate, start_speed: float) -> Change:
    names = tuple(changed(search.bk, c.state) + changed(search.ak, c.act))
    base, s = search.base, c.scenario
    # the knobs each changed axis sets together (data/knobs.toml [axis.*]), where the plan's scenario differs
    fields = {name: getattr(s, name) for axis in names for name in axes()[axis]
              if getattr(s, name) != getattr(base, name)}
    cost = 1.0 - c.speed.tokens_per_second / start_speed if start_speed > 0 else 0.0
    return Change(fields, names, s, cost)

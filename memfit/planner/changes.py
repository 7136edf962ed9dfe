"""Each change of a plan row, measured: its memory saving applied alone to the user's scenario (or, when it
cannot stand alone, removed from the plan), its speed cost, and whether the plan needs it to fit; a knob the
framework has no flag for carries the edit of the framework's code that sets it."""
from __future__ import annotations

from dataclasses import dataclass, replace

from memfit.facts.scenario import Scenario
from memfit.planner.knobs import Layout, changed
from memfit.planner.search import Candidate, Search, fits


@dataclass(frozen=True)
class CodeEdit:
    """A knob the framework has no flag for, reached by editing one function of its code
    (data/frameworks/NAME.toml [plan.code_edits]): assign each target inside `function` before it returns."""

    file: str
    function: str
    assignments: tuple[tuple[str, object], ...]  # (Python target inside the function, value)

    def lines(self) -> list[str]:
        return [f"{target} = {value!r}" for target, value in self.assignments]

    def __str__(self) -> str:
        return f"{self.file}::{self.function}(): " + "; ".join(self.lines())

    def to_json(self) -> dict:
        return {"file": self.file, "function": self.function, "lines": self.lines()}


def json_value(v):
    return str(v) if isinstance(v, Layout) else v


@dataclass(frozen=True)
class Change:
    """One knob changed from the user's scenario, with what it saves and what it costs."""

    knob: str  # tuning | optimizer | sharding | offload | pin_memory | ratio | offload_param | checkpointing |
    #            micro_batch | attention | loss | padding
    before: object
    after: object
    device_saving_bytes: int  # device-total peak per GPU: without the change minus with it
    host_saving_bytes: int  # host RAM peak per node: without minus with
    speed_cost_pct: float  # tokens/s this change costs the plan, in % (negative = it makes the plan faster)
    measured: str  # memory saving: "alone" = applied alone to the user's scenario; "in_plan" = removed from the plan
    needed_to_fit: bool  # the plan without this change does not fit (else it is there for speed or headroom)
    in_plan_device_saving_bytes: int = 0  # the plan without it minus the plan (changes interact)
    in_plan_host_saving_bytes: int = 0
    code_edit: CodeEdit | None = None  # the framework has no flag for it: the edit of its code that sets it

    def to_json(self) -> dict:
        return {"knob": self.knob, "before": json_value(self.before), "after": json_value(self.after),
                "device_saving_bytes": self.device_saving_bytes, "host_saving_bytes": self.host_saving_bytes,
                "speed_cost_pct": round(self.speed_cost_pct, 2), "measured": self.measured,
                "needed_to_fit": self.needed_to_fit, "in_plan_device_saving_bytes": self.in_plan_device_saving_bytes,
                "in_plan_host_saving_bytes": self.in_plan_host_saving_bytes,
                "code_edit": self.code_edit.to_json() if self.code_edit else None}


def code_edit(search: Search, name: str, s: Scenario) -> CodeEdit | None:
    """The exact edit for a knob the framework has no flag for (data/frameworks/NAME.toml [plan.code_edits])."""
    if name not in search.opts["edited"]:
        return None
    where = search.opts["code_edits"]
    edits: dict[str, list[tuple[str, object]]] = {
        "pin_memory": [("pin_memory", s.pin_memory)], "ratio": [("ratio", s.ratio), ("sub_group_size", s.sub_group_size)]}
    values = edits[name]
    return CodeEdit(where["file"], where["function"], tuple((where[key], value) for key, value in values))


def measure(search: Search, c: Candidate, cache: dict) -> tuple[Change, ...]:
    """Memory: the change applied alone to the user's scenario (when it stands alone: valid, and not a
    no-op there, like pin_memory without offload), else removed from the plan; also, always, removed from
    the plan. Speed: the plan against the plan without it (changes interact: a larger micro-batch pays
    off only once rows are packed)."""
    bk, ak = search.bk, search.ak
    base_c = search.build(bk, ak)
    out = []
    for group, mine, theirs in (("state", c.state, bk), ("act", c.act, ak)):
        for name in changed(theirs, mine):
            before, after = getattr(theirs, name), getattr(mine, name)
            if (name, after) not in cache:
                k2 = replace(bk, **{name: after}) if group == "state" else bk
                a2 = replace(ak, **{name: after}) if group == "act" else ak
                cache[(name, after)] = search.build(k2, a2)
            alone = cache[(name, after)]
            if alone is not None and (base_c is None or alone.scenario == base_c.scenario):
                alone = None
            k3 = replace(c.state, **{name: before}) if group == "state" else c.state
            a3 = replace(c.act, **{name: before}) if group == "act" else c.act
            without = search.build(k3, a3)  # the plan without this change
            in_plan = savings(search, c, without)
            memory = savings(search, alone, base_c) if alone is not None else in_plan
            faster, slower = (c, without) if without is not None else (alone, base_c)
            cost = 0.0
            if faster is not None and slower is not None:
                cost = (1.0 - faster.speed.tokens_per_second / slower.speed.tokens_per_second) * 100.0
            out.append(Change(name, before, after, memory[0], memory[1], cost,
                              "alone" if alone is not None else "in_plan",
                              without is None or not fits(search.estimate(without)), *in_plan,
                              code_edit=code_edit(search, name, c.scenario)))
    return tuple(out)


def savings(search: Search, with_c: Candidate | None, without_c: Candidate | None) -> tuple[int, int]:
    """(device, host) peak bytes that `with_c` saves against `without_c`."""
    if with_c is None or without_c is None:
        return 0, 0
    w, wo = search.estimate(with_c), search.estimate(without_c)
    return wo.device_peak - w.device_peak, wo.host_peak - w.host_peak

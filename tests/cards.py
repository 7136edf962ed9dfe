"""Card sizes for the tests that need a plan to change something, derived from memfit's own estimate and error
band instead of picked by hand: "fits" needs a margin that clears the run's band (memfit/facts/error_bands.py),
and the bands move as real runs are added and the estimate improves, so a hand-picked `--gpu-mem 3.5GiB` stops
meaning "the plan must change this" the day they do.

`card(run, change)` is the capacity where the run with `change` fits and the run as written does not: the smallest
card (on a 1/64 GiB grid) on which memfit's own verdict for the changed run is "fits", plus a little. `not_enough`
names changes that must still not fit there (a plan that stops at one of them would miss the test's point); a
capacity that cannot separate them is an AssertionError naming the estimates, so the test fails for that reason.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from memfit.facts.catalog import custom_gpu
from memfit.facts.knobs import acting_when
from memfit.facts.profiles import build_scenario
from memfit.interfaces.cli.args import blank_arguments, scenario_and_file
from memfit.interfaces.formats import knobs_from_scenario
from memfit.planner.search import judge
from memfit.roles.estimate import estimate

GiB = 2**30
STEP = GiB // 64  # the capacity grid
SLACK = GiB // 16  # above the smallest fitting card: the plan's row of the same knobs is the same estimate
LARGEST = 4096 * GiB  # no card memfit knows comes near; a change that needs more is a broken test
ENGINES = ("deepspeed", "fsdp")  # the engines with settings of their own (the knob table's `when`)


def from_file(paths, **hardware):
    """The run a file (or a launch, or several --from files) says, as `memfit fit` and `estimate --from` read it
    (hardware: gpu or gpu_mem, gpus_per_node, nodes, host_ram, as the CLI's options name them)."""
    args = argparse.Namespace(**{**blank_arguments(), "from_file": paths, **hardware})
    return scenario_and_file(args)[0]


def on_card(s, capacity: int):
    """The run on a card of `capacity` bytes, with the speed facts of the GPU it was on."""
    return replace(s, hardware=replace(s.hardware, gpu=custom_gpu(capacity, like=s.hardware.gpu)))


def changed(s, change: dict):
    """The run with `change` (knobs as a file says them) applied the way build_scenario fills the rest; a new
    engine leaves the old engine's own settings behind, as a rewritten file does."""
    given = knobs_from_scenario(s)
    if change.get("engine", s.engine) != s.engine:
        old = set(acting_when(s.engine)) if s.engine in ENGINES else set()
        given = {k: v for k, v in given.items() if k not in old}
    out = build_scenario(s.model, s.hardware, given | change, s.profile)
    return replace(out, unread=s.unread)


def verdict(s, capacity: int, resume: bool = True) -> str:
    return judge(estimate(on_card(s, capacity)), resume).verdict


def smallest_fitting(s, resume: bool = True) -> int:
    """The smallest capacity on the grid at which memfit's verdict for `s` is "fits" (it grows with the card)."""
    high = STEP
    while verdict(s, high, resume) != "fits":
        high *= 2
        assert high <= LARGEST, f"{s.model.id}: no card up to {LARGEST / GiB:.0f} GiB fits it"
    low = high // 2 if high > STEP else 0  # verdict(low) is not "fits" (or low is 0)
    while high - low > STEP:
        mid = (low + high) // 2 // STEP * STEP
        low, high = (low, mid) if verdict(s, mid, resume) == "fits" else (mid, high)
    return high


def _peak(s, capacity: int) -> str:
    e = estimate(on_card(s, capacity))
    return f"{e.device_total.peak.total / GiB:.2f} GiB ({e.verdict})"


def card(run, change: dict, not_enough: tuple[dict, ...] = (), resume: bool = True) -> int:
    """A capacity (bytes) where `run` with `change` fits and `run` as written does not, nor with any change in
    `not_enough`."""
    capacity = smallest_fitting(changed(run, change), resume) + SLACK
    for other in ({}, *not_enough):
        s = changed(run, other) if other else run
        assert verdict(s, capacity, resume) != "fits", (
            f"{run.model.id}: at {capacity / GiB:.2f} GiB, where {change} fits, {other or 'the run as written'} "
            f"fits too ({_peak(s, capacity)}): no card separates them")
    return capacity


def gpu_mem(capacity: int) -> list[str]:
    """The CLI words for a card of `capacity` bytes (parse_size takes plain bytes)."""
    return ["--gpu-mem", str(capacity)]

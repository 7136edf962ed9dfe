"""The allocator's reserve over whole runs (memfit/trace/allocator_reserve.py): the shares' arithmetic on hand-made
streams, the shipped table against a re-derived row, and the estimate reading the table's share for its tuning."""
import tomllib

import pytest

from memfit.errors import MemfitError
from memfit.trace.allocator import MiB, replay
from memfit.trace.allocator_study import least_capacity, reserve_share
from memfit.trace.step_stream import PhaseLoad


# ---------------------------------------------------------------------------------------------- the shares
def test_reserve_share_is_the_least_factor_that_reaches_the_reserve():
    phases = {"forward": PhaseLoad(80, 40), "backward": PhaseLoad(100, 20), "optimizer_step": PhaseLoad(60, 0)}
    # forward reaches 120 at (120 - 80) / 40 = 1.0, backward at (120 - 100) / 20 = 1.0: the least is 1.0
    assert reserve_share(phases, 120) == 1.0
    assert reserve_share(phases, 110) == 0.5  # backward: (110 - 100) / 20
    assert reserve_share(phases, 100) == 0.0  # the allocated peak already reaches it


def test_a_run_fits_in_less_than_it_reserves_on_a_roomy_card():
    # 30 MiB freed, then 40 MiB asked: a roomy card keeps the 30 MiB segment cached and makes another (70 MiB); a
    # 40 MiB card frees the cached segment and retries (R8)
    events = [(1, "a", 30 * MiB), (-1, "a"), (1, "b", 40 * MiB)]
    assert replay(events).peak_reserved == 70 * MiB
    assert least_capacity(events, 40 * MiB, 70 * MiB) == 40 * MiB
    # a block still live in the cached segment (split from it, R5) pins it: nothing can be released, the run needs
    # all 70 MiB
    pinned = [(1, "x", 30 * MiB), (-1, "x"), (1, "a", 20 * MiB), (1, "keep", 8 * MiB), (-1, "a"), (1, "b", 40 * MiB)]
    assert replay(pinned).peak_reserved == 70 * MiB
    assert least_capacity(pinned, 48 * MiB, 70 * MiB) == 70 * MiB


def test_a_whole_run_stream_needs_one_gpu_without_an_engine():
    from memfit.trace.allocator_study import Spec, spec_scenario
    from memfit.trace.step_stream import trace_run

    zero3 = spec_scenario(Spec("Qwen/Qwen2.5-0.5B", "sdpa", 512, layers=1))
    with pytest.raises(MemfitError, match="engine 'single'"):
        trace_run(zero3)


# ---------------------------------------------------------------------------------------------- the table
@pytest.fixture(scope="module")
def table():
    from memfit.trace.allocator_reserve import OUT

    return tomllib.loads(OUT.read_text())


def test_the_shipped_table_is_what_the_replay_derives(table):
    pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[trace])")
    from memfit.facts.versions import pinned
    from memfit.trace.allocator_reserve import CHECK_SPEC, derive_row

    row = dict(table["run"][CHECK_SPEC.key])
    assert row.pop("counted") is False
    assert row == derive_row(CHECK_SPEC)  # two layers of Qwen2.5-0.5B, traced and replayed in seconds
    # the rules are c10's of the pinned torch, the streams the pinned transformers': a bump fails until re-derived
    assert (table["torch"], table["transformers"]) == (pinned()["torch"], pinned()["transformers"])


def test_the_tuning_rows_are_the_medians_of_the_counted_runs(table):
    from memfit.trace.allocator_reserve import SPECS, summary

    counted = {k: v for k, v in table["run"].items() if v.get("counted", True)}
    assert set(counted) == {s.key for s in SPECS}
    assert table["tuning"] == summary(counted)
    for row in counted.values():  # a run never needs more than it reserves with room to spare
        assert 0 <= row["fit_share"] <= row["reserve_share"]
        assert row["peak_allocated_bytes"] <= row["least_capacity_bytes"] <= row["peak_reserved_bytes"] + 2 * MiB


# ---------------------------------------------------------------------------------------------- the estimate
def _qlora():
    from memfit.facts.catalog import find_gpu, find_model
    from memfit.facts.profiles import build_scenario
    from memfit.facts.scenario import Hardware

    knobs = {"tuning": "qlora", "micro_batch": 4, "seq_len": 4096, "attention": "flash", "checkpointing": "full",
             "padding": "packed"}
    return build_scenario(find_model("mistralai/Mistral-7B-v0.1"), Hardware(find_gpu("a100-80gb")), knobs)


def test_the_estimate_reserves_its_tunings_derived_share(table):
    from dataclasses import replace

    from memfit.roles.estimate import estimate

    from memfit.facts.runtime import RESERVE_SHARE

    s = _qlora()
    rt = s.hardware.runtime
    qlora, anything = table["tuning"]["qlora"][RESERVE_SHARE], table["tuning"]["any"][RESERVE_SHARE]
    assert rt.slack_share("qlora") == qlora and rt.slack_share("not-traced") == anything
    assert qlora != anything  # else the test below could not tell the rows apart
    without_row = replace(rt, slack_by_tuning=tuple(p for p in rt.slack_by_tuning if p[0] != "qlora"))
    other = replace(s, hardware=replace(s.hardware, runtime=without_row))

    def cache(e):
        return e.reserved.phases["backward"].total - e.allocated.phases["backward"].total

    ours, theirs = estimate(s), estimate(other)
    assert ours.allocated.phases["backward"] == theirs.allocated.phases["backward"]
    assert cache(ours) / cache(theirs) == pytest.approx(qlora / anything, rel=1e-3)


def test_a_measured_share_replaces_the_derived_ones():
    from memfit.facts.runtime import default_runtime

    rt = default_runtime().with_values({"fragmentation_of_churn": 0.2}, "calibrated")
    assert rt.slack_share("qlora") == rt.slack_share("full") == 0.2
    assert default_runtime().with_values({"cuda_context": 1}, "calibrated").slack_by_tuning  # others keep them


def test_a_table_without_its_fallback_row_is_refused(monkeypatch):
    import memfit.facts.runtime as runtime

    monkeypatch.setattr(runtime, "data_table", lambda name: {"torch": "2.13.0", "transformers": "5.24.0",
                                                             "tuning": {"lora": {"fit_share": 0.3}}})
    with pytest.raises(MemfitError, match=r"\[tuning.any\].*python -m memfit.trace.allocator_reserve"):
        runtime.reserve_shares()
    monkeypatch.setattr(runtime, "data_table", lambda name: {"torch": "2.13.0", "transformers": "5.24.0",
                                                             "tuning": {"any": {"fit_share": "high"}}})
    with pytest.raises(MemfitError, match="fit_share must be a share"):
        runtime.reserve_shares()

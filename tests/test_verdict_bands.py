"""Verdicts that carry their uncertainty: the error band of each kind of run (memfit/facts/error_bands.py, the
table bench/error_bands.py writes from the benches), the verdict rule at the band's edge, the chance of OOM, and
the planner judging with the same rule."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import tomllib
from pathlib import Path

import pytest

from memfit.facts import error_bands
from memfit.facts.error_bands import TABLE, band_for, band_of, kind_of, widest
from memfit.interfaces.cli.main import main
from memfit.memory.phases import TIGHT_FRACTION, required_margin, verdict_of
from memfit.planner.plan import plan
from memfit.roles.estimate import estimate
from shared_cases import PUBLISHED
from shared_support import shared

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30
# issue 11 item 5: LLaMA-Factory, Llama-3-8B full, ZeRO-3, fp16, 8 x RTX 3090, cutoff 1024, micro-batch 1 ran out
# of memory where memfit said "FITS: 22.49 of 23.70 GiB, margin 1.21 GiB"
LLAMA3_3090 = ["estimate", "meta-llama/Meta-Llama-3-8B", "--gpu", "rtx3090", "--gpus", "8", "--profile", "llamafactory",
               "--tuning", "full", "--zero", "3", "--precision", "fp16-mixed", "--seq", "1024", "--micro-batch", "1"]


def _bench_module():
    spec = importlib.util.spec_from_file_location("error_bands_bench", ROOT / "bench" / "error_bands.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table() -> dict:
    with open(TABLE, "rb") as f:
        return tomllib.load(f)


# --- the band of a kind of run


@pytest.mark.parametrize("knobs, kind", [
    (dict(tuning="full"), "single/full"),
    (dict(tuning="lora"), "single/adapters"),
    (dict(tuning="ia3"), "single/adapters"),
    (dict(tuning="qlora"), "single/qlora"),
    (dict(gpus=8, tuning="full", zero_stage=3), "zero3/full"),
    (dict(gpus=8, tuning="full", zero_stage=2), "zero0-2/full"),
    (dict(gpus=8, tuning="lora", engine="ddp"), "ddp/adapters"),
    (dict(gpus=8, tuning="full", fsdp_strategy="full_shard"), "fsdp/full"),
])
def test_kind_names_engine_family_and_what_trains(scenario, knobs, kind):
    gpus = knobs.pop("gpus", 1)
    assert kind_of(scenario(model="llama-3.1-8b", gpu="a100-80gb", gpus=gpus, **knobs)) == kind


def test_a_measured_kind_gets_its_row_of_the_table():
    row = _table()["band"]["zero3/full"]
    band = band_for("zero3/full")
    assert band.fraction == row["band"] == pytest.approx(row["measured"] + row["allowance"], abs=1e-4)
    assert band.measured == row["trace_p95"] + row["engine"] and band.allowance > 0 and not band.stands_in_for
    # the chance is drawn from the kind's own trace rows, the engine part added
    assert len(band.under) == _table()["trace"][row["trace"]]["rows"]


@pytest.mark.parametrize("kind", ["zero3/qlora", "ddp/adapters", "fsdp/freeze", "single/freeze", "zero3/full+vllm"])
def test_an_unmeasured_kind_falls_back_to_the_widest_band_and_says_so(kind):
    assert kind not in _table()["band"]
    band = band_for(kind)
    assert band.fraction == max(row["band"] for row in _table()["band"].values()) == widest().fraction
    assert band.stands_in_for == widest().kind and band.kind == kind
    assert f"{kind} is not measured" in band.describe(20 * GiB)


def test_the_estimate_lists_its_band_under_assumed(scenario):
    e = estimate(scenario(model="llama-3.1-8b", gpu="a100-80gb", tuning="freeze", micro_batch=1))
    peak = e.device_total.peak.total
    assert e.band_kind == "single/freeze" and e.band_fraction == band_for("single/freeze").fraction_at(peak)
    assert band_for("single/freeze").fraction == widest().fraction
    listed = [a for a in e.assumptions if a.startswith("error band")]
    assert len(listed) == 1 and "not measured" in listed[0] and f"{e.band_fraction:.1%}" in listed[0]


# --- the verdict rule


def test_fits_exactly_at_the_band_and_tight_one_byte_inside():
    capacity, band = 100 * GiB, 0.25  # a band wider than the card floor (0.25 x 80 GiB is exact)
    assert required_margin(80 * GiB, capacity, band) == 20 * GiB
    assert verdict_of(20 * GiB, capacity, None, band) == "fits"  # margin = band x estimate
    assert verdict_of(20 * GiB - 1, capacity, None, band) == "tight"  # one byte more on the card
    assert verdict_of(20 * GiB - 1, capacity, None, band - 0.01) == "fits"


def test_zero_margin_is_tight_negative_is_oom_and_host_ram_is_judged_after_the_card():
    capacity = 24 * GiB
    assert verdict_of(0, capacity, None, 0.1) == "tight"
    assert verdict_of(-1, capacity, -1, 0.1) == "oom"
    assert verdict_of(capacity // 2, capacity, -1, 0.1) == "host_oom"
    assert verdict_of(capacity // 2, capacity, 0, 0.1) == "fits"


def test_the_card_floor_holds_under_a_narrow_band():
    capacity = 80 * GiB
    margin = int(0.04 * capacity)  # clears a 1% band of the estimate, not 5% of the card
    assert verdict_of(margin, capacity, None, 0.01) == "tight"
    assert verdict_of(int(TIGHT_FRACTION * capacity) + 1, capacity, None, 0.01) == "fits"


# --- the chance of OOM


@pytest.mark.parametrize("kind", ["single/full", "zero3/full", "ddp/adapters"])
def test_oom_chance_falls_as_the_margin_grows(kind):
    band, peak = band_for(kind), 20 * GiB
    margins = [int(peak * f / 1000) for f in range(-1500, 2000, 5)]
    chances = [band.oom_chance(m, peak) for m in margins]
    assert all(a >= b for a, b in zip(chances, chances[1:]))
    assert chances[-1] == 0.0
    # the chance is drawn from real GPU runs: a margin below every real run's excess is eaten by every one
    assert band.real and band.oom_chance(int(min(band.real) * peak) - 1, peak) == 1.0
    # ... and past the largest, by none
    assert band.oom_chance(int(max(band.real) * peak) + 1, peak) == 0.0


def test_without_real_runs_the_chance_comes_from_the_cpu_benches():
    band = dataclasses.replace(band_for("single/full"), real=())
    peak = 20 * GiB
    assert band.oom_chance(int(min(band.under) * peak) - 1, peak) == 1.0
    assert 0.0 < band.oom_chance(int(0.5 * band.fraction * peak), peak) < 1.0
    # at the band's edge only the rows beyond the measured quantile (5%) can still eat the margin
    assert band.oom_chance(int(band.fraction * peak) + 1, peak) <= 0.05


# --- bands from real GPU runs


def test_a_verdict_needs_the_larger_of_the_cpu_band_and_the_real_runs_band():
    band = band_for("fsdp/qlora")
    real = _table()["real"]["fsdp/qlora"]
    assert not real["stands_in"] and real["rows"] >= 10
    for peak in (2 * GiB, 20 * GiB, 200 * GiB):
        cpu = math.ceil(band.fraction * peak)
        measured = int(real["floor_gib"] * GiB) + math.ceil(real["fraction"] * peak)
        assert band.required(peak) == max(cpu, measured)


def test_a_kind_with_few_real_runs_takes_the_widest_real_band_of_its_tuning_and_says_so():
    rows = _table()["real"]
    few = next(k for k, r in rows.items() if r["stands_in"])
    source = rows[few]["stands_in"]
    assert rows[few]["rows"] < 10 and not rows[source]["stands_in"]
    assert source.split("/")[-1] == few.split("/")[-1]  # a measured kind of the same tuning
    band = band_for(few)
    assert band.real_stands_in == source and band.real_fraction == rows[source]["fraction"]
    assert "too few" in band.describe(20 * GiB)
    # a kind no real run has measured takes its tuning's widest, or the widest of all when its tuning has none
    assert band_for("zero0-2/adapters").real_stands_in == _table()["real_widest_of"]["adapters"]
    assert band_for("zero0-2/freeze").real_stands_in == _table()["real_widest"]["kind"]


def test_the_real_band_is_set_on_one_part_and_its_coverage_reported_on_the_other():
    shared(PUBLISHED)  # the real runs are rows of the team's cases
    bench = _bench_module()
    kinds = bench.real_kinds({})
    measured = {k: e for k, e in kinds.items() if not k.startswith("widest") and not e.get("stands_in")}
    assert measured
    for kind, e in measured.items():
        fit, held = e["fit"], e["held"]
        assert fit and held and {r.group for r in fit}.isdisjoint({r.group for r in held})
        # the band covers 95% of the part it was set on (nearest rank) ...
        inside = sum(bench.covered(r, e["floor"], e["fraction"], 0.0) for r in fit)
        assert inside >= math.ceil(0.95 * len(fit))
        # ... and the table says how many of the other part fall outside
        assert _table()["real"][kind]["held_out_outside"] == sum(
            not bench.covered(r, e["floor"], e["fraction"], band_for(kind).fraction) for r in held)


def test_the_estimate_carries_band_and_chance_in_json(scenario):
    e = estimate(scenario(model="llama-3.1-8b", gpu="rtx4090", tuning="lora", micro_batch=1, seq_len=2048,
                          checkpointing="full", attention="flash"))
    doc = e.to_json()
    peak = e.device_total.peak.total
    assert doc["band_kind"] == "single/adapters" and doc["band_fraction"] == round(
        band_of(e.scenario).fraction_at(peak), 4)
    assert doc["oom_chance"] == round(band_of(e.scenario).oom_chance(e.margin_bytes, e.device_total.peak.total), 4)
    assert doc["gpu_groups"][0]["verdict"] == doc["verdict"]


# --- the table agrees with the benches


def test_the_table_agrees_with_the_stored_bench_files():
    shared(PUBLISHED)
    assert _bench_module().main(["--check"]) == 0


def test_the_check_fails_when_the_table_disagrees(tmp_path, monkeypatch):
    shared(PUBLISHED)
    bench = _bench_module()
    lines = TABLE.read_text().splitlines(keepends=True)
    first = next(i for i, x in enumerate(lines) if x.startswith("band = "))
    lines[first] = "band = 0.0001\n"  # one band edited by hand
    changed = tmp_path / "error_bands.toml"
    changed.write_text("".join(lines))
    monkeypatch.setattr(bench, "TABLE", changed)
    assert bench.main(["--check"]) == 1


def test_the_table_is_derived_from_the_bench_rows():
    """The trace part of a band is the 95th percentile of the trace bench's rows, recomputed here."""
    doc = _bench_module().trace_doc()
    full = sorted(1 / (1 + r["total_peak"]["error_pct"] / 100) - 1 for r in doc["rows"]
                  if r["status"] == "ok" and r["knobs"]["tuning"] == "full")
    p95 = full[-(-95 * len(full) // 100) - 1]
    assert _table()["band"]["single/full"]["trace_p95"] == round(max(0.0, p95), 4)


# --- what the user sees, and the planner


def test_the_llama3_8b_zero3_run_on_8_rtx3090_that_ran_out_of_memory_is_no_longer_fits(capsys):
    assert main([*LLAMA3_3090, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    peak = doc["per_rank"]["device_total"]["peak_bytes"]
    assert doc["band_kind"] == "zero3/full"
    assert 0 < doc["margin_bytes"] < doc["band_fraction"] * peak  # the margin is inside the band
    assert doc["verdict"] == "tight" and doc["oom_chance"] > 0.2
    assert main(LLAMA3_3090) == 0
    out = " ".join(capsys.readouterr().out.split())  # the terminal wraps long lines
    line = out[out.index("TIGHT:"):out.index("assumed:")]
    assert f"error band {doc['band_fraction']:.1%}" in line and f"{doc['oom_chance']:.0%} chance of OOM" in line


def test_the_planner_offers_only_runs_that_clear_their_band(scenario):
    base = scenario(model="meta-llama/Meta-Llama-3-8B", gpu="rtx3090", gpus=8, profile="llamafactory", tuning="full",
                    zero_stage=3, precision="fp16-mixed", seq_len=1024, micro_batch=1)
    rows = plan(base, set(), None, top_k=3)
    assert rows and all(r.verdict == "fits" for r in rows)
    for r in rows:
        assert r.headroom_bytes >= band_of(r.scenario).required(r.device_peak_bytes)


def test_bands_are_read_once(monkeypatch):
    """The planner judges thousands of estimates: the table is parsed once, not per estimate."""
    band_for("zero3/full")
    monkeypatch.setattr(error_bands, "TABLE", Path("/nonexistent/error_bands.toml"))
    assert band_for("zero3/full").fraction > 0

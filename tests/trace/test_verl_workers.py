"""verl's own FSDP engine (verl 0.9.1) on 2 gloo ranks vs memfit (memory/states/verl_fsdp.py): the actor's update and
the reference's log-prob pass, FSDP1 and FSDP2, each phase within 5% of verl's code run for real.

The measurements are kept in bench/verl_workers.json (with the releases they were measured on); the live re-run of
one row needs verl's venv (tests/trace/setup_verl_venv.sh) and is skipped without it. Each fact of
data/verl_fsdp.toml is checked to matter: set to what memfit would otherwise assume, some saved row leaves its
band.
"""
from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from memfit.errors import MemfitError
from memfit.memory.states import verl_fsdp

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("MEMFIT_VERL_VENV", ROOT / ".venvs" / "verl"))
TOLERANCE_PCT = 5.0  # issue 33: verl's worker memory within 5% of its own engine on 2 ranks
PHASE_TOLERANCE_PCT = 2.0  # every phase (not only the peak) and the host bytes; measured: 1.5% at most
RERUN_ROW = "actor full fsdp2"  # the row issue 33 asks for first: about 60 s on 2 CPU cores


def _bench():
    """bench/verl_workers.py by path (bench/ is no package)."""
    spec = importlib.util.spec_from_file_location("verl_workers_bench", ROOT / "bench" / "verl_workers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench()
SAVED_ROWS, SAVED_VERSIONS = BENCH.saved_rows()


def _phase_errors(row: dict) -> dict[str, float]:
    """Relative error of every measured phase, and of the host bytes where the row has any."""
    errors = {phase: 100 * (row["estimate_phases"][phase] - b) / b for phase, b in row["phases"].items()}
    if row["host"]:
        errors["host"] = 100 * (row["estimate_host"] - row["host"]) / row["host"]
    return errors


def test_saved_measurements_are_of_the_modelled_release():
    doc = json.loads(BENCH.SAVED.read_text())
    assert doc["versions"]["verl"] == verl_fsdp.RELEASE
    assert doc["versions"]["torch"].split("+")[0] == verl_fsdp.facts()["torch"]
    assert set(doc["rows"]) == set(BENCH.ROWS), "re-measure: python bench/verl_workers.py --save"


@pytest.mark.parametrize("row", SAVED_ROWS, ids=lambda r: r["name"])
def test_estimate_within_5_percent_of_verls_engine(row):
    assert abs(row["error_pct"]) <= TOLERANCE_PCT, (
        f"{row['name']}: estimate {row['estimate']:,} ({row['estimate_phase']}) vs measured {row['measured']:,} "
        f"({row['measured_phase']}) bytes: {row['error_pct']:+.2f}%")
    assert row["estimate_phase"] == row["measured_phase"]
    worst = {k: round(v, 2) for k, v in _phase_errors(row).items() if abs(v) > PHASE_TOLERANCE_PCT}
    assert not worst, f"{row['name']}: phases off by more than {PHASE_TOLERANCE_PCT}%: {worst}"


# what memfit would assume without each fact (its other FSDP layouts' bf16 models, no host reference, ...)
WITHOUT = {"shard_bytes": 2, "gathered_bytes": 4, "reduce_bytes": 2, "fsdp2_head_copies": 1,
           "fsdp1_root_kept": False, "last_reduce_copies": 0, "reference_on_host": False,
           "fsdp1_reference_host_grad": False, "logits_bytes": 4,
           "saved_per_logit": {"flash_ce": 0, "torch_rows": 0}, "backward_per_logit": {"flash_ce": 0, "torch_rows": 0},
           "loop_temporaries": 1}


@pytest.mark.parametrize("fact", sorted(WITHOUT))
def test_every_fact_is_needed(fact, monkeypatch):
    shipped = verl_fsdp.facts()
    monkeypatch.setattr(verl_fsdp, "facts", lambda release=verl_fsdp.RELEASE: {**shipped, fact: WITHOUT[fact]})
    rows, _ = BENCH.saved_rows()
    worst = max(abs(e) for row in rows for e in _phase_errors(row).values())
    assert worst > PHASE_TOLERANCE_PCT, f"without {fact} every saved phase still within {PHASE_TOLERANCE_PCT}%"


def test_a_mistyped_or_missing_fact_is_one_line(monkeypatch):
    shipped = verl_fsdp.facts()
    for broken in ({**shipped, "shard_bites": 4}, {k: v for k, v in shipped.items() if k != "shard_bytes"}):
        monkeypatch.setattr(verl_fsdp, "data_table", lambda name, row=broken: {"release": {"0.9.1": row}})
        with pytest.raises(MemfitError) as e:
            verl_fsdp.facts()
        assert "\n" not in str(e.value) and "shard_b" in str(e.value)
    with pytest.raises(MemfitError, match="no facts for verl 0.8"):
        verl_fsdp.facts("0.8")
    with pytest.raises(MemfitError, match="valid are flash_ce, torch_rows"):
        verl_fsdp.actor_update_bytes(BENCH.scenario(RERUN_ROW), logprob_path="fused")


def test_the_gpu_log_prob_path_holds_less_than_the_cpu_one():
    """flash-attn's in-place cross entropy (verl's GPU install) keeps no log_softmax beside the logits."""
    s = BENCH.scenario(RERUN_ROW)
    gpu, cpu = verl_fsdp.actor_update_bytes(s), verl_fsdp.actor_update_bytes(s, logprob_path="torch_rows")
    assert gpu["forward"] <= cpu["forward"] and gpu["backward"] <= cpu["backward"]


@pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason="verl venv: bash tests/trace/setup_verl_venv.sh")
def test_one_row_re_measured_live_matches_the_saved_one():
    ranks = BENCH.measure([RERUN_ROW])[RERUN_ROW]
    live = BENCH.compare(RERUN_ROW, ranks)
    saved = next(r for r in SAVED_ROWS if r["name"] == RERUN_ROW)
    assert ranks[0]["versions"]["verl"] == verl_fsdp.RELEASE
    assert abs(live["error_pct"]) <= TOLERANCE_PCT, live
    # the same code on the same releases: the peak moves only by the collectives' timing (a few KiB)
    assert abs(live["measured"] - saved["measured"]) <= 64 * 1024, (live["measured"], saved["measured"])

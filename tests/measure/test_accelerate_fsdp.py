"""HF Trainer's FSDP path through accelerate's own preparation on 2 gloo ranks (bench/accelerate_fsdp.py): the saved
measurements still hold for the installed releases, and the estimate with each row's --fsdp-version follows what
FSDP1 and FSDP2 keep gathered, reduce and sum (memfit/memory/states/accelerate_fsdp.py)."""
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import accelerate_fsdp as BENCH  # noqa: E402

SAVED = json.loads(BENCH.SAVED.read_text())
ROWS = {name: BENCH.compare(name, m) for name, m in SAVED["rows"].items()}
# LoRA on wide layers under FSDP1: the estimate's backward moment holds a recomputed layer's activations beside two
# gathered layers (the one running and the prefetched); the measured peak does not have both at once: errs high
WIDE_LORA = "wide-layer lora fsdp1"


def test_the_saved_rows_were_measured_on_the_installed_releases():
    from importlib.metadata import version

    assert SAVED["versions"] == {name: version(name) for name in SAVED["versions"]}
    assert set(ROWS) == set(BENCH.ROWS)


@pytest.mark.parametrize("name", list(BENCH.ROWS))
def test_what_fsdp_does_is_never_under_predicted_by_more_than_one_percent(name):
    assert ROWS[name]["delta_error_pct"] >= -1.0, ROWS[name]


@pytest.mark.parametrize("name", [n for n in BENCH.ROWS if n != WIDE_LORA])
def test_each_version_is_estimated_within_one_and_a_half_percent(name):
    assert abs(ROWS[name]["error_pct"]) <= 1.5, ROWS[name]


def test_lora_on_wide_layers_under_fsdp1_errs_high():
    assert 0 < ROWS[WIDE_LORA]["error_pct"] <= 5, ROWS[WIDE_LORA]


def test_one_row_reruns_as_saved():
    name = "lora fsdp1"
    again = BENCH.measure([name])[name]
    for side in ("fsdp", "single"):
        assert [r["peak"] for r in again[side]] == [r["peak"] for r in SAVED["rows"][name][side]], side

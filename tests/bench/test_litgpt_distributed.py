"""`--profile litgpt` on 2 devices against LitGPT's own several-device strategies run for real on 2 gloo ranks
(bench/litgpt_distributed.py; its measurements are kept in bench/litgpt_distributed.json, so only the re-run needs
LitGPT's venv)."""
import importlib.util
import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("litgpt_distributed_bench", ROOT / "bench" / "litgpt_distributed.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench
_spec.loader.exec_module(bench)

TOLERANCE_PCT = 5.0
VENV = Path(os.environ.get("MEMFIT_LITGPT_VENV") or ROOT / ".venvs" / "litgpt")
SEVERAL = tomllib.loads((ROOT / "memfit" / "facts" / "data" / "frameworks" / "litgpt.toml").read_text())[
    "model_code"]["several_devices"]


@pytest.fixture(scope="module")
def saved() -> dict:
    return json.loads(bench.MEASURED.read_text())


@pytest.mark.parametrize("index", range(len(bench.ROWS)))
def test_estimate_is_within_5_percent_of_the_measured_row(saved, index):
    row = bench.ROWS[index]
    (_, est, got, err), = bench.compare([row], saved["rows"])
    assert abs(err) <= TOLERANCE_PCT, f"{bench.label(row)}: estimate {est:,} vs measured {got:,} ({err:+.1f}%)"


def test_the_rows_were_measured_on_the_release_the_facts_cite(saved):
    assert saved["versions"]["litgpt"] == SEVERAL["litgpt"]
    assert saved["versions"]["lightning"] == SEVERAL["lightning"]
    assert set(saved["rows"]) == {bench._key(r) for r in bench.ROWS}, "python bench/litgpt_distributed.py --remeasure"


def _row(saved, method: str, shape: str = "wide") -> dict:
    return next(m for k, m in saved["rows"].items() if json.loads(k)["method"] == method
                and json.loads(k)["shape"] == shape)


def test_fsdp1_keeps_a_gradient_for_every_parameter_of_a_unit_that_trains(saved):
    """What `flat_params` says: under FSDPStrategy (use_orig_params=True) LLaMA-Adapter v2, whose every Block and root
    hold a trainable parameter, ends backward with the whole model's sharded gradient (2 B x all / 2 ranks); v1 with the
    gradient of its prompted Blocks only; LoRA under FSDP2 with its adapters' only."""
    assert bench.TUNING["adapter_v2"] in SEVERAL["flat_params"] and "lora" not in SEVERAL["flat_params"]
    v2 = _row(saved, "adapter_v2")
    step_grads = max(r["phases"]["optimizer_step"]["gradients"] for r in v2["ranks"])
    assert step_grads >= 2 * v2["ranks"][0]["params"] // 2 * 0.99
    lora = _row(saved, "lora")
    assert max(r["phases"]["optimizer_step"]["gradients"] for r in lora["ranks"]) <= 2 * lora["ranks"][0]["trainable"]


def test_the_root_stays_gathered_through_backward(saved):
    """What `root_gathered` says: LoRA's backward peak (FSDP2, reshard_after_forward unset) holds the shards, the root
    (wte, ln_f, lm_head) and two Blocks unsharded, in bf16."""
    c = bench.SHAPES["wide"]
    root = 2 * (2 * c["padded_vocab_size"] * c["n_embd"] + c["n_embd"])
    lora = _row(saved, "lora")["ranks"][0]
    gathered = lora["phases"]["backward"]["weights"] + lora["phases"]["backward"].get("engine_buffers", 0)
    shards = lora["phases"]["optimizer_step"]["weights"]
    assert gathered - shards >= root


@pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason="LitGPT's venv (tests/trace/setup_litgpt_venv.sh)")
def test_a_fresh_two_rank_run_matches_the_estimate():
    """One FSDP1 row run again on 2 gloo ranks (about half a minute): LLaMA-Adapter v2, the row the flat gradients
    and the root kept gathered decide."""
    row = {"method": "adapter_v2", "shape": "wide", "micro_batch": 1, "seq_len": 512}
    (result,) = bench.run_rows([row])
    (_, est, got, err), = bench.compare([row], {bench._key(row): bench._kept(result)})
    assert abs(err) <= TOLERANCE_PCT, f"estimate {est:,} vs measured {got:,} ({err:+.1f}%)"


def test_accuracy_reports_the_group():
    """bench/accuracy.py's framework groups carry these rows (bench/framework_paths.py)."""
    sys.path.insert(0, str(ROOT / "bench"))
    import framework_paths

    group = framework_paths.framework_groups()["framework:litgpt-distributed"]
    assert group["rows"] == len(bench.ROWS) and group["max_abs_pct_error"] <= TOLERANCE_PCT, group
    assert group["versions"]["litgpt"] == SEVERAL["litgpt"]

"""bench/accuracy.py's row machinery on two tiny rows: the comparison's structure, the trace cache,
and exact agreement of the estimate and the trace on the weights of full bf16-pure tuning."""
import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import accuracy  # noqa: E402

from memfit.facts.catalog import ModelSpec  # noqa: E402
from memfit.roles.estimate import estimate  # noqa: E402

LINEARS = {"q_proj": ["q"], "k_proj": ["k"], "v_proj": ["v"], "o_proj": ["o"],
           "gate_proj": ["gate"], "up_proj": ["up"], "down_proj": ["down"]}
# every parameter a multiple of 512 bytes in bf16, so the trace's block rounding adds nothing
TINY = ModelSpec(id="tiny-llama", arch="llama", hidden_size=256, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=64, intermediate_size=512, vocab_size=1024, linear_names=LINEARS)
FULL = accuracy.GridRow("tiny", TINY, "full", "off", "sdpa", 2, 64, "bf16-pure", "adamw-foreach")
LORA = accuracy.GridRow("tiny", TINY, "lora", "full", "eager", 1, 128, "bf16-mixed", "adamw-fused", 8)
ROWS = [FULL, LORA]


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "trace_cache.json"
    cache = accuracy.TraceCache(path)
    accuracy.fill_cache(ROWS, cache, log=lambda *_: None)
    return path, {c.row.id: c for c in accuracy.evaluate(ROWS, cache)}


def test_each_row_compares_total_activation_peak_and_phase(traced):
    _, comparisons = traced
    assert set(comparisons) == {FULL.id, LORA.id}
    for c in comparisons.values():
        assert c.ok, c.reason
        doc = c.to_json()
        assert doc["total_peak"]["trace"] == c.trace.peak.total > 0
        assert doc["total_peak"]["estimate"] == c.estimate.peak.total > 0
        assert doc["activation_peak"]["trace"] > 0
        assert set(doc["peak_phase"]) == {"estimate", "trace"}
        assert set(doc["delta_at_peak"]) == set(accuracy.COMPARED)
        assert set(doc["phases"]) == {"forward", "backward", "optimizer_step"}
        for phase in doc["phases"].values():  # both sides in the same categories, runtime overhead left out
            assert phase["estimate"]["runtime_overhead"] == phase["trace"]["runtime_overhead"] == 0
        assert doc["trace_marks"]["forward_end"]["activations"] > 0
    summary = accuracy.summary(list(comparisons.values()))
    assert set(summary) == {"n", "median_abs_pct_error", "max_abs_pct_error", "phase_agreement"}
    assert summary["n"] == 2


def test_cache_is_keyed_by_scenario_and_read_back_without_tracing(traced):
    path, comparisons = traced
    doc = json.loads(path.read_text())
    assert doc["schema"] == accuracy.CACHE_SCHEMA
    assert set(doc["entries"]) == {accuracy.fingerprint(r.scenario()) for r in ROWS}
    again = accuracy.TraceCache(path)
    assert accuracy.fill_cache(ROWS, again, log=lambda *_: None) == 0.0  # nothing left to trace
    reread = {c.row.id: c for c in accuracy.evaluate(ROWS, again)}
    assert {k: c.trace_total for k, c in reread.items()} == {k: c.trace_total for k, c in comparisons.items()}
    assert accuracy.fingerprint(FULL.scenario()) != accuracy.fingerprint(
        accuracy.GridRow("tiny", TINY, "full", "off", "sdpa", 2, 128, "bf16-pure", "adamw-foreach").scenario())


def test_full_bf16_pure_weights_agree_exactly(traced):
    from memfit.trace.accountant import block_bytes
    from memfit.trace.build import build_model

    _, comparisons = traced
    c = comparisons[FULL.id]
    scenario = FULL.scenario()
    params_bytes = estimate(scenario).total_params * 2
    # the trace labels buffers (rotary inv_freq) as weights too; the parameters must agree to the byte
    buffers = sum(block_bytes(b.nbytes) for b in build_model(scenario, device="meta").model.buffers())
    for phase in accuracy.STEP_PHASES:
        assert c.estimate.phases[phase].get("weights") == params_bytes
        assert c.trace.phases[phase].get("weights") - buffers == params_bytes


def test_fingerprint_keeps_to_what_the_trace_reads():
    from dataclasses import replace

    s = FULL.scenario()
    key = accuracy.fingerprint(s)
    assert accuracy.fingerprint(replace(s, grad_accum=8)) == key  # the trace runs one micro-batch per step
    assert accuracy.fingerprint(replace(s, hardware=replace(s.hardware, host_ram=2**40))) == key
    assert accuracy.fingerprint(replace(s, seq_len=128)) != key
    assert accuracy.fingerprint(replace(s, checkpointing="full")) != key


def test_rows_filter_and_grid_shape():
    grid = accuracy.grid()
    assert len(grid) >= 150 and len({r.id for r in grid}) == len(grid)
    assert len({r.model for r in grid}) >= 8
    assert 15 <= len(accuracy.quick_grid()) <= 25
    picked = accuracy.select(grid, "qwen3-8b+lora,gemma2")
    assert picked and all(("qwen3-8b" in r.id and "lora" in r.id) or "gemma2" in r.id for r in picked)


def test_dpo_rows_are_keyed_apart_and_compared_with_estimate_roles(tmp_path):
    dpo = accuracy.GridRow("tiny", TINY, "full", "off", "sdpa", 2, 64, "bf16-pure", "adamw-foreach", method="dpo")
    sft = accuracy.GridRow("tiny", TINY, "full", "off", "sdpa", 2, 64, "bf16-pure", "adamw-foreach")
    assert dpo.id.startswith("dpo/") and dpo.scenario().profile == "openrlhf"
    assert accuracy.fingerprint(dpo.scenario()) != accuracy.fingerprint(sft.scenario())
    cache = accuracy.TraceCache(tmp_path / "cache.json")
    accuracy.fill_cache([dpo], cache, log=lambda *_: None)
    (c,) = accuracy.evaluate([dpo], cache)
    assert c.ok and abs(c.total_error) <= 2.0  # the bench's bar for the DPO group
    groups = accuracy.group_summaries([c])
    assert groups["dpo"]["n"] == 1 and groups["moe"]["n"] == 0
    ids = [r.id for r in accuracy.all_rows()]
    assert len(ids) == len(set(ids)) and sum(i.startswith("dpo/") for i in ids) >= 16

"""Real CPU training loops, monitored by MemoryMonitor and read back by `memfit watch`."""
import pytest

from memfit.facts.run_findings import finding

pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[monitor])")

from monitor_loop import run_loops

SEQ, STEPS, STABLE_STEPS = 256, 30, 300
ROW_BYTES = 8 * SEQ * 4  # BATCH * SEQ float32 losses kept per step by the "rows" loop


def kinds(doc):
    return [(f["kind"], f.get("rank")) for f in doc["findings"]]


def test_a_loss_history_of_tensors_is_growth_and_of_items_is_not(tmp_path, watch_json):
    # the stable loop runs STABLE_STEPS (issue 13: >= 300 steps raise nothing), the leaking ones STEPS
    run_loops([(tmp_path / f"{leak}.jsonl", 0, STABLE_STEPS if leak == "none" else STEPS, SEQ, leak)
               for leak in ("graph", "rows", "none")])
    graph, rows, none = (watch_json(tmp_path / f"{leak}.jsonl", "--capacity", "1") for leak in ("graph", "rows", "none"))
    assert none["findings"] == [] and none["leak"]["detected"] is False
    assert none["ranks"]["0"]["steps"] == STABLE_STEPS
    g, = graph["findings"]
    assert g["kind"] == "growth" and g["series"] == "allocated" and g["r2"] > 0.9
    assert g["bytes_per_step"] > ROW_BYTES  # the loss rows and their autograd nodes
    assert g["causes"] == finding("growth")["causes"]
    # a known leak: the slope is the bytes kept per step, within 10%
    r, = rows["findings"]
    assert abs(r["bytes_per_step"] - ROW_BYTES) <= 0.1 * ROW_BYTES, r
    # the projection: the run's peak plus slope * steps reaches the 1 GiB capacity at the step it names
    peak = rows["ranks"]["0"]["peak_bytes"]
    assert r["reaches_capacity_at_step"] > STEPS
    assert abs(r["steps_to_capacity"] * r["bytes_per_step"] - (2**30 - peak)) < 2 * r["bytes_per_step"] + 0.05 * 2**30


def test_b_imbalance_that_follows_tokens_and_a_rank_specific_leak(tmp_path, watch_json):
    run_loops([(tmp_path / "long.rank0.jsonl", 0, 12, 128, "none"), (tmp_path / "long.rank1.jsonl", 1, 12, 1024, "none"),
               (tmp_path / "leak.rank0.jsonl", 0, 16, SEQ, "none"), (tmp_path / "leak.rank1.jsonl", 1, 16, SEQ, "logits")])
    long = watch_json(tmp_path / "long.jsonl")  # finds long.rank*.jsonl
    assert set(long["ranks"]) == {"0", "1"}
    imb, = [f for f in long["findings"] if f["kind"] == "imbalance"]
    assert imb["max_rank"] == 1 and imb["ratio"] > 1.1 and imb["follows_tokens"] is True
    assert imb["causes"] == finding("imbalance_tokens")["causes"]
    assert [f for f in long["findings"] if f["kind"] == "growth"] == []

    leak = watch_json(tmp_path / "leak.rank0.jsonl", tmp_path / "leak.rank1.jsonl")
    assert ("growth", 1) in kinds(leak) and ("growth", 0) not in kinds(leak)
    imb, = [f for f in leak["findings"] if f["kind"] == "imbalance"]
    assert imb["max_rank"] == 1 and imb["follows_tokens"] is False and imb["growing_ranks"] == [1]
    assert imb["causes"] == finding("imbalance_leak")["causes"]
    g, = [f for f in leak["findings"] if f["kind"] == "growth"]
    assert g["bytes_per_step"] >= 8 * SEQ * 1000 * 4  # at least the logits kept each step

"""The estimate page's sweep charts (device total against micro-batch and sequence length) and role shares:
every dot is memfit's own estimate of the run at that value, the marked value is planner/limits.py's answer,
and nothing of it leaks into --json."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

import cards
from memfit.interfaces.cli.args import scenario_from_args
from memfit.interfaces.cli.main import build_parser, main
from memfit.interfaces.render.html import estimate_page
from memfit.planner.limits import limit
from memfit.planner.sweep import ladder, sweeps
from memfit.roles.estimate import estimate
from tests.render.test_html import LLAMA, parse

PPO_ALL = ["llama-2-7b", "--gpu", "a100-80gb", "--gpus-per-node", "8", "--profile", "openrlhf", "--method", "ppo",
           "--zero-stage", "3", "--micro-batch", "4", "--seq-len", "2048", "--checkpointing", "full", "--colocate",
           "all", "--vllm-engines", "8", "--vllm-tp", "1", "--rollout-micro-batch", "8"]


def scenario(argv):
    return scenario_from_args(build_parser().parse_args(["estimate", *argv]))


@pytest.fixture(scope="module")
def llama():
    """LLAMA (micro-batch 4, 2048 tokens) on a card derived from memfit's own verdict (tests/cards.py) where
    micro-batch 2 and 1024 tokens each fit and the run as written does not, so both charts mark a largest fitting
    value below the run's own as the error bands move (on the real 4090 even micro-batch 1 is "tight")."""
    run = scenario(LLAMA)
    capacity = max(cards.card(run, {"micro_batch": 2}, resume=False),  # limits judges without the resume phase
                   cards.card(run, {"seq_len": 1024}, resume=False))
    return LLAMA + cards.gpu_mem(capacity)


@pytest.fixture(scope="module")
def llama_page(tmp_path_factory, llama):
    path = tmp_path_factory.mktemp("sweep") / "llama.html"
    assert main(["estimate", *llama, "--html", str(path)]) == 0
    return parse(path.read_text(encoding="utf-8"))


def dots(items, knob):
    return [e for e in items if e["tag"] == "circle" and e.get("data-knob") == knob]


@pytest.mark.parametrize("knob", ["micro_batch", "seq_len"])
def test_every_dot_is_memfits_estimate_at_that_value(llama, llama_page, knob):
    s = scenario(llama)
    got = [(int(d["data-x"]), int(d["data-bytes"])) for d in dots(llama_page, knob)]
    assert len(got) >= 4
    want = [(v, estimate(replace(s, **{knob: v})).device_total.peak.total) for v, _ in got]
    assert got == want
    # the ladder reaches past the run's own value and past the largest that fits
    lim = limit(s, knob)
    assert max(v for v, _ in got) > max(getattr(s, knob), lim.value or 1)
    # the verdict each dot is coloured by is the estimate's
    assert [d["data-verdict"] for d in dots(llama_page, knob)] == \
        [estimate(replace(s, **{knob: v})).verdict for v, _ in got]


@pytest.mark.parametrize("knob", ["micro_batch", "seq_len"])
def test_the_marked_value_is_limits_answer(llama, llama_page, knob):
    s = scenario(llama)
    marks = {e["data-mark"]: int(e["data-value"]) for e in llama_page
             if e["tag"] == "line" and "vmark" in e.get("class", "") and
             e.get("data-value") and e.get("data-mark") and _in_chart(llama_page, e, f"sweep-{knob}")}
    largest = limit(s, knob).value
    assert largest is not None and marks.get("largest-fitting") == largest, marks
    assert marks["current"] == getattr(s, knob)


def _in_chart(items, element, chart_id):
    """Whether `element` comes after the <svg id=chart_id> and before the next <svg> (the parser is flat)."""
    i = next(k for k, e in enumerate(items) if e is element)
    svg = max(k for k, e in enumerate(items[:i]) if e["tag"] == "svg")
    return items[svg].get("id") == chart_id


def test_dots_rise_with_bytes_and_the_capacity_line_is_the_cards(llama, llama_page):
    for knob in ("micro_batch", "seq_len"):
        ds = dots(llama_page, knob)
        by_bytes = sorted(ds, key=lambda d: int(d["data-bytes"]))
        assert [float(d["cy"]) for d in by_bytes] == sorted((float(d["cy"]) for d in ds), reverse=True)
        assert [float(d["cx"]) for d in ds] == sorted(float(d["cx"]) for d in ds)
    s = scenario(llama)
    caps = [e for e in llama_page if e["tag"] == "line" and e.get("class") == "capacity"
            and _in_chart(llama_page, e, "sweep-seq_len")]
    assert [int(c["data-bytes"]) for c in caps] == [s.hardware.gpu.memory_bytes]


def test_sweep_is_not_in_the_json_output(capsys, tmp_path):
    assert main(["estimate", *LLAMA, "--json", "--html", str(tmp_path / "x.html")]) == 0
    assert "sweep" not in json.loads(capsys.readouterr().out)


def test_ladder_runs_past_the_largest_fitting_and_stops_at_the_cap():
    assert ladder("micro_batch", 4, 1, 2**16) == [1, 2, 4, 8, 16]
    assert ladder("seq_len", 2048, 675, 2**17) == [256, 512, 1024, 2048, 4096, 8192]
    assert ladder("seq_len", 1024, 8000, 4096) == [256, 512, 1024, 2048, 4096]
    assert ladder("micro_batch", 1, None, 2**16) == [1, 2, 4]


def test_refused_values_are_gaps_with_an_escaped_reason():
    s = scenario(LLAMA)
    doc = estimate(s).to_json() | {"sweep": sweeps(s)}
    evil = '<script>alert("x")</script>'
    doc["sweep"]["seq_len"]["points"].append({"value": 16384, "verdict": "refused", "device_peak_bytes": None,
                                              "message": evil})
    doc["sweep"]["micro_batch"]["largest_fitting"] = None
    text = estimate_page(doc)
    items = parse(text)
    assert "<script" not in text and "&lt;script&gt;" in text
    assert 16384 not in [int(d["data-x"]) for d in dots(items, "seq_len")]
    assert not [e for e in items if e.get("data-mark") == "largest-fitting" and _in_chart(items, e, "sweep-micro_batch")]
    note = next(e for e in items if e.get("class") == "note sweep-note" and e.get("data-knob") == "micro_batch")
    assert note["text"].startswith("no micro-batch fits")


def test_role_shares_of_a_colocated_run_are_the_groups_moments(tmp_path, capsys):
    out = tmp_path / "ppo.html"
    assert main(["estimate", *PPO_ALL, "--json", "--html", str(out)]) == 0
    doc = json.loads(capsys.readouterr().out)
    items = parse(out.read_text(encoding="utf-8"))
    segs = [e for e in items if e["tag"] == "rect" and e.get("data-bar") == "role-share"]
    for g in doc["gpu_groups"]:
        want = {r: b["total"] for r, b in g["moments"][g["peak_moment"]].items() if b["total"]}
        got = {e["data-role"]: int(e["data-bytes"]) for e in segs if e["data-group"] == g["name"]}
        assert got == want and len(got) > 1, g["name"]
        total = next(e for e in items if e["tag"] == "text" and e.get("data-bar") == "role-share"
                     and e["data-group"] == g["name"])
        assert int(total["data-bytes"]) == g["peak_bytes"]  # the shares add up to the group's peak

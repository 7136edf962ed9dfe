"""`memfit trace ... --html FILE`: the timeline drawn is the one --timeline writes (every event, the peak marked
at its tick), the phase bars are the trace's profile, and the model's path is escaped."""
from __future__ import annotations

import json

import pytest

from memfit.breakdown import CATEGORIES
from memfit.interfaces.cli.main import main
from memfit.interfaces.render import svg_line
from memfit.interfaces.render.html_trace import MAX_POINTS, _thin, totals
from tests.render.test_html import parse

TINY = {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000}


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    pytest.importorskip("torch", reason="torch is not installed (an optional extra: memfit[trace])")
    root = tmp_path_factory.mktemp("trace")
    folder = root / "<script>alert(1)<"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    timeline, page = root / "timeline.json", root / "trace.html"
    assert main(["trace", str(folder), "--gpu", "rtx4090", "--seq-len", "256", "--timeline", str(timeline),
                 "--html", str(page)]) == 0
    return json.loads(timeline.read_text()), page.read_text(encoding="utf-8")


def test_the_timeline_drawn_is_the_traces(traced):
    doc, text = traced
    items = parse(text)
    pts = totals(doc)
    assert 10 < len(pts) <= MAX_POINTS
    line = next(e for e in items if e["tag"] == "polyline" and e.get("data-trace") == "allocated")
    assert int(line["data-count"]) == len(pts)
    # a step line: each event's level is held until the next, so vertex 2k is event k's level
    ys = [float(v.split(",")[1]) for v in line["points"].split()]
    assert len(ys) == 2 * len(pts) - 1
    peak = max(b for _, b, _, _ in pts)
    top_bytes = peak * 1.1  # the capacity is off this scale for a tiny model (checked below)
    plot_h = svg_line.HEIGHT - svg_line.TOP - svg_line.BOTTOM
    drawn = [round((1 - (y - svg_line.TOP) / plot_h) * top_bytes) for y in ys[0::2]]
    assert all(abs(d - b) <= top_bytes * 0.001 for d, (_, b, _, _) in zip(drawn, pts))
    mark = next(e for e in items if e["tag"] == "line" and e.get("data-mark") == "peak")
    tick, nbytes, _, phase = max(pts, key=lambda p: p[1])
    assert (int(mark["data-tick"]), int(mark["data-bytes"]), mark["data-phase"]) == (tick, nbytes, phase)
    assert not [e for e in items if e["tag"] == "line" and e.get("class") == "capacity"]
    assert "off this scale" in text


def test_phase_bars_are_the_profile_and_nothing_is_fetched_or_injected(traced):
    doc, text = traced
    items = parse(text)
    for phase, b in doc["profile"]["phases"].items():
        got = {e["data-category"]: int(e["data-bytes"]) for e in items
               if e["tag"] == "rect" and e.get("data-bar") == "trace-phase" and e["data-phase"] == phase}
        assert got == {c: b[c] for c in CATEGORIES if b[c]}, phase
    assert "<script" not in text and "&lt;script&gt;alert(1)&lt;" in text
    assert not [e for e in items if e["tag"] in ("script", "img", "link")] and "http" not in text


def test_a_long_timeline_keeps_its_peak():
    points = [(i, (i * 7919) % 1000) for i in range(3 * MAX_POINTS + 5)] + [(10**6, 5000)]
    thin = _thin(points)
    assert len(thin) <= MAX_POINTS and max(b for _, b in thin) == 5000

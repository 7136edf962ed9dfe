"""`--html FILE` on estimate and plan: a self-contained page whose every bar carries the --json document's numbers,
with user strings escaped; and, where Debian's chromium and Playwright are installed, the page drawn offline."""
from __future__ import annotations

import contextlib
import io
import json
import re
from html.parser import HTMLParser

import pytest

from browser_support import CHROMIUM, artifacts, sync_playwright_or_skip

from memfit.breakdown import CATEGORIES
from memfit.interfaces.cli.main import main
from memfit.interfaces.render.html import estimate_page

# the 7 x RTX 4090 Llama-3.1-8B LoRA report (tests/test_user_reports.py LLAMA, micro-batch 4: OOM from logits)
LLAMA = ["meta-llama/Llama-3.1-8B-Instruct", "--gpu", "rtx4090", "--gpus-per-node", "7", "--profile", "llamafactory",
         "--tuning", "lora", "--lora-rank", "8", "--seq-len", "2048", "--precision", "bf16-pure", "--micro-batch", "4"]


class Elements(HTMLParser):
    """Every start tag with its attributes and the text directly inside it."""

    def __init__(self):
        super().__init__()
        self.items: list[dict] = []
        self.open: list[dict] = []

    def handle_starttag(self, tag, attrs):
        item = {"tag": tag, **{k: v or "" for k, v in attrs}, "text": ""}
        self.items.append(item)
        self.open.append(item)

    def handle_startendtag(self, tag, attrs):
        self.items.append({"tag": tag, **{k: v or "" for k, v in attrs}, "text": ""})

    def handle_endtag(self, tag):
        while self.open and self.open.pop()["tag"] != tag:
            pass

    def handle_data(self, data):
        for item in self.open:
            item["text"] += data


def parse(text: str) -> list[dict]:
    p = Elements()
    p.feed(text)
    p.close()
    return p.items


def run_cli(argv, capsys):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def llama_report(tmp_path_factory):
    """The estimate's --json document and its --html page, from one command."""
    path = tmp_path_factory.mktemp("html") / "llama.html"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["estimate", *LLAMA, "--json", "--html", str(path)]) == 0
    return json.loads(buf.getvalue()), path


def segments(items, bar):
    return [e for e in items if e["tag"] == "rect" and "seg" in e.get("class", "") and e.get("data-bar") == bar]


def test_every_bar_carries_the_json_numbers(llama_report):
    doc, path = llama_report
    items = parse(path.read_text(encoding="utf-8"))
    rank = doc["per_rank"]
    peak = rank["device_total"]["peak_phase"]
    for level in ("allocated", "reserved", "device_total"):
        want = {c: rank[level]["phases"][peak][c] for c in CATEGORIES if rank[level]["phases"][peak][c]}
        got = {e["data-category"]: int(e["data-bytes"]) for e in segments(items, level) if e["data-phase"] == peak}
        assert got == want, level
        totals = [e for e in items if e["tag"] == "text" and e.get("data-bar") == level]
        assert [int(t["data-bytes"]) for t in totals] == [rank[level]["phases"][peak]["total"]]
    for bar, profile in (("timeline", rank["device_total"]), ("host", doc["host_per_node"])):
        for phase, b in profile["phases"].items():
            got = {e["data-category"]: int(e["data-bytes"]) for e in segments(items, bar) if e["data-phase"] == phase}
            assert got == {c: b[c] for c in CATEGORIES if b[c]}, (bar, phase)
    capacity = [e for e in items if e["tag"] == "line" and e.get("class") == "capacity"]
    assert capacity and {int(e["data-bytes"]) for e in capacity} == {doc["gpu_memory_bytes"]}


def test_heights_are_proportional_to_bytes_within_each_chart(llama_report):
    """The picture, not only the attributes: a segment's height is its bytes on the chart's one scale."""
    _, path = llama_report
    items = parse(path.read_text(encoding="utf-8"))
    for bar in ("device_total", "timeline", "host"):
        scale = [float(e["height"]) / int(e["data-bytes"]) for e in segments(items, bar)]
        assert scale and max(scale) == pytest.approx(min(scale), rel=0.02), bar


def test_verdict_band_and_assumptions_are_shown(llama_report):
    doc, path = llama_report
    items = parse(path.read_text(encoding="utf-8"))
    verdict = next(e for e in items if e.get("id") == "verdict")
    assert doc["verdict"] == "oom" and verdict["text"].startswith("OOM")
    assert f"{doc['band_fraction']:.1%}" in verdict["text"] and doc["band_kind"] in verdict["text"]
    shown = [e["text"] for e in items if e["tag"] == "li" and e.get("id") is None]
    assert all(a in shown for a in doc["assumptions"])
    peak = [e for e in items if e.get("class") == "mark-label"]
    assert [e["text"] for e in peak] == ["peak", "peak"]  # the device timeline's and the host's


def test_page_fetches_nothing(llama_report):
    _, path = llama_report
    text = path.read_text(encoding="utf-8")
    items = parse(text)
    assert not [e for e in items if e["tag"] in ("script", "link", "iframe", "img", "object", "embed")]
    assert not [e for e in items for k in ("src", "href", "xlink:href") if k in e]
    assert not re.search(r"https?://|url\(|@import", text, re.I)


def test_hostile_model_path_is_escaped(tmp_path, capsys):
    """A model given as a local folder: its path is the model id the page shows."""
    folder = tmp_path / "<script>alert(1)</script>"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "intermediate_size": 512, "vocab_size": 1000}))
    out = tmp_path / "<img src=x onerror=alert(1)>.html"
    code, _, err = run_cli(["estimate", str(folder), "--gpu", "rtx4090", "--html", str(out)], capsys)
    assert code == 0, err
    text = out.read_text(encoding="utf-8")
    assert "<script" not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert not [e for e in parse(text) if e["tag"] in ("script", "img")]


def test_hostile_strings_in_the_document_are_escaped(llama_report):
    doc, _ = llama_report
    evil = '"><script>alert(1)</script>'
    doc = json.loads(json.dumps(doc))
    doc["assumptions"].append(f"{evil}.yaml: read as a LLaMA-Factory file")
    doc["drivers"][evil] = 1
    doc["gpu_groups"][0]["name"] = evil
    doc["gpu"] = evil
    text = estimate_page(doc)
    assert "<script" not in text
    assert not [e for e in parse(text) if e["tag"] == "script"]


def test_plan_page_shows_each_change_and_the_start_bars(tmp_path, capsys):
    out = tmp_path / "plan.html"
    code, stdout, err = run_cli(["plan", *LLAMA, "--json", "--html", str(out)], capsys)
    assert code == 0, err
    plan = json.loads(stdout)
    items = parse(out.read_text(encoding="utf-8"))
    rows = [e for e in items if e["tag"] == "tr" and "plan-row" in e.get("class", "")]
    want = [plan["start"]] + plan["rows"]
    assert [int(r["data-device-peak"]) for r in rows] == [r["device_peak_bytes"] for r in want]
    changes = [e for e in items if e["tag"] == "li" and "data-knob" in e]
    assert [(c["data-knob"], int(c["data-device-saving"]), float(c["data-speed-cost"])) for c in changes] == \
        [(c["knob"], c["device_saving_bytes"], c["speed_cost_pct"]) for r in plan["rows"] for c in r["changes"]]
    assert plan["rows"] and changes  # the report's plans change something
    # the bars are the start's own estimate: its device total is the plan's starting peak
    total = next(e for e in items if e["tag"] == "text" and e.get("data-bar") == "device_total")
    assert int(total["data-bytes"]) == plan["start"]["device_peak_bytes"]


def test_html_refused_for_limits_and_unwritable_path_is_one_line(tmp_path, capsys):
    code, _, err = run_cli(["plan", *LLAMA, "--max-seq", "--html", str(tmp_path / "x.html")], capsys)
    assert code == 2 and err.startswith("memfit: error: --html") and err.count("\n") == 1
    code, _, err = run_cli(["estimate", *LLAMA, "--html", str(tmp_path / "missing" / "x.html")], capsys)
    assert code == 2 and err.startswith("memfit: error:") and "x.html" in err and err.count("\n") == 1


# ---------------------------------------------------------------- in a real browser


def test_report_renders_offline_in_headless_chromium(llama_report, tmp_path_factory):
    sync_playwright = sync_playwright_or_skip()
    doc, path = llama_report
    shots = artifacts(tmp_path_factory)
    backgrounds = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        try:
            for scheme in ("light", "dark"):
                context = browser.new_context(offline=True, color_scheme=scheme,
                                              viewport={"width": 1200, "height": 900})
                page = context.new_page()
                fetched = []
                page.on("request", lambda r: fetched.append(r.url) if not r.url.startswith("file:") else None)
                page.goto(path.as_uri())
                backgrounds[scheme] = _check_page(page, doc)
                assert fetched == []
                page.screenshot(path=str(shots / f"llama-estimate-{scheme}.png"), full_page=True)
                context.close()
        finally:
            browser.close()
    assert backgrounds["light"] != backgrounds["dark"]  # prefers-color-scheme took effect
    assert (shots / "llama-estimate-light.png").stat().st_size > 10_000


def _check_page(page, doc) -> str:
    """The bars drawn with non-zero size, the device total over the capacity line (the report is OOM), the
    verdict visible; returns the page's background colour."""
    peak = doc["per_rank"]["device_total"]["peak_phase"]
    drawn = page.locator('svg#per-rank rect.seg[data-bar="device_total"]')
    want = [c for c in CATEGORIES if doc["per_rank"]["device_total"]["phases"][peak][c]]
    assert drawn.count() == len(want)
    boxes = [drawn.nth(i).bounding_box() for i in range(drawn.count())]
    assert all(b and b["width"] > 0 and b["height"] > 0 for b in boxes)
    capacity = page.locator("svg#per-rank line.capacity")
    assert capacity.count() == 1
    line = capacity.bounding_box()
    assert line and line["width"] > 0
    top = min(b["y"] for b in boxes)
    assert top < line["y"]  # on screen, y grows downward: the stack rises above the capacity line
    verdict = page.locator("#verdict")
    assert verdict.is_visible() and verdict.inner_text().startswith("OOM")
    assert page.locator("svg#timeline .mark-label").text_content() == "peak"
    _check_sweep_chart(page)
    return page.evaluate("getComputedStyle(document.body).backgroundColor")


def _check_sweep_chart(page) -> None:
    """The micro-batch sweep drawn: its line and dots have size, the largest-fitting mark is a visible vertical
    line left of the run's own value (the report's micro-batch 4 does not fit), dots above the capacity line red."""
    chart = page.locator("svg#sweep-micro_batch")
    box = chart.bounding_box()
    assert box and box["width"] > 200 and box["height"] > 100
    line = chart.locator("polyline.series").bounding_box()
    assert line and line["width"] > 0 and line["height"] > 0
    dots = chart.locator("circle.dot")
    assert dots.count() >= 4 and all((b := dots.nth(i).bounding_box()) and b["width"] > 0 for i in range(dots.count()))
    best = chart.locator('line.vmark[data-mark="largest-fitting"]').bounding_box()
    mine = chart.locator('line.vmark[data-mark="current"]').bounding_box()
    assert best and mine and best["height"] > 100 and best["x"] < mine["x"]
    capacity_y = chart.locator("line.capacity").bounding_box()["y"]
    for i in range(dots.count()):
        d = dots.nth(i)
        if d.get_attribute("data-verdict") == "oom":
            assert d.bounding_box()["y"] < capacity_y


def test_several_model_run_draws_one_bar_per_gpu_group(tmp_path, capsys):
    out = tmp_path / "ppo.html"
    code, stdout, err = run_cli(["estimate", "llama-2-7b", "--gpu", "a100-80gb", "--gpus-per-node", "8", "--profile",
                                 "openrlhf", "--method", "ppo", "--zero-stage", "3", "--micro-batch", "4", "--seq-len",
                                 "2048", "--checkpointing", "full", "--colocate", "none", "--vllm-engines", "2",
                                 "--vllm-tp", "1", "--rollout-micro-batch", "8", "--role-gpus",
                                 "actor=2,critic=2,ref=1,reward=1", "--json", "--html", str(out)], capsys)
    assert code == 0, err
    doc = json.loads(stdout)
    items = parse(out.read_text(encoding="utf-8"))
    assert len(doc["gpu_groups"]) > 1
    for g in doc["gpu_groups"]:
        b = g["device_total"]["phases"][g["device_total"]["peak_phase"]]
        got = {e["data-category"]: int(e["data-bytes"])
               for e in segments(items, "group") if e["data-group"] == g["name"]}
        assert got == {c: b[c] for c in CATEGORIES if b[c]}, g["name"]
    marks = [e["text"] for e in items if e.get("class") == "mark-label"]
    assert marks.count("worst") == 1
    roles = next(e for e in items if e.get("id") == "roles")
    assert all(r["role"] in roles["text"] for r in doc["roles"])

"""`memfit watch ... --html FILE`: every dot is a sample's number from the monitor's lines, the capacity line is
the card's, the findings of the --json report are listed, and file names are escaped."""
from __future__ import annotations

import json

from memfit.facts.catalog import find_gpu
from memfit.interfaces.cli.main import main
from tests.render.test_html import parse

GiB, MiB = 2**30, 2**20


def line(step, rank=0, **kw):
    d = {"schema": "memfit.monitor/1", "rank": rank, "world_size": 2, "step": step, "time": 1.0,
         "step_seconds": 0.5, "tokens": 100, "device_kind": "cuda", "allocated_bytes": 10 * GiB,
         "reserved_bytes": 12 * GiB, "peak_allocated_bytes": 11 * GiB, "device_total_bytes": 80 * GiB}
    return json.dumps({**d, **kw}) + "\n"


def leaky_run(folder, stem="run"):
    """Rank 0 leaks 50 MiB a step and keeps 9 GiB of cache; rank 1 is flat: growth, imbalance, fragmentation."""
    (folder / f"{stem}.rank0.jsonl").write_text("".join(
        line(s, allocated_bytes=10 * GiB + s * 50 * MiB, peak_allocated_bytes=11 * GiB + s * 50 * MiB,
             reserved_bytes=20 * GiB + s * 50 * MiB) for s in range(1, 41)))
    (folder / f"{stem}.rank1.jsonl").write_text("".join(
        line(s, rank=1, allocated_bytes=6 * GiB, peak_allocated_bytes=7 * GiB, reserved_bytes=8 * GiB)
        for s in range(1, 41)))
    return folder / f"{stem}.jsonl"


def run(capsys, *argv):
    code = main(["watch", *map(str, argv)])
    out = capsys.readouterr()
    assert code == 0, out.err
    return out.out


def test_every_dot_is_a_samples_number(tmp_path, capsys):
    path = leaky_run(tmp_path)
    page = tmp_path / "watch.html"
    report = json.loads(run(capsys, path, "--gpu", "a100-80gb", "--json", "--html", page))
    items = parse(page.read_text(encoding="utf-8"))
    lines = {r: [json.loads(x) for x in (tmp_path / f"run.rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    for metric, key in (("peak", "peak_allocated_bytes"), ("allocated", "allocated_bytes"),
                        ("reserved", "reserved_bytes")):
        for r in (0, 1):
            got = [(int(e["data-x"]), int(e["data-bytes"])) for e in items
                   if e["tag"] == "circle" and e.get("data-metric") == metric and e.get("data-rank") == str(r)]
            assert got == [(d["step"], d[key]) for d in lines[r]], (metric, r)
    capacity = {int(e["data-bytes"]) for e in items if e["tag"] == "line" and e.get("class") == "capacity"}
    assert capacity == {find_gpu("a100-80gb").memory_bytes}
    top = next(e for e in items if e.get("data-mark") == "peak")
    assert int(top["data-bytes"]) == max(s["peak_bytes"] for s in report["ranks"].values())
    kinds = [e["data-kind"] for e in items if e["tag"] == "li" and "finding" in e.get("class", "")]
    assert kinds == [f["kind"] for f in report["findings"]] and {"growth", "imbalance", "fragmentation"} <= set(kinds)
    growth = next(e for e in items if e.get("data-kind") == "growth")
    assert "50.000 MiB per step" in growth["text"]
    text = page.read_text(encoding="utf-8")
    assert not [e for e in items if e["tag"] in ("script", "link", "img", "iframe")]
    assert not [e for e in items for k in ("src", "href") if k in e] and "http" not in text


def test_capacity_from_the_lines_without_gpu_and_hostile_names_escaped(tmp_path, capsys):
    folder = tmp_path / "<script>alert(1)<"
    folder.mkdir()
    path = leaky_run(folder, stem='"><img src=x>')
    page = tmp_path / "watch.html"
    run(capsys, path, "--html", page)
    text = page.read_text(encoding="utf-8")
    assert "<script" not in text and "<img" not in text and "&lt;script&gt;" in text
    items = parse(text)
    assert {int(e["data-bytes"]) for e in items if e["tag"] == "line" and e.get("class") == "capacity"} == {80 * GiB}

"""`memfit watch ... --html FILE`, what the page adds over the samples: the leak detector's fitted line over the
rank's series and its projection to the capacity (from the growth finding of --json), and each marked phase's
measured peak beside memfit's estimate (vs_estimate.by_phase). Every drawn number is the --json document's."""
from __future__ import annotations

import json
from pathlib import Path

from memfit.interfaces.cli.main import main
from tests.render.test_html import parse
from tests.render.test_html_run import leaky_run, line, run

GiB, MiB = 2**30, 2**20
LF_LORA = Path(__file__).resolve().parents[1] / "formats/examples/llamafactory/examples/train_lora/llama3_lora_sft.yaml"


def charted(items: list[dict]) -> list[tuple[str | None, dict]]:
    """Each element with the id of the <svg> it sits in (None outside one): the parser keeps no parents."""
    out, chart = [], None
    for e in items:
        if e["tag"] == "svg" and e.get("id"):
            chart = e["id"]
        elif e["tag"] in ("figure", "figcaption", "ul", "h2", "p"):
            chart = None
        out.append((chart, e))
    return out


def watch_page(tmp_path, capsys, *argv):
    page = tmp_path / "watch.html"
    doc = json.loads(run(capsys, *argv, "--json", "--html", page))
    return doc, parse(page.read_text(encoding="utf-8"))


def points(items, chart_of, **attrs):
    return [(chart, int(e["data-x"]), int(e["data-bytes"])) for chart, e in chart_of
            if e["tag"] == "circle" and all(e.get(f"data-{k}") == v for k, v in attrs.items())]


def test_the_growth_fit_is_drawn_over_its_series_and_far_projections_are_left_to_the_text(tmp_path, capsys):
    path = leaky_run(tmp_path)  # rank 0: allocated and peak rise exactly 50 MiB a step over 40 steps
    doc, items = watch_page(tmp_path, capsys, path, "--gpu", "a100-80gb")
    g, = [f for f in doc["findings"] if f["kind"] == "growth"]
    assert g["rank"] == 0 and g["series"] in ("allocated", "peak")
    got = points(items, charted(items), growth="fitted", rank="0")
    assert got == [(f"run-{g['series']}", step, nbytes) for step, nbytes in g["fitted_line"]]
    # an exact leak: the fitted line passes through the samples at its ends
    key = {"allocated": "allocated_bytes", "peak": "peak_allocated_bytes"}[g["series"]]
    samples = {d["step"]: d[key] for d in map(json.loads, (tmp_path / "run.rank0.jsonl").read_text().splitlines())}
    assert all(abs(nbytes - samples[step]) <= 1 for step, nbytes in g["fitted_line"])
    # 80 GiB is ~1,370 steps away, past 4x the run's 40: the chart keeps its steps, the finding says the step
    assert g["reaches_capacity_at_step"] > 4 * 40
    assert not points(items, charted(items), growth="projection")
    assert not [e for e in items if e.get("data-mark") == "capacity-step"]
    growth_text = next(e for e in items if e.get("data-kind") == "growth")["text"]
    assert f"step {g['reaches_capacity_at_step']}" in growth_text


def test_a_near_capacity_is_projected_on_the_peak_chart_with_its_step(tmp_path, capsys):
    path = leaky_run(tmp_path)
    doc, items = watch_page(tmp_path, capsys, path, "--capacity", "16")
    g, = [f for f in doc["findings"] if f["kind"] == "growth"]
    assert 40 < g["reaches_capacity_at_step"] <= 4 * 40
    assert g["projection"][1] == [g["reaches_capacity_at_step"], 16 * GiB]
    got = points(items, charted(items), growth="projection", rank="0")
    assert got == [("run-peak", step, nbytes) for step, nbytes in g["projection"]]
    mark, = [e for e in items if e.get("data-mark") == "capacity-step"]
    assert (mark["data-rank"], int(mark["data-step"])) == ("0", g["reaches_capacity_at_step"])
    # the flat rank has no finding and no fitted line
    assert not points(items, charted(items), growth="fitted", rank="1")


def phased_run(folder, phases: dict[int, dict[str, int]]):
    """Two CUDA ranks, two steps; rank r's step s marks phases[s] scaled by (r + 1) / 2 (rank 1 is the higher)."""
    for rank in (0, 1):
        text = "".join(line(s, rank=rank, phase_peaks={k: v * (rank + 1) // 2 for k, v in phases[s].items()},
                            peak_allocated_bytes=max(phases[s].values()) * (rank + 1) // 2) for s in (1, 2))
        (folder / f"run.rank{rank}.jsonl").write_text(text)
    return folder / "run.jsonl"


def test_each_marked_phase_is_drawn_beside_its_estimate(tmp_path, capsys):
    assert main(["estimate", "--from", str(LF_LORA), "--gpu-mem", "80GiB", "--gpus", "2", "--json"]) == 0
    est = {k: v["total"] for k, v in json.loads(capsys.readouterr().out)["per_rank"]["allocated"]["phases"].items()}
    assert {"forward", "backward"} <= set(est)
    # forward 10% over the estimate at its highest (rank 1, step 2); backward 20% under; nothing else marked
    path = phased_run(tmp_path, {1: {"forward": est["forward"] // 2, "backward": est["backward"] * 8 // 10},
                                 2: {"forward": est["forward"] * 11 // 10, "backward": est["backward"] // 3}})
    doc, items = watch_page(tmp_path, capsys, path, "--estimate-from", LF_LORA)
    rows = doc["vs_estimate"]["by_phase"]
    assert [r["phase"] for r in rows] == ["forward", "backward"]
    assert [r["under_predicted"] for r in rows] == [True, False]
    bars = [(chart, e["data-phase"], e["data-bar"], int(e["data-bytes"])) for chart, e in charted(items)
            if e["tag"] == "rect" and e.get("data-bar")]
    assert bars == [("run-by-phase", r["phase"], bar, r[f"{bar}_bytes"]) for r in rows
                    for bar in ("measured", "estimate")]
    under = [e for chart, e in charted(items) if chart == "run-by-phase" and e["tag"] == "text"
             and e.get("class") == "mark-label"]
    assert [e["text"] for e in under] == ["UNDER"]  # forward's measured column alone
    listed = next(e for e in items if e.get("id") == "vs-estimate")["text"]
    assert "forward (allocated peak of the phase)" in listed and "UNDER-predicted" in listed


def test_no_phase_chart_without_marks_or_without_an_estimate(tmp_path, capsys):
    est = {"forward": 5 * GiB, "backward": 7 * GiB}
    path = phased_run(tmp_path, {1: est, 2: est})
    _, items = watch_page(tmp_path, capsys, path)  # marks, no --estimate-from
    assert not [e for e in items if e.get("id") in ("by-phase", "run-by-phase")]
    for rank in (0, 1):  # an estimate, no marks
        f = tmp_path / f"run.rank{rank}.jsonl"
        f.write_text("".join(json.dumps({k: v for k, v in json.loads(x).items() if k != "phase_peaks"}) + "\n"
                             for x in f.read_text().splitlines()))
    doc, items = watch_page(tmp_path, capsys, path, "--estimate-from", LF_LORA)
    assert doc["vs_estimate"]["available"] and "by_phase" not in doc["vs_estimate"]
    assert not [e for e in items if e.get("id") in ("by-phase", "run-by-phase")]

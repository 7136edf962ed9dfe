"""`memfit doctor LOG --html FILE` with the run's config: memfit's bars for the run, the log's figures as levels
(each the number --json reports), the fixes listed; without a config, one line and exit 2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from memfit.breakdown import CATEGORIES
from memfit.interfaces.cli.main import main
from tests.render.test_html import parse

ROOT = Path(__file__).parents[2]
LOG = ROOT / "tests" / "doctor" / "reports" / "llama31-8b-lora-7x4090-ddp.log"
CONFIG = ROOT / "tests" / "formats" / "examples" / "llamafactory" / "examples" / "train_lora" / \
    "llama31_8b_lora_7x4090.yaml"
ARGS = ["--from", str(CONFIG), "--gpu", "rtx4090", "--gpus", "7"]


def test_bars_are_the_estimate_and_levels_are_the_logs(tmp_path, capsys):
    log = tmp_path / "<script>alert(1)<.log"  # the log's name is shown: escaped
    shutil.copy(LOG, log)
    page = tmp_path / "doctor.html"
    assert main(["doctor", str(log), *ARGS, "--json", "--html", str(page)]) == 0
    diag = json.loads(capsys.readouterr().out)
    assert main(["estimate", *ARGS, "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    text = page.read_text(encoding="utf-8")
    items = parse(text)
    f = max(diag["failures"], key=lambda x: sum(v is not None for v in x.values()))
    levels = {e["class"]: int(e["data-bytes"]) for e in items if e["tag"] == "line" and "data-bytes" in e}
    assert levels == {"capacity": est["gpu_memory_bytes"], "log-total": f["total_bytes"],
                      "log-allocated": f["allocated_bytes"],
                      "log-reserved": f["allocated_bytes"] + f["reserved_unallocated_bytes"]}
    peak = est["per_rank"]["device_total"]["peak_phase"]
    for level in ("allocated", "reserved", "device_total"):
        got = {e["data-category"]: int(e["data-bytes"]) for e in items
               if e["tag"] == "rect" and e.get("data-bar") == level}
        b = est["per_rank"][level]["phases"][peak]
        assert got == {c: b[c] for c in CATEGORIES if b[c]}, level
    fixes = [e for e in items if e["tag"] == "li" and e.get("class") == "fix"]
    assert [int(e["data-rank"]) for e in fixes] == [fx["rank"] for fx in diag["fixes"]] and fixes
    assert "<script" not in text and "&lt;script&gt;" in text and "http" not in text
    assert not [e for e in items if e["tag"] in ("script", "img", "link")]


def test_html_without_a_config_is_one_line(tmp_path, capsys):
    assert main(["doctor", str(LOG), "--html", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("memfit: error: --html") and err.count("\n") == 1
    assert not (tmp_path / "x.html").exists()

"""Record the golden estimates and plans: `python tests/golden/record.py` (rewrites golden.json.gz).

Run it only when a change is meant to move numbers, and say in the change's note which numbers moved and
which real code or measurement shows they should. tests/test_golden.py compares the current code with it.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
sys.path.insert(0, str(HERE))

from scenarios import PLANS, sample  # noqa: E402

GOLDEN = HERE / "golden.json.gz"


def run(args: list[str]) -> tuple[int, dict | None]:
    from memfit.interfaces.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*args, "--json"])
    return code, json.loads(out.getvalue()) if code == 0 else None


def estimate_view(doc: dict) -> dict:
    """What must not move: every byte of the profiles, the verdict and margins, the roles' and groups' numbers."""
    keep = ("params", "per_rank", "host_per_node", "verdict", "margin_bytes", "host_margin_bytes")
    view = {k: doc[k] for k in keep}
    if doc.get("gpu_groups") and len(doc["gpu_groups"]) > 1 or doc.get("method", "sft") not in ("sft", "pt"):
        view["roles"] = [{k: r[k] for k in ("role", "gpus", "trains", "params", "trainable_params", "rows",
                                             "idle", "active", "host_per_node")} for r in doc["roles"]]
        view["gpu_groups"] = [{k: g[k] for k in ("gpus", "peak_bytes", "margin_bytes", "device_total")}
                              for g in doc["gpu_groups"]]
    return view


def plan_view(doc: dict) -> dict:
    def row(r: dict) -> dict:
        return {"verdict": r["verdict"], "device_peak_bytes": r["device_peak_bytes"],
                "host_peak_bytes": r["host_peak_bytes"], "tokens_per_second": r["tokens_per_second"],
                "changes": sorted([c["knob"], str(c["before"]), str(c["after"]), c["device_saving_bytes"],
                                   c["needed_to_fit"]] for c in r["changes"])}

    return {"start": row(doc["start"]), "rows": [row(r) for r in doc["rows"]],
            "closest_miss": row(doc["closest_miss"]) if doc.get("closest_miss") else None}


def record() -> dict:
    estimates = []
    for args in sample():
        code, doc = run(["estimate", *args])
        if code == 0:
            estimates.append({"args": args, "expect": estimate_view(doc)})
    plans = []
    for args in PLANS:
        code, doc = run(["plan", *args])
        assert code == 0, args
        plans.append({"args": args, "expect": plan_view(doc)})
    return {"estimates": estimates, "plans": plans}


if __name__ == "__main__":
    data = record()
    with gzip.open(GOLDEN, "wt") as f:
        json.dump(data, f, separators=(",", ":"))
    print(f"wrote {GOLDEN}: {len(data['estimates'])} estimates, {len(data['plans'])} plans")

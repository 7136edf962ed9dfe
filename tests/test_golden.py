"""Numbers must not move by accident: a few hundred estimates and ten plans, given as `memfit` arguments,
against tests/golden/golden.json.gz (recorded by tests/golden/record.py; re-record only for a change meant to
move numbers, and say in its note which moved and why)."""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "golden"))

from record import GOLDEN, estimate_view, plan_view, run  # noqa: E402

DATA = json.load(gzip.open(GOLDEN, "rt"))


def _first_difference(a, b, path="") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {a!r} != {b!r}"


def test_golden_file_covers_every_kind_of_run():
    args = [" ".join(e["args"]) for e in DATA["estimates"]]
    assert len(args) >= 300
    for needle in ("--zero 3", "--fsdp", "--method dpo", "--method ppo", "--tuning qlora", "--engine ddp"):
        assert any(needle in a for a in args), needle


@pytest.mark.parametrize("case", DATA["estimates"], ids=lambda c: " ".join(c["args"][:2]))
def test_estimate_unchanged(case):
    code, doc = run(["estimate", *case["args"]])
    assert code == 0
    got = estimate_view(doc)
    assert got == case["expect"], _first_difference(got, case["expect"])


@pytest.mark.parametrize("case", DATA["plans"], ids=lambda c: " ".join(c["args"][:2]))
def test_plan_unchanged(case):
    code, doc = run(["plan", *case["args"]])
    assert code == 0
    got = plan_view(doc)
    assert got == case["expect"], _first_difference(got, case["expect"])

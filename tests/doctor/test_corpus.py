"""`memfit doctor` on real OOM and host-kill reports from public issue threads (tests/doctor/corpus/index.toml
cites each): every figure, the phase and the component read back as the thread shows them."""
import re
import tomllib
from pathlib import Path

import pytest

from memfit.interfaces.logs import parse_log
from memfit.interfaces.logs.diagnose import diagnose

CORPUS = Path(__file__).parent / "corpus"
CASES = tomllib.loads((CORPUS / "index.toml").read_text())["case"]
UNIT = {"bytes": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}
FIELDS = {"tried": "tried_to_allocate_bytes", "total": "total_bytes", "free": "free_bytes",
          "allocated": "allocated_bytes", "unallocated": "reserved_unallocated_bytes",
          "other": "other_processes_bytes"}


def nbytes(text: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+) (\w+)", text).groups()
    return float(number) * UNIT[unit]


def close(got, want: float) -> bool:
    """Within the rounding of the printed figures (2 decimals of the unit, and sums of three such figures)."""
    return got is not None and abs(got - want) <= max(0.015 * UNIT["GiB"] if want >= UNIT["GiB"] else 0.015 * UNIT["MiB"],
                                                      1e-4 * want)


def test_the_corpus_is_large_and_spans_the_forms():
    assert len(CASES) >= 20
    assert len({c["url"] for c in CASES}) == len(CASES)  # one thread per case
    forms = {c.get("form") for c in CASES}
    assert {"pytorch-1.0-1.3", "pytorch-1.4-2.0", "pytorch-2.2+", "cuda-error", "sigkill", "kernel-oom-killer",
            "ray-memory-monitor", "nccl-shm"} <= forms
    repos = {re.match(r"https://github.com/([^/]+/[^/]+)/", c["url"]).group(1) for c in CASES}
    assert {"pytorch/pytorch", "deepspeedai/DeepSpeed", "huggingface/transformers", "hiyouga/LlamaFactory",
            "OpenRLHF/OpenRLHF", "huggingface/trl"} <= repos


@pytest.mark.parametrize("case", CASES, ids=[c["file"] for c in CASES])
def test_case(case):
    report = parse_log((CORPUS / case["file"]).read_text())
    if case["kind"] == "none":
        assert report.failures == []
    else:
        assert len(report.failures) == 1, [f.to_json() for f in report.failures]
        f = report.failures[0]
        assert (f.kind, f.form, f.gpu, f.fragmentation) == (case["kind"], case["form"], case.get("gpu"),
                                                            case["fragmentation"])
        for key, name in FIELDS.items():
            if key in case:
                assert close(getattr(f, name), nbytes(case[key])), (name, getattr(f, name), case[key])
        if "reserved" in case:  # the 1.4-2.0 form prints reserved in total: unallocated is the difference
            assert close(f.reserved_unallocated_bytes, nbytes(case["reserved"]) - nbytes(case["allocated"]))
        assert f.phase == case.get("phase")
        assert (case.get("component") or "") in (f.component or "")
        if "component" not in case:
            assert f.component is None
    assert len(report.timeline) == case.get("timeline", 0)
    kinds = {x["kind"] for x in diagnose(report).findings}
    for want in case.get("findings", []):
        name, _, absent = want.partition(":")
        assert (name in kinds) != bool(absent), (want, kinds)

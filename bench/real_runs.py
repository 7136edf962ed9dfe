"""Real GPU runs against memfit's estimate: how many bytes each one needed beyond what memfit says, by kind of run.

    python bench/real_runs.py            # one line per real run: kind, estimate, excess
    python bench/real_runs.py --json     # the same rows as JSON

The rows the error bands are measured on (bench/error_bands.py). Three sources, in order of authority:
- bench/cuda_h200.json: our own runs on an H200 (bench/cuda_truth.py), when a session had the device;
- cases/published.jsonl: measured memory of public runs;
- cases/user-reports.jsonl: users' fits / OOM labels.
Rows marked reliability "low" are left out (their sources contradict themselves, cases/README.md).

A row's excess is measured bytes minus memfit's estimate on what was measured:
- the device total (nvidia-smi) where the source gives it, also as a secondary number (fms-acceleration's CSV
  carries nvidia-smi's peak `memory.used` in its notes beside torch's allocated): that is what a verdict judges;
- else the row's own basis (allocated / reserved / ...) against the same profile of the estimate; the bytes a real
  run adds beyond that basis (the allocator's cache, the CUDA context) are then not in the row, so such a row
  understates the device total's excess;
- a run that ran out of memory: at least the card's capacity minus memfit's device total (a lower bound; a run
  that fit bounds nothing from below).
A row's group (model, GPUs, method, micro-batch, length) names its configuration: rows of one configuration
measured several times (a plugin switched on and off) share it, so a held-out split by group tests the band on
configurations it was not set on; `split` puts each model's configurations on both sides.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import published  # noqa: E402
from shared_cases import PUBLISHED  # noqa: E402

USER_REPORTS = PUBLISHED.parent / "user-reports.jsonl"
CUDA_ROWS = ROOT / "bench" / "cuda_h200.json"
# fms-acceleration's rows: "nvidia-smi peak memory.used (mean over GPUs) = 28.88 GiB" in the notes
SMI_NOTE = re.compile(r"nvidia-smi peak memory\.used \(mean over GPUs\) = ([\d.]+) GiB")
GIB = 2**30


@dataclass(frozen=True)
class RealRow:
    id: str
    source: str  # cuda_h200 | published | user-reports
    kind: str  # memfit/facts/error_bands.py kind_of: FAMILY/TUNING
    group: str  # the configuration, for a split that holds out whole configurations
    basis: str  # device_total | allocated | reserved | active | unknown | oom (a lower bound)
    estimate: int  # memfit's device total, bytes: what the band is a share of
    excess: int  # measured - memfit on the basis, bytes (negative: memfit over-predicted)

    model: str = ""  # the model's id: the split keeps each model's configurations on both sides

    @property
    def relative(self) -> float:
        return self.excess / self.estimate


def split(rows: list[RealRow]) -> dict[tuple[str, str], str]:
    """(kind, group) -> "fit" or "held_out". Within each kind, the configurations of each model in a fixed
    pseudo-random order (sha256 of the group), one model after another, alternately on each side: a model with two
    or more configurations is on both, the two sides are as large as the configurations allow, and rows of one
    configuration stay together."""
    by_kind: dict[str, dict[str, set[str]]] = {}
    for r in rows:
        by_kind.setdefault(r.kind, {}).setdefault(r.model, set()).add(r.group)
    out: dict[tuple[str, str], str] = {}
    for kind, models in by_kind.items():
        ordered = [g for m in sorted(models, key=lambda m: hashlib.sha256(m.encode()).hexdigest())
                   for g in sorted(models[m], key=lambda g: hashlib.sha256(g.encode()).hexdigest())]
        out |= {(kind, g): ("fit", "held_out")[i % 2] for i, g in enumerate(ordered)}
    return out


def _group(case: dict) -> str:
    keys = ("model", "num_gpus", "method", "micro_batch_size", "seq_len", "gpu_type", "distributed", "zero_stage")
    return "|".join(str(case.get(k)) for k in keys)


def _from_case(case: dict, source: str) -> RealRow | None:
    """The case as a real row, or None when it is not comparable (skipped by the published bench, or a fit label)."""
    from memfit.errors import MemfitError
    from memfit.facts.error_bands import kind_of
    from memfit.roles.estimate import estimate

    try:
        case = published.normalize(case)
        s = published.scenario_for(case)
        e = estimate(s)
    except (published.Skip, MemfitError):
        return None
    if case.get("reliability") == "low":
        return None
    total = e.device_total.peak.total
    smi = SMI_NOTE.search(case.get("notes") or "")
    basis, excess = None, None
    if case.get("outcome") == "oom":  # what a crashed run showed is where it stopped, not what it needed
        basis, excess = "oom", s.hardware.gpu.memory_bytes - total
    elif case.get("basis") == "device_total" or smi:
        measured = float(smi.group(1)) * GIB if smi else _measured(case)
        basis, excess = "device_total", int(measured - total)
    elif case.get("basis") in published.NUMERIC_BASES and case.get("measured_value") is not None:
        profile = getattr(e, published.BASIS_PROFILE[case["basis"]])
        basis, excess = case["basis"], int(_measured(case) - profile.peak.total)
    if basis is None:
        return None
    return RealRow(case["id"], source, kind_of(s), _group(case), basis, total, excess, s.model.id)


def _measured(case: dict) -> float:
    scale = (case.get("num_gpus") or 1) if case.get("value_scope") == "aggregate" else 1
    return case["measured_value"] * published._unit_bytes(case) / scale


def _cuda_rows() -> list[RealRow]:
    """Our own H200 runs (bench/cuda_truth.py --compare's rows), when the file exists."""
    if not CUDA_ROWS.exists():
        return []
    import cuda_truth

    return [RealRow(**row) for row in cuda_truth.real_rows(CUDA_ROWS)]


def sources_digest() -> str:
    """What the real rows were read from, as the first 16 hex digits of a sha256 over the files' bytes."""
    h = hashlib.sha256()
    for path in (CUDA_ROWS, PUBLISHED, USER_REPORTS):
        h.update(path.read_bytes() if path.exists() else b"-")
    return h.hexdigest()[:16]


def real_rows() -> list[RealRow]:
    rows = _cuda_rows()
    for path, source in ((PUBLISHED, "published"), (USER_REPORTS, "user-reports")):
        rows += [r for r in (_from_case(c, source) for c in published.read_cases(path)) if r is not None]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    rows = real_rows()
    part = split(rows)
    if a.json:
        print(json.dumps([asdict(r) | {"part": part[r.kind, r.group]} for r in rows], indent=1))
        return 0
    print(f"{'id':<40}{'kind':<18}{'basis':<14}{'estimate':>9}{'excess':>9}{'rel':>8}  part")
    for r in sorted(rows, key=lambda r: (r.kind, -r.relative)):
        print(f"{r.id:<40}{r.kind:<18}{r.basis:<14}{r.estimate / GIB:9.2f}{r.excess / GIB:9.2f}{r.relative:8.1%}  "
              f"{part[r.kind, r.group]}")
    print(f"{len(rows)} real runs (GiB); next: python bench/error_bands.py to see the bands they set")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The traced peaks behind tests/trace/test_peft_methods.py, kept in peft_traces.json so the suite compares
every row with the estimate in seconds instead of re-tracing each (about 7 minutes on 2 cores).

    python tests/trace/peft_traces.py      # re-trace every row and rewrite peft_traces.json

An entry is used only while its libraries and memfit/trace's code are the ones that traced it (bench/trace_cache.py
stamps both); a stale or missing entry is traced live. test_peft_methods.py fails when the file is stale (so it is
refreshed with the change that made it so) and re-traces a few rows live each run to check the file against the
installed libraries.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from trace_cache import TraceCache, fingerprint, is_stale, library_versions, trace_code_hash  # noqa: E402

PATH = Path(__file__).with_name("peft_traces.json")
COMPARED = ("weights", "gradients", "optimizer_states", "activations", "logits_loss")


def peak_of(phases: dict) -> int:
    """The largest sum of the compared categories over the phases (profile JSON: phase -> category -> bytes)."""
    return max(sum(b.get(c, 0) for c in COMPARED) for b in phases.values())


def trace_phases(s) -> dict:
    from memfit.trace.run import run_trace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {p: b.to_json() for p, b in run_trace(s).profile.phases.items()}


def fresh(entry: dict | None) -> bool:
    return entry is not None and not is_stale(entry, trace_code_hash(), library_versions())


def traced_peak(s, cache: TraceCache) -> tuple[int, bool]:
    """(the traced peak of `s`, whether it came from the file)."""
    entry = cache.get(fingerprint(s))
    if fresh(entry):
        return peak_of(entry["profile"]), True
    return peak_of(trace_phases(s)), False


def refresh(scenarios: dict[str, object]) -> None:
    cache = TraceCache(PATH)
    cache.entries = {}
    for row, s in scenarios.items():
        print(row, flush=True)
        cache.put(fingerprint(s), {"row": row, "versions": library_versions(), "trace_code": trace_code_hash(),
                                   "profile": trace_phases(s)})
        cache.save()


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import memfit.trace.run  # noqa: F401  (import first, then hash the code that was imported)
    from test_peft_methods import cached_rows

    refresh(cached_rows())

"""memfit's analytic estimate vs the fake-tensor trace of the real transformers/PEFT step, over a grid.

    python bench/accuracy.py                      # table + summary (trace results come from the cache)
    python bench/accuracy.py --summary-json       # {"n", "median_abs_pct_error", "max_abs_pct_error", "phase_agreement",
                                                  #  "groups": {"dpo": {...}, "moe": {...}, "peft": {...}}}
    python bench/accuracy.py --quick              # ~20 rows
    python bench/accuracy.py --rows qwen3,lora    # rows whose id contains every comma-separated part
    python bench/accuracy.py --refresh --jobs 2   # re-trace (the selected rows) instead of reading the cache

Every row is one single-GPU, plain-PyTorch (engine single) run on an A100-80GB: a catalog model x
full/LoRA x checkpointing x attention x micro-batch x sequence length x bf16-pure/bf16-mixed x
foreach/fused AdamW. The headline summary is the 162-row SFT grid's; groups beside it add DPO rows (OpenRLHF's
step: policy + frozen bf16 reference on chosen + rejected rows, against the estimate), more MoE
families, and PEFT methods besides LoRA (IA3, VeRA, AdaLoRA, LoHa, LoKr, OFT, BOFT, prompt / p-tuning, LN tuning),
summarised as groups. For each row the estimate's *allocated* profile is compared with the trace's:
- total peak: the estimate counts only the categories the trace models (weights, gradients,
  optimizer states, activations, logits/loss); its runtime_overhead (cuBLAS workspace) and
  engine_buffers are left out, because the trace does not model them;
- activation peak: the largest activations + logits_loss over the phases (at each phase's peak
  moment), i.e. the at-peak value whenever the peak falls in forward or backward;
- peak phase.

Trace cache: the trace is deterministic for a given scenario, torch/transformers/peft and trace code,
and the full grid takes 25-45 minutes to trace on 2 cores (--jobs 2), so results live in
bench/trace_cache.json, keyed by a fingerprint of what the trace reads from the scenario
(TRACE_INPUTS, the model's architecture, the GPU's compute capability). The file is meant to be committed: a re-run after an analytic-model
change takes seconds, CI and machines without torch can run the bench, and a refresh shows up as a
reviewable diff. Each entry records the library versions and a hash of memfit/trace/*.py; entries
from other versions or trace code are still used, but counted as stale in the output, and
`--refresh-stale` re-traces just those, and `--restamp` re-traces the --quick rows and, if they match
the cache exactly, marks every entry current (for trace changes that do not touch the grid).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))

from accuracy_grid import GPU_ID, GROUPS, GridRow, all_rows, grid, quick_grid, select  # noqa: E402,F401
from trace_cache import (CACHE_PATH, CACHE_SCHEMA, TraceCache, fill_cache, fingerprint, is_stale,  # noqa: E402,F401
                         library_versions, restamp, trace_code_hash)

from memfit.breakdown import Breakdown, PhaseProfile  # noqa: E402
from memfit.errors import MemfitError  # noqa: E402
from memfit.facts.catalog import find_model  # noqa: E402
from memfit.facts.scenario import Scenario  # noqa: E402
from memfit.roles.estimate import estimate  # noqa: E402
from memfit.roles.result import Estimate  # noqa: E402
from memfit.facts.versions import installed  # noqa: E402
from memfit.interfaces.render.common import show  # noqa: E402

ROWS_PATH = ROOT / "bench" / "accuracy_rows.json"
# The categories the trace models; the estimate's other ones (runtime_overhead, engine_buffers) are
# not part of the comparison.
COMPARED = ("weights", "gradients", "optimizer_states", "activations", "logits_loss")
ACTIVATION_PARTS = ("activations", "logits_loss")
STEP_PHASES = ("forward", "backward", "optimizer_step")
GIB = 2**30


# ---------------------------------------------------------------------------------------------- comparing
def _profile_from_json(phases: dict) -> PhaseProfile:
    return PhaseProfile({p: Breakdown({c: v for c, v in b.items() if c != "total"}) for p, b in phases.items()})


def comparable(b: Breakdown) -> Breakdown:
    return Breakdown({c: b.get(c) for c in COMPARED})


def _activation_peak(profile: PhaseProfile) -> int:
    return max((sum(profile.phases[p].get(c) for c in ACTIVATION_PARTS) for p in STEP_PHASES
                if p in profile.phases), default=0)


def _pct(estimated: int, traced: int) -> float | None:
    return None if traced == 0 else 100.0 * (estimated - traced) / traced


@dataclass
class Comparison:
    row: GridRow
    key: str
    status: str = "ok"  # ok / refused (the trace refuses the scenario) / untraced / error
    reason: str = ""
    estimate: PhaseProfile | None = None  # allocated, compared categories only, training phases
    trace: PhaseProfile | None = None
    trace_seconds: float | None = None
    stale: bool = False
    runtime_overhead: int = 0  # estimate bytes left out of the comparison
    details: dict = field(default_factory=dict)  # trace marks / extras / kernels

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def est_total(self) -> int:
        return self.estimate.peak.total

    @property
    def trace_total(self) -> int:
        return self.trace.peak.total

    @property
    def total_error(self) -> float:
        return _pct(self.est_total, self.trace_total)

    @property
    def est_act(self) -> int:
        return _activation_peak(self.estimate)

    @property
    def trace_act(self) -> int:
        return _activation_peak(self.trace)

    @property
    def act_error(self) -> float | None:
        return _pct(self.est_act, self.trace_act)

    @property
    def phase_agrees(self) -> bool:
        return self.estimate.peak_phase == self.trace.peak_phase

    def deltas_at_peak(self) -> dict[str, int]:
        """estimate minus trace, per category, each at its own peak."""
        return {c: self.estimate.peak.get(c) - self.trace.peak.get(c) for c in COMPARED}

    def to_json(self) -> dict:
        out = {"id": self.row.id, "fingerprint": self.key, "status": self.status,
               "knobs": {k: v for k, v in self.row.knobs().items() if v is not None},
               "model": self.row.model if isinstance(self.row.model, str) else self.row.model.id}
        if not self.ok:
            return out | {"reason": self.reason}
        return out | {
            "total_peak": {"estimate": self.est_total, "trace": self.trace_total,
                           "error_pct": round(self.total_error, 3)},
            "activation_peak": {"estimate": self.est_act, "trace": self.trace_act,
                                "error_pct": None if self.act_error is None else round(self.act_error, 3)},
            "peak_phase": {"estimate": self.estimate.peak_phase, "trace": self.trace.peak_phase},
            "delta_at_peak": self.deltas_at_peak(),
            "phases": {p: {"estimate": self.estimate.phases[p].to_json(), "trace": self.trace.phases[p].to_json()}
                       for p in STEP_PHASES if p in self.trace.phases and p in self.estimate.phases},
            "estimate_left_out": {"runtime_overhead": self.runtime_overhead},
            "trace_marks": self.details.get("marks", {}),
            "trace_extras": self.details.get("extras", {}),
            "trace_kernels": self.details.get("kernels", {}),
            "trace_seconds": self.trace_seconds,
            "stale_trace": self.stale,
        }


def compare(row: GridRow, scenario: Scenario, est: Estimate, entry: dict, stale: bool = False) -> Comparison:
    key = fingerprint(scenario)
    if "refused" in entry:
        return Comparison(row, key, "refused", entry["refused"])
    alloc = est.allocated
    estimate_profile = PhaseProfile({p: comparable(alloc.phases[p]) for p in STEP_PHASES if p in alloc.phases})
    trace_profile = _profile_from_json({p: b for p, b in entry["profile"].items() if p in STEP_PHASES})
    trace_profile = PhaseProfile({p: comparable(b) for p, b in trace_profile.phases.items()})
    return Comparison(row, key, "ok", "", estimate_profile, trace_profile, entry.get("seconds"), stale,
                      alloc.peak.get("runtime_overhead") + alloc.peak.get("engine_buffers"),
                      {k: entry.get(k, {}) for k in ("marks", "extras", "kernels")})


def evaluate(rows: list[GridRow], cache: TraceCache) -> list[Comparison]:
    code, versions = trace_code_hash(), library_versions()
    out = []
    for row in rows:
        try:
            scenario = row.scenario()
            key = fingerprint(scenario)
            entry = cache.get(key)
            if entry is None:
                out.append(Comparison(row, key, "untraced", "not in the trace cache (run with --refresh)"))
                continue
            est = estimate(scenario)
        except MemfitError as e:
            out.append(Comparison(row, "", "error", f"estimate: {e}"))
            continue
        out.append(compare(row, scenario, est, entry, is_stale(entry, code, versions)))
    return out


# ---------------------------------------------------------------------------------------------- summary
def summary(comparisons: list[Comparison]) -> dict:
    ok = [c for c in comparisons if c.ok]
    errs = [abs(c.total_error) for c in ok]
    return {
        "n": len(ok),
        "median_abs_pct_error": round(statistics.median(errs), 2) if errs else None,
        "max_abs_pct_error": round(max(errs), 2) if errs else None,
        "phase_agreement": round(sum(c.phase_agrees for c in ok) / len(ok), 4) if ok else None,
    }


def scoreboard(comparisons: list[Comparison]) -> list[Comparison]:
    """The rows of the 162-row SFT grid: the headline summary, comparable across versions."""
    ids = {r.id for r in grid()}
    return [c for c in comparisons if c.row.id in ids]


def group_summaries(comparisons: list[Comparison]) -> dict:
    """Median / max |error| of the groups beside the SFT grid (DPO rows, MoE rows from both lists), and of the
    framework paths traced on their own code (bench/framework_paths.py)."""
    from framework_paths import framework_groups

    return {name: summary([c for c in comparisons if member(c.row)])
            for name, member in GROUPS.items()} | framework_groups()


def extended_summary(comparisons: list[Comparison]) -> dict:
    ok = [c for c in comparisons if c.ok]
    act = [abs(c.act_error) for c in ok if c.act_error is not None]
    models = {c.row.model if isinstance(c.row.model, str) else c.row.model.id for c in ok}
    families = {(find_model(m).arch if isinstance(m, str) else m) for m in models}
    by_status: dict[str, int] = {}
    for c in comparisons:
        by_status[c.status] = by_status.get(c.status, 0) + 1
    return summary(comparisons) | {
        "activation_median_abs_pct_error": round(statistics.median(act), 2) if act else None,
        "activation_max_abs_pct_error": round(max(act), 2) if act else None,
        "within_2pct": sum(abs(c.total_error) <= 2 for c in ok),
        "within_8pct": sum(abs(c.total_error) <= 8 for c in ok),
        "models": len(models), "families": len(families),
        "rows_by_status": by_status,
        "stale_traces": sum(c.stale for c in ok),
    }


def _gib(b: int) -> str:
    return f"{b / GIB:.2f}"


def _err(e: float | None) -> str:
    return "" if e is None else f"{e:+.1f}"


def _worst_delta(c: Comparison) -> str:
    deltas = c.deltas_at_peak()
    cat = max(deltas, key=lambda k: abs(deltas[k]))
    return f"{cat} {deltas[cat] / GIB:+.2f}" if deltas[cat] else ""


def print_table(comparisons: list[Comparison], console=None, title: str = "memfit estimate vs trace") -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(width=200)
    table = Table(title=f"{title} (allocated GiB; err % = (estimate - trace) / trace)")
    for col, justify in (("row", "left"), ("est peak", "right"), ("trace peak", "right"), ("err %", "right"),
                         ("est act", "right"), ("trace act", "right"), ("act err %", "right"),
                         ("peak phase est / trace", "left"), ("largest delta at peak (GiB)", "left")):
        table.add_column(col, justify=justify, no_wrap=col == "row")
    for c in comparisons:
        if not c.ok:
            table.add_row(c.row.id, "", "", "", "", "", "", f"[dim]{c.status}[/]", f"[dim]{c.reason[:70]}[/]")
            continue
        err = c.total_error
        style = "red" if abs(err) > 8 else ("yellow" if abs(err) > 2 else "green")
        phase = (f"{c.estimate.peak_phase}" if c.phase_agrees
                 else f"[red]{c.estimate.peak_phase} / {c.trace.peak_phase}[/]")
        table.add_row(c.row.id + (" [dim](stale)[/]" if c.stale else ""), _gib(c.est_total), _gib(c.trace_total),
                      f"[{style}]{err:+.1f}[/]", _gib(c.est_act), _gib(c.trace_act), _err(c.act_error), phase,
                      _worst_delta(c))
    show(console, table)


def write_rows(comparisons: list[Comparison], path: Path = ROWS_PATH) -> None:
    doc = {"schema": "memfit.accuracy_rows/1", "gpu": GPU_ID, "versions": installed(),
           "compared_categories": list(COMPARED), "summary": extended_summary(scoreboard(comparisons)),
           "groups": group_summaries(comparisons),
           "rows": [c.to_json() for c in comparisons]}
    path.write_text(json.dumps(doc, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--summary-json", action="store_true", help="print only the summary as JSON")
    p.add_argument("--quick", action="store_true", help="about 20 rows")
    p.add_argument("--rows", help="filter: comma-separated alternatives of '+'-joined id substrings")
    p.add_argument("--refresh", action="store_true", help="re-trace the selected rows")
    p.add_argument("--refresh-stale", action="store_true", help="re-trace rows traced by other trace code/versions")
    p.add_argument("--restamp", action="store_true",
                   help="re-trace the --quick rows (or --rows); if all match the cache, mark every entry current")
    p.add_argument("--no-trace", action="store_true", help="never trace; rows missing from the cache are listed")
    p.add_argument("--jobs", type=int, default=1, help="parallel trace processes (default 1)")
    p.add_argument("--cache", default=str(CACHE_PATH))
    p.add_argument("--rows-json", default=str(ROWS_PATH), help="per-row details (estimate vs trace per category)")
    p.add_argument("--worst", type=int, default=15, help="rows in the worst-rows table")
    a = p.parse_args(argv)
    rows = select(quick_grid() if a.quick else all_rows(), a.rows)
    if not rows:
        print("accuracy.py: error: no grid row matches --rows", file=sys.stderr)
        return 2
    cache = TraceCache(Path(a.cache))
    log = (lambda *x: print(*x, file=sys.stderr)) if a.summary_json else print
    if a.restamp:
        return 0 if restamp(cache, select(quick_grid(), a.rows), a.jobs, log) else 1
    traced_s = 0.0
    if not a.no_trace:
        traced_s = fill_cache(rows, cache, a.refresh, a.refresh_stale, a.jobs, log)
    if not a.quick and not a.rows:  # a full run drops entries no grid row uses (old keys) from the file
        used = {fingerprint(r.scenario()) for r in rows}
        unused = [k for k in cache.entries if k not in used]
        for k in unused:
            del cache.entries[k]
        if unused:
            cache.save()
            log(f"dropped {len(unused)} cache entries no grid row uses")
    started = time.perf_counter()
    comparisons = evaluate(rows, cache)
    compare_s = time.perf_counter() - started
    if a.rows_json and not a.quick and not a.rows:
        write_rows(comparisons, Path(a.rows_json))
    if a.summary_json:  # the SFT grid's summary, then the DPO and MoE groups'
        print(json.dumps(summary(scoreboard(comparisons)) | {"groups": group_summaries(comparisons),
                                                             "versions": installed()}))
        return 0
    print_table(comparisons)
    ok = [c for c in comparisons if c.ok]
    worst = sorted(ok, key=lambda c: -abs(c.total_error))[: a.worst]
    if len(ok) > a.worst:
        print_table(worst, title=f"{len(worst)} worst rows")
    print(json.dumps(extended_summary(scoreboard(comparisons)) | {"groups": group_summaries(comparisons),
                                                                  "versions": installed()}, indent=1))
    print(f"trace {traced_s:.0f} s, estimate + compare {compare_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

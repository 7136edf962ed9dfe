"""A trace for people: the timeline as JSON, and a terminal view (phases, a sparkline, the peak's parts)."""
from __future__ import annotations

import json
from pathlib import Path

from memfit.breakdown import CATEGORIES
from memfit.trace.accountant import TRAINING_PHASES, TimelinePoint
from memfit.trace.run import TraceResult


def write_timeline(result: TraceResult, path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(result.to_json(), indent=None, separators=(",", ":")))
    return path


def _unit(peak: int) -> tuple[str, int]:
    return ("GiB", 2**30) if peak >= 2**30 else ("MiB", 2**20)


def _phase_runs(points: list[TimelinePoint]) -> list[list[TimelinePoint]]:
    runs: list[list[TimelinePoint]] = []
    for p in points:
        if runs and runs[-1][0].phase == p.phase:
            runs[-1].append(p)
        else:
            runs.append([p])
    return runs


def _sparkline(points: list[TimelinePoint], width: int, peak_tick: int) -> tuple[str, str, str]:
    """(bars, phase letters, peak marker) over about `width` columns; each column shows its maximum.

    Columns are shared out per phase in proportion to its allocations, at least 3 per phase, so
    the optimizer step (few, large allocations) stays visible next to thousands in backward."""
    bars = "▁▂▃▄▅▆▇█"
    if not points:
        return "", "", ""
    top = max(p.total for p in points) or 1
    line, phases, marker = [], [], []
    for run in _phase_runs(points):
        cols = max(3, round(width * len(run) / len(points)))
        buckets = [b for b in (run[i * len(run) // cols:(i + 1) * len(run) // cols] for i in range(cols)) if b]
        for bucket in buckets:
            best = max(bucket, key=lambda p: p.total)
            line.append(bars[min(len(bars) - 1, best.total * len(bars) // (top + 1))])
            phases.append({"forward": "F", "backward": "B", "optimizer_step": "O"}.get(best.phase, "?"))
            marker.append("▲" if any(p.tick == peak_tick for p in bucket) else " ")
    return "".join(line), "".join(phases), "".join(marker)


def render(result: TraceResult, console) -> None:
    """Compact timeline of the last step (peak marked) and the breakdown at each phase's peak."""
    from rich.table import Table

    profile = result.profile
    last = result.steps - 1
    peak_phase = profile.peak_phase
    peak_tick = max((p.tick for p in result.step_timeline(last)
                     if p.phase == peak_phase and p.total == profile.peak.total), default=-1)
    s = result.scenario
    console.print(f"[bold]memfit trace[/] {s.get('model')}  {s.get('tuning')} {s.get('precision')}  "
                  f"attn={s.get('attention')} ckpt={s.get('checkpointing')}  "
                  f"batch {s.get('micro_batch')} x {s.get('seq_len')}   ({result.seconds:.1f} s, step {last + 1} of "
                  f"{result.steps})")
    unit, scale = _unit(profile.peak.total)
    bars, phases, marker = _sparkline(result.step_timeline(last), 72, peak_tick)
    console.print(f"  live │{bars}│ {profile.peak.total / scale:.2f} {unit} peak")
    console.print(f"       │{phases}│ F forward  B backward  O optimizer")
    console.print(f"       │{marker}│ ▲ peak ({peak_phase})")
    table = Table(title=f"allocated at each phase's peak ({unit}, as torch.cuda.max_memory_allocated counts)")
    table.add_column("category")
    phase_names = [p for p in TRAINING_PHASES if p in profile.phases]
    for phase in phase_names:
        table.add_column(phase + (" ▲" if phase == peak_phase else ""), justify="right")
    for category in CATEGORIES:
        if any(profile.phases[p].get(category) for p in phase_names):
            table.add_row(category, *[f"{profile.phases[p].get(category) / scale:.2f}" for p in phase_names])
    table.add_row("[bold]total", *[f"[bold]{profile.phases[p].total / scale:.2f}" for p in phase_names])
    console.print(table)
    if result.kernels:
        console.print("  attention kernels: " + ", ".join(f"{k} x{v}" for k, v in result.kernels.items()))
    for note in result.notes:
        console.print(f"  [dim]- {note}[/]")

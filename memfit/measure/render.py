"""Terminal view of a MeasureResult (rich). Presentation only: every number comes from the result."""
from __future__ import annotations

from memfit.breakdown import CATEGORIES, PHASES
from memfit.measure.result import MeasureResult

GiB = 2**30
MiB = 2**20


def _size(n: int) -> str:
    """GiB for big numbers, MiB for the small models measure runs on a CPU."""
    return f"{n / GiB:,.2f} GiB" if n >= GiB else f"{n / MiB:,.1f} MiB"


def render(result: MeasureResult, console) -> None:
    from rich.table import Table

    s = result.scenario
    console.print(f"[bold]measured[/] {s.get('model', '')}: {result.engine}, {result.world_size} ranks on "
                  f"{result.device_kind}, {result.steps} steps + checkpoint save + resume "
                  f"({result.wall_seconds:.0f} s)")
    console.print(f"params {result.params_total:,}, trainable {result.params_trainable:,}; micro-batch "
                  f"{s.get('micro_batch')} x {s.get('seq_len')} tokens, grad-accum {s.get('grad_accum')}")
    for note in result.used_instead:
        console.print(f"[yellow]note[/] {note}")
    rank = max(result.ranks, key=lambda r: r.device.peak.total)
    for side, title in (("device", "would be on the GPU (per rank)"), ("host", "host RAM (per rank)")):
        profile = getattr(rank, side)
        if not profile.phases or not profile.peak.total:
            continue
        table = Table(title=f"rank {rank.rank}: {title}, peak in {profile.peak_phase}")
        table.add_column("category")
        phases = [p for p in PHASES if p in profile.phases]
        for p in phases:
            table.add_column(p.replace("_", " "), justify="right")
        for c in CATEGORIES:
            if any(profile.phases[p].get(c) for p in phases):
                table.add_row(c.replace("_", " "), *(_size(profile.phases[p].get(c)) for p in phases))
        table.add_row("[bold]total[/]", *(f"[bold]{_size(profile.phases[p].total)}[/]" for p in phases))
        console.print(table)
    if rank.buffers:
        table = Table(title=f"rank {rank.rank}: the engine's own objects after the last step")
        for col in ("object", "category", "side", "size", "pinned"):
            table.add_column(col, justify="right" if col == "size" else "left")
        for b in sorted(rank.buffers, key=lambda b: -b.storage_bytes):
            table.add_row(b.name, b.category, b.side, _size(b.storage_bytes), "yes" if b.pinned else "")
        console.print(table)
    rss = ", ".join(f"{k} {_size(v)}" for k, v in rank.rss_peak_bytes.items())
    console.print(f"process RSS peak per phase (rank {rank.rank}, includes what would be on the GPU on a CPU run): {rss}")
    console.print(f"host RAM of engine objects per node (sum of ranks' peaks): {_size(result.host_peak_per_node)}; "
                  f"pinned: {_size(sum(r.pinned_host_bytes for r in result.ranks))}")

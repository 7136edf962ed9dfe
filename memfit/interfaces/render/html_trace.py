"""`memfit trace ... --html FILE`: the trace's real timeline (the bytes its tensors hold after every allocation and
free, over all traced steps) with the peak marked, and each phase's peak by category.

Draws `TraceResult.to_json(timeline=True)` (the document `--timeline` writes); computes none of its numbers. A
timeline longer than MAX_POINTS is drawn bucket by bucket at each bucket's highest point, so the peak is kept.
Strings are escaped. Standard library only.
"""
from __future__ import annotations

from html import escape

from memfit.breakdown import CATEGORIES
from memfit.interfaces.render.common import gib
from memfit.interfaces.render.html import page
from memfit.interfaces.render.svg import Column, Line, legend, stacked_chart
from memfit.interfaces.render.svg_line import Mark, Series, line_chart

MAX_POINTS = 4000  # beyond this a polyline adds nothing a reader sees, only bytes
SCALE = 20  # the capacity line is drawn when the traced peak is at least 1/SCALE of it


def totals(doc: dict) -> list[tuple[int, int, int, str]]:
    """(tick, allocated bytes, step, phase) of every timeline point: its parts summed."""
    n = len(doc["timeline_categories"])
    return [(p[0], sum(p[3:3 + n]), p[1], p[2]) for p in doc["timeline"]]


def _thin(points: list[tuple[int, int]]) -> list[tuple[int, int]]:
    if len(points) <= MAX_POINTS:
        return points
    size = -(-len(points) // MAX_POINTS)
    return [max(points[i:i + size], key=lambda p: p[1]) for i in range(0, len(points), size)]


def timeline_chart(doc: dict, capacity: int | None) -> str:
    pts = totals(doc)
    if not pts:
        return '<p class="note">the trace recorded no allocations</p>'
    top = max(pts, key=lambda p: p[1])
    series = Series("allocated (traced tensors)", _thin([(t, b) for t, b, _, _ in pts]), "s0",
                    {"trace": "allocated"}, step=True)
    marks = [Mark(top[0], f"peak {gib(top[1])} GiB (step {top[2]}, {top[3]})",
                  {"mark": "peak", "bytes": str(top[1]), "tick": str(top[0]), "phase": top[3]})]
    # the card's line only where it leaves the timeline readable (a small model's trace is a flat line under it)
    levels: list[Line] = []
    if capacity and top[1] * SCALE >= capacity:
        levels = [Line("capacity", "GPU capacity", capacity)]
    shown = bool(levels)
    note = "" if shown or not capacity else (f'<p class="note">GPU capacity {gib(capacity)} GiB: off this scale '
                                             f"(the traced peak is {top[1] / capacity:.2%} of it)</p>")
    title = "allocated over the trace's events (every allocation and free, all steps)"
    svg = line_chart("trace-timeline", title, [series], levels, marks, "event (allocation or free)")
    return f"<figure><figcaption>{escape(title)}</figcaption>\n{svg}\n{note}</figure>"


def phase_chart(doc: dict) -> str:
    prof = doc["profile"]
    columns = [Column(p, {c: b.get(c, 0) for c in CATEGORIES}, b["total"], {"bar": "trace-phase", "phase": p},
                      mark="peak" if p == prof["peak_phase"] else "") for p, b in prof["phases"].items()]
    title = "each phase's peak by category (the last traced step)"
    return f"<figure><figcaption>{escape(title)}</figcaption>\n{stacked_chart('trace-phases', title, columns)}</figure>"


def trace_page(doc: dict, model: str, gpu: str, capacity: int | None) -> str:
    prof = doc["profile"]
    notes = "".join(f"<li>{escape(str(n))}</li>" for n in doc.get("notes", []))
    kernels = ", ".join(f"{escape(str(k))}: {escape(str(v))}" for k, v in doc.get("kernels", {}).items())
    body = [f"<h1>memfit trace: {escape(model)}</h1>",
            f"<p>the real modeling code on fake tensors, {doc['steps']} step(s) in {doc['seconds']} s on the CPU; "
            f"allocated peak {gib(prof['peak_bytes'])} GiB in {escape(prof['peak_phase'])} (the last step), against "
            f"{escape(gpu)}'s {gib(capacity) if capacity else '?'} GiB (the trace counts tensors only: no allocator "
            "cache, CUDA context or NCCL)</p>",
            legend(), '<div class="charts">', timeline_chart(doc, capacity), phase_chart(doc), "</div>"]
    if kernels:
        body.append(f'<p class="note">attention kernels: {kernels}</p>')
    if notes:
        body += ["<h2>notes</h2>", f'<ul id="notes">{notes}</ul>']
    body.append('<p class="note">memfit trace; numbers as in <code>memfit trace --timeline</code>; GiB = 2^30 '
                "bytes</p>")
    return page(f"memfit trace: {model}", body)

"""`memfit watch ... --html FILE`: a monitored run's page: per rank, the measured peak over the steps (and the
allocated and reserved bytes when the lines have them) against the card's capacity when known, and the
findings (growth, imbalance, fragmentation) with their causes and knobs. A growth finding's fitted line is drawn
over its rank's series (and, on the peak chart, its projection to the capacity when that step is near enough to
show); with --estimate-from and phase marks in the lines, each phase's measured peak beside memfit's estimate.

Draws the memfit.watch/1 document plus the samples' series the command line adds (`series`: rank -> list of
{step, peak, allocated, reserved}); computes none of the numbers. Strings are escaped. Standard library only.
"""
from __future__ import annotations

from html import escape

from memfit.interfaces.render.common import gib
from memfit.interfaces.render.html import page
from memfit.interfaces.render.svg import Column, Line, stacked_chart
from memfit.interfaces.render.svg_line import Mark, Series, line_chart, series_legend

COLOURS = 8
METRICS = (("peak", "measured peak per rank (the allocator's peak on CUDA, the RSS high-water mark on the CPU)"),
           ("allocated", "allocated at each step's end, per rank"),
           ("reserved", "reserved by the allocator at each step's end, per rank"))
# a projection to the capacity is drawn when it lands within this many times the run's last step: further out it
# would squeeze the measured steps into a sliver at the chart's left; the findings' text still says the step
PROJECT_WITHIN = 4


def _series(doc: dict, metric: str) -> list[Series]:
    out = []
    for i, (rank, samples) in enumerate(doc["series"].items()):
        pts = [(s["step"], s[metric]) for s in samples if s.get(metric) is not None]
        if pts:
            out.append(Series(f"rank {rank}", pts, f"s{i % COLOURS}", {"metric": metric, "rank": str(rank)}))
    return out


def _colour(doc: dict, rank) -> str:
    ranks = list(doc["series"])
    return f"s{ranks.index(str(rank)) % COLOURS}" if str(rank) in ranks else "s0"


def _growths(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["kind"] == "growth" and f.get("fitted_line")]


def _growth_lines(doc: dict, metric: str, series: list[Series]) -> tuple[list[Series], list[Mark]]:
    """The detector's fitted lines over the series they were fitted to, and on the peak chart each projection to
    the capacity with a mark at its step (what the finding says, not recomputed)."""
    last = max((x for s in series for x, _ in s.points), default=0)
    lines, marks = [], []
    for g in _growths(doc):
        css, rank = _colour(doc, g["rank"]), str(g["rank"])
        if g["series"] == metric:
            lines.append(Series(f"rank {rank} growth fit", [tuple(p) for p in g["fitted_line"]], f"fit {css}",
                                {"growth": "fitted", "rank": rank}))
        proj = g.get("projection")
        if metric == "peak" and proj and proj[1][0] <= PROJECT_WITHIN * max(last, 1):
            lines.append(Series(f"rank {rank} projected", [tuple(p) for p in proj], f"projection {css}",
                                {"growth": "projection", "rank": rank}))
            marks.append(Mark(proj[1][0], f"rank {rank} reaches capacity: step {proj[1][0]:,}",
                              {"mark": "capacity-step", "rank": rank, "step": str(proj[1][0])}))
    return lines, marks


def _levels(doc: dict) -> list[Line]:
    cap = doc.get("capacity_bytes")
    return [Line("capacity", "device capacity", cap)] if cap else []


def metric_chart(doc: dict, metric: str, title: str) -> str:
    series = _series(doc, metric)
    if not series:
        return ""
    marks = []
    if metric == "peak":  # where the highest measured peak happened
        top = max(((b, x, s.name) for s in series for x, b in s.points))
        marks.append(Mark(top[1], f"highest: {gib(top[0])} GiB ({top[2]}, step {top[1]:,})",
                          {"mark": "peak", "bytes": str(top[0]), "step": str(top[1])}))
    fits, growth_marks = _growth_lines(doc, metric, series)
    svg = line_chart(f"run-{metric}", title, series + fits, _levels(doc), marks + growth_marks, "training step")
    return (f"<figure><figcaption>{escape(title)}</figcaption>\n{svg}\n{series_legend(series + fits)}</figure>")


def _finding(f: dict, text: str) -> str:
    causes = "".join(f"<li>{escape(c)}</li>" for c in f.get("causes", []))
    knobs = "".join(f"<li>{escape(k)}</li>" for k in f.get("knobs", []))
    return (f'<li class="finding" data-kind="{escape(f["kind"])}"><b>{escape(text)}</b>'
            f'<br><span class="muted">likely causes:</span><ul>{causes}</ul>'
            f'<span class="muted">knobs:</span><ul>{knobs}</ul></li>')


def findings_html(doc: dict) -> list[str]:
    items = doc["findings"]
    if not items:
        return ['<p id="findings">no growth, imbalance or fragmentation found</p>']
    return ['<ul id="findings">' + "".join(_finding(f, t) for f, t in zip(items, doc["finding_texts"])) + "</ul>"]


def ranks_table(doc: dict) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("rank", "steps", "last step", "device", "peak GiB", "allocated GiB",
                                              "reserved GiB"))
    rows = "".join(f'<tr data-rank="{escape(r)}" data-peak="{s["peak_bytes"]}"><td>{escape(r)}</td>'
                   f'<td>{s["steps"]}</td><td>{s["last_step"]}</td><td>{escape(s["device_kind"] or "?")}</td>'
                   + "".join(f"<td>{'-' if s[k] is None else gib(s[k])}</td>"
                             for k in ("peak_bytes", "allocated_bytes", "reserved_bytes")) + "</tr>"
                   for r, s in doc["ranks"].items())
    return f'<table id="ranks"><tr>{head}</tr>{rows}</table>'


def _vs_estimate(doc: dict) -> list[str]:
    vs = doc.get("vs_estimate")
    if not vs:
        return []
    if not vs["available"]:
        return [f'<p class="note">vs memfit\'s estimate: {escape(vs["why"])}</p>']
    rows = [f"<li>{escape(basis)}: {_versus(r)}</li>" for basis, r in vs.items() if isinstance(r, dict)]
    rows += [f"<li>{escape(r['phase'])} (allocated peak of the phase): {_versus(r)}</li>"
             for r in vs.get("by_phase", ())]
    return ["<h2>against memfit's estimate</h2>", f'<ul id="vs-estimate">{"".join(rows)}</ul>', *by_phase_chart(doc)]


def _versus(r: dict) -> str:
    pct = "" if r["error_pct"] is None else f" ({r['error_pct']:+.1f}%)"
    return (f"measured {gib(r['measured_bytes'])} GiB, estimate {gib(r['estimate_bytes'])} GiB{pct}: "
            f"{'UNDER-predicted' if r['under_predicted'] else 'covered'}")


def by_phase_chart(doc: dict) -> list[str]:
    """vs_estimate.by_phase as pairs of columns: each marked phase's highest measured peak (over ranks and steps)
    and memfit's estimate of that phase; a measured column over its estimate is marked UNDER."""
    rows = (doc.get("vs_estimate") or {}).get("by_phase")
    if not rows:
        return []
    columns = []
    for r in rows:
        for bar, css, key in (("measured", "s0", "measured_bytes"), ("estimate", "s1", "estimate_bytes")):
            columns.append(Column(f"{r['phase']} {bar}", {bar: r[key]}, r[key], {"phase": r["phase"]},
                                  mark="UNDER" if bar == "measured" and r["under_predicted"] else "", kind="bar",
                                  classes={bar: css}))
    title = "each marked phase: measured peak (allocated) against memfit's estimate"
    legend_key = [Series("measured: the phase's highest peak over ranks and steps", [], "s0"),
                  Series("memfit's estimate of the phase", [], "s1")]
    return ['<figure id="by-phase"><figcaption>' + escape(title) + "</figcaption>",
            stacked_chart("run-by-phase", title, columns, _levels(doc)), series_legend(legend_key), "</figure>"]


def watch_page(doc: dict) -> str:
    cap = doc.get("capacity_bytes")
    where = (f"capacity {gib(cap)} GiB per device" if cap else
             "capacity not known (give --gpu or --capacity, or lines with the device total)")
    charts = [metric_chart(doc, m, t) for m, t in METRICS]
    body = ["<h1>memfit watch: a monitored run</h1>",
            f'<p>{len(doc["ranks"])} rank(s), up to {doc["steps"]} steps; {escape(where)}; sources: '
            f'{escape(", ".join(doc.get("sources", [])))}</p>', ranks_table(doc),
            "<h2>memory over the steps</h2>", '<div class="charts">', *[c for c in charts if c], "</div>",
            "<h2>findings</h2>", *findings_html(doc), *_vs_estimate(doc),
            '<p class="note">memfit watch; numbers as in <code>memfit watch --json</code> and the monitor\'s lines; '
            "GiB = 2^30 bytes</p>"]
    return page("memfit watch", body)


def series_of(by_rank: dict) -> dict:
    """The samples as the page's `series` (rank -> [{step, peak, allocated, reserved}]): what each line draws."""
    return {str(r): [{"step": s.step, "peak": s.peak, "allocated": s.allocated, "reserved": s.reserved} for s in ss]
            for r, ss in by_rank.items()}

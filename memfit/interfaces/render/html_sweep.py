"""The estimate page's extra charts: the device total against the micro-batch and against the sequence length
(from the `sweep` section the command line adds: memfit/planner/sweep.py), and, for several-model runs, each
role's share of every GPU group's bar (from the estimate document's gpu_groups).

Draws the documents' numbers; computes none. Strings are escaped. Standard library only.
"""
from __future__ import annotations

from html import escape

from memfit.interfaces.render.svg import Column, Line, stacked_chart
from memfit.interfaces.render.svg_line import Mark, Series, line_chart

TITLES = {"micro_batch": ("micro-batch", "micro-batch (rows per GPU per step)"),
          "seq_len": ("sequence length", "sequence length (tokens)")}
ROLE_COLOURS = 8  # s0..s7 in svg_line.CSS


def _figure(title: str, svg: str, note: str = "") -> str:
    return f"<figure><figcaption>{escape(title)}</figcaption>\n{svg}\n{note}</figure>"


def sweep_chart(doc: dict, knob: str) -> str:
    sw = doc["sweep"][knob]
    name, x_title = TITLES[knob]
    drawn = [p for p in sw["points"] if p["device_peak_bytes"] is not None]
    series = Series("device total per GPU", [(p["value"], p["device_peak_bytes"]) for p in drawn], "s0",
                    {"knob": knob}, step=False, dot_attrs=[{"verdict": p["verdict"]} for p in drawn])
    marks = [Mark(sw["current"], "this run", {"mark": "current", "value": str(sw["current"])})]
    best = sw["largest_fitting"]
    if best is not None:
        marks.append(Mark(best, f"largest that fits: {best:,}", {"mark": "largest-fitting", "value": str(best)}))
    values = [p["value"] for p in sw["points"]]
    xs = values + [v for v in (best, sw["current"]) if v]
    title = f"device total per GPU against {name}"
    svg = line_chart(f"sweep-{knob}", title, [series] if drawn else [],
                     [Line("capacity", "GPU capacity", doc["gpu_memory_bytes"])], marks, x_title, log_x=True,
                     x_ticks=values, x_range=(min(xs), max(xs)))
    return _figure(title, svg, _sweep_note(sw, name))


def _sweep_note(sw: dict, name: str) -> str:
    best = sw["largest_fitting"]
    said = (f"largest {name} that fits: {best:,} (stops at: {sw['stop'].replace('_', ' ')})" if best is not None
            else f"no {name} fits, down to 1 (runs out of: {sw['stop'].replace('_', ' ')})")
    refused = [p for p in sw["points"] if p["device_peak_bytes"] is None]
    gaps = "".join(f"; {p['value']:,} refused: {escape(p['message'])}" for p in refused[:2])
    return f'<p class="note sweep-note" data-knob="{escape(sw["knob"])}">{escape(said)}{gaps}</p>'


def sweep_section(doc: dict) -> list[str]:
    if not doc.get("sweep"):
        return []
    charts = [sweep_chart(doc, k) for k in ("micro_batch", "seq_len") if k in doc["sweep"]]
    return ["<h2>what fits: the device total as the batch and the sequence grow</h2>",
            '<p class="note">each dot is memfit\'s estimate of this run at that value, everything else fixed '
            "(green fits, amber tight, red out of memory); the dashed mark is the largest value that fits, as "
            "<code>memfit plan --max-batch / --max-seq</code> finds it</p>", '<div class="charts">', *charts, "</div>"]


def role_share_chart(doc: dict) -> str:
    """Each GPU group's device total per GPU at its peak moment, split by the roles on it."""
    roles = list(dict.fromkeys(r["role"] for r in doc["roles"]))
    classes = {r: f"s{i % ROLE_COLOURS}" for i, r in enumerate(roles)}
    columns = []
    for g in doc["gpu_groups"]:
        shares = {r: b["total"] for r, b in g["moments"][g["peak_moment"]].items()}
        order = {r: classes.setdefault(r, f"s{len(classes) % ROLE_COLOURS}") for r in shares}
        columns.append(Column(g["name"], shares, sum(shares.values()),
                              {"bar": "role-share", "group": g["name"], "moment": g["peak_moment"]},
                              kind="role", classes=order))
    title = "each role's share per GPU, by GPU group (at the group's peak moment)"
    key = "".join(f'<li><svg width="12" height="12" aria-hidden="true"><rect class="{c}" width="12" height="12"/>'
                  f"</svg>{escape(r)}</li>" for r, c in classes.items())
    return _figure(title, stacked_chart("role-share", title, columns,
                                        [Line("capacity", "GPU capacity", doc["gpu_memory_bytes"])]),
                   f'<ul class="legend">{key}</ul>')


def role_share_section(doc: dict) -> list[str]:
    groups = doc.get("gpu_groups") or []
    if len(doc.get("roles") or []) < 2 or not all(g.get("moments") and g.get("peak_moment") in g["moments"]
                                                   for g in groups):
        return []
    return [role_share_chart(doc)]

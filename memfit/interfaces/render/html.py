"""`--html FILE`: one self-contained page (inline CSS and SVG, no script, nothing fetched at view time) of an
estimate or a plan, built from the same JSON documents `--json` prints; it shows their numbers and computes none.

Every string that may come from the user or a file (model ids are paths, assumptions quote file names) is
escaped. Standard library only.
"""
from __future__ import annotations

import os
import sys
from html import escape

from memfit.breakdown import CATEGORIES, PHASES
from memfit.interfaces.render.common import GiB, gib
from memfit.interfaces.render.html_sweep import role_share_section, sweep_section
from memfit.interfaces.render.svg import Column, Line, legend, stacked_chart
from memfit.interfaces.render import svg_line

LEVELS = (("allocated", "allocated"), ("reserved", "reserved"), ("device_total", "device total"))
VERDICT_WORDS = {"fits": "FITS", "tight": "TIGHT", "oom": "OOM", "host_oom": "HOST OOM"}

CSS = """
:root { color-scheme: light dark; --bg: #ffffff; --fg: #1b1f24; --muted: #59636e; --grid: #d8dee4;
  --panel: #f6f8fa; --cap: #cf222e; --over: rgba(207, 34, 46, 0.08); --host: #8250df; --mark: #1b1f24;
  --fits: #1a7f37; --tight: #9a6700; --oom: #cf222e;
  --c-weights: #4c78a8; --c-gradients: #c45f00; --c-optimizer_states: #e45756; --c-activations: #2b8a84;
  --c-logits_loss: #3a8a33; --c-engine_buffers: #b279a2; --c-runtime_overhead: #9d755d; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #0d1117; --fg: #e6edf3; --muted: #9198a1; --grid: #30363d; --panel: #161b22; --cap: #ff7b72;
    --over: rgba(255, 123, 114, 0.10); --host: #d2a8ff; --mark: #e6edf3; --fits: #3fb950; --tight: #d29922;
    --oom: #ff7b72; --c-weights: #6fa0d8; --c-gradients: #ffa552; --c-optimizer_states: #ff8a87;
    --c-activations: #8fd3ce; --c-logits_loss: #7fcf74; --c-engine_buffers: #d5a0c8; --c-runtime_overhead: #c49a80; }
}
body { background: var(--bg); color: var(--fg); font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif;
  margin: 0 auto; max-width: 1100px; padding: 1.2em; }
h1 { font-size: 1.35em; margin: 0 0 0.2em; } h2 { font-size: 1.1em; margin: 1.6em 0 0.4em; }
.muted, .note { color: var(--muted); } .note { font-size: 0.9em; }
.verdict { padding: 0.7em 1em; border-radius: 6px; background: var(--panel); border-left: 6px solid var(--muted);
  margin: 1em 0; font-weight: 600; }
.verdict.fits { border-color: var(--fits); } .verdict.tight { border-color: var(--tight); }
.verdict.oom, .verdict.host_oom { border-color: var(--oom); }
.verdict .word { font-size: 1.15em; margin-right: 0.4em; }
.fits .word, td.fits { color: var(--fits); } .tight .word, td.tight { color: var(--tight); }
.oom .word, .host_oom .word, td.oom, td.host_oom { color: var(--oom); }
.charts { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
figure { margin: 0; } figcaption { font-weight: 600; margin-bottom: 0.3em; }
svg.chart { max-width: 100%; height: auto; font-size: 11px; }
svg text { fill: var(--fg); } svg .tick, svg .col-label, svg .axis-title { fill: var(--muted); }
svg .grid { stroke: var(--grid); stroke-width: 1; }
svg .capacity { stroke: var(--cap); stroke-width: 2; stroke-dasharray: 6 3; }
svg .host-ram { stroke: var(--host); stroke-width: 2; stroke-dasharray: 6 3; }
svg .over { fill: var(--over); } svg .mark { fill: none; stroke: var(--mark); stroke-width: 1.5; }
svg .mark-label, svg .total { font-weight: 700; paint-order: stroke; stroke: var(--bg); stroke-width: 3px; }
svg .total { font-weight: 600; } svg .level-label { fill: var(--muted); }
svg .seg { stroke: var(--bg); stroke-width: 0.5; }
""" + "".join(f".cat-{c} {{ fill: var(--c-{c}); }}\n" for c in CATEGORIES) + """
.legend { list-style: none; padding: 0; display: flex; flex-wrap: wrap; gap: 0.4em 1.2em; margin: 0.3em 0; }
.legend svg { vertical-align: -1px; margin-right: 0.35em; }
table { border-collapse: collapse; margin: 0.4em 0; font-variant-numeric: tabular-nums; }
th, td { padding: 0.25em 0.7em; border-bottom: 1px solid var(--grid); text-align: right; vertical-align: top; }
th:first-child, td:first-child, td.text, th.text { text-align: left; }
ul.changes { margin: 0; padding-left: 1.1em; text-align: left; } code { font-size: 0.9em; }
""" + svg_line.CSS


def page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{escape(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
            + "\n".join(body) + "\n</body>\n</html>\n")


_announced: set[str] = set()  # `watch --follow` rewrites its page each update: named once, not per update


def write_page(path: str, text: str) -> None:
    """The page to `path` (an unwritable path raises OSError, which the command line reports in one line), and
    one line on stderr naming where it went: stdout may be a --json document that must stay pure JSON."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    where = os.path.abspath(path)
    if where not in _announced:
        _announced.add(where)
        print(f"wrote the HTML report to {where} (open it in a browser)", file=sys.stderr)


def _phases(profile: dict) -> list[str]:
    return [p for p in PHASES if p in profile["phases"]]


def _parts(b: dict) -> dict[str, int]:
    return {c: b.get(c, 0) for c in CATEGORIES}


def _capacity(doc: dict) -> Line:
    return Line("capacity", "GPU capacity", doc["gpu_memory_bytes"])


# ---------------------------------------------------------------- estimate


def _header(doc: dict) -> list[str]:
    nodes = f" per node, {doc['nodes']} nodes" if doc["nodes"] > 1 else ""
    p = doc["params"]
    return [f"<h1>{escape(doc['model'])}</h1>",
            f"<p>{doc['gpus_per_node']} x {escape(doc['gpu'])} ({gib(doc['gpu_memory_bytes'])} GiB usable){nodes}; "
            f"method {escape(doc['method'])}; params {p['total'] / 1e9:.2f}B, trainable {p['trainable'] / 1e9:.3f}B"
            "</p>"]


def verdict_html(doc: dict) -> str:
    """The verdict with the error band it was judged with (and the host margin when host RAM is known)."""
    v = doc["verdict"]
    rank = doc["per_rank"]["device_total"]
    text = (f"device total {gib(rank['peak_bytes'])} GiB of {gib(doc['gpu_memory_bytes'])} GiB per GPU "
            f"(peak in {escape(rank['peak_phase'])}), margin {gib(doc['margin_bytes'])} GiB; error band "
            f"{doc['band_fraction']:.1%} of the device total ({escape(doc['band_kind'])} runs)")
    if v != "host_oom":  # the chance is the GPU's; beside HOST OOM it read as the run's
        text += f", {doc['oom_chance']:.0%} chance of running out of GPU memory"
    if doc.get("host_margin_bytes") is not None:
        text += f"; host margin {gib(doc['host_margin_bytes'])} GiB per node"
    return (f'<div class="verdict {escape(v)}" id="verdict"><span class="word">{VERDICT_WORDS.get(v, escape(v))}'
            f"</span>{text}</div>")


def rank_chart(doc: dict, chart_id: str = "per-rank") -> str:
    """Allocated, reserved and device total per GPU at the device-total peak phase, by category."""
    rank = doc["per_rank"]
    peak = rank["device_total"]["peak_phase"]
    columns = [Column(label, _parts(rank[key]["phases"][peak]), rank[key]["phases"][peak]["total"],
                      {"bar": key, "phase": peak}) for key, label in LEVELS]
    title = f"per GPU at the peak ({peak}), worst GPU group"
    return _figure(title, stacked_chart(chart_id, title, columns, [_capacity(doc)]))


def group_chart(doc: dict) -> str:
    """Several GPU groups (several-model runs): each group's device total per GPU at its own peak."""
    columns = []
    for g in doc["gpu_groups"]:
        dt = g["device_total"]
        b = dt["phases"][dt["peak_phase"]]
        columns.append(Column(g["name"], _parts(b), b["total"],
                              {"bar": "group", "group": g["name"], "phase": dt["peak_phase"]},
                              mark="worst" if g["name"] == doc["worst_gpu_group"] else ""))
    title = "device total per GPU of each GPU group, at its peak"
    return _figure(title, stacked_chart("per-group", title, columns, [_capacity(doc)]))


def timeline_chart(doc: dict) -> str:
    dt = doc["per_rank"]["device_total"]
    columns = [Column(p, _parts(dt["phases"][p]), dt["phases"][p]["total"], {"bar": "timeline", "phase": p},
                      mark="peak" if p == dt["peak_phase"] else "") for p in _phases(dt)]
    title = "device total per GPU by phase (each phase's own peak)"
    return _figure(title, stacked_chart("timeline", title, columns, [_capacity(doc)]))


def host_chart(doc: dict) -> str:
    host = doc["host_per_node"]
    columns = [Column(p, _parts(host["phases"][p]), host["phases"][p]["total"], {"bar": "host", "phase": p},
                      mark="peak" if p == host["peak_phase"] else "") for p in _phases(host)]
    known = doc.get("host_ram_bytes")
    lines = [Line("host-ram", "host RAM", known)] if known else []
    title = "host RAM per node by phase"
    note = "" if known else '<p class="note">host RAM not given (--host-ram): no line to judge it against</p>'
    return _figure(title, stacked_chart("host", title, columns, lines)) + note


def _figure(title: str, svg: str) -> str:
    return f"<figure><figcaption>{escape(title)}</figcaption>\n{svg}\n</figure>"


def peak_table(doc: dict) -> str:
    rank = doc["per_rank"]
    peak = rank["device_total"]["peak_phase"]
    head = "".join(f"<th>{label}</th>" for _, label in LEVELS)
    rows = [f"<tr><td>{c.replace('_', ' ')}</td>"
            + "".join(f"<td>{gib(rank[k]['phases'][peak][c])}</td>" for k, _ in LEVELS) + "</tr>"
            for c in CATEGORIES]
    rows.append("<tr><th>total</th>" + "".join(f"<th>{gib(rank[k]['phases'][peak]['total'])}</th>"
                                                 for k, _ in LEVELS) + "</tr>")
    return f"<table id=\"peak-table\"><tr><th>GiB per GPU at {escape(peak)}</th>{head}</tr>{''.join(rows)}</table>"


def _roles_table(doc: dict) -> str:
    head = "".join(f'<th class="text">{h}</th>' if h in ("role", "model", "GPU group", "placement") else f"<th>{h}</th>"
                   for h in ("role", "model", "GPU group", "placement", "active GiB/GPU", "host GiB/node"))
    rows = "".join(f'<tr><td>{escape(r["role"])}</td><td class="text">{escape(r["model"])}</td>'
                   f'<td class="text">{escape(r["group"])}</td><td class="text">{escape(r["engine"])}</td>'
                   f'<td>{gib(r["active"]["total"])}</td><td>{gib(r["host_per_node"])}</td></tr>'
                   for r in doc["roles"])
    return f'<table id="roles"><tr>{head}</tr>{rows}</table>'


def _list(title: str, items, list_id: str) -> list[str]:
    if not items:
        return []
    return [f"<h2>{escape(title)}</h2>", f'<ul id="{list_id}">'
            + "".join(f"<li>{escape(str(x))}</li>" for x in items) + "</ul>"]


def estimate_body(doc: dict) -> list[str]:
    """The charts and tables of one estimate document (also the base run's part of a plan page)."""
    several = len(doc["roles"]) > 1 or len(doc["gpu_groups"]) > 1
    charts = [rank_chart(doc)] + ([group_chart(doc)] if len(doc["gpu_groups"]) > 1 else []) + role_share_section(doc)
    body = [verdict_html(doc), legend(), '<div class="charts">', *charts, "</div>", peak_table(doc),
            "<h2>phase timeline</h2>", '<div class="charts">', timeline_chart(doc), host_chart(doc), "</div>",
            *sweep_section(doc)]  # only when the command line computed the sweep (estimate --html)
    if several:
        body += ["<h2>roles</h2>", _roles_table(doc)]
    drivers = [f"{k}: {gib(v)} GiB" for k, v in doc.get("drivers", {}).items()]
    return body + _list("what drives the peak", drivers, "drivers")


def next_section(doc: dict) -> list[str]:
    """What to do next, as the terminal ends with it: the changes that each fit (flags to add), then the command
    that searches further (estimate), or the command that checks the fastest plan (plan)."""
    steps = [f"add {' '.join(s['flags'])}: {gib(s['device_total_bytes'])} GiB per GPU, speed cost "
             f"{s['speed_cost']:+.1%}" for s in doc.get("next_steps", [])]
    commands = [c for c in (doc.get("plan_command"), doc.get("next_command")) if c]
    if not steps and not commands:
        return []
    items = "".join(f"<li>{escape(s)}</li>" for s in steps) + "".join(f"<li><code>{escape(c)}</code></li>"
                                                                       for c in commands)
    return ["<h2>next</h2>", f'<ul id="next">{items}</ul>']


def estimate_page(doc: dict) -> str:
    body = _header(doc) + estimate_body(doc) + _list("assumptions", doc["assumptions"], "assumptions")
    body += next_section(doc)
    body.append('<p class="note">memfit estimate; numbers as in <code>memfit estimate --json</code>; GiB = 2^30 '
                "bytes</p>")
    return page(f"memfit estimate: {doc['model']}", body)


# ---------------------------------------------------------------- plan


def _why(c: dict) -> str:
    return "needed to fit" if c["needed_to_fit"] else "for speed" if c["speed_cost_pct"] <= 0 else "for headroom"


def _change(c: dict) -> str:
    how = "applied alone to the start" if c["measured"] == "alone" else "removed from the plan"
    saving = f"saves {gib(c['device_saving_bytes'])} GiB/GPU ({how})"
    # as the terminal does: the in-plan saving only where the plan changes it by a GiB or more
    if c["measured"] == "alone" and abs(c["in_plan_device_saving_bytes"] - c["device_saving_bytes"]) >= GiB:
        saving += f", {gib(c['in_plan_device_saving_bytes'])} GiB/GPU in this plan"
    if c["host_saving_bytes"]:
        saving += f", {gib(c['host_saving_bytes'])} GiB host/node"
    edit = c.get("code_edit")
    edit_html = (f'<br><span class="note">needs a code edit (no flag): <code>{escape(edit["file"])}::'
                 f'{escape(edit["function"])}(): {escape("; ".join(edit["lines"]))}</code></span>' if edit else "")
    return (f'<li data-knob="{escape(c["knob"])}" data-device-saving="{c["device_saving_bytes"]}" '
            f'data-speed-cost="{c["speed_cost_pct"]}"><b>{escape(c["knob"].replace("_", " "))}</b> '
            f'{escape(str(c["before"]))} &rarr; {escape(str(c["after"]))}: {saving}; speed cost '
            f'{c["speed_cost_pct"]:+.2f}% ({_why(c)}){edit_html}</li>')


def _plan_row(label: str, r: dict, host_known: bool) -> str:
    changes = "".join(_change(c) for c in r["changes"]) or "<li>none</li>"
    host = gib(r["host_peak_bytes"]) + (f" (headroom {gib(r['host_headroom_bytes'])})" if host_known else "")
    return (f'<tr class="plan-row" data-row="{escape(label)}" data-device-peak="{r["device_peak_bytes"]}">'
            f'<td>{escape(label)}</td><td class="text {escape(r["verdict"])}">{escape(r["verdict"])}</td>'
            f'<td>{gib(r["device_peak_bytes"])}</td><td>{gib(r["headroom_bytes"])}</td><td>{host}</td>'
            f'<td>{r["tokens_per_second"]:,.0f}</td><td class="text"><ul class="changes">{changes}</ul></td></tr>')


def plan_table(plan: dict) -> str:
    host_known = plan.get("host_ram_bytes") is not None
    text_columns = ("verdict", "changes: saving and speed cost")
    head = "".join(f'<th class="text">{h}</th>' if h in text_columns else f"<th>{h}</th>"
                   for h in ("#", "verdict", "GiB/GPU", "headroom GiB", "host GiB/node", "tokens/s",
                             "changes: saving and speed cost"))
    rows = [_plan_row("start", plan["start"], host_known)]
    rows += [_plan_row(str(i), r, host_known) for i, r in enumerate(plan["rows"], 1)]
    if not plan["rows"] and plan.get("closest_miss"):
        rows.append(_plan_row("closest miss", plan["closest_miss"], host_known))
    return f'<table id="plan-table"><tr>{head}</tr>{"".join(rows)}</table>'


def plan_page(plan: dict, base: dict) -> str:
    """`plan`: the memfit.plan/1 document; `base`: the memfit.estimate/1 document of its starting scenario."""
    found = (f"{len(plan['rows'])} configuration{'s' * (len(plan['rows']) != 1)} that fit, fastest first"
             if plan["rows"] else "no configuration in memfit's search space fits")
    body = _header(base) + [
        f"<p class=\"muted\">profile {escape(plan['profile'])}; code edits searched: "
        f"{'yes' if plan['code_edits_searched'] else 'no'}; resume judged: {'yes' if plan['resume_judged'] else 'no'}"
        "</p>", f"<h2>plan: {found}</h2>", plan_table(plan), f'<p class="note">{escape(plan["note"])}; saving: the '
        "change applied alone to the start (or, where it cannot stand alone, removed from the plan); speed cost: "
        "the plan with vs without it (negative = faster)</p>", "<h2>the start, as estimated</h2>",
        *estimate_body(base), *_list("assumptions", base["assumptions"], "assumptions"), *next_section(plan)]
    return page(f"memfit plan: {plan['model']}", body)

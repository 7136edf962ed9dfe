"""`memfit doctor LOG --html FILE` (with the run's config): memfit's estimate of the run as bars (allocated,
reserved, device total per GPU at the peak) with the log's own figures as marked levels (the card's total as
PyTorch reported it, what PyTorch had allocated and reserved when it ran out), then the findings and the
ranked fixes.

Draws the memfit.doctor/1 and memfit.estimate/1 documents; computes none of their numbers (the log's reserved
level is its allocated plus its "reserved but unallocated", the two figures PyTorch prints). Strings escaped.
"""
from __future__ import annotations

from html import escape

from memfit.interfaces.render.html import LEVELS, _header, _parts, page, verdict_html
from memfit.interfaces.render.svg import Column, Line, legend, stacked_chart

CSS_KINDS = ("log-total", "log-allocated", "log-reserved")


def log_levels(failure: dict | None) -> list[Line]:
    """The log's figures of its GPU out-of-memory error, as levels (none for a host or NCCL failure)."""
    if not failure or failure.get("kind") != "cuda_oom":
        return []
    out = []
    if failure.get("total_bytes"):
        out.append(Line("log-total", "log: GPU total", failure["total_bytes"]))
    if failure.get("allocated_bytes") is not None:
        out.append(Line("log-allocated", "log: allocated", failure["allocated_bytes"]))
        if failure.get("reserved_unallocated_bytes") is not None:
            out.append(Line("log-reserved", "log: reserved",
                            failure["allocated_bytes"] + failure["reserved_unallocated_bytes"]))
    return out


def primary(diag: dict) -> dict | None:
    """The failure with the most figures (as memfit/interfaces/logs/diagnose.py picks the one the fixes are for)."""
    return max(diag["failures"], key=lambda f: sum(v is not None for v in f.values()), default=None)


def capacity_level(diag: dict, est: dict) -> Line:
    """memfit's capacity of the card. When doctor took the card's capacity from the log (a "capacity" finding),
    the estimate's capacity is the log's total, drawn already: the catalog's figure is drawn, named as such, so
    the page shows the two it reconciled."""
    note = next((x for x in diag["findings"] if x["kind"] == "capacity"), None)
    if note:
        return Line("capacity", "memfit's catalog: GPU capacity (the log's total is used)", note["catalog_bytes"])
    return Line("capacity", "memfit: GPU capacity", est["gpu_memory_bytes"])


def bars_chart(est: dict, failure: dict | None, capacity: Line) -> str:
    rank = est["per_rank"]
    peak = rank["device_total"]["peak_phase"]
    columns = [Column(label, _parts(rank[key]["phases"][peak]), rank[key]["phases"][peak]["total"],
                      {"bar": key, "phase": peak}) for key, label in LEVELS]
    lines = [capacity, *log_levels(failure)]
    title = f"memfit's estimate per GPU at its peak ({peak}), with the log's figures"
    return f"<figure><figcaption>{escape(title)}</figcaption>\n{stacked_chart('doctor', title, columns, lines)}</figure>"


def _fix(fx: dict) -> str:
    edits = "".join(f'<br><span class="note">needs a code edit (no flag): <code>{escape(str(e))}</code></span>'
                    for e in fx.get("code_edits") or [])
    speed = f", {fx['tokens_per_second']:,.0f} tokens/s predicted" if fx.get("tokens_per_second") else ""
    return (f'<li class="fix" data-rank="{fx["rank"]}" data-from="{escape(str(fx["from"]))}">{escape(fx["fix"])} '
            f'<span class="muted">[{escape(str(fx["from"]))}{speed}]</span>{edits}</li>')


def doctor_page(diag: dict, est: dict, log_name: str) -> str:
    failure = primary(diag)
    where = ""
    if failure:
        spot = ", ".join(escape(str(x)) for x in (failure.get("phase"), failure.get("component")) if x)
        where = (f"<p>the log ({escape(log_name)}): {escape(str(failure['kind']))} at line {failure.get('line')}"
                 f"{'; ' + spot if spot else ''}</p>")
    findings = "".join(f'<li data-kind="{escape(str(x["kind"]))}">{escape(x["text"])}</li>' for x in diag["findings"])
    fixes = "".join(_fix(fx) for fx in diag["fixes"])
    chart = bars_chart(est, failure, capacity_level(diag, est))
    body = [*_header(est), where, verdict_html(est), legend(), '<div class="charts">', chart,
            "</div>", "<h2>findings</h2>", f'<ul id="findings">{findings}</ul>',
            "<h2>fixes, best first</h2>", f'<ol id="fixes">{fixes}</ol>',
            '<p class="note">memfit doctor; numbers as in <code>memfit doctor --json</code> and '
            "<code>memfit estimate --json</code>; GiB = 2^30 bytes</p>"]
    css = ("<style>svg .log-total, svg .log-allocated, svg .log-reserved { stroke-width: 2; stroke-dasharray: 2 3; }"
           " svg .log-total { stroke: var(--mark); } svg .log-allocated { stroke: var(--s2); }"
           " svg .log-reserved { stroke: var(--s3); }</style>")
    return page(f"memfit doctor: {log_name}", [css, *body])

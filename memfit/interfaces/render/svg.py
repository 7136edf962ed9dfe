"""Inline SVG charts for the HTML report: stacked columns of bytes by category against a capacity line.

Draws numbers it is given (bytes from an estimate's or a plan's JSON document); it computes none of them.
Only the drawing scale (pixels per byte, the axis ticks) is derived here. Colours come from the page's CSS
classes (cat-<category>), so one chart reads in the light and the dark theme. Standard library only.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from memfit.breakdown import CATEGORIES
from memfit.interfaces.render.common import GiB, gib

# the chart's frame, in SVG user units (the viewBox scales it to the page's width)
HEIGHT, TOP, BOTTOM, LEFT, RIGHT = 300, 34, 56, 64, 160
COLUMN, GAP = 56, 34
TICK_STEPS_GIB = (0.5, 1, 2, 4, 5, 8, 10, 16, 20, 25, 40, 50, 80, 100, 200, 250, 500, 1000, 2000, 5000)


@dataclass
class Column:
    """One stacked column: `parts` (category -> bytes) stacked bottom-up in CATEGORIES order, `total` on top."""

    label: str  # under the column
    parts: dict[str, int]
    total: int
    attrs: dict[str, str] = field(default_factory=dict)  # data-* attributes of every segment (bar, phase, group)
    mark: str = ""  # a word above the total, e.g. "peak"
    kind: str = "category"  # what a segment is (its data-* name): a category, or a role (html_extra.py)
    classes: dict[str, str] = field(default_factory=dict)  # non-category segments: key -> colour class, in order


@dataclass
class Line:
    """A horizontal level across the chart (the card's capacity, host RAM)."""

    kind: str  # css class: capacity | host-ram
    label: str
    nbytes: int


def _ticks(top: int) -> list[int]:
    """Axis ticks in bytes: a round GiB step giving at most six ticks up to `top`."""
    top_gib = top / GiB
    step = next((s for s in TICK_STEPS_GIB if top_gib / s <= 6), None)
    decade = 10 * TICK_STEPS_GIB[-1]
    while step is None:  # past the table (a 10M-token run's TiBs): 1-2-5 steps of ever larger decades
        step = next((m * decade for m in (1, 2, 5) if top_gib / (m * decade) <= 6), None)
        decade *= 10
    n = int(top_gib // step)
    return [round(i * step * GiB) for i in range(n + 1)]


def _attrs(d: dict[str, str]) -> str:
    return "".join(f' data-{escape(k)}="{escape(str(v))}"' for k, v in d.items())


def _tick_label(nbytes: int) -> str:
    return f"{nbytes / GiB:g}"


class _Frame:
    """Maps bytes to y and a column index to x."""

    def __init__(self, columns: list[Column], lines: list[Line]):
        tallest = max([c.total for c in columns] + [ln.nbytes for ln in lines] + [1])
        self.top_bytes = tallest * 1.12  # room above the tallest for its label
        self.plot_h = HEIGHT - TOP - BOTTOM
        self.width = LEFT + len(columns) * (COLUMN + GAP) + RIGHT

    def y(self, nbytes: float) -> float:
        return TOP + self.plot_h * (1 - nbytes / self.top_bytes)

    def x(self, i: int) -> float:
        return LEFT + GAP / 2 + i * (COLUMN + GAP)


def _axis(f: _Frame) -> list[str]:
    out = []
    right = f.width - RIGHT + 8
    for t in _ticks(int(f.top_bytes)):
        y = f"{f.y(t):.1f}"
        out.append(f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{y}" y2="{y}"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{y}" text-anchor="end" dominant-baseline="middle">'
                   f'{_tick_label(t)}</text>')
    out.append(f'<text class="axis-title" x="14" y="{TOP + f.plot_h / 2:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {TOP + f.plot_h / 2:.0f})">GiB</text>')
    return out


def _segments(f: _Frame, i: int, c: Column) -> list[str]:
    out, below = [], 0
    x = f.x(i)
    for cat in tuple(c.classes) or CATEGORIES:
        n = c.parts.get(cat, 0)
        if n <= 0:  # nothing of this kind: no segment (every drawn segment has a height)
            continue
        y0, y1 = f.y(below), f.y(below + n)
        css, key = escape(c.classes.get(cat, f"cat-{cat}")), escape(cat)
        out.append(f'<rect class="seg {css}"{_attrs(c.attrs)} data-{escape(c.kind)}="{key}" data-bytes="{n}" '
                   f'x="{x:.1f}" y="{y1:.2f}" width="{COLUMN}" height="{y0 - y1:.2f}">'
                   f'<title>{escape(c.label)}: {key.replace("_", " ")} {gib(n)} GiB</title></rect>')
        below += n
    top = f.y(c.total)
    out.append(f'<text class="total"{_attrs(c.attrs)} data-bytes="{c.total}" x="{x + COLUMN / 2:.1f}" '
               f'y="{top - 5:.1f}" text-anchor="middle">{gib(c.total)}</text>')
    if c.mark:
        out.append(f'<rect class="mark" x="{x - 3:.1f}" y="{top - 3:.1f}" width="{COLUMN + 6}" '
                   f'height="{f.y(0) - top + 3:.1f}"/>')
        out.append(f'<text class="mark-label" x="{x + COLUMN / 2:.1f}" y="{top - 19:.1f}" '
                   f'text-anchor="middle">{escape(c.mark)}</text>')
    for k, word in enumerate(_wrap(c.label)):
        out.append(f'<text class="col-label" x="{x + COLUMN / 2:.1f}" y="{f.y(0) + 16 + 13 * k:.1f}" '
                   f'text-anchor="middle">{escape(word)}</text>')
    return out


def _wrap(label: str, width: int = 11) -> list[str]:
    """A column label on at most three short lines (phase names like optimizer_step, 'device total')."""
    words, lines = label.replace("_", " ").split(), [""]
    for w in words:
        if lines[-1] and len(lines[-1]) + 1 + len(w) > width:
            lines.append(w)
        else:
            lines[-1] = f"{lines[-1]} {w}".strip()
    return lines[:3]


def _label_ys(f: _Frame, lines: list[Line]) -> list[float]:
    """Each level's label height: at its line, pushed down where levels lie closer than its two text lines."""
    order = sorted(range(len(lines)), key=lambda i: f.y(lines[i].nbytes))
    ys, last = [0.0] * len(lines), -1e9
    for i in order:
        ys[i] = last = max(f.y(lines[i].nbytes), last + 27)
    return ys


def _level(f: _Frame, ln: Line, label_y: float | None = None) -> list[str]:
    y = f"{f.y(ln.nbytes):.1f}"
    ly = f.y(ln.nbytes) if label_y is None else label_y
    right = f.width - RIGHT + 8
    over = (f'<rect class="over" x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{f.y(ln.nbytes) - TOP:.1f}"/>'
            if ln.kind == "capacity" else "")
    return [over, f'<line class="{escape(ln.kind)}" data-bytes="{ln.nbytes}" x1="{LEFT}" x2="{right}" y1="{y}" '
                  f'y2="{y}"/>',
            f'<text class="level-label" x="{right + 4}" y="{ly:.1f}" dominant-baseline="middle">'
            f'{escape(ln.label)}</text>',
            f'<text class="level-label" x="{right + 4}" y="{ly + 13:.1f}" dominant-baseline="middle">'
            f'{gib(ln.nbytes)} GiB</text>']


def stacked_chart(chart_id: str, title: str, columns: list[Column], lines: Sequence[Line] = ()) -> str:
    """An <svg> of stacked columns (bytes by category) with horizontal levels; `title` is its accessible name."""
    levels = list(lines)
    f = _Frame(columns, levels)
    body = [f'<svg class="chart" id="{escape(chart_id)}" role="img" aria-label="{escape(title)}" '
            f'viewBox="0 0 {f.width:.0f} {HEIGHT}" width="{f.width:.0f}" height="{HEIGHT}">',
            f"<title>{escape(title)}</title>"]
    for ln in levels:
        body += _level(f, ln)[:1]  # the over-capacity shade goes under everything
    body += _axis(f)
    for i, c in enumerate(columns):
        body += _segments(f, i, c)
    for ln, ly in zip(levels, _label_ys(f, levels)):
        body += _level(f, ln, ly)[1:]  # the level lines go over the columns
    body.append("</svg>")
    return "\n".join(x for x in body if x)


def legend(categories=CATEGORIES) -> str:
    """The colour key of the categories, as HTML (one per page; the charts share it)."""
    items = "".join(f'<li><svg width="12" height="12" aria-hidden="true"><rect class="cat-{c}" width="12" '
                    f'height="12"/></svg>{c.replace("_", " ")}</li>' for c in categories)
    return f'<ul class="legend">{items}</ul>'

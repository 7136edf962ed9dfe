"""Inline SVG line and step charts for the HTML report: bytes (y) against a count (x: micro-batch, sequence
length, training step, trace event), with horizontal levels (the card's capacity) and vertical marks (the
largest value that fits, the peak).

Like svg.py it draws numbers it is given and computes none; each dot carries its numbers as data-* attributes
so a test (or a reader of the page's source) can check them. Standard library only.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from memfit.interfaces.render.common import gib
from memfit.interfaces.render.svg import Line, _attrs, _tick_label, _ticks

WIDTH, HEIGHT, TOP, BOTTOM, LEFT, RIGHT = 640, 320, 44, 48, 64, 150
MAX_DOTS = 400  # a longer series is drawn as its line only (a trace has thousands of events)


@dataclass
class Series:
    """One line: (x, bytes) points in x order; `css` names its colour class."""

    name: str
    points: Sequence[tuple[float, int]]
    css: str = "s0"
    attrs: dict[str, str] = field(default_factory=dict)  # data-* on its line and every dot
    step: bool = False  # hold each value until the next x (an allocator's level between events)
    dot_attrs: list[dict[str, str]] = field(default_factory=list)  # per point (e.g. its verdict), when given


@dataclass
class Mark:
    """A vertical line at x (the largest fitting value, the peak)."""

    x: float
    label: str
    attrs: dict[str, str] = field(default_factory=dict)


class _Frame:
    def __init__(self, series: list[Series], levels: list[Line], log_x: bool,
                 x_range: tuple[float, float] | None = None):
        xs = [x for s in series for x, _ in s.points] or [1]
        self.log = log_x
        lo, hi = x_range or (min(xs), max(xs))
        self.x0, self.x1 = (self._t(lo), self._t(hi)) if hi > lo else (self._t(lo) - 1, self._t(lo) + 1)
        tallest = max([b for s in series for _, b in s.points] + [ln.nbytes for ln in levels] + [1])
        self.top_bytes = tallest * 1.1
        self.plot_w, self.plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def _t(self, x: float) -> float:
        return math.log2(x) if self.log else x

    def x(self, v: float) -> float:
        return LEFT + self.plot_w * (self._t(v) - self.x0) / (self.x1 - self.x0)

    def y(self, nbytes: float) -> float:
        return TOP + self.plot_h * (1 - nbytes / self.top_bytes)


def _x_ticks(f: _Frame, given: list[float] | None) -> list[float]:
    if given:
        return given
    lo, hi = f.x0, f.x1
    span = hi - lo
    step = next(s * 10**e for e in range(0, 12) for s in (1, 2, 5) if span / (s * 10**e) <= 8)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) // step) + 1)]


def _x_label(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:g}"


def _axes(f: _Frame, x_title: str, x_ticks: list[float] | None) -> list[str]:
    out, right = [], LEFT + f.plot_w
    for t in _ticks(int(f.top_bytes)):
        y = f"{f.y(t):.1f}"
        out.append(f'<line class="grid" x1="{LEFT}" x2="{right}" y1="{y}" y2="{y}"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{y}" text-anchor="end" dominant-baseline="middle">'
                   f'{_tick_label(t)}</text>')
    base = f.y(0)
    for xt in _x_ticks(f, x_ticks):
        x = f"{f.x(xt):.1f}"
        out.append(f'<line class="grid" x1="{x}" x2="{x}" y1="{TOP}" y2="{base:.1f}"/>')
        out.append(f'<text class="tick" x="{x}" y="{base + 14:.1f}" text-anchor="middle">{_x_label(xt)}</text>')
    mid = TOP + f.plot_h / 2
    out.append(f'<text class="axis-title" x="14" y="{mid:.0f}" text-anchor="middle" '
               f'transform="rotate(-90 14 {mid:.0f})">GiB</text>')
    out.append(f'<text class="axis-title" x="{LEFT + f.plot_w / 2:.0f}" y="{HEIGHT - 8}" text-anchor="middle">'
               f'{escape(x_title)}</text>')
    return out


def _path(f: _Frame, s: Series) -> str:
    pts: list[str] = []
    for i, (x, b) in enumerate(s.points):
        if s.step and i:
            pts.append(f"{f.x(x):.1f},{f.y(s.points[i - 1][1]):.1f}")
        pts.append(f"{f.x(x):.1f},{f.y(b):.1f}")
    return (f'<polyline class="series {escape(s.css)}"{_attrs(s.attrs)} data-series="{escape(s.name)}" '
            f'data-count="{len(s.points)}" fill="none" points="{" ".join(pts)}"/>')


def _dots(f: _Frame, s: Series) -> list[str]:
    if len(s.points) > MAX_DOTS:
        return []
    extra = s.dot_attrs or [{}] * len(s.points)
    r = 3.5 if len(s.points) <= 40 else 2.2  # smaller dots where they crowd
    return [f'<circle class="dot {escape(s.css)} {escape(a.get("verdict", ""))}"{_attrs(s.attrs | a)} '
            f'data-series="{escape(s.name)}" data-x="{_x_label(x).replace(",", "")}" data-bytes="{b}" '
            f'cx="{f.x(x):.1f}" cy="{f.y(b):.1f}" r="{r}"><title>{escape(s.name)} at {_x_label(x)}: {gib(b)} GiB'
            f'</title></circle>' for (x, b), a in zip(s.points, extra)]


def _level(f: _Frame, ln: Line) -> list[str]:
    y, right = f.y(ln.nbytes), LEFT + f.plot_w
    return [f'<line class="{escape(ln.kind)}" data-bytes="{ln.nbytes}" x1="{LEFT}" x2="{right}" y1="{y:.1f}" '
            f'y2="{y:.1f}"/>',
            f'<text class="level-label" x="{right + 4}" y="{y:.1f}" dominant-baseline="middle">{escape(ln.label)}'
            f'</text>',
            f'<text class="level-label" x="{right + 4}" y="{y + 13:.1f}" dominant-baseline="middle">'
            f'{gib(ln.nbytes)} GiB</text>']


def _mark(f: _Frame, m: Mark, row: int) -> list[str]:
    """The line, and its label above the plot on its own row (two marks may sit close together)."""
    x = f.x(m.x)
    # the label runs away from the nearer edge so it is never cut off
    anchor, dx = ("start", 3) if x < LEFT + f.plot_w / 2 else ("end", -3)
    return [f'<line class="vmark"{_attrs(m.attrs)} x1="{x:.1f}" x2="{x:.1f}" y1="{TOP - 13 * row - 2}" '
            f'y2="{f.y(0):.1f}"/>',
            f'<text class="mark-label vmark-label" x="{x + dx:.1f}" y="{TOP - 6 - 13 * row}" text-anchor="{anchor}">'
            f'{escape(m.label)}</text>']


def line_chart(chart_id: str, title: str, series: list[Series], levels: Sequence[Line] = (),
               marks: Sequence[Mark] = (), x_title: str = "", log_x: bool = False, x_ticks: list[float] | None = None,
               x_range: tuple[float, float] | None = None) -> str:
    """An <svg> of lines of bytes against x, with horizontal `levels` and vertical `marks`."""
    level_lines, mark_lines = list(levels), list(marks)
    f = _Frame(series, level_lines, log_x, x_range)
    body = [f'<svg class="chart line-chart" id="{escape(chart_id)}" role="img" aria-label="{escape(title)}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}">', f"<title>{escape(title)}</title>"]
    body += _axes(f, x_title, x_ticks)
    for row, m in enumerate(mark_lines[:3]):
        body += _mark(f, m, row)
    for s in series:
        body.append(_path(f, s))
    for s in series:
        body += _dots(f, s)
    for ln in level_lines:
        body += _level(f, ln)
    body.append("</svg>")
    return "\n".join(body)


def series_legend(series: list[Series]) -> str:
    items = "".join(f'<li><svg width="14" height="4" aria-hidden="true"><rect class="{escape(s.css)} swatch" '
                    f'width="14" height="4"/></svg>{escape(s.name)}</li>' for s in series)
    return f'<ul class="legend">{items}</ul>'


# the colours of the lines (s0..s7) and the vertical marks, light and dark; added to the page's CSS
CSS = """
:root { --s0: #4c78a8; --s1: #c45f00; --s2: #3a8a33; --s3: #b279a2; --s4: #e45756; --s5: #2b8a84;
  --s6: #9d755d; --s7: #8a7300; }
@media (prefers-color-scheme: dark) {
  :root { --s0: #6fa0d8; --s1: #ffa552; --s2: #7fcf74; --s3: #d5a0c8; --s4: #ff8a87; --s5: #8fd3ce;
    --s6: #c49a80; --s7: #f5d76e; }
}
svg .series { stroke-width: 2; }
svg polyline.fit { stroke-dasharray: 7 4; } svg polyline.projection { stroke-dasharray: 2 4; } svg .vmark { stroke: var(--mark); stroke-width: 1.5; stroke-dasharray: 3 3; }
svg circle.dot { stroke: var(--bg); stroke-width: 1; }
svg circle.dot.fits { fill: var(--fits); } svg circle.dot.tight { fill: var(--tight); }
svg circle.dot.oom, svg circle.dot.host_oom { fill: var(--oom); }
""" + "".join(f"svg polyline.s{i} {{ stroke: var(--s{i}); }} svg .s{i}.dot, svg rect.s{i}, .legend .s{i}.swatch {{ fill: var(--s{i}); }}\n"
              for i in range(8))

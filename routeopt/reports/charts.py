"""Small inline-SVG charts for the self-contained HTML report (no CDN, no JS needed to draw).

Each chart is a string of SVG markup with `<title>` tooltips on its marks; the report embeds it
as is, so the page renders offline and in a headless browser alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape
from typing import Sequence

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777")
W, H = 580, 330
M_L, M_R, M_T, M_B = 64, 165, 20, 44


@dataclass
class Series:
    name: str
    xs: Sequence[float | None]
    ys: Sequence[float | None]
    labels: Sequence[str] = ()
    line: bool = True
    marker: str = "circle"  # circle | diamond | star | square
    color: str | None = None
    dashed: bool = False
    annotate: bool = False  # write each point's label beside it


@dataclass
class Axis:
    label: str
    log: bool = False
    fmt: str = ".3g"
    lo: float | None = None
    hi: float | None = None
    categories: list[str] = field(default_factory=list)


def _finite(v: float | None) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def _bounds(values: list[float], axis: Axis) -> tuple[float, float]:
    if axis.log:
        values = [v for v in values if v > 0]
    lo = axis.lo if axis.lo is not None else min(values, default=0.0)
    hi = axis.hi if axis.hi is not None else max(values, default=1.0)
    if axis.log:
        lo, hi = math.log10(lo if lo > 0 else 1e-9), math.log10(hi if hi > 0 else 1e-8)
    if hi - lo < 1e-12:
        pad = abs(hi) * 0.1 or (0.5 if axis.log else 1.0)
        lo, hi = lo - pad, hi + pad
    pad = (hi - lo) * 0.06
    return (lo if axis.lo is not None and not axis.log else lo - pad), (
        hi if axis.hi is not None and not axis.log else hi + pad
    )


def _ticks(lo: float, hi: float, axis: Axis) -> list[tuple[float, str]]:
    if axis.log:
        return [(float(e), f"{10.0**e:{axis.fmt}}") for e in range(math.ceil(lo), math.floor(hi) + 1)] or [
            (lo, f"{10**lo:{axis.fmt}}"),
            (hi, f"{10**hi:{axis.fmt}}"),
        ]
    step = 10 ** math.floor(math.log10((hi - lo) / 4))
    for mult in (1, 2, 5, 10):
        if (hi - lo) / (step * mult) <= 6:
            step *= mult
            break
    first = math.ceil(lo / step) * step
    n = int((hi - first) / step + 1e-9) + 1
    return [(first + i * step, f"{first + i * step:{axis.fmt}}") for i in range(max(n, 0))]


def _marker(kind: str, x: float, y: float, color: str, tip: str) -> str:
    title = f"<title>{escape(tip)}</title>"
    if kind == "diamond":
        pts = f"{x},{y - 7} {x + 7},{y} {x},{y + 7} {x - 7},{y}"
        return f'<polygon class="mark" points="{pts}" fill="{color}">{title}</polygon>'
    if kind == "star":
        pts = " ".join(
            f"{x + r * math.sin(k * math.pi / 5):.1f},{y - r * math.cos(k * math.pi / 5):.1f}"
            for k, r in zip(range(10), [8, 3.5] * 5)
        )
        return f'<polygon class="mark" points="{pts}" fill="{color}">{title}</polygon>'
    if kind == "square":
        return (
            f'<rect class="mark" x="{x - 5}" y="{y - 5}" width="10" height="10" fill="{color}">{title}</rect>'
        )
    return f'<circle class="mark" cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="{color}">{title}</circle>'


def _frame(
    title: str, chart_id: str, xs: tuple[float, float, Axis], ys: tuple[float, float, Axis]
) -> list[str]:
    """The SVG element, plot area, grid, ticks and axis labels."""
    (x0, x1, x), (y0, y1, y) = xs, ys
    cat = bool(x.categories)
    out = [
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        f'<rect x="{M_L}" y="{M_T}" width="{W - M_L - M_R}" height="{H - M_T - M_B}" class="plot-bg"/>',
    ]
    for v, label in _ticks(y0, y1, y):
        yy = H - M_B - (v - y0) / (y1 - y0) * (H - M_T - M_B)
        out.append(f'<line class="grid" x1="{M_L}" x2="{W - M_R}" y1="{yy:.1f}" y2="{yy:.1f}"/>')
        out.append(
            f'<text class="tick" x="{M_L - 6}" y="{yy + 4:.1f}" text-anchor="end">{escape(label)}</text>'
        )
    xticks = list(enumerate(x.categories)) if cat else _ticks(x0, x1, x)
    step = max(1, len(xticks) // 8)
    for i, (v, label) in enumerate(xticks):
        if i % step:
            continue
        xx = M_L + (v - x0) / (x1 - x0) * (W - M_L - M_R)
        out.append(
            f'<text class="tick" x="{xx:.1f}" y="{H - M_B + 16}" text-anchor="middle">'
            f"{escape(str(label)[-12:])}</text>"
        )
    out.append(
        f'<text class="axis" x="{(M_L + W - M_R) / 2}" y="{H - 6}" text-anchor="middle">'
        f"{escape(x.label)}</text>"
    )
    out.append(
        f'<text class="axis" transform="translate(14,{(M_T + H - M_B) / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y.label)}</text>'
    )
    return out


def chart(title: str, series: Sequence[Series], x: Axis, y: Axis, *, chart_id: str) -> str:
    """A line/scatter chart; categorical x when `x.categories` is set (e.g. run ids)."""
    cat = bool(x.categories)
    pts = [(s, [(xv, yv) for xv, yv in zip(s.xs, s.ys) if _finite(xv) and _finite(yv)]) for s in series]
    ys = [p[1] for _, ps in pts for p in ps]
    xs = [p[0] for _, ps in pts for p in ps]
    if not ys:
        return f'<div class="chart empty" id="{escape(chart_id)}">{escape(title)}: no data</div>'
    x0, x1 = (-0.5, len(x.categories) - 0.5) if cat else _bounds(xs, x)
    y0, y1 = _bounds(ys, y)

    def px(v: float) -> float:
        v = math.log10(v) if x.log and not cat else v
        return M_L + (v - x0) / (x1 - x0) * (W - M_L - M_R)

    def py(v: float) -> float:
        v = math.log10(v) if y.log else v
        return H - M_B - (v - y0) / (y1 - y0) * (H - M_T - M_B)

    out = _frame(title, chart_id, (x0, x1, x), (y0, y1, y))
    for k, (s, ps) in enumerate(pts):
        color = s.color or PALETTE[k % len(PALETTE)]
        labels = list(s.labels) or [s.name] * len(s.xs)
        tips = [lab for lab, xv, yv in zip(labels, s.xs, s.ys) if _finite(xv) and _finite(yv)]
        coords = [(px(xv), py(yv)) for xv, yv in ps]
        if s.line and len(coords) > 1:
            dash = ' stroke-dasharray="5,4"' if s.dashed else ""
            path = " ".join(f"{a:.1f},{b:.1f}" for a, b in coords)
            out.append(f'<polyline class="series" points="{path}" stroke="{color}" fill="none"{dash}/>')
        for (cx, cy), tip in zip(coords, tips) if s.annotate else ():
            right = cx > W - M_R - 70  # near the legend: write the label on the left
            anchor = f'x="{cx - 7:.1f}" text-anchor="end"' if right else f'x="{cx + 7:.1f}"'
            out.append(f'<text class="label" {anchor} y="{cy - 6:.1f}">{escape(tip[:24])}</text>')
        for (cx, cy), (xv, yv), tip in zip(coords, ps, tips):
            out.append(
                _marker(
                    s.marker,
                    cx,
                    cy,
                    color,
                    f"{tip}: {x.label} {xv:{x.fmt}}, {y.label} {yv:{y.fmt}}"
                    if not cat
                    else f"{tip}: {yv:{y.fmt}}",
                )
            )
        ly = M_T + 14 + 18 * k
        out.append(_marker(s.marker, W - M_R + 14, ly - 4, color, s.name))
        out.append(f'<text class="legend" x="{W - M_R + 26}" y="{ly}">{escape(s.name[:24])}</text>')
    out.append("</svg>")
    return "\n".join(out)

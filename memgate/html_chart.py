"""The HTML report's memory chart, drawn as inline SVG: step bands, axes, curves, budget lines, the peak.

Every text label has a box of its own: tick labels in the margins, step labels above the plot only
where their band is wide enough, budget labels in the column right of the plot, the peak label
inside the plot. Curves are downsampled for drawing only (:mod:`memgate.lttb`); the numbers in the
labels and tooltips are the report's, exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from memgate.chart_data import CURVE_KINDS, GREY, OFF_SCALE, RED, BudgetLine, Curve, StepSpan
from memgate.html_text import BYTE_UNITS, TIME_UNITS, absolute_time, exact_text, relative_time, unit_of
from memgate.html_text import escape as _e  # short: the markup calls it on every value
from memgate.lttb import downsample_steps
from memgate.sizes import format_size

CURVE_HELP = {
    "allocated": "bytes the framework allocator had handed out (the series peak_allocated is measured on)",
    "reserved": "bytes the framework allocator held from the device, handed out or cached (peak_reserved)",
    "app_reserved": "bytes the whole process held on the device, as the driver saw it (peak_app_reserved)",
}
MAX_STEP_BANDS = 2000  # beyond this the bands are one grey blur; say so instead
W, H = 1160, 380
ML, MR, MT, MB = 84, 250, 30, 42  # margins: y labels left, budget labels right, step labels top, x labels bottom
LABEL_X = W - MR + 14  # the budget label column, right of the plot: labels never cross a curve or a line
LABEL_LINE = 13  # px per label line (11 px text)
LABEL_CHARS = 33  # characters per label line that fit the column (at CHAR_W["label"])
CHAR_W = {"label": 7.0, "tick": 7.6, "peak": 7.6}  # generous average glyph widths (px) of each text style


def _nice(x: float) -> float:
    """The smallest 1/2/5 x 10^k step >= x."""
    if x <= 0 or not math.isfinite(x):
        return 1.0
    power = 10.0 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * power >= x * (1 - 1e-12):
            return m * power
    return 10 * power


def _tick_label(v: float, step: float) -> str:
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    return f"{v:.{decimals}f}"


def _fit(text: str, chars: int = LABEL_CHARS) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def _stack(wanted: list[float], height: float, top: float, bottom: float, gap: float = 3.0) -> list[float] | None:
    """Tops of boxes of ``height``, each as near its wanted top as the others allow, none
    overlapping, all within [top, bottom]; None when they do not fit."""
    if len(wanted) * (height + gap) - gap > bottom - top:
        return None
    order = sorted(range(len(wanted)), key=lambda i: wanted[i])
    placed = [0.0] * len(wanted)
    floor = top
    for i in order:  # downwards: no box above its predecessor's bottom
        placed[i] = max(wanted[i], floor)
        floor = placed[i] + height + gap
    ceiling = bottom
    for i in reversed(order):  # upwards: no box below the bottom or its successor's top
        placed[i] = min(placed[i], ceiling - height)
        ceiling = placed[i] - gap
    return placed


@dataclass(frozen=True)
class _Axes:
    t0: int
    t1: int
    ymax: float
    ystep: float = 1.0  # bytes between grid lines
    yfactor: int = 1  # bytes per unit of the y labels
    yunit: str = "B"

    def x(self, t: np.ndarray | int) -> np.ndarray:
        return np.asarray(ML + (np.asarray(t, dtype=np.int64) - self.t0) / max(self.t1 - self.t0, 1) * (W - ML - MR))

    def y(self, v: np.ndarray | float) -> np.ndarray:
        return np.asarray(MT + (1 - np.asarray(v, dtype=np.float64) / self.ymax) * (H - MT - MB))


def _step_path(xs: np.ndarray, ys: np.ndarray) -> str:
    """Step-after path: hold each value until the next sample (``H`` then ``V``)."""
    parts = [f"M{xs[0]:.1f} {ys[0]:.1f}"]
    for x, y in zip(np.round(xs[1:], 1).tolist(), np.round(ys[1:], 1).tolist()):
        parts.append(f"H{x}V{y}")
    return "".join(parts)


def chart(
    curves: list[Curve],
    spans: list[StepSpan],
    lines: list[BudgetLine],
    device_entry: dict[str, Any],
    max_points: int,
) -> tuple[str, list[str]]:
    """(svg markup, legend items): the step bands under everything, then the grid and axes, the
    curves, the budget lines with their labels, and the peak on top."""
    times = [c.t_ns[[0, -1]] for c in curves if len(c.t_ns)]
    if not times:
        return "", []
    t0 = int(min(int(t[0]) for t in times))
    t1 = int(max(int(t[-1]) for t in times))
    data_max = max(int(c.values.max()) for c in curves if len(c.values))
    drawn_lines = [b for b in lines if b.limit <= max(data_max, 1) * OFF_SCALE]
    off_lines = [b for b in lines if b not in drawn_lines]
    top = max([data_max, *(b.limit for b in drawn_lines)], default=1) or 1
    factor, unit = unit_of(top, BYTE_UNITS)
    step = _nice(top * 1.08 / factor / 6) * factor
    axes = _Axes(t0, t1 if t1 > t0 else t0 + 1, math.ceil(top * 1.08 / step) * step, step, factor, unit)
    out: list[str] = [
        (f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
         f'aria-label="memory curves of {_e(device_entry.get("device"))}">'),
        f'<rect x="{ML}" y="{MT}" width="{W - ML - MR}" height="{H - MT - MB}" class="plot"/>',
    ]
    out += _step_bands(spans, axes)
    out += _value_grid(axes)
    out += _time_axis(axes)
    marks, legend = _curve_marks(curves, axes, max_points)
    out += marks
    out += _budget_marks(drawn_lines, axes)
    legend += _budget_legend(lines, off_lines)
    out += _budget_labels(drawn_lines, off_lines, axes)
    out += _peak_mark(device_entry, axes)
    out.append("</svg>")
    return "".join(out), legend


def _step_bands(spans: list[StepSpan], axes: _Axes) -> list[str]:
    """A band per step in the time range; its label only where it fits inside the band."""
    t0 = axes.t0
    visible = [s for s in spans if s.t_end >= t0 and s.t_start <= axes.t1]
    if len(visible) > MAX_STEP_BANDS:
        return []
    out = []
    for i, s in enumerate(visible):
        xa, xb = float(axes.x(max(s.t_start, t0))), float(axes.x(min(s.t_end, axes.t1)))
        text = f"step {s.step}"
        fits = xb - xa >= len(text) * CHAR_W["tick"] + 6
        out.append(
            f'<g class="stepband"><title>step {s.step}: {_e(relative_time(s.t_start, t0))} … '
            f'{_e(relative_time(s.t_end, t0))} ({(s.t_end - s.t_start) / 1e6:.3f} ms) after the profile start; '
            f'from {_e(absolute_time(s.t_start))} to {_e(absolute_time(s.t_end))}</title>'
            f'<rect x="{xa:.1f}" y="{MT}" width="{max(xb - xa, 0.5):.1f}" height="{H - MT - MB}" '
            f'class="band{i % 2}"/>'
            + (f'<text x="{(xa + xb) / 2:.1f}" y="{MT - 8}" class="steplabel">{_e(text)}</text>' if fits else "")
            + "</g>"
        )
    return out


def _value_grid(axes: _Axes) -> list[str]:
    """Horizontal grid lines with their byte labels in the left margin."""
    out = []
    step, factor = axes.ystep, axes.yfactor
    v = 0.0
    while v <= axes.ymax + step / 2:
        y = float(axes.y(v))
        out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{ML - 8}" y="{y + 4:.1f}" class="ylabel">{_tick_label(v / factor, step / factor)} '
                   f"{axes.yunit}</text>")
        v += step
    return out


def _time_axis(axes: _Axes) -> list[str]:
    """Time ticks since the profile start (absolute time on hover), the axis title and line."""
    out = []
    t0 = axes.t0
    span_ns = axes.t1 - axes.t0
    tf, tu = unit_of(span_ns, TIME_UNITS, floor=5)
    tstep = _nice(span_ns / tf / 8)
    k = 0.0
    while k * tf <= span_ns * (1 + 1e-9):
        t = t0 + round(k * tf)
        x = float(axes.x(t))
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{H - MB}" y2="{H - MB + 5}" class="axis"/>'
                   f'<text x="{x:.1f}" y="{H - MB + 18}" class="xlabel"><title>{_e(absolute_time(t))}</title>'
                   f"{_tick_label(k, tstep)}</text>")
        k += tstep
    out.append(f'<text x="{(ML + W - MR) / 2:.0f}" y="{H - 6}" class="xtitle"><title>profile start: '
               f'{_e(absolute_time(t0))}</title>time since the profile start, its first memory sample ({tu})</text>')
    out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{H - MB}" y2="{H - MB}" class="axis"/>')
    return out


def _curve_marks(curves: list[Curve], axes: _Axes, max_points: int) -> tuple[list[str], list[str]]:
    """(paths, legend items) of the curves, step-after, downsampled for drawing only."""
    out: list[str] = []
    legend: list[str] = []
    for c in curves:
        idx = downsample_steps(c.t_ns, c.values, max_points)
        xs, ys = np.asarray(axes.x(c.t_ns[idx])), np.asarray(axes.y(c.values[idx]))
        colour = CURVE_KINDS[c.kind][2]
        out.append(f'<path class="curve {c.kind}" d="{_step_path(xs, ys)}" stroke="{colour}">'
                   f'<title>{_e(c.label)}: {len(c.values)} samples, {len(idx)} drawn; max '
                   f'{int(c.values.max())} B ({_e(format_size(int(c.values.max())))})</title></path>')
        legend.append(f'<span class="key" title="{_e(CURVE_HELP[c.kind])}"><i style="background:{colour}"></i>'
                      f'{_e(c.label)} <small>({len(c.values):,} samples, {len(idx):,} drawn; from '
                      f'{_e(c.source or "-")})</small></span>')
    return out, legend


def _budget_marks(drawn: list[BudgetLine], axes: _Axes) -> list[str]:
    """Budget lines across the plot (their labels are in the column to the right)."""
    out = []
    for b in drawn:
        y = float(axes.y(b.limit))
        colour = RED if b.exceeded else GREY
        verdict = "exceeded" if b.exceeded else "within"
        out.append(
            f'<g class="budget {"exceeded" if b.exceeded else "ok"}"><title>budget {_e(b.budget)}: {_e(b.metric)} '
            f'limit {b.limit} B ({_e(format_size(b.limit))}); this device {_e(exact_text(b.value))} — {verdict}</title>'
            f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" stroke="{colour}" class="budgetline"/></g>'
        )
    return out


def _budget_legend(lines: list[BudgetLine], off: list[BudgetLine]) -> list[str]:
    """A legend item per budget, drawn or off the scale."""
    legend = []
    for b in lines:
        colour = RED if b.exceeded else GREY
        legend.append(f'<span class="key" title="a budget limit: the check fails when this device\'s value is above '
                      f'it"><i class="dash" style="border-color:{colour}"></i>budget {_e(b.budget)} {_e(b.metric)} '
                      f'≤ {_e(format_size(b.limit))}{" — EXCEEDED" if b.exceeded else ""}'
                      + (" (off scale)" if b in off else "") + "</span>")
    return legend


def _budget_labels(drawn: list[BudgetLine], off: list[BudgetLine], axes: _Axes) -> list[str]:
    """Two-line labels in the column right of the plot, each beside its line (a short leader joins
    them where labels had to move apart); budgets off the scale at the top. Full text on hover."""
    items = [(b, float(axes.y(b.limit)), False) for b in drawn] + [(b, float(MT), True) for b in off]
    height = 2 * LABEL_LINE
    placed = _stack([y - height / 2 for _, y, _ in items], height, 4.0, float(H - MB))
    shown = len(items)
    while placed is None:  # more labels than the column holds: the rest are in the legend
        shown -= 1
        placed = _stack([y - height / 2 for _, y, _ in items[:shown]], height, 4.0, float(H - MB - height - 3))
    out = []
    for (b, y, off_scale), top in zip(items[:shown], placed):
        colour = RED if b.exceeded else GREY
        verdict = "EXCEEDED" if b.exceeded else "within"
        first = _fit(("↑ " if off_scale else "") + f"{b.budget}: {b.metric}")
        second = _fit(f"≤ {format_size(b.limit)}" + (" (off scale)" if off_scale else "")
                      + (" — EXCEEDED" if b.exceeded else ""))
        base = top + LABEL_LINE - 3
        leader = "" if off_scale else (
            f'<line x1="{W - MR:.1f}" y1="{y:.1f}" x2="{LABEL_X - 3:.1f}" y2="{top + height / 2:.1f}" '
            f'stroke="{colour}" class="leader"/>')
        out.append(
            f'<g class="budgetnote"><title>budget {_e(b.budget)}: {_e(b.metric)} limit {b.limit} B '
            f'({_e(format_size(b.limit))}); this device {_e(exact_text(b.value))} — {verdict}'
            + (" (above the drawn range)" if off_scale else "") + f"</title>{leader}"
            f'<text x="{LABEL_X}" y="{base:.1f}" fill="{colour}" class="budgetlabel">'
            f'<tspan x="{LABEL_X}">{_e(first)}</tspan><tspan x="{LABEL_X}" dy="{LABEL_LINE}">{_e(second)}</tspan>'
            "</text></g>"
        )
    if shown < len(items):
        out.append(f'<text x="{LABEL_X}" y="{H - MB - 3}" class="budgetlabel more">+{len(items) - shown} more '
                   "budget(s) in the legend</text>")
    return out


def _peak_mark(device_entry: dict[str, Any], axes: _Axes) -> list[str]:
    """The peak, at its exact value and time (LTTB keeps the argmax, so the curve passes through it)."""
    metrics = device_entry.get("metrics", {})
    peak_value, peak_t = metrics.get("peak_allocated_bytes"), device_entry.get("peak_t_ns")
    t0 = axes.t0
    if peak_value is None or peak_t is None or not t0 <= peak_t <= axes.t1:
        return []
    px, py = float(axes.x(peak_t)), float(axes.y(peak_value))
    step_no = device_entry.get("peak_step")
    text = f"peak {format_size(peak_value)}" + (f" · step {step_no}" if step_no is not None else "")
    exact = f"({peak_value} B)"
    width = (len(text) + 1 + len(exact)) * CHAR_W["peak"]
    right = px + 9 + width <= W - MR or px - 9 - width < ML  # inside the plot, right of the point if it fits
    return [
        f'<g class="peak"><title>peak_allocated_bytes = {peak_value} B ({_e(format_size(peak_value))}) at '
        f'{_e(relative_time(peak_t, t0))} after the profile start' + (f", step {step_no}" if step_no is not None else "")
        + f"; {_e(absolute_time(peak_t))}</title>"
        f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{py:.1f}" y2="{H - MB}" class="peakline"/>'
        f'<circle cx="{px:.1f}" cy="{py:.1f}" r="5"/>'
        f'<text x="{px + (9 if right else -9):.1f}" y="{max(py - 8, MT + 14):.1f}" '
        f'text-anchor="{"start" if right else "end"}" class="peaklabel">{_e(text)} '
        f'<tspan class="exact">{exact}</tspan></text></g>'
    ]

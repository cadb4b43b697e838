"""One self-contained HTML page for a CI artifact: curves, steps, budgets, peak holders, metrics.

The page opens offline: CSS and SVG are inline, there is no script, no font, no image and no
URL of any kind (text that contains ``://`` is written with an entity so even a profile path that
looks like a URL is not one in the file). Curves are downsampled for drawing only (LTTB over the
change points of the step-shaped series, :mod:`memgate.lttb`); every number printed — peak,
budgets, holders, metrics — comes from the report entries, exact, never from the kept points.

The chart data (:func:`device_curves`, :func:`budget_lines`, :func:`step_spans`) is shared with
:mod:`memgate.plot`, which draws the same picture with matplotlib.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from memgate import __version__
from memgate.budgets import CROSS_RANK, LIMITS
from memgate.errors import printable
from memgate.lttb import downsample_steps
from memgate.model import APP_COMPONENT, DeviceModel, Profile
from memgate.sizes import format_size
from memgate.table import Table

# Curve kind → (budget metric drawn against it, metric key, colour).
CURVE_KINDS: dict[str, tuple[str, str, str]] = {
    "allocated": ("peak_allocated", "peak_allocated_bytes", "#1f6fb4"),
    "reserved": ("peak_reserved", "peak_reserved_bytes", "#e6820e"),
    "app_reserved": ("peak_app_reserved", "peak_app_reserved_bytes", "#2a9d4b"),
}
BUDGET_METRIC_KIND = {metric: kind for kind, (metric, _, _) in CURVE_KINDS.items()}
RED, GREY = "#d62728", "#5b6470"
MAX_STEP_BANDS = 2000  # beyond this the bands are one grey blur; say so instead
OFF_SCALE = 1.5  # a budget above 1.5x the data is listed, not drawn (it would flatten the curves)


# ---- chart data (shared with memgate.plot) ------------------------------------------------------


@dataclass(frozen=True)
class Curve:
    kind: str  # a CURVE_KINDS key
    label: str  # e.g. "PTA+GE allocated"
    t_ns: np.ndarray  # int64, time order
    values: np.ndarray  # int64 bytes
    source: str | None


@dataclass(frozen=True)
class BudgetLine:
    budget: str
    metric: str  # budget key, e.g. peak_allocated
    kind: str  # the curve it is drawn against
    limit: int
    value: int | None  # this device's exact metric value
    exceeded: bool  # this device's value > limit


@dataclass(frozen=True)
class StepSpan:
    step: int
    t_start: int
    t_end: int


def _find_device(profile: Profile | None, device: str) -> DeviceModel | None:
    if profile is None:
        return None
    return next((d for d in profile.devices if d.device == device), None)


def device_curves(device: DeviceModel, device_entry: dict[str, Any]) -> list[Curve]:
    """Framework allocated and reserved (the series the metrics used) and APP reserved, as int64."""
    curves: list[Curve] = []
    name = device_entry.get("component")
    if name == "blocks":
        from memgate.metrics import block_components, blocks_total  # the curve the metrics measured
        from memgate.reconcile import reconcile

        t, allocated = blocks_total(reconcile(device), block_components(device, "blocks"))
        curves.append(Curve("allocated", "allocated (rebuilt from blocks)", t, allocated, device.blocks_source))
    elif name is not None and name in device.series:
        series = device.series[name]
        for column, kind in (("allocated", "allocated"), ("reserved", "reserved")):
            known = _known(series.frame, column)
            if known is not None:
                curves.append(Curve(kind, f"{name} {column}", *known, series.source))
    app = device.series.get(APP_COMPONENT)
    if app is not None:
        known = _known(app.frame, "reserved")
        if known is not None:
            curves.append(Curve("app_reserved", "APP reserved", *known, app.source))
    return curves


def _known(series: Table, column: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(t_ns, values) of a series' samples where both are known, as int64; None where none is."""
    t_ns, values = series.ints("t_ns"), series.ints(column)
    rows = t_ns.present() & values.present()
    if not rows.any():
        return None
    return (np.asarray(t_ns.values[rows], dtype=np.int64), np.asarray(values.values[rows], dtype=np.int64))


def budget_lines(entry: dict[str, Any], device_entry: dict[str, Any], outcomes: Iterable[dict[str, Any]]) -> list[BudgetLine]:
    """Horizontal limits of this profile's peak budgets, judged against this device's exact value."""
    lines: list[BudgetLine] = []
    seen: set[tuple[str, str]] = set()
    metrics = device_entry.get("metrics", {})
    for o in outcomes:
        kind = BUDGET_METRIC_KIND.get(str(o.get("metric")))
        if kind is None or o.get("profile") != entry.get("path") or o.get("limit") is None:
            continue
        if (o["budget"], o["metric"]) in seen:
            continue
        seen.add((o["budget"], o["metric"]))
        value = metrics.get(CURVE_KINDS[kind][1])
        limit = int(o["limit"])
        lines.append(BudgetLine(str(o["budget"]), str(o["metric"]), kind, limit, value,
                                value is not None and value > limit))
    return lines


def step_spans(entry: dict[str, Any]) -> list[StepSpan]:
    return [StepSpan(int(s["step"]), int(s["t_start"]), int(s["t_end"]))
            for s in entry.get("steps", []) if s.get("t_start") is not None and s.get("t_end") is not None
            and s.get("step") is not None]


# ---- text helpers ------------------------------------------------------------------------------


def _e(value: object) -> str:
    """Escape for text and attribute values; ``://`` as an entity so the file holds no URL; what a
    page cannot show (control characters, a path's bytes that are not UTF-8) as escapes."""
    return html.escape(printable(str(value)), quote=True).replace("://", ":&#47;/")


def _size(value: float | None) -> str:
    return "-" if value is None else format_size(value)


def _exact(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value} B" if isinstance(value, int) else f"{value:.6g} B"


# Budget keys and metric keys (they differ by ``_bytes``) whose values are ratios, from LIMITS' kind.
RATIO_METRICS = frozenset(k for budget_key, (metric_key, kind) in LIMITS.items() if kind == "ratio"
                          for k in (budget_key, metric_key))


def _is_ratio(metric: str) -> bool:
    """A ratio check: a ratio metric, or a ``rank_imbalance[...]`` (1 − min/max over ranks, whatever it compares)."""
    return metric in RATIO_METRICS or metric.startswith(f"{CROSS_RANK}[")


def _metric_text(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if _is_ratio(metric):
        return f"{value:.4f} ({value:.2%})"
    return format_size(value)


def _nice(x: float) -> float:
    """The smallest 1/2/5 x 10^k step >= x."""
    if x <= 0 or not math.isfinite(x):
        return 1.0
    power = 10.0 ** math.floor(math.log10(x))
    for m in (1, 2, 5, 10):
        if m * power >= x * (1 - 1e-12):
            return m * power
    return 10 * power


_BYTE_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))
_TIME_UNITS = ((1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "µs"), (1, "ns"))


def _unit(value: float, units: tuple[tuple[int, str], ...], floor: float = 1.0) -> tuple[int, str]:
    return next(((f, u) for f, u in units if value >= f * floor), units[-1])


def _tick_label(v: float, step: float) -> str:
    decimals = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    return f"{v:.{decimals}f}"


def _relative(t_ns: int, t0: int) -> str:
    d = t_ns - t0
    factor, unit = _unit(abs(d), _TIME_UNITS)
    return f"+{d / factor:.3f} {unit}" if d >= 0 else f"{d / factor:.3f} {unit}"


# Times between 2000 and 2100 read as ns since the epoch; others are a writer's own clock (a
# snapshot's trace index, a trace's relative microseconds).
_EPOCH_RANGE = (946_684_800 * 10**9, 4_102_444_800 * 10**9)


def absolute_time(t_ns: int) -> str:
    """``2025-01-09 07:48:03.573957920 UTC (1736408883573957920 ns since the epoch)``."""
    if _EPOCH_RANGE[0] <= t_ns < _EPOCH_RANGE[1]:
        seconds, ns = divmod(t_ns, 10**9)
        stamp = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
        return f"{stamp}.{ns:09d} UTC ({t_ns} ns since the epoch)"
    return f"t = {t_ns} ns on the writer's clock"


def _when(t_ns: int, t0: int | None) -> str:
    """A time as the page shows it: relative to the profile start, the absolute time on hover."""
    if t0 is None:
        return f'<span title="{_e(absolute_time(t_ns))}">{_e(absolute_time(t_ns))}</span>'
    return f'<span class="time" title="{_e(absolute_time(t_ns))}">{_e(_relative(t_ns, t0))}</span>'


# ---- the chart ---------------------------------------------------------------------------------

W, H = 1160, 380
ML, MR, MT, MB = 84, 250, 30, 42  # margins: y labels left, budget labels right, step labels top, x labels bottom
LABEL_X = W - MR + 14  # the budget label column, right of the plot: labels never cross a curve or a line
LABEL_LINE = 13  # px per label line (11 px text)
LABEL_CHARS = 33  # characters per label line that fit the column (at CHAR_W["label"])
CHAR_W = {"label": 7.0, "tick": 7.6, "peak": 7.6}  # generous average glyph widths (px) of each text style


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
            f'({_e(format_size(b.limit))}); this device {_e(_exact(b.value))} — {verdict}'
            + (" (above the drawn range)" if off_scale else "") + f"</title>{leader}"
            f'<text x="{LABEL_X}" y="{base:.1f}" fill="{colour}" class="budgetlabel">'
            f'<tspan x="{LABEL_X}">{_e(first)}</tspan><tspan x="{LABEL_X}" dy="{LABEL_LINE}">{_e(second)}</tspan>'
            "</text></g>"
        )
    if shown < len(items):
        out.append(f'<text x="{LABEL_X}" y="{H - MB - 3}" class="budgetlabel more">+{len(items) - shown} more '
                   "budget(s) in the legend</text>")
    return out


def _chart(
    curves: list[Curve],
    spans: list[StepSpan],
    lines: list[BudgetLine],
    device_entry: dict[str, Any],
    max_points: int,
) -> tuple[str, list[str]]:
    """(svg markup, legend items). Every text label has a box of its own: tick labels in the
    margins, step labels above the plot only where their band is wide enough, budget labels in the
    column right of the plot, the peak label inside the plot."""
    metrics = device_entry.get("metrics", {})
    peak_value, peak_t = metrics.get("peak_allocated_bytes"), device_entry.get("peak_t_ns")
    times = [c.t_ns[[0, -1]] for c in curves if len(c.t_ns)]
    if not times:
        return "", []
    t0 = int(min(int(t[0]) for t in times))
    t1 = int(max(int(t[-1]) for t in times))
    data_max = max(int(c.values.max()) for c in curves if len(c.values))
    drawn_lines = [b for b in lines if b.limit <= max(data_max, 1) * OFF_SCALE]
    off_lines = [b for b in lines if b not in drawn_lines]
    top = max([data_max, *(b.limit for b in drawn_lines)], default=1) or 1
    factor, unit = _unit(top, _BYTE_UNITS)
    step = _nice(top * 1.08 / factor / 6) * factor
    axes = _Axes(t0, t1 if t1 > t0 else t0 + 1, math.ceil(top * 1.08 / step) * step)
    out: list[str] = [
        (f'<svg class="chart" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" '
         f'aria-label="memory curves of {_e(device_entry.get("device"))}">'),
        f'<rect x="{ML}" y="{MT}" width="{W - ML - MR}" height="{H - MT - MB}" class="plot"/>',
    ]
    # Step bands, under everything else; a band's label only where it fits inside the band.
    visible = [s for s in spans if s.t_end >= t0 and s.t_start <= axes.t1]
    if len(visible) <= MAX_STEP_BANDS:
        for i, s in enumerate(visible):
            xa, xb = float(axes.x(max(s.t_start, t0))), float(axes.x(min(s.t_end, axes.t1)))
            text = f"step {s.step}"
            fits = xb - xa >= len(text) * CHAR_W["tick"] + 6
            out.append(
                f'<g class="stepband"><title>step {s.step}: {_e(_relative(s.t_start, t0))} … '
                f'{_e(_relative(s.t_end, t0))} ({(s.t_end - s.t_start) / 1e6:.3f} ms) after the profile start; '
                f'from {_e(absolute_time(s.t_start))} to {_e(absolute_time(s.t_end))}</title>'
                f'<rect x="{xa:.1f}" y="{MT}" width="{max(xb - xa, 0.5):.1f}" height="{H - MT - MB}" '
                f'class="band{i % 2}"/>'
                + (f'<text x="{(xa + xb) / 2:.1f}" y="{MT - 8}" class="steplabel">{_e(text)}</text>' if fits else "")
                + "</g>"
            )
    # Grid and axes.
    v = 0.0
    while v <= axes.ymax + step / 2:
        y = float(axes.y(v))
        out.append(f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{ML - 8}" y="{y + 4:.1f}" class="ylabel">{_tick_label(v / factor, step / factor)} {unit}</text>')
        v += step
    span_ns = axes.t1 - axes.t0
    tf, tu = _unit(span_ns, _TIME_UNITS, floor=5)
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
    # Curves, step-after, downsampled for drawing only.
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
    # Budget lines across the plot; their labels in the column to the right.
    for b in drawn_lines:
        y = float(axes.y(b.limit))
        colour = RED if b.exceeded else GREY
        verdict = "exceeded" if b.exceeded else "within"
        out.append(
            f'<g class="budget {"exceeded" if b.exceeded else "ok"}"><title>budget {_e(b.budget)}: {_e(b.metric)} '
            f'limit {b.limit} B ({_e(format_size(b.limit))}); this device {_e(_exact(b.value))} — {verdict}</title>'
            f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" stroke="{colour}" class="budgetline"/></g>'
        )
    for b in lines:
        colour = RED if b.exceeded else GREY
        legend.append(f'<span class="key" title="a budget limit: the check fails when this device\'s value is above '
                      f'it"><i class="dash" style="border-color:{colour}"></i>budget {_e(b.budget)} {_e(b.metric)} '
                      f'≤ {_e(format_size(b.limit))}{" — EXCEEDED" if b.exceeded else ""}'
                      + (" (off scale)" if b in off_lines else "") + "</span>")
    out.extend(_budget_labels(drawn_lines, off_lines, axes))
    # The peak, at its exact value and time (LTTB keeps the argmax, so the curve passes through it).
    if peak_value is not None and peak_t is not None and t0 <= peak_t <= axes.t1:
        px, py = float(axes.x(peak_t)), float(axes.y(peak_value))
        step_no = device_entry.get("peak_step")
        text = f"peak {format_size(peak_value)}" + (f" · step {step_no}" if step_no is not None else "")
        exact = f"({peak_value} B)"
        width = (len(text) + 1 + len(exact)) * CHAR_W["peak"]
        right = px + 9 + width <= W - MR or px - 9 - width < ML  # inside the plot, right of the point if it fits
        out.append(
            f'<g class="peak"><title>peak_allocated_bytes = {peak_value} B ({_e(format_size(peak_value))}) at '
            f'{_e(_relative(peak_t, t0))} after the profile start' + (f", step {step_no}" if step_no is not None else "")
            + f"; {_e(absolute_time(peak_t))}</title>"
            f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{py:.1f}" y2="{H - MB}" class="peakline"/>'
            f'<circle cx="{px:.1f}" cy="{py:.1f}" r="5"/>'
            f'<text x="{px + (9 if right else -9):.1f}" y="{max(py - 8, MT + 14):.1f}" '
            f'text-anchor="{"start" if right else "end"}" class="peaklabel">{_e(text)} '
            f'<tspan class="exact">{exact}</tspan></text></g>'
        )
    out.append("</svg>")
    return "".join(out), legend


# ---- what every figure means (tooltips and notes) -------------------------------------------

CURVE_HELP = {
    "allocated": "bytes the framework allocator had handed out (the series peak_allocated is measured on)",
    "reserved": "bytes the framework allocator held from the device, handed out or cached (peak_reserved)",
    "app_reserved": "bytes the whole process held on the device, as the driver saw it (peak_app_reserved)",
}
METRIC_HELP = {
    "peak_allocated_bytes": "max of the framework series' allocated bytes: what the run needed at its worst moment",
    "peak_reserved_bytes": "max of the framework series' reserved bytes: what it took from the device",
    "peak_app_reserved_bytes": "max of the whole-process (APP) reserved bytes: what the device saw the process hold",
    "fragmentation": "per allocator pool 1 − peak allocated ÷ peak reserved; the worst pool (named)",
    "external_fragmentation": "per pool, at each growth of reserved: the free share of the pool just before it "
                              "grew ÷ reserved just after; the largest (0: the pool never grew with memory free)",
    "step_growth_bytes": "bytes per step of persistent growth over the counted steps (one-time jumps and periodic "
                         "patterns do not move it)",
    "leaked_bytes": "bytes of blocks allocated in a counted step (except the last leak_horizon_steps) and still live "
                    "when the last counted step ends",
    "peak_requested_bytes": "snapshot: the allocated peak in the bytes the program requested (before the allocator's "
                            "rounding)",
    "leak_undetermined_bytes": "bytes allocated in the last leak_horizon_steps counted steps and still live at the end",
    "allocated_at_dump_bytes": "snapshot: bytes of active blocks when it was dumped",
    "reserved_at_dump_bytes": "snapshot: bytes of all segments when it was dumped",
    "largest_free_block_bytes": "snapshot: the largest cached (inactive) block at the dump",
    "free_block_fragmentation": "snapshot: 1 − largest inactive block ÷ all inactive bytes",
    "op_max_block_bytes": "per operator, the largest single block it allocated (op_caps budgets it by glob)",
}
CONSISTENCY_NOTE = ("consistency: the share of the checked allocations (those the writer recorded an allocator "
                    "total for) at which that total equals the pre-window baseline plus the bytes of the blocks live "
                    "then; below 100% the totals count memory the block rows do not show (or the reverse), so a curve "
                    "rebuilt from blocks alone is approximate — the peaks above come from the recorded series")
SUM_CHECK_HELP = "a combined series (PTA+GE) checked row by row against the sum of its parts (PTA + GE)"
COLUMN_HELP = {
    # budgets
    "rank": "the rank (process) the profile belongs to; the link goes to the profile",
    "device": "the device whose value decided the verdict (a profile's value is its worst device)",
    "budget": "the budget's name in the budget file, or the test's marker",
    "metric": "the budget key judged (op_caps[glob]: the largest block of the operators matching glob)",
    "measured": "the profile's value (exact on hover)",
    "limit": "the budget's limit (exact on hover); a check passes when measured ≤ limit",
    "headroom": "limit − measured: room left before the check fails (negative: over by that much)",
    "result": "pass, FAIL, error (the value could not be measured: see the message) or not selected (the "
              "budget's devices select none of the profile's)",
    "message": "the verdict line, as pytest and memgate check print it",
    # metrics
    "value": "the value, in IEC units or as a ratio and a percentage",
    "exact": "the exact value: bytes, or the ratio at full precision",
    "pool": "the allocator pool a per-pool metric comes from (its worst pool)",
    "note": "how to read the value, or why it could not be measured",
    # pools
    "peak allocated": "the pool's highest allocated bytes",
    "peak reserved": "the pool's highest reserved bytes",
    "fragmentation": "the pool's 1 − peak allocated ÷ peak reserved",
    "external fragmentation": "the pool's largest free share just before its reserved grew",
    "reserved at its peak from the first sample": "yes: the pool reserved its maximum before the window began, so "
                                                  "its fragmentation reflects memory reserved before profiling",
    # holders and operators
    "#": "rank of the block by size among the blocks live at the peak",
    "size": "the block's size (exact on hover)",
    "bytes": "the exact size in bytes",
    "op": "the operator that allocated the block",
    "stream": "the stream the block was allocated on",
    "owner": "the module, Python frame or owner tag that holds it, where the writer records one",
    "component": "the allocator (series) the block belongs to",
    "allocated at": "when the block was allocated, relative to the profile start (absolute time on hover)",
    "largest block": "the operator's largest block (exact on hover)",
    "live at the peak": "bytes of its blocks live at the device's peak allocated (exact on hover)",
    # reconciliation
    "blocks": "block rows of this allocator in the window",
    "allocated before window": "blocks freed in the window but allocated before it began",
    "open at end": "blocks still live when the window ended",
    "pre-window baseline": "allocator bytes at the window start that no block row accounts for (exact on hover)",
    "baseline bytes": "the pre-window baseline in bytes",
    "consistency": CONSISTENCY_NOTE,
    "checked": "allocations with a recorded allocator total, checked against the baseline",
    # errors
    "profile": "the profile that could not be read",
    "error": "what was wrong, where",
}


# ---- tables ------------------------------------------------------------------------------------


def _table(head: Sequence[str], rows: Iterable[str], cls: str = "") -> str:
    """A table whose every column heading explains its figures on hover (:data:`COLUMN_HELP`)."""
    body = "".join(rows)
    return (f'<table class="{cls}"><thead><tr>'
            + "".join(f'<th title="{_e(COLUMN_HELP[h])}">{_e(h)}</th>' for h in head)
            + f"</tr></thead><tbody>{body}</tbody></table>")


def _size_cell(value: float | None) -> str:
    if value is None:
        return "<td>-</td>"
    return f'<td class="num" title="{_e(_exact(value))}">{_e(_size(value))}</td>'


def _share_text(share: float) -> str:
    return f"{share * 100:.6g}%"


def _limit_text(o: dict[str, Any], capacities: dict[tuple[str, str], int]) -> str:
    """The limit cell: the limit, and for a share of the device's capacity ``75% of 2.00 GiB``."""
    metric, limit = str(o.get("metric", "")), o.get("limit")
    if o.get("limit_text"):
        return str(o["limit_text"])  # a share whose capacity could not be resolved
    text = _metric_text(metric, limit)
    share = o.get("limit_share")
    if share is not None and limit is not None:
        capacity = capacities.get((str(o.get("profile")), str(o.get("device"))))
        if capacity is None and share > 0:
            capacity = round(limit / share)
        text += f" ({_share_text(share)} of {format_size(capacity)})" if capacity else f" ({_share_text(share)})"
    return text


def _measured_text(o: dict[str, Any]) -> str:
    """The measured cell; for a rank_imbalance the worst and the best rank (with their values) named."""
    metric = str(o.get("metric", ""))
    text = _metric_text(metric, o.get("value"))
    if metric.startswith(f"{CROSS_RANK}[") and o.get("worst_rank") is not None:
        inner = metric[len(CROSS_RANK) + 1:-1]
        parts = []
        for which in ("worst", "best"):
            value = o.get(f"{which}_value")
            shown = "" if value is None else " " + _metric_text(inner, value)
            parts.append(f"{which} rank {o.get(f'{which}_rank')}{shown}")
        text += " — " + ", ".join(parts)
    return text


def _capacities(entries: Iterable[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """(profile path, device) → the capacity in bytes the profile records (metadata ``device_capacity_bytes``)."""
    out = {}
    for e in entries:
        recorded = (e.get("metadata") or {}).get("device_capacity_bytes")
        if isinstance(recorded, dict):
            for device, cap in recorded.items():
                if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
                    out[(str(e.get("path")), str(device))] = cap
    return out


def _budget_rows(outcomes: list[dict[str, Any]], anchors: dict[str, str],
                 capacities: dict[tuple[str, str], int] | None = None) -> list[str]:
    rows = []
    for o in outcomes:
        metric = str(o.get("metric", ""))
        value, limit = o.get("value"), o.get("limit")
        if o.get("skipped"):
            result, cls = "not selected", "skipped"
        elif o.get("error") or o.get("passed") is None:
            result, cls = "error", "error"
        else:
            result, cls = ("pass", "pass") if o["passed"] else ("FAIL", "fail")
        headroom = "-"
        if o.get("limit_text"):
            pass  # the share's capacity is unknown: no limit to measure room against
        elif value is not None and limit is not None and not _is_ratio(metric):
            headroom = format_size(limit - value)
        elif value is not None and limit is not None:
            headroom = f"{limit - value:+.4f}"
        anchor = anchors.get(str(o.get("profile")))
        rank = _e(o.get("rank", "?"))
        rank_cell = f'<a href="#{anchor}">{rank}</a>' if anchor else rank
        rows.append(
            f'<tr class="{cls}"><td>{rank_cell}</td><td>{_e(o.get("device") or "-")}</td><td>{_e(o.get("budget"))}</td>'
            f"<td>{_e(metric)}</td>"
            f'<td class="num" title="{_e(_exact(value))}">{_e(_measured_text(o))}</td>'
            f'<td class="num" title="{_e(_exact(limit))}">{_e(_limit_text(o, capacities or {}))}</td>'
            f'<td class="num">{_e(headroom)}</td><td class="result">{result}</td>'
            f'<td class="msg">{_e(o.get("error") or o.get("skipped") or o.get("message") or "")}</td></tr>'
        )
    return rows


# Every budgeted metric, in LIMITS' order; the snapshot pool state only where a snapshot recorded it.
_METRIC_ROWS = tuple(metric_key for metric_key, _ in LIMITS.values())
_DUMP_ROWS = ("allocated_at_dump_bytes", "reserved_at_dump_bytes", "largest_free_block_bytes",
              "free_block_fragmentation")
SNAPSHOT_FORMATS = frozenset({"torch_snapshot"})


def _metrics_table(device_entry: dict[str, Any], profile_format: str | None = None, t0: int | None = None) -> str:
    metrics = device_entry.get("metrics", {})
    missing = device_entry.get("not_measurable", {})
    pool_of = device_entry.get("pool_of") or {}
    notes = device_entry.get("notes") or {}
    snapshot = profile_format in SNAPSHOT_FORMATS or any(metrics.get(k) is not None for k in _DUMP_ROWS)
    rows = []
    for key in _METRIC_ROWS:
        if key in _DUMP_ROWS and not snapshot:
            continue
        value = metrics.get(key)
        if key in RATIO_METRICS:
            shown, exact = _metric_text(key, value), ("-" if value is None else repr(value))
        else:
            shown = _size(value) + (" / step" if key == "step_growth_bytes" and value is not None else "")
            exact = _exact(value)
        pool = pool_of.get(key) if value is not None else None
        note = notes.get(key, "") if value is not None else "not measurable: " + missing.get(key, "no data")
        rows.append(f'<tr><td title="{_e(METRIC_HELP[key])}">{_e(key)}</td><td class="num">{_e(shown)}</td>'
                    f'<td class="num exact">{_e(exact)}</td>'
                    f'<td class="pool">{_e(pool or "")}</td><td class="note">{_e(note)}</td></tr>')
    ops = metrics.get("op_max_block_bytes") or {}
    note = missing.get("op_max_block_bytes", "")
    rows.append(f'<tr><td title="{_e(METRIC_HELP["op_max_block_bytes"])}">op_max_block_bytes</td>'
                f'<td class="num">{len(ops)} ops</td><td></td><td></td>'
                f'<td class="note">{_e("not measurable: " + note if note else "")}</td></tr>')
    where = []
    if device_entry.get("peak_t_ns") is not None:
        where.append("peak at " + _when(int(device_entry["peak_t_ns"]), t0) + (" after the profile start" if t0 is not None else ""))
    if device_entry.get("peak_step") is not None:
        where.append(f"step {_e(device_entry['peak_step'])}")
    caption = f"series {_e(device_entry.get('component') or '-')}" + (f"; {', '.join(where)}" if where else "")
    facts = []
    if device_entry.get("window_relative"):
        carried = device_entry.get("carried_over_bytes")
        facts.append(f"window-relative totals (memory allocated before profiling started is not in them): "
                     f"carried_over_bytes = {carried} B ({format_size(carried or 0)}), left out of peak_allocated_bytes")
    return (f'<h4>Metrics</h4><p class="caption">{caption}</p>'
            + _table(("metric", "value", "exact", "pool", "note"), rows, "metrics")
            + "".join(f'<p class="fact">{_e(f)}</p>' for f in facts)
            + _pools_table(device_entry))


def _pools_table(device_entry: dict[str, Any]) -> str:
    """Each allocator pool's own figures: what fragmentation and external_fragmentation are judged on."""
    pools = device_entry.get("pools") or {}
    if not pools:
        return ""
    rows = []
    for name, pool in sorted(pools.items()):
        frag, external = pool.get("fragmentation"), pool.get("external_fragmentation")
        rows.append(
            f"<tr><td>{_e(name)}</td>{_size_cell(pool.get('peak_allocated_bytes'))}"
            f"{_size_cell(pool.get('peak_reserved_bytes'))}"
            f'<td class="num" title="{_e(repr(frag))}">{_e(_metric_text("fragmentation", frag))}</td>'
            f'<td class="num" title="{_e(repr(external))}">{_e(_metric_text("external_fragmentation", external))}</td>'
            f"<td>{'yes' if pool.get('reserved_before_window') else 'no'}</td></tr>"
        )
    return ("<h4>Allocator pools</h4>"
            + _table(("pool", "peak allocated", "peak reserved", "fragmentation", "external fragmentation",
                      "reserved at its peak from the first sample"), rows, "pools"))


HTML_HOLDERS = 10  # rows of the holders table


def _holders_table(device_entry: dict[str, Any], t0: int | None) -> str:
    holders = (device_entry.get("metrics", {}) or {}).get("top_at_peak") or []
    if not holders:
        return '<h4>Top holders at the peak</h4><p class="note">no per-block data at the peak</p>'
    rows = []
    for i, b in enumerate(holders[:HTML_HOLDERS], 1):  # the report keeps more, for -v in the terminal
        at = "before the window" if b.get("t_alloc") is None else _when(int(b["t_alloc"]), t0)
        rows.append(
            f'<tr><td class="num">{i}</td>{_size_cell(b.get("size"))}<td class="num exact">{_e(b.get("size"))}</td>'
            f'<td class="op">{_e(b.get("op") or "-")}</td><td>{_e(b.get("stream") or "-")}</td>'
            f'<td class="owner">{_e(b.get("owner") or "-")}</td><td>{_e(b.get("component") or "-")}</td>'
            f"<td>{at}</td></tr>"
        )
    return ("<h4>Top holders at the peak</h4>"
            + _table(("#", "size", "bytes", "op", "stream", "owner", "component", "allocated at"), rows, "holders"))


def _ops_table(device_entry: dict[str, Any], n: int = 10) -> str:
    ops = (device_entry.get("metrics", {}) or {}).get("op_max_block_bytes") or {}
    if not ops:
        return ""
    top = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    rows = [f'<tr><td class="op">{_e(op)}</td>{_size_cell(size)}<td class="num exact">{size}</td></tr>'
            for op, size in top]
    return (f"<h4>Largest block per operator (top {len(top)} of {len(ops)})</h4>"
            + _table(("op", "largest block", "bytes"), rows, "ops"))


def _at_peak_table(device_entry: dict[str, Any], key: str, what: str, n: int = 10) -> str:
    """The bytes live at the peak per owner (``owner_bytes_at_peak``) or per operator (``op_bytes_at_peak``)."""
    named = (device_entry.get("metrics", {}) or {}).get(key) or {}
    if not isinstance(named, dict) or not named:
        return ""
    top = sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    rows = [f'<tr><td class="{what}">{_e(name)}</td>{_size_cell(size)}<td class="num exact">{_e(size)}</td></tr>'
            for name, size in top]
    title = "Owners at the peak" if what == "owner" else "Operators at the peak"
    return (f"<h4>{title} (top {len(top)} of {len(named)})</h4>"
            + _table((what, "live at the peak", "bytes"), rows, f"{what}s-at-peak"))


def _capacity_note(entry: dict[str, Any], device_entry: dict[str, Any]) -> str:
    """The device's recorded capacity and the room left above its peak (reserved, else allocated)."""
    recorded = ((entry.get("metadata") or {}).get("device_capacity_bytes") or {})
    capacity = recorded.get(str(device_entry.get("device"))) if isinstance(recorded, dict) else None
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
        return ""
    metrics = device_entry.get("metrics", {}) or {}
    for key, word in (("peak_reserved_bytes", "peak reserved"), ("peak_allocated_bytes", "peak allocated")):
        peak = metrics.get(key)
        if isinstance(peak, (int, float)) and not isinstance(peak, bool):
            room = capacity - peak
            return (f'<p class="capacity">device capacity <span title="{_e(_exact(capacity))}">{_e(format_size(capacity))}'
                    f"</span>; headroom above the {word}: <span title=\"{_e(_exact(room))}\">{_e(format_size(room))}"
                    f"</span> ({_e(f'{room / capacity:.2%}')} of the capacity)</p>")
    return (f'<p class="capacity">device capacity <span title="{_e(_exact(capacity))}">{_e(format_size(capacity))}'
            "</span>; no peak measured</p>")


def _reconciliation(device_entry: dict[str, Any]) -> str:
    rec = device_entry.get("reconciliation") or {}
    comps = rec.get("components") or {}
    parts = ["<h4>Reconciliation</h4>"]
    if comps:
        rows = []
        for name, f in comps.items():
            consistency = f.get("consistency")
            rows.append(
                f"<tr><td>{_e(name)}</td><td class=\"num\">{_e(f.get('blocks'))}</td>"
                f"<td class=\"num\">{_e(f.get('pre_window_blocks'))}</td><td class=\"num\">{_e(f.get('open_blocks'))}</td>"
                f"{_size_cell(f.get('baseline_bytes'))}<td class=\"num exact\">{_e(f.get('baseline_bytes'))}</td>"
                f"<td class=\"num\" title=\"{_e(COLUMN_HELP['consistency'])}\">"
                f"{'-' if consistency is None else f'{consistency:.2%}'}</td>"
                f"<td class=\"num\">{_e(f.get('checked_blocks'))}</td></tr>"
            )
        parts.append(_table(("component", "blocks", "allocated before window", "open at end", "pre-window baseline",
                             "baseline bytes", "consistency", "checked"), rows, "recon"))
        parts.append(f'<p class="note">{_e(CONSISTENCY_NOTE)}</p>')
    else:
        parts.append('<p class="note">no per-block data to reconcile</p>')
    for total, share in (rec.get("sum_checks") or {}).items():
        parts.append(f'<p class="fact" title="{_e(SUM_CHECK_HELP)}">{_e(total)} equals the sum of its parts on '
                     f"{share:.2%} of its rows</p>")
    return "".join(parts)


# ---- the page ----------------------------------------------------------------------------------

_CSS = """
:root{--fg:#1d232b;--muted:#5b6470;--line:#d9dee5;--red:#d62728;--green:#1e8a3c;--bg:#fff}
*{box-sizing:border-box}
body{margin:0;padding:24px 32px;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--fg);background:var(--bg)}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-bottom:2px solid var(--line);padding-bottom:4px}
h3{font-size:16px;margin:20px 0 6px}h4{font-size:14px;margin:16px 0 6px}
.status{display:inline-block;padding:3px 10px;border-radius:4px;font-weight:600;color:#fff}
.status.ok{background:var(--green)}.status.bad{background:var(--red)}.status.none{background:var(--muted)}
.meta,.caption,.note,.path{color:var(--muted)}.path{font-family:ui-monospace,Menlo,Consolas,monospace;word-break:break-all}
table{border-collapse:collapse;margin:4px 0 10px;font-size:13px}
th,td{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f8;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.exact{color:var(--muted);font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
td.op{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
td.owner{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11px;white-space:pre-wrap;max-width:420px;word-break:break-all}
td.note{color:var(--muted);max-width:460px}td.msg{max-width:520px}
tr.fail td{background:#fdecec}tr.fail td.result{color:var(--red);font-weight:700}
tr.pass td.result{color:var(--green);font-weight:600}tr.error td.result{color:#a15c00;font-weight:700}
tr.skipped td{color:var(--muted)}th[title],td[title],.key[title]{cursor:help}
.legend{display:flex;flex-wrap:wrap;gap:6px 18px;margin:6px 0}
.key{display:inline-flex;align-items:center;gap:6px}.key small{color:var(--muted)}
.key i{display:inline-block;width:18px;height:3px}.key i.dash{height:0;border-top:2px dashed}
.device{border:1px solid var(--line);border-radius:6px;padding:8px 16px 12px;margin:12px 0}
.cols{display:flex;flex-wrap:wrap;gap:0 32px}.cols>div{min-width:420px}
svg.chart{display:block;max-width:100%;height:auto;font:12px system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif}
svg .plot{fill:#fff;stroke:var(--line)}svg .band0{fill:#e8eef7}svg .band1{fill:#f3f6fb}
svg .grid{stroke:#e6e9ee}svg .axis{stroke:#8a929c}
svg .ylabel{text-anchor:end;fill:var(--muted)}svg .xlabel{text-anchor:middle;fill:var(--muted)}
svg .xtitle{text-anchor:middle;fill:var(--muted)}svg .steplabel{text-anchor:middle;fill:#3b4b63;font-weight:600}
svg .curve{fill:none;stroke-width:1.6;stroke-linejoin:round}
svg .budgetline{stroke-width:1.6;stroke-dasharray:7 4}
svg .budgetlabel,svg .peaklabel,svg .steplabel{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
svg .budgetlabel{text-anchor:start;font-weight:600;font-size:11px}svg .leader{stroke-width:1;opacity:.6}
svg .peak circle{fill:var(--red);stroke:#fff;stroke-width:1.5}svg .peakline{stroke:var(--red);stroke-dasharray:2 3}
svg .peaklabel{fill:var(--red);font-weight:700}svg .peaklabel .exact{font-weight:400}
nav ul{margin:4px 0;padding-left:20px}
"""


def render_html(
    entries: list[dict[str, Any]],
    outcomes: list[dict[str, Any]],
    profiles: list[Profile] | None = None,
    *,
    max_points: int = 2000,
    errors: list[dict[str, Any]] | None = None,
    title: str = "memgate report",
) -> str:
    """The whole page as a string.

    ``entries``: :func:`memgate.report.profile_entry` dicts; ``outcomes``: budget outcome dicts
    (:func:`memgate.report.outcome_entry`, or the error rows of :func:`memgate.session.error_outcome`);
    ``profiles``: the normalized profiles, matched to entries by ``path``, for the curves (without
    them the page has every table but no chart); ``max_points``: samples drawn per curve at most
    (+1 for the peak); ``errors``: profiles that failed to load (``{"profile", "error"}``).
    """
    by_path = {p.path: p for p in profiles or []}
    anchors = {str(e.get("path")): f"p{i}" for i, e in enumerate(entries)}
    skipped = [o for o in outcomes if o.get("skipped")]
    checks = [o for o in outcomes if not o.get("skipped")]
    judged = [o for o in checks if o.get("passed") is not None and not o.get("error")]
    failed = sum(1 for o in judged if not o["passed"])
    broken = len(checks) - len(judged) + len(errors or [])
    aside = f", {len(skipped)} not selected" if skipped else ""
    if failed or broken:
        status = (f'<span class="status bad">{failed} of {len(checks)} budget checks failed'
                  + (f", {broken} error(s)" if broken else "") + aside + "</span>")
    elif checks:
        status = f'<span class="status ok">all {len(checks)} budget checks passed{aside}</span>'
    else:
        status = '<span class="status none">no budgets judged</span>'
    out = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1><p>{status}</p>",
        (f'<p class="meta">memgate {_e(__version__)} · {len(entries)} profile(s) · every number is exact '
         "(hover a value for its bytes); curves are downsampled for drawing only</p>"),
    ]
    out.append("<h2>Budgets</h2>")
    if outcomes:
        out.append(_table(("rank", "device", "budget", "metric", "measured", "limit", "headroom", "result", "message"),
                          _budget_rows(outcomes, anchors, _capacities(entries)), "budgets"))
    else:
        out.append('<p class="note">no budget was judged (run memgate check or pytest --memgate with budgets)</p>')
    if errors:
        out.append("<h2>Profiles that could not be read</h2>")
        out.append(_table(("profile", "error"), (f"<tr><td class=\"path\">{_e(x.get('profile'))}</td>"
                                                  f"<td>{_e(x.get('error'))}</td></tr>" for x in errors), "errors"))
    if len(entries) > 1:
        out.append("<nav><h2>Profiles</h2><ul>" + "".join(
            f'<li><a href="#p{i}">rank {_e(e.get("rank"))}</a> <span class="path">{_e(e.get("path"))}</span></li>'
            for i, e in enumerate(entries)) + "</ul></nav>")
    for i, entry in enumerate(entries):
        out.append(_profile_section(i, entry, outcomes, by_path.get(str(entry.get("path"))), profiles is not None,
                                    max_points))
    out.append("</body></html>\n")
    return "".join(out)


def _profile_section(i: int, entry: dict[str, Any], outcomes: list[dict[str, Any]], profile: Profile | None,
                     profiles_given: bool, max_points: int) -> str:
    meta = entry.get("metadata") or {}
    steps = entry.get("steps") or []
    out = [f'<section class="profile" id="p{i}"><h2>rank {_e(entry.get("rank"))} · {_e(entry.get("format"))}</h2>',
           f'<p class="path">{_e(entry.get("path"))}</p>']
    facts = [f"{_e(k)} = {_e(v)}" for k, v in meta.items()]
    numbers = [str(s["step"]) for s in steps if s.get("step") is not None]
    facts.append(f"{len(steps)} step(s)" + (f": {_e(', '.join(numbers[:12]))}{' …' if len(numbers) > 12 else ''}"
                                             if numbers else ""))
    out.append(f'<p class="meta">{" · ".join(facts)}</p>')
    spans = step_spans(entry)
    for j, dev in enumerate(entry.get("devices") or []):
        name = str(dev.get("device"))
        out.append(f'<section class="device" id="p{i}-d{j}"><h3>{_e(name)} <small class="meta">series '
                   f'{_e(dev.get("component") or "-")} from <span class="path">{_e(dev.get("source") or "-")}'
                   "</span></small></h3>")
        out.append(_capacity_note(entry, dev))
        model = _find_device(profile, name)
        t0: int | None = None
        if model is not None:
            curves = device_curves(model, dev)
            svg, legend = _chart(curves, spans, budget_lines(entry, dev, outcomes), dev, max_points)
            if svg:
                t0 = min(int(c.t_ns[0]) for c in curves if len(c.t_ns))
                out.append(f'<div class="legend">{"".join(legend)}</div>{svg}')
            else:
                out.append('<p class="note">no memory series on this device to draw</p>')
        else:
            out.append('<p class="note">' + ("the normalized profile was not given: no curves"
                                             if not profiles_given else "no curves for this device") + "</p>")
        out.append(f'<div class="cols"><div>{_metrics_table(dev, entry.get("format"), t0)}{_reconciliation(dev)}</div>'
                   f"<div>{_holders_table(dev, t0)}{_ops_table(dev)}"
                   f'{_at_peak_table(dev, "owner_bytes_at_peak", "owner")}{_at_peak_table(dev, "op_bytes_at_peak", "op")}'
                   "</div></div></section>")
    out.append("</section>")
    return "".join(out)

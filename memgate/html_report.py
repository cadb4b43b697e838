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
from typing import Any

import numpy as np

from memgate import __version__
from memgate.budgets import LIMITS
from memgate.lttb import downsample_steps
from memgate.model import APP_COMPONENT, DeviceModel, Profile
from memgate.sizes import format_size

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
            frame = series.frame[["t_ns", column]].dropna()
            if len(frame):
                curves.append(Curve(kind, f"{name} {column}", frame["t_ns"].to_numpy(dtype=np.int64),
                                    frame[column].to_numpy(dtype=np.int64), series.source))
    app = device.series.get(APP_COMPONENT)
    if app is not None:
        frame = app.frame[["t_ns", "reserved"]].dropna()
        if len(frame):
            curves.append(Curve("app_reserved", "APP reserved", frame["t_ns"].to_numpy(dtype=np.int64),
                                frame["reserved"].to_numpy(dtype=np.int64), app.source))
    return curves


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
    """Escape for text and attribute values; ``://`` as an entity so the file holds no URL."""
    return html.escape(str(value), quote=True).replace("://", ":&#47;/")


def _size(value: float | None) -> str:
    return "-" if value is None else format_size(value)


def _exact(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value} B" if isinstance(value, int) else f"{value:.6g} B"


# Budget keys and metric keys (they differ by ``_bytes``) whose values are ratios, from LIMITS' kind.
RATIO_METRICS = frozenset(k for budget_key, (metric_key, kind) in LIMITS.items() if kind == "ratio"
                          for k in (budget_key, metric_key))


def _metric_text(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if metric in RATIO_METRICS:
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


# ---- the chart ---------------------------------------------------------------------------------

W, H = 1160, 380
ML, MR, MT, MB = 84, 18, 30, 42  # margins: y labels left, step labels top, x labels bottom


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


def _chart(
    curves: list[Curve],
    spans: list[StepSpan],
    lines: list[BudgetLine],
    device_entry: dict[str, Any],
    max_points: int,
) -> tuple[str, list[str]]:
    """(svg markup, legend items)."""
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
    # Step bands, under everything else.
    visible = [s for s in spans if s.t_end >= t0 and s.t_start <= axes.t1]
    if len(visible) <= MAX_STEP_BANDS:
        for i, s in enumerate(visible):
            xa, xb = float(axes.x(max(s.t_start, t0))), float(axes.x(min(s.t_end, axes.t1)))
            out.append(
                f'<g class="stepband"><title>step {s.step}: {_e(_relative(s.t_start, t0))} … '
                f'{_e(_relative(s.t_end, t0))} ({(s.t_end - s.t_start) / 1e6:.3f} ms)</title>'
                f'<rect x="{xa:.1f}" y="{MT}" width="{max(xb - xa, 0.5):.1f}" height="{H - MT - MB}" '
                f'class="band{i % 2}"/>'
                + (f'<text x="{(xa + xb) / 2:.1f}" y="{MT - 8}" class="steplabel">step {s.step}</text>'
                   if xb - xa >= 44 else "")
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
        x = float(axes.x(t0 + round(k * tf)))
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{H - MB}" y2="{H - MB + 5}" class="axis"/>'
                   f'<text x="{x:.1f}" y="{H - MB + 18}" class="xlabel">{_tick_label(k, tstep)}</text>')
        k += tstep
    out.append(f'<text x="{(ML + W - MR) / 2:.0f}" y="{H - 6}" class="xtitle">time since the first sample ({tu})</text>')
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
        legend.append(f'<span class="key"><i style="background:{colour}"></i>{_e(c.label)} '
                      f'<small>({len(c.values):,} samples, {len(idx):,} drawn; from {_e(c.source or "-")})</small></span>')
    # Budget lines.
    for b in drawn_lines:
        y = float(axes.y(b.limit))
        colour = RED if b.exceeded else GREY
        verdict = "exceeded" if b.exceeded else "within"
        out.append(
            f'<g class="budget {"exceeded" if b.exceeded else "ok"}"><title>budget {_e(b.budget)}: {_e(b.metric)} '
            f'limit {b.limit} B ({_e(format_size(b.limit))}); this device {_e(_exact(b.value))} — {verdict}</title>'
            f'<line x1="{ML}" x2="{W - MR}" y1="{y:.1f}" y2="{y:.1f}" stroke="{colour}" class="budgetline"/>'
            f'<text x="{W - MR - 6}" y="{y - 5:.1f}" fill="{colour}" class="budgetlabel">'
            f'{_e(b.budget)}: {_e(b.metric)} ≤ {_e(format_size(b.limit))}{" — EXCEEDED" if b.exceeded else ""}</text></g>'
        )
        legend.append(f'<span class="key"><i class="dash" style="border-color:{colour}"></i>budget {_e(b.budget)} '
                      f'{_e(b.metric)} {_e(format_size(b.limit))}</span>')
    for i, b in enumerate(off_lines):
        colour = RED if b.exceeded else GREY
        out.append(f'<text x="{W - MR - 6}" y="{MT + 14 + 14 * i}" fill="{colour}" class="budgetlabel">'
                   f'<title>{b.limit} B</title>↑ {_e(b.budget)}: {_e(b.metric)} ≤ {_e(format_size(b.limit))} (off scale)</text>')
    # The peak, at its exact value and time (LTTB keeps the argmax, so the curve passes through it).
    if peak_value is not None and peak_t is not None and t0 <= peak_t <= axes.t1:
        px, py = float(axes.x(peak_t)), float(axes.y(peak_value))
        step_no = device_entry.get("peak_step")
        text = f"peak {format_size(peak_value)}" + (f" · step {step_no}" if step_no is not None else "")
        right = px < W - MR - 260
        out.append(
            f'<g class="peak"><title>peak_allocated_bytes = {peak_value} B ({_e(format_size(peak_value))}) at '
            f'{_e(_relative(peak_t, t0))}' + (f", step {step_no}" if step_no is not None else "") + "</title>"
            f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{py:.1f}" y2="{H - MB}" class="peakline"/>'
            f'<circle cx="{px:.1f}" cy="{py:.1f}" r="5"/>'
            f'<text x="{px + (9 if right else -9):.1f}" y="{max(py - 8, MT + 12):.1f}" '
            f'text-anchor="{"start" if right else "end"}" class="peaklabel">{_e(text)} '
            f'<tspan class="exact">({peak_value} B)</tspan></text></g>'
        )
    out.append("</svg>")
    return "".join(out), legend


# ---- tables ------------------------------------------------------------------------------------


def _table(head: Sequence[str], rows: Iterable[str], cls: str = "") -> str:
    body = "".join(rows)
    return (f'<table class="{cls}"><thead><tr>' + "".join(f"<th>{_e(h)}</th>" for h in head)
            + f"</tr></thead><tbody>{body}</tbody></table>")


def _size_cell(value: float | None) -> str:
    if value is None:
        return "<td>-</td>"
    return f'<td class="num" title="{_e(_exact(value))}">{_e(_size(value))}</td>'


def _budget_rows(outcomes: list[dict[str, Any]], anchors: dict[str, str]) -> list[str]:
    rows = []
    for o in outcomes:
        metric = str(o.get("metric", ""))
        value, limit = o.get("value"), o.get("limit")
        if o.get("error") or o.get("passed") is None:
            result, cls = "error", "error"
        else:
            result, cls = ("pass", "pass") if o["passed"] else ("FAIL", "fail")
        headroom = "-"
        if value is not None and limit is not None and metric not in RATIO_METRICS:
            headroom = format_size(limit - value)
        elif value is not None and limit is not None:
            headroom = f"{limit - value:+.4f}"
        anchor = anchors.get(str(o.get("profile")))
        rank = _e(o.get("rank", "?"))
        rank_cell = f'<a href="#{anchor}">{rank}</a>' if anchor else rank
        rows.append(
            f'<tr class="{cls}"><td>{rank_cell}</td><td>{_e(o.get("device") or "-")}</td><td>{_e(o.get("budget"))}</td>'
            f"<td>{_e(metric)}</td>"
            f'<td class="num" title="{_e(_exact(value))}">{_e(_metric_text(metric, value))}</td>'
            f'<td class="num" title="{_e(_exact(limit))}">{_e(_metric_text(metric, limit))}</td>'
            f'<td class="num">{_e(headroom)}</td><td class="result">{result}</td>'
            f'<td class="msg">{_e(o.get("error") or o.get("message") or "")}</td></tr>'
        )
    return rows


# Every budgeted metric, in LIMITS' order; the snapshot pool state only where a snapshot recorded it.
_METRIC_ROWS = tuple(metric_key for metric_key, _ in LIMITS.values())
_DUMP_ROWS = ("allocated_at_dump_bytes", "reserved_at_dump_bytes", "largest_free_block_bytes",
              "free_block_fragmentation")
SNAPSHOT_FORMATS = frozenset({"torch_snapshot"})


def _metrics_table(device_entry: dict[str, Any], profile_format: str | None = None) -> str:
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
        rows.append(f'<tr><td>{_e(key)}</td><td class="num">{_e(shown)}</td><td class="num exact">{_e(exact)}</td>'
                    f'<td class="pool">{_e(pool or "")}</td><td class="note">{_e(note)}</td></tr>')
    ops = metrics.get("op_max_block_bytes") or {}
    note = missing.get("op_max_block_bytes", "")
    rows.append(f'<tr><td>op_max_block_bytes</td><td class="num">{len(ops)} ops</td><td></td><td></td>'
                f'<td class="note">{_e("not measurable: " + note if note else "")}</td></tr>')
    where = []
    if device_entry.get("peak_t_ns") is not None:
        where.append(f"peak at t = {device_entry['peak_t_ns']} ns")
    if device_entry.get("peak_step") is not None:
        where.append(f"step {device_entry['peak_step']}")
    caption = f"series {device_entry.get('component') or '-'}" + (f"; {', '.join(where)}" if where else "")
    facts = []
    if device_entry.get("window_relative"):
        carried = device_entry.get("carried_over_bytes")
        facts.append(f"window-relative totals (memory allocated before profiling started is not in them): "
                     f"carried_over_bytes = {carried} B ({format_size(carried or 0)}), left out of peak_allocated_bytes")
    return (f'<h4>Metrics</h4><p class="caption">{_e(caption)}</p>'
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


def _holders_table(device_entry: dict[str, Any], t0: int | None) -> str:
    holders = (device_entry.get("metrics", {}) or {}).get("top_at_peak") or []
    if not holders:
        return '<h4>Top holders at the peak</h4><p class="note">no per-block data at the peak</p>'
    rows = []
    for i, b in enumerate(holders, 1):
        at = "before the window" if b.get("t_alloc") is None else (
            _relative(b["t_alloc"], t0) if t0 is not None else f"{b['t_alloc']} ns")
        rows.append(
            f'<tr><td class="num">{i}</td>{_size_cell(b.get("size"))}<td class="num exact">{_e(b.get("size"))}</td>'
            f'<td class="op">{_e(b.get("op") or "-")}</td><td>{_e(b.get("stream") or "-")}</td>'
            f'<td class="owner">{_e(b.get("owner") or "-")}</td><td>{_e(b.get("component") or "-")}</td>'
            f"<td>{_e(at)}</td></tr>"
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
                f"<td class=\"num\">{'-' if consistency is None else f'{consistency:.2%}'}</td>"
                f"<td class=\"num\">{_e(f.get('checked_blocks'))}</td></tr>"
            )
        parts.append(_table(("component", "blocks", "allocated before window", "open at end", "pre-window baseline",
                             "baseline bytes", "consistency", "checked"), rows, "recon"))
    else:
        parts.append('<p class="note">no per-block data to reconcile</p>')
    for total, share in (rec.get("sum_checks") or {}).items():
        parts.append(f'<p class="fact">{_e(total)} equals the sum of its parts on {share:.2%} of its rows</p>')
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
svg .budgetlabel{text-anchor:end;font-weight:600}
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
    judged = [o for o in outcomes if o.get("passed") is not None and not o.get("error")]
    failed = sum(1 for o in judged if not o["passed"])
    broken = len(outcomes) - len(judged) + len(errors or [])
    if failed or broken:
        status = (f'<span class="status bad">{failed} of {len(outcomes)} budget checks failed'
                  + (f", {broken} error(s)" if broken else "") + "</span>")
    elif outcomes:
        status = f'<span class="status ok">all {len(outcomes)} budget checks passed</span>'
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
                          _budget_rows(outcomes, anchors), "budgets"))
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
        out.append(f'<div class="cols"><div>{_metrics_table(dev, entry.get("format"))}{_reconciliation(dev)}</div>'
                   f"<div>{_holders_table(dev, t0)}{_ops_table(dev)}</div></div></section>")
    out.append("</section>")
    return "".join(out)

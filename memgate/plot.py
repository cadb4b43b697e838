"""A PNG or SVG of a profile's memory curves, via matplotlib (optional extra ``pytest-memgate[plot]``).

The same picture as the HTML report (:mod:`memgate.html_report`): framework allocated and
reserved and APP reserved drawn step-after, step bands, budget lines (red when this device's
exact value exceeds them) and the peak marked at its exact value. matplotlib is imported only
when an image is written, with the Agg backend, so importing memgate never needs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memgate.chart_data import CURVE_KINDS, GREY, OFF_SCALE, RED, budget_lines, device_curves, step_spans
from memgate.errors import ConfigError
from memgate.lttb import downsample_steps
from memgate.model import STEP_COLUMNS, Profile
from memgate.sizes import format_size

FORMATS = {".png": "png", ".svg": "svg"}
_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))


def _device_entries(profile: Profile, metrics_entry: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Accept a profile entry (``report.profile_entry``), one device entry, or a DeviceMetrics."""
    if hasattr(metrics_entry, "as_json"):
        metrics_entry = metrics_entry.as_json()
    if not isinstance(metrics_entry, dict):
        raise TypeError(f"metrics_entry must be a report entry dict, got {type(metrics_entry).__name__}")
    if "devices" in metrics_entry:
        return metrics_entry, list(metrics_entry["devices"])
    steps = [r for r in profile.steps.select(STEP_COLUMNS).records() if None not in r.values()]
    return {"path": profile.path, "rank": profile.rank, "steps": steps}, [metrics_entry]


def write_curve_image(
    profile: Profile,
    metrics_entry: Any,
    path: str | os.PathLike[str],
    outcomes: Iterable[dict[str, Any]] = (),
    *,
    max_points: int = 4000,
    dpi: int = 120,
) -> Path:
    """Write the curves of ``profile`` to ``path`` (``.png`` or ``.svg``); one panel per device.

    ``metrics_entry``: the profile's report entry (:func:`memgate.report.profile_entry`), or one
    device entry / :class:`memgate.metrics.DeviceMetrics` for a single panel. ``outcomes``: budget
    outcome dicts; the peak budgets of this profile are drawn as horizontal lines.
    """
    target = Path(path)
    fmt = FORMATS.get(target.suffix.lower())
    if fmt is None:
        raise ConfigError("unsupported image type", file=target, expected="a file name ending in .png or .svg",
                          found=target.suffix or "no extension")
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        raise ConfigError("writing a curve image needs matplotlib", file=target,
                          expected="pip install 'pytest-memgate[plot]'") from None
    entry, devices = _device_entries(profile, metrics_entry)
    outcomes = list(outcomes)
    spans = step_spans(entry)
    fig, axes = plt.subplots(max(len(devices), 1), 1, figsize=(12, 5 * max(len(devices), 1)), squeeze=False)
    try:
        for ax, dev in zip(axes[:, 0], devices):
            _panel(ax, profile, entry, dev, spans, outcomes, max_points, FuncFormatter)
        fig.tight_layout()
        target.parent.mkdir(parents=True, exist_ok=True)
        # Fixed metadata: the same profile gives the same bytes (no date, no version in the file).
        metadata = {"Software": None} if fmt == "png" else {"Date": None, "Creator": None}
        fig.savefig(target, format=fmt, dpi=dpi, metadata=metadata)
    finally:
        plt.close(fig)
    return target


def _panel(ax: Any, profile: Profile, entry: dict[str, Any], dev: dict[str, Any], spans: list[Any],
           outcomes: list[dict[str, Any]], max_points: int, formatter: Any) -> None:
    name = str(dev.get("device"))
    model = next((d for d in profile.devices if d.device == name), None)
    curves = device_curves(model, dev) if model is not None else []
    ax.set_title(f"rank {profile.rank} {name} — series {dev.get('component') or '-'}", loc="left", fontsize=11, pad=16)
    if not curves:
        ax.text(0.5, 0.5, "no memory series on this device", ha="center", va="center", transform=ax.transAxes)
        return
    t0 = min(int(c.t_ns[0]) for c in curves)
    t1 = max(int(c.t_ns[-1]) for c in curves)
    span = max(t1 - t0, 1)
    scale, tunit = next(((f, u) for f, u in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")) if span >= 5 * f), (1.0, "ns"))
    data_max = max(int(c.values.max()) for c in curves)
    lines = budget_lines(entry, dev, outcomes)
    drawn = [b for b in lines if b.limit <= max(data_max, 1) * OFF_SCALE]
    top = max([data_max, *(b.limit for b in drawn)])
    factor, unit = next(((f, u) for f, u in _UNITS if top >= f), (1, "B"))
    for i, s in enumerate(spans):
        if s.t_end < t0 or s.t_start > t1:
            continue
        a, b = (max(s.t_start, t0) - t0) / scale, (min(s.t_end, t1) - t0) / scale
        ax.axvspan(a, b, color="#e8eef7" if i % 2 == 0 else "#f3f6fb", zorder=0, lw=0)
        if (b - a) / (span / scale) > 0.04:
            ax.text((a + b) / 2, 1.005, f"step {s.step}", transform=ax.get_xaxis_transform(), ha="center",
                    va="bottom", fontsize=8, color="#3b4b63", fontweight="bold")
    for c in curves:
        idx = downsample_steps(c.t_ns, c.values, max_points)
        ax.plot((c.t_ns[idx] - t0) / scale, c.values[idx] / factor, drawstyle="steps-post", lw=1.3,
                color=CURVE_KINDS[c.kind][2], label=f"{c.label} ({len(c.values):,} samples)", zorder=3)
    for b in drawn:
        colour = RED if b.exceeded else GREY
        ax.axhline(b.limit / factor, color=colour, ls="--", lw=1.3, zorder=4,
                   label=f"budget {b.budget} {b.metric} ≤ {format_size(b.limit)}" + (" EXCEEDED" if b.exceeded else ""))
    off = [b for b in lines if b not in drawn]
    for i, b in enumerate(off):
        ax.text(0.99, 0.97 - 0.06 * i, f"↑ {b.budget}: {b.metric} ≤ {format_size(b.limit)} (off scale)",
                transform=ax.transAxes, ha="right", va="top", fontsize=8, color=RED if b.exceeded else GREY)
    peak, peak_t = dev.get("metrics", {}).get("peak_allocated_bytes"), dev.get("peak_t_ns")
    if peak is not None and peak_t is not None:
        px = (peak_t - t0) / scale
        ax.plot([px], [peak / factor], "o", color=RED, ms=6, zorder=5)
        step = dev.get("peak_step")
        ax.annotate(f"peak {format_size(peak)} ({peak} B)" + (f" · step {step}" if step is not None else ""),
                    (px, peak / factor), xytext=(8, 6), textcoords="offset points", color=RED, fontsize=9,
                    fontweight="bold", ha="left" if px < 0.7 * span / scale else "right", zorder=6)
    ax.set_ylim(0, top * 1.1 / factor)
    ax.set_xlim(0, span / scale)
    ax.yaxis.set_major_formatter(formatter(lambda v, _pos: f"{v:g} {unit}"))
    ax.set_xlabel(f"time since the profile start, its first memory sample ({tunit})")
    ax.grid(True, axis="y", color="#e6e9ee", zorder=1)
    # Below the axes: inside, it would hide part of a curve.
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)

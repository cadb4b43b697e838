"""What the memory chart shows, apart from how it is drawn: the curves, the budget lines, the steps.

Shared by the HTML report's SVG chart (:mod:`memgate.html_chart`) and :mod:`memgate.plot`, which
draws the same picture with matplotlib.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from memgate.metric_specs import budget_key
from memgate.model import APP_COMPONENT, DeviceModel
from memgate.table import Table


def _curve_kind(report_key: str, colour: str) -> tuple[str, str, str]:
    return budget_key(report_key), report_key, colour


# Curve kind → (budget metric drawn against it, metric key, colour).
CURVE_KINDS: dict[str, tuple[str, str, str]] = {
    "allocated": _curve_kind("peak_allocated_bytes", "#1f6fb4"),
    "reserved": _curve_kind("peak_reserved_bytes", "#e6820e"),
    "app_reserved": _curve_kind("peak_app_reserved_bytes", "#2a9d4b"),
}
BUDGET_METRIC_KIND = {metric: kind for kind, (metric, _, _) in CURVE_KINDS.items()}
RED, GREY = "#d62728", "#5b6470"
OFF_SCALE = 1.5  # a budget above 1.5x the data is listed, not drawn (it would flatten the curves)


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

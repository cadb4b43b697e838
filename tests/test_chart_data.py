"""memgate.chart_data: what the memory chart shows, apart from how it is drawn (the HTML report's SVG and
memgate.plot's image): the curves of the series the metrics used, the budget lines of this profile with
this device's exact value, and the timed steps."""

from __future__ import annotations

import pandas as pd

from memgate.chart_data import BudgetLine, StepSpan, budget_lines, device_curves, step_spans
from memgate.metrics import block_components, blocks_total
from memgate.model import BLOCK_COLUMNS, DeviceModel, Series, typed_blocks
from memgate.reconcile import reconcile
from memgate.table import Table


def _series(name: str, rows: list[tuple[int | None, ...]], source: str) -> Series:
    frame = pd.DataFrame(rows, columns=["t_ns", "allocated", "reserved", "active"]).astype("Int64")
    return Series(name, Table.from_pandas(frame), source)


DEVICE = DeviceModel("npu:0", series={
    "PTA+GE": _series("PTA+GE", [(1, 10, 20, None), (2, None, 25, None), (None, 5, 5, None), (3, 30, 40, None)],
                      "memory_record.csv"),
    "PTA": _series("PTA", [(1, 7, 9, None)], "memory_record.csv"),
    "APP": _series("APP", [(1, None, 100, None), (4, None, 120, None)], "npu_module_mem.csv"),
})


def test_curves_of_the_series_the_metrics_used_and_app_reserved() -> None:
    curves = device_curves(DEVICE, {"component": "PTA+GE"})
    assert [(c.kind, c.label, c.source) for c in curves] == [
        ("allocated", "PTA+GE allocated", "memory_record.csv"), ("reserved", "PTA+GE reserved", "memory_record.csv"),
        ("app_reserved", "APP reserved", "npu_module_mem.csv")]
    # only the samples where both the time and the value are known, as int64
    assert [(c.t_ns.tolist(), c.values.tolist()) for c in curves] == [([1, 3], [10, 30]), ([1, 2, 3], [20, 25, 40]),
                                                                      ([1, 4], [100, 120])]
    assert {str(c.values.dtype) for c in curves} == {"int64"}
    assert [c.kind for c in device_curves(DEVICE, {"component": None})] == ["app_reserved"]  # no series measured
    assert device_curves(DeviceModel("npu:0"), {"component": "PTA"}) == []


def test_a_device_measured_on_its_blocks_draws_the_curve_the_metrics_rebuilt() -> None:
    frame = pd.DataFrame({"size": [100, 10], "t_alloc": pd.array([None, 10], dtype="Int64"),
                          "t_free": pd.array([30, 20], dtype="Int64"), "op": None, "stream": None, "owner": None,
                          "component": "PTA", "alloc_total": pd.array([None, 1110], dtype="Int64")})
    device = DeviceModel("cpu", blocks=typed_blocks(frame[list(BLOCK_COLUMNS)]), blocks_source="trace.json")
    [curve] = device_curves(device, {"component": "blocks"})
    assert (curve.kind, curve.label, curve.source) == ("allocated", "allocated (rebuilt from blocks)", "trace.json")
    t, allocated = blocks_total(reconcile(device), block_components(device, "blocks"))
    assert (curve.t_ns.tolist(), curve.values.tolist()) == (t.tolist(), allocated.tolist())
    assert max(curve.values.tolist()) == 1110  # the recorded total: the baseline the blocks leave out included


def test_budget_lines_are_this_profiles_peak_budgets_once_each_judged_on_this_device() -> None:
    device_entry = {"metrics": {"peak_allocated_bytes": 300, "peak_reserved_bytes": 400}}
    outcomes = [
        {"profile": "p", "budget": "b", "metric": "peak_allocated", "limit": 200},
        {"profile": "p", "budget": "b", "metric": "peak_allocated", "limit": 200},  # another device's row: once
        {"profile": "p", "budget": "b", "metric": "peak_reserved", "limit": 500},
        {"profile": "p", "budget": "b", "metric": "peak_app_reserved", "limit": 500},
        {"profile": "q", "budget": "b", "metric": "peak_allocated", "limit": 1},  # another profile
        {"profile": "p", "budget": "b", "metric": "fragmentation", "limit": 0.1},  # no curve to draw it on
        {"profile": "p", "budget": "c", "metric": "peak_allocated", "limit": None},  # an error row: no limit
    ]
    assert budget_lines({"path": "p"}, device_entry, outcomes) == [
        BudgetLine("b", "peak_allocated", "allocated", 200, 300, True),
        BudgetLine("b", "peak_reserved", "reserved", 500, 400, False),
        BudgetLine("b", "peak_app_reserved", "app_reserved", 500, None, False),  # not measured: not exceeded
    ]


def test_step_spans_are_the_steps_with_both_times() -> None:
    entry = {"steps": [{"step": 1, "t_start": 0, "t_end": 10}, {"step": 2, "t_start": 10, "t_end": None},
                       {"step": None, "t_start": 1, "t_end": 2}]}
    assert step_spans(entry) == [StepSpan(1, 0, 10)]
    assert step_spans({}) == []

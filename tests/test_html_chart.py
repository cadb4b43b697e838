"""memgate.html_chart: the HTML report's memory chart as inline SVG, on hand-made curves, steps and budgets.

Step bands with a label where it fits, budget lines (red when this device exceeds them) labelled in the
column right of the plot, a budget far above the data listed instead of drawn, the peak at its exact
value; curves downsampled for drawing only. (The page around it, and its layout in a browser:
tests/test_html_report.py.)
"""

from __future__ import annotations

import re

import numpy as np

from memgate.chart_data import BudgetLine, Curve, StepSpan
from memgate.html_chart import MAX_STEP_BANDS, chart

T0 = 1736408883573957920  # 2025-01-09 07:48:03.573957920 UTC
MS = 10**6
GIB = 1 << 30
CURVE = Curve("allocated", "PTA+GE allocated", np.array([T0, T0 + MS, T0 + 2 * MS], dtype=np.int64),
              np.array([GIB, 3 * GIB // 2, GIB // 2], dtype=np.int64), "memory_record.csv")
DEVICE = {"device": "npu:0", "metrics": {"peak_allocated_bytes": 3 * GIB // 2}, "peak_t_ns": T0 + MS, "peak_step": 2}
EXCEEDED = BudgetLine("b", "peak_allocated", "allocated", GIB, 3 * GIB // 2, True)
FAR = BudgetLine("far", "peak_reserved", "reserved", 10 * GIB, None, False)  # above 1.5x the data


def _groups(svg: str, cls: str) -> list[str]:
    return re.findall(rf'<g class="{cls}">.*?</g>', svg)


def test_no_curve_is_no_chart() -> None:
    assert chart([], [StepSpan(1, T0, T0 + MS)], [EXCEEDED], DEVICE, 100) == ("", [])


def test_steps_in_the_time_range_are_bands_labelled_where_the_label_fits() -> None:
    spans = [StepSpan(1, T0, T0 + MS), StepSpan(2, T0 + MS, T0 + 2 * MS), StepSpan(3, T0 + 5 * MS, T0 + 6 * MS)]
    svg, _ = chart([CURVE], spans, [], DEVICE, 100)
    bands = _groups(svg, "stepband")
    assert len(bands) == 2  # step 3 is after the last sample
    assert bands[0].startswith("<g class=\"stepband\"><title>step 1: +0.000 ns … +1.000 ms (1.000 ms) after the "
                               "profile start; from 2025-01-09 07:48:03.573957920 UTC")
    assert re.findall(r'class="steplabel">([^<]*)', svg) == ["step 1", "step 2"]
    narrow = [StepSpan(1, T0, T0 + 1000)]  # 1 µs of 2 ms: no room for its label
    assert 'class="steplabel"' not in chart([CURVE], narrow, [], DEVICE, 100)[0]
    many = [StepSpan(i, T0 + i, T0 + i + 1) for i in range(MAX_STEP_BANDS + 1)]
    assert _groups(chart([CURVE], many, [], DEVICE, 100)[0], "stepband") == []  # one grey blur: none drawn


def test_axes_in_the_units_the_data_reaches() -> None:
    svg, _ = chart([CURVE], [], [], DEVICE, 100)
    assert re.findall(r'class="ylabel">([^<]*)', svg) == ["0.0 GiB", "0.5 GiB", "1.0 GiB", "1.5 GiB", "2.0 GiB"]
    assert "time since the profile start, its first memory sample (µs)</text>" in svg  # 2 ms: not 5 ms


def test_a_budget_in_range_is_a_line_and_one_far_above_the_data_is_listed_off_scale() -> None:
    svg, legend = chart([CURVE], [], [EXCEEDED, FAR], DEVICE, 100)
    [line] = _groups(svg, "budget exceeded")
    assert ("<title>budget b: peak_allocated limit 1073741824 B (1.00 GiB); this device 1610612736 B — exceeded"
            "</title>") in line and 'stroke="#d62728"' in line  # red: exceeded
    assert _groups(svg, "budget ok") == []  # the far one has no line
    labels = [re.findall(r"<tspan[^>]*>([^<]*)</tspan>", note) for note in _groups(svg, "budgetnote")]
    assert labels == [["b: peak_allocated", "≤ 1.00 GiB — EXCEEDED"],
                      ["↑ far: peak_reserved", "≤ 10.00 GiB (off scale)"]]  # at the top of the label column
    assert [re.sub(r"<[^>]+>", "", item) for item in legend] == [
        "PTA+GE allocated (3 samples, 3 drawn; from memory_record.csv)",
        "budget b peak_allocated ≤ 1.00 GiB — EXCEEDED", "budget far peak_reserved ≤ 10.00 GiB (off scale)"]


def test_the_peak_is_marked_at_its_exact_value_and_step() -> None:
    [peak] = _groups(chart([CURVE], [], [], DEVICE, 100)[0], "peak")
    assert ("peak_allocated_bytes = 1610612736 B (1.50 GiB) at +1.000 ms after the profile start, step 2; "
            "2025-01-09 07:48:03.574957920 UTC") in peak
    assert 'class="peaklabel">peak 1.50 GiB · step 2 <tspan class="exact">(1610612736 B)</tspan>' in peak
    outside = {**DEVICE, "peak_t_ns": T0 + 9 * MS}
    assert _groups(chart([CURVE], [], [], outside, 100)[0], "peak") == []  # not in the drawn range


def test_a_long_curve_is_drawn_from_at_most_max_points_samples() -> None:
    n = 10_000
    t = T0 + np.arange(n, dtype=np.int64) * 1000
    values = (np.arange(n, dtype=np.int64) % 97) * 1024
    svg, legend = chart([Curve("allocated", "PTA allocated", t, values, None)], [], [], DEVICE, 200)
    [path] = re.findall(r'<path class="curve allocated" d="([^"]*)"', svg)
    drawn = path.count("H") + 1  # M then one H..V per further sample
    assert drawn <= 200
    assert f"PTA allocated: {n} samples, {drawn} drawn; max {96 * 1024} B (96.00 KiB)" in svg  # the max is exact
    assert f"(10,000 samples, {drawn:,} drawn; from -)" in legend[0]

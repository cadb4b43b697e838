"""memgate.html_text: the HTML report's text. Values escaped for text and attributes (no URL, no control
character), sizes exact and in IEC units, times relative to the profile start with the absolute time
on hover, where a time is one: ns since the epoch between 2000 and 2100."""

from __future__ import annotations

import pytest

from memgate.html_text import (
    BYTE_UNITS,
    TIME_UNITS,
    absolute_time,
    escape,
    exact_text,
    relative_time,
    size_text,
    unit_of,
    when_html,
)

T0 = 1736408883573957920  # 2025-01-09 07:48:03.573957920 UTC


def test_escape_quotes_markup_breaks_urls_and_writes_control_characters_as_escapes() -> None:
    assert escape('<a href="x">&\'</a>') == "&lt;a href=&quot;x&quot;&gt;&amp;&#x27;&lt;/a&gt;"
    assert escape("see http://example.com") == "see http:&#47;/example.com"  # the page holds no URL
    assert escape("op\x1b[31m run\udcff") == "op\\x1b[31m run\\xff"  # ESC; a path's byte that is not UTF-8
    assert escape(12) == "12"


def test_sizes_rounded_and_exact() -> None:
    assert (size_text(None), size_text(1536), size_text(10782243840)) == ("-", "1.50 KiB", "10.04 GiB")
    assert (exact_text(None), exact_text(1234), exact_text(1.5e9), exact_text(0.25)) == (
        "-", "1234 B", "1.5e+09 B", "0.25 B")


@pytest.mark.parametrize(("value", "units", "floor", "unit"), [
    (1536, BYTE_UNITS, 1.0, (1024, "KiB")),
    (1 << 30, BYTE_UNITS, 1.0, (1 << 30, "GiB")),
    (0, BYTE_UNITS, 1.0, (1, "B")),  # below every unit: the smallest
    (5000, TIME_UNITS, 5, (1000, "µs")),  # reaches 5 µs
    (4999, TIME_UNITS, 5, (1, "ns")),
])
def test_unit_of_is_the_largest_unit_the_value_reaches_floor_times(value: float, units: tuple[tuple[int, str], ...],
                                                                  floor: float, unit: tuple[int, str]) -> None:
    assert unit_of(value, units, floor) == unit


def test_relative_time_in_the_largest_unit_it_reaches() -> None:
    assert [relative_time(T0 + d, T0) for d in (0, 1_250_000, 2_500_000_000, 999)] == [
        "+0.000 ns", "+1.250 ms", "+2.500 s", "+999.000 ns"]
    assert relative_time(T0 - 5, T0) == "-5.000 ns"  # before the start: its sign, no "+"


def test_absolute_time_between_2000_and_2100_else_the_writers_clock() -> None:
    assert absolute_time(T0) == "2025-01-09 07:48:03.573957920 UTC (1736408883573957920 ns since the epoch)"
    start_2000, start_2100 = 946_684_800 * 10**9, 4_102_444_800 * 10**9
    assert absolute_time(start_2000) == "2000-01-01 00:00:00.000000000 UTC (946684800000000000 ns since the epoch)"
    assert absolute_time(start_2000 - 1) == "t = 946684799999999999 ns on the writer's clock"
    assert absolute_time(start_2100) == "t = 4102444800000000000 ns on the writer's clock"
    assert absolute_time(12345) == "t = 12345 ns on the writer's clock"  # a trace's own microseconds


def test_when_html_is_relative_with_the_absolute_time_on_hover() -> None:
    assert when_html(T0 + 1_250_000, T0) == ('<span class="time" title="2025-01-09 07:48:03.575207920 UTC '
                                            '(1736408883575207920 ns since the epoch)">+1.250 ms</span>')
    assert when_html(5, None) == ("<span title=\"t = 5 ns on the writer&#x27;s clock\">"
                                  "t = 5 ns on the writer&#x27;s clock</span>")  # no start to count from

"""Text for the HTML report: escaping, exact and IEC sizes, and times as the page shows them.

Shared by the page's tables (:mod:`memgate.html_report`) and its SVG chart (:mod:`memgate.html_chart`).
"""

from __future__ import annotations

import html
from datetime import UTC, datetime

from memgate.errors import printable
from memgate.sizes import format_size

BYTE_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"), (1, "B"))
TIME_UNITS = ((1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "µs"), (1, "ns"))
# Times between 2000 and 2100 read as ns since the epoch; others are a writer's own clock (a
# snapshot's trace index, a trace's relative microseconds).
_EPOCH_RANGE = (946_684_800 * 10**9, 4_102_444_800 * 10**9)


def escape(value: object) -> str:
    """Escape for text and attribute values; ``://`` as an entity so the file holds no URL; what a
    page cannot show (control characters, a path's bytes that are not UTF-8) as escapes."""
    return html.escape(printable(str(value)), quote=True).replace("://", ":&#47;/")


def size_text(value: float | None) -> str:
    return "-" if value is None else format_size(value)


def exact_text(value: float | None) -> str:
    """The exact size: ``1234 B`` (``-`` where there is none)."""
    if value is None:
        return "-"
    return f"{value} B" if isinstance(value, int) else f"{value:.6g} B"


def unit_of(value: float, units: tuple[tuple[int, str], ...], floor: float = 1.0) -> tuple[int, str]:
    """The largest (factor, unit) of ``units`` that ``value`` reaches ``floor`` times; else the smallest."""
    return next(((f, u) for f, u in units if value >= f * floor), units[-1])


def relative_time(t_ns: int, t0: int) -> str:
    """``+1.250 ms``: ``t_ns`` after ``t0`` in the largest unit it reaches."""
    d = t_ns - t0
    factor, unit = unit_of(abs(d), TIME_UNITS)
    return f"+{d / factor:.3f} {unit}" if d >= 0 else f"{d / factor:.3f} {unit}"


def absolute_time(t_ns: int) -> str:
    """``2025-01-09 07:48:03.573957920 UTC (1736408883573957920 ns since the epoch)``."""
    if _EPOCH_RANGE[0] <= t_ns < _EPOCH_RANGE[1]:
        seconds, ns = divmod(t_ns, 10**9)
        stamp = datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")
        return f"{stamp}.{ns:09d} UTC ({t_ns} ns since the epoch)"
    return f"t = {t_ns} ns on the writer's clock"


def when_html(t_ns: int, t0: int | None) -> str:
    """A time as the page shows it: relative to the profile start, the absolute time on hover."""
    if t0 is None:
        return f'<span title="{escape(absolute_time(t_ns))}">{escape(absolute_time(t_ns))}</span>'
    return f'<span class="time" title="{escape(absolute_time(t_ns))}">{escape(relative_time(t_ns, t0))}</span>'

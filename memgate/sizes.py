"""Size strings: ``"24 GiB"``, ``"512MiB"``, ``"1.5 GiB"``, bare int = bytes.

IEC units are exact. ``KB/MB/GB/TB`` are the same binary units, as the Ascend files use them.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from memgate.errors import ConfigError, show

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "kb": 1 << 10,
    "k": 1 << 10,
    "mib": 1 << 20,
    "mb": 1 << 20,
    "m": 1 << 20,
    "gib": 1 << 30,
    "gb": 1 << 30,
    "g": 1 << 30,
    "tib": 1 << 40,
    "tb": 1 << 40,
    "t": 1 << 40,
}
MAX_SIZE = 1 << 56  # memgate.model.MAX_BYTES: 64 PiB, more than any device holds
_MAX_NUMBER_CHARS = 40  # of the number in a size or percentage (64 PiB in bytes has 17 digits)
ACCEPTED_UNITS = "B, KiB, MiB, GiB, TiB (KB/MB/GB/TB mean the same binary units)"
_SIZE_RE = re.compile(r"\A\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*\Z")


def parse_size(value: object, *, what: str = "size") -> int:
    """Return bytes for a size string or a non-negative int; raise ConfigError otherwise."""
    if isinstance(value, bool):
        raise ConfigError(f"invalid {what}", expected=ACCEPTED_UNITS, found=repr(value))
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"invalid {what}: negative", expected="a size >= 0", found=show(value))
        if value > MAX_SIZE:
            raise ConfigError(f"invalid {what}: past 64 PiB", expected=f"a size up to {MAX_SIZE} bytes (64 PiB)",
                              found=show(value))
        return value
    if not isinstance(value, str):
        raise ConfigError(f"invalid {what}", expected=f"a size string in {ACCEPTED_UNITS}", found=repr(value))
    match = _SIZE_RE.match(value)
    unit = match.group("unit").lower() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(f"invalid {what} {show(value)}", expected=f"a number with a unit in {ACCEPTED_UNITS}")
    try:
        number = Decimal(match.group("num"))
    except InvalidOperation:  # pragma: no cover - the regex admits only decimals
        raise ConfigError(f"invalid {what} {show(value)}", expected=ACCEPTED_UNITS) from None
    if match.end("num") - match.start("num") > _MAX_NUMBER_CHARS:  # no size needs it; Decimal would take it
        raise ConfigError(f"invalid {what} {show(value)}", expected=f"a size up to 64 PiB in {ACCEPTED_UNITS}")
    scaled = number * _UNITS[unit]
    if scaled != scaled.to_integral_value():
        raise ConfigError(f"invalid {what} {show(value)}: not a whole number of bytes", expected="a whole byte count")
    if scaled > MAX_SIZE:  # no device holds more (memgate.model.MAX_BYTES): a limit that can never fail
        raise ConfigError(f"invalid {what} {show(value)}: past 64 PiB", expected=f"a size up to 64 PiB ({MAX_SIZE} bytes)")
    return int(scaled)


_INT_TEXT = re.compile(r"\s*(?P<num>-?0*[0-9]{1,18})\s*")


def int_text(text: str) -> int | None:
    """The integer ``text`` writes in ASCII digits (at most 18 past leading zeros: an int64), else None.

    ``int()`` alone takes what no one types as a count: ``'１０'`` and ``'٣'`` (other scripts' digits),
    ``'1_000'``, and a 5000-digit text it refuses with a ValueError of its own."""
    match = _INT_TEXT.fullmatch(text)
    return int(match.group("num")) if match else None


_IEC = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def format_size(nbytes: float) -> str:
    """IEC text with two decimals, e.g. ``25.10 GiB``; negative values keep their sign."""
    sign = "-" if nbytes < 0 else ""
    value = abs(nbytes)
    for factor, unit in _IEC:
        if value >= factor:
            return f"{sign}{value / factor:.2f} {unit}"
    return f"{sign}{value:.0f} B" if value == int(value) else f"{sign}{value:.2f} B"


_SHARE_RE = re.compile(r"\A\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*%\s*\Z")


def parse_share(value: object, *, what: str = "size") -> float | None:
    """A limit written as a percentage of the device's capacity (``"92%"``) → 0.92; None if not one."""
    if not isinstance(value, str):
        return None
    match = _SHARE_RE.match(value)
    if match is None:
        return None
    if len(match.group("num")) > _MAX_NUMBER_CHARS:
        raise ConfigError(f"invalid {what} {show(value)}", expected="a percentage above 0% and at most 100%")
    share = float(match.group("num")) / 100
    if not 0 < share <= 1:  # more than the whole device can never fail
        raise ConfigError(f"invalid {what} {show(value)}", expected="a percentage above 0% and at most 100%")
    return share


def format_share(share: float) -> str:
    """0.92 → ``92%``; 0.925 → ``92.5%``."""
    return f"{share * 100:.6g}%"

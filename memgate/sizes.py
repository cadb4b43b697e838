"""Size strings: ``"24 GiB"``, ``"512MiB"``, ``"1.5 GiB"``, bare int = bytes.

IEC units are exact. ``KB/MB/GB/TB`` are the same binary units, as the Ascend files use them.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from memgate.errors import ConfigError

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
ACCEPTED_UNITS = "B, KiB, MiB, GiB, TiB (KB/MB/GB/TB mean the same binary units)"
_SIZE_RE = re.compile(r"\A\s*(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[A-Za-z]*)\s*\Z")


def parse_size(value: object, *, what: str = "size") -> int:
    """Return bytes for a size string or a non-negative int; raise ConfigError otherwise."""
    if isinstance(value, bool):
        raise ConfigError(f"invalid {what}", expected=ACCEPTED_UNITS, found=repr(value))
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"invalid {what}: negative", expected="a size >= 0", found=str(value))
        return value
    if not isinstance(value, str):
        raise ConfigError(f"invalid {what}", expected=f"a size string in {ACCEPTED_UNITS}", found=repr(value))
    match = _SIZE_RE.match(value)
    unit = match.group("unit").lower() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(f"invalid {what} {value!r}", expected=f"a number with a unit in {ACCEPTED_UNITS}")
    try:
        number = Decimal(match.group("num"))
    except InvalidOperation:  # pragma: no cover - the regex admits only decimals
        raise ConfigError(f"invalid {what} {value!r}", expected=ACCEPTED_UNITS) from None
    scaled = number * _UNITS[unit]
    if scaled != scaled.to_integral_value():
        raise ConfigError(f"invalid {what} {value!r}: not a whole number of bytes", expected="a whole byte count")
    return int(scaled)


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
    share = float(match.group("num")) / 100
    if share <= 0:
        raise ConfigError(f"invalid {what} {value!r}", expected="a percentage above 0%")
    return share


def format_share(share: float) -> str:
    """0.92 → ``92%``; 0.925 → ``92.5%``."""
    return f"{share * 100:.6g}%"

"""Size strings: ``"24 GiB"``, ``"512MiB"``, ``"1.5 GiB"``, bare int = bytes.

The one reader of a size, for budget files, markers, compare rules and the environment's caps. A
size is an ASCII number (digits, an optional decimal fraction; no sign, exponent or separators), an
optional unit, and spaces or tabs around them. The units are :data:`UNITS`, in any case: IEC units
are exact, and ``KB/MB/GB/TB`` (and ``K/M/G/T``) are the same binary units, as the Ascend files use
them, so ``"64 kB"`` is 65536 bytes. A size is a whole number of bytes up to :data:`MAX_BYTES`.
budgets.schema.json's size pattern is :data:`SIZE_PATTERN`, written from the same table.
"""

from __future__ import annotations

import re

from memgate.errors import ConfigError, show

# The one table of units (matched in any case): unit → bytes. No unit is bytes too.
UNITS: dict[str, int] = {
    "B": 1,
    "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
    "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40,
    "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40,
}
_BY_FOLDED = {unit.casefold(): factor for unit, factor in UNITS.items()}
ACCEPTED_UNITS = "B, KiB, MiB, GiB, TiB (KB/MB/GB/TB and K/M/G/T mean the same binary units; any case)"
MAX_BYTES = 1 << 56  # memgate.model.MAX_BYTES: 64 PiB, more than any device holds (a limit that could never fail)
MAX_SIZE = MAX_BYTES
_UP_TO = f"a size up to 64 PiB ({MAX_BYTES} bytes)"
_MAX_NUMBER_CHARS = 40  # of the number in a percentage (no share needs more)
_MAX_FRACTION_DIGITS = 40  # a fraction of more (trailing zeros aside) is never whole bytes: 2**-40 has 40


def _any_case(unit: str) -> str:
    return "".join(f"[{c.upper()}{c.lower()}]" for c in unit)


# Longest first: a regex alternation takes the first that matches. The same text in Python and in
# a JSON Schema (ECMA-262) regex: no flags, no \Z, [ \t] rather than \s (which differ between them).
SIZE_PATTERN = (r"^[ \t]*[0-9]+(\.[0-9]+)?[ \t]*("
                + "|".join(_any_case(u) for u in sorted(UNITS, key=lambda u: (-len(u), u))) + r")?[ \t]*$")
_SIZE_RE = re.compile(r"\A[ \t]*(?P<num>[0-9]+(?:\.[0-9]+)?)[ \t]*(?P<unit>[A-Za-z]*)[ \t]*\Z")
_NEGATIVE_RE = re.compile(r"\A[ \t]*-[ \t]*[0-9]")


def parse_size(value: object, *, what: str = "size") -> int:
    """Return bytes for a size string or an int in 0..MAX_BYTES; raise ConfigError otherwise.

    Every message names ``what`` and the value; one about the form lists the accepted units."""
    if isinstance(value, bool):
        raise ConfigError(f"invalid {what}", expected=ACCEPTED_UNITS, found=repr(value))
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"invalid {what}: negative", expected="a size >= 0", found=show(value))
        if value > MAX_BYTES:
            raise ConfigError(f"invalid {what}: past 64 PiB", expected=_UP_TO, found=show(value))
        return value
    if not isinstance(value, str):
        raise ConfigError(f"invalid {what}", expected=f"a size string in {ACCEPTED_UNITS}", found=show(value))
    shown = show(value)
    if _NEGATIVE_RE.match(value):
        raise ConfigError(f"invalid {what} {shown}: negative", expected="a size >= 0")
    match = _SIZE_RE.match(value)
    if match is None:
        raise ConfigError(f"invalid {what} {shown}", expected=f"a number with a unit in {ACCEPTED_UNITS}")
    unit = match.group("unit")
    factor = _BY_FOLDED.get(unit.casefold(), 1 if not unit else None)
    if factor is None:
        raise ConfigError(f"invalid {what} {shown}: unknown unit {unit!r}", expected=f"one of {ACCEPTED_UNITS}")
    whole, _, fraction = match.group("num").partition(".")
    whole, fraction = whole.lstrip("0"), fraction.rstrip("0")
    if len(whole) > len(str(MAX_BYTES)):  # before int(): a number of 5000 digits is no size either
        raise ConfigError(f"invalid {what} {shown}: past 64 PiB", expected=_UP_TO)
    if len(fraction) > _MAX_FRACTION_DIGITS:
        raise ConfigError(f"invalid {what} {shown}: not a whole number of bytes", expected="a whole byte count")
    # Exact: integer arithmetic on the digits (Decimal would round past 28 digits, float far sooner).
    denominator: int = 10 ** len(fraction)
    scaled, rest = divmod(int(whole + fraction or "0") * factor, denominator)
    if rest:
        raise ConfigError(f"invalid {what} {shown}: not a whole number of bytes", expected="a whole byte count")
    if scaled > MAX_BYTES:
        raise ConfigError(f"invalid {what} {shown}: past 64 PiB", expected=_UP_TO)
    return scaled


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

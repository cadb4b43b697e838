"""memgate.sizes: size strings in budgets (``"1.5 GiB"``, ``"512MiB"``, a bare int of bytes) read exactly,
sizes written as IEC text with two decimals, and limits written as a share of the device (``"92%"``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from memgate.errors import ConfigError
from memgate.schemas import load_schema
from memgate.sizes import (
    ACCEPTED_UNITS,
    MAX_BYTES,
    MAX_SIZE,
    SIZE_PATTERN,
    format_share,
    format_size,
    int_text,
    parse_share,
    parse_size,
)
from memgate.sizes import UNITS as UNITS_TABLE

UNITS = "B, KiB, MiB, GiB, TiB (KB/MB/GB/TB and K/M/G/T mean the same binary units; any case)"
FORM = f"expected a number with a unit in {UNITS}"
FACTORS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "KB": 1 << 10, "MB": 1 << 20,
           "GB": 1 << 30, "TB": 1 << 40, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
MAX = 2**56  # 64 PiB: more than any device holds (a larger limit could never fail)


def test_the_unit_table_is_the_documented_one() -> None:
    assert UNITS_TABLE == FACTORS and ACCEPTED_UNITS == UNITS and MAX_BYTES == MAX


@pytest.mark.parametrize("unit", sorted(FACTORS))
@pytest.mark.parametrize("case", [str, str.upper, str.lower, str.swapcase])
def test_every_unit_in_any_case(unit: str, case: Callable[[str], str]) -> None:
    assert parse_size(f"3 {case(unit)}") == parse_size(f"3{case(unit)}") == 3 * FACTORS[unit]


@pytest.mark.parametrize(("text", "nbytes"), [
    ("1.5 GiB", 3 << 29),
    ("0 B", 0),
    ("0", 0),
    (0, 0),
    (7, 7),  # a bare int is bytes
    ("7", 7),  # so is a number without a unit
    ("512MiB", 512 << 20),
    (" 24 gib ", 24 << 30),  # units in any case, spaces around
    ("\t64\tMiB\t", 64 << 20),  # tabs too
    ("64 kB", 64 << 10),  # a lowercase k is the same binary unit: one rule for markers and files
    ("64 KB", 64 << 10),  # KB/MB/GB/TB are the binary units, as the Ascend files use them
    ("64kb", 64 << 10),
    ("1k", 1024),
    ("2 TB", 2 << 40),
    ("0.5 KiB", 512),
    ("1.25 MiB", 1310720),  # exact arithmetic, no float rounding
    ("0.00000095367431640625 MiB", 1),  # 2**-20 MiB: twenty fraction digits, still exact
    ("1.500000000000000000000000000000000000000000000000000 KiB", 1536),  # trailing zeros say nothing
    ("000000000000000000000000000000000000001 KiB", 1024),  # nor do leading ones
    (MAX, MAX),
    (str(MAX), MAX),
    ("65535.5 TiB", 2**56 - 2**39),  # just below the largest
])
def test_sizes_parse_to_exact_bytes(text: object, nbytes: int) -> None:
    assert parse_size(text) == nbytes
@pytest.mark.parametrize(("value", "message"), [
    # a unit not in the table: named, with the accepted ones
    ("12 parsecs", f"invalid eval.peak '12 parsecs': unknown unit 'parsecs'; expected one of {UNITS}"),
    ("64 XB", f"invalid eval.peak '64 XB': unknown unit 'XB'; expected one of {UNITS}"),
    ("24 PiB", f"invalid eval.peak '24 PiB': unknown unit 'PiB'; expected one of {UNITS}"),
    ("2 GiBs", f"invalid eval.peak '2 GiBs': unknown unit 'GiBs'; expected one of {UNITS}"),
    # anything else that is no number with a unit: trailing garbage, signs, exponents, separators
    ("1e3", f"invalid eval.peak '1e3'; {FORM}"),
    ("1e3 MiB", f"invalid eval.peak '1e3 MiB'; {FORM}"),
    ("2 GB!", f"invalid eval.peak '2 GB!'; {FORM}"),
    ("24 GiB extra", f"invalid eval.peak '24 GiB extra'; {FORM}"),
    ("1,5 GiB", f"invalid eval.peak '1,5 GiB'; {FORM}"),
    ("1_000 B", f"invalid eval.peak '1_000 B'; {FORM}"),
    ("+1 GiB", f"invalid eval.peak '+1 GiB'; {FORM}"),
    (".5 GiB", f"invalid eval.peak '.5 GiB'; {FORM}"),
    ("5. GiB", f"invalid eval.peak '5. GiB'; {FORM}"),
    ("GiB", f"invalid eval.peak 'GiB'; {FORM}"),
    ("", f"invalid eval.peak ''; {FORM}"),
    ("64 MiB\n", f"invalid eval.peak '64 MiB\\n'; {FORM}"),  # spaces and tabs only
    ("64\u00a0MiB", f"invalid eval.peak '64\\xa0MiB'; {FORM}"),  # a no-break space is no space here (and shown)
    ("\uff16\uff14 MiB", f"invalid eval.peak '\uff16\uff14 MiB'; {FORM}"),  # ASCII digits only: no fullwidth 64
    ("\u0666\u0664 MiB", f"invalid eval.peak '\u0666\u0664 MiB'; {FORM}"),  # nor Arabic-Indic ones
    # negative, not whole, too large
    ("-1 GiB", "invalid eval.peak '-1 GiB': negative; expected a size >= 0"),
    (" - 0", "invalid eval.peak ' - 0': negative; expected a size >= 0"),
    (-1, "invalid eval.peak: negative; expected a size >= 0, found '-1'"),
    ("1.5 B", "invalid eval.peak '1.5 B': not a whole number of bytes; expected a whole byte count"),
    ("1.0001 KiB", "invalid eval.peak '1.0001 KiB': not a whole number of bytes; expected a whole byte count"),
    ("1.00000000000000000000000000000001 KiB",  # past Decimal's 28 digits: still not whole
     ("invalid eval.peak '1.00000000000000000000000000000001 KiB': not a whole number of bytes; "
      "expected a whole byte count")),
    ("65537 TiB", f"invalid eval.peak '65537 TiB': past 64 PiB; expected a size up to 64 PiB ({MAX} bytes)"),
    (str(MAX + 1), f"invalid eval.peak '{MAX + 1}': past 64 PiB; expected a size up to 64 PiB ({MAX} bytes)"),
    (MAX + 1, f"invalid eval.peak: past 64 PiB; expected a size up to 64 PiB ({MAX} bytes), found '{MAX + 1}'"),
    # not a size at all
    (True, f"invalid eval.peak; expected {UNITS}, found 'True'"),  # a TOML true is no 1 byte
    (1.5, f"invalid eval.peak; expected a size string in {UNITS}, found '1.5'"),
    (None, f"invalid eval.peak; expected a size string in {UNITS}, found 'None'"),
])
def test_a_bad_size_is_a_config_error_naming_what_it_is_for(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(value, what="eval.peak")
    assert info.value.one_line() == message


@pytest.mark.parametrize(("value", "says"), [
    ("1" * 5000 + " KiB", "past 64 PiB"),  # refused before int(), which raises past 4300 digits
    ("0." + "0" * 5000 + "1 B", "not a whole number of bytes"),
    ("0" * 5000 + "1 x", "unknown unit 'x'"),
])
def test_a_long_size_is_refused_in_bounded_time_and_shown_cut(value: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(value, what="eval.peak")
    assert says in info.value.one_line() and len(info.value.one_line()) < 300


# ---- the budgets schema's size pattern is the reader's ---------------------------------------------

def _schema_size() -> dict[str, Any]:
    return load_schema("budgets")["$defs"]["size"]  # type: ignore[no-any-return]


def test_the_budgets_schema_size_pattern_is_written_from_the_unit_table() -> None:
    integer, string, _share = _schema_size()["oneOf"]
    assert string["pattern"] == SIZE_PATTERN, f"write {SIZE_PATTERN!r} into budgets.schema.json"
    assert (integer["minimum"], integer["maximum"]) == (0, MAX_BYTES)
    assert not re.search(r"\\[AZzs]|\(\?", SIZE_PATTERN)  # the same in ECMA-262: no \A \Z \s, no inline flags


SAMPLES = [*(f"3 {u}" for u in FACTORS), *(f"3{u.swapcase()}" for u in FACTORS), "64 kB", " 64 MiB ", "\t1\tG\t",
           "1.5 GiB", "0", "7", "65535.5 TiB", "12 parsecs", "64 XB", "24 PiB", "1e3", "1e3 MiB", "2 GB!",
           "1,5 GiB", "-1 GiB", ".5 GiB", "", "64\u00a0MiB", "\uff16\uff14 MiB", "92%", 0, 7, MAX, MAX + 1, -1, 1.5,
           True, None]


@pytest.mark.parametrize("value", SAMPLES)
def test_the_schema_accepts_what_the_reader_reads(value: object) -> None:
    """The schema (for editors and other tools) and parse_size judge a size alike; a share (``92%``)
    is the schema's other form."""
    schema = Draft202012Validator({"$defs": {"size": _schema_size()}, "$ref": "#/$defs/size"})
    try:
        read = parse_share(value) is not None or parse_size(value) >= 0
    except ConfigError:
        read = False
    assert schema.is_valid(value) == read


@pytest.mark.parametrize("value", ["1.5 B", "65537 TiB", "64 MiB\n"])
def test_what_only_the_reader_refuses(value: str) -> None:
    """Arithmetic (whole bytes, the largest size) and Python's ``$`` before a final newline: the
    schema's pattern lets these by, so memgate.budgets lets parse_size alone judge a file's sizes."""
    assert Draft202012Validator(_schema_size() | {"$defs": {}}).is_valid(value)
    with pytest.raises(ConfigError):
        parse_size(value)


@pytest.mark.parametrize(("nbytes", "text"), [
    (0, "0 B"),
    (1023, "1023 B"),
    (1024, "1.00 KiB"),
    (1536, "1.50 KiB"),
    (10782243840, "10.04 GiB"),
    (-2048, "-2.00 KiB"),  # a negative difference keeps its sign
    (0.5, "0.50 B"),  # a mean of bytes need not be whole
    (1 << 40, "1.00 TiB"),
    (1 << 50, "1024.00 TiB"),  # no unit past TiB
])
def test_format_size_is_iec_with_two_decimals(nbytes: float, text: str) -> None:
    assert format_size(nbytes) == text


@pytest.mark.parametrize(("text", "share"), [("92%", 0.92), (" 10 % ", 0.1), ("0.5%", 0.005), ("100%", 1.0)])
def test_a_percentage_is_a_share(text: str, share: float) -> None:
    assert parse_share(text) == share


@pytest.mark.parametrize("value", ["92", "92 pct", "1 GiB", 0.9, 92, None])
def test_what_is_not_a_percentage_is_no_share(value: object) -> None:
    assert parse_share(value) is None  # read as a size (and refused there) instead


def test_zero_percent_is_refused() -> None:
    with pytest.raises(ConfigError) as info:
        parse_share("0%", what="train.peak_reserved")
    assert info.value.one_line() == "invalid train.peak_reserved '0%'; expected a percentage above 0% and at most 100%"


def test_format_share() -> None:
    assert [format_share(s) for s in (0.92, 0.925, 1.0, 0.001234567)] == ["92%", "92.5%", "100%", "0.123457%"]


@pytest.mark.parametrize("value", ["９ GiB", "٣ MiB", "1_0 MiB", "NaN GiB", "inf", "1e3 MiB", "9" * 400 + " GiB",
                                   "65537 TiB", MAX_SIZE + 1, 2**63])
def test_hostile_sizes_are_one_bounded_error(value: object) -> None:
    """Other scripts' digits, '1_0', NaN, exponents (Decimal takes all of them), and sizes past 64 PiB: a
    limit no device can reach never fails."""
    with pytest.raises(ConfigError) as info:
        parse_size(value, what="train.peak_allocated")
    assert info.value.one_line().startswith("invalid train.peak_allocated") and len(info.value.one_line()) < 250
    assert parse_size(MAX_SIZE) == parse_size("65536 TiB") == MAX_SIZE


@pytest.mark.parametrize("value", ["100.5%", "150%", "9" * 400 + "%", "1" + "0" * 300 + "%"])
def test_a_share_past_the_whole_device_is_refused(value: str) -> None:
    """float('9' * 400) is inf: a limit of more than the device's whole capacity can never fail."""
    with pytest.raises(ConfigError) as info:
        parse_share(value, what="train.peak_reserved")
    assert info.value.expected == "a percentage above 0% and at most 100%" and len(info.value.one_line()) < 250


@pytest.mark.parametrize(("text", "number"), [("3", 3), (" 0012 ", 12), ("-4", -4), ("9" * 18, int("9" * 18)),
                                              ("9" * 19, None), ("²", None), ("３", None), ("\u0663", None),
                                              ("1_0", None), ("+1", None), ("1.0", None), ("", None)])
def test_int_text_is_ascii_digits(text: str, number: int | None) -> None:
    assert int_text(text) == number

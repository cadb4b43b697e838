"""memgate.sizes: size strings in budgets (``"1.5 GiB"``, ``"512MiB"``, a bare int of bytes) read exactly,
sizes written as IEC text with two decimals, and limits written as a share of the device (``"92%"``)."""

from __future__ import annotations

import pytest

from memgate.errors import ConfigError
from memgate.sizes import MAX_SIZE, format_share, format_size, int_text, parse_share, parse_size

UNITS = "B, KiB, MiB, GiB, TiB (KB/MB/GB/TB mean the same binary units)"


@pytest.mark.parametrize(("text", "nbytes"), [
    ("1.5 GiB", 3 << 29),
    ("0 B", 0),
    ("0", 0),
    (0, 0),
    (7, 7),  # a bare int is bytes
    ("512MiB", 512 << 20),
    (" 24 gib ", 24 << 30),  # units in any case, spaces around
    ("1 KB", 1024),  # KB/MB/GB/TB are the binary units, as the Ascend files use them
    ("1k", 1024),
    ("2 TB", 2 << 40),
    ("0.5 KiB", 512),
    ("1.25 MiB", 1310720),  # decimal arithmetic: exact, no float rounding
])
def test_sizes_parse_to_exact_bytes(text: object, nbytes: int) -> None:
    assert parse_size(text) == nbytes


@pytest.mark.parametrize(("value", "message"), [
    ("12 parsecs", f"invalid eval.peak '12 parsecs'; expected a number with a unit in {UNITS}"),
    ("-1 GiB", f"invalid eval.peak '-1 GiB'; expected a number with a unit in {UNITS}"),
    ("1e3", f"invalid eval.peak '1e3'; expected a number with a unit in {UNITS}"),
    ("1,5 GiB", f"invalid eval.peak '1,5 GiB'; expected a number with a unit in {UNITS}"),
    ("", f"invalid eval.peak ''; expected a number with a unit in {UNITS}"),
    ("1.5 B", "invalid eval.peak '1.5 B': not a whole number of bytes; expected a whole byte count"),
    ("1.0001 KiB", "invalid eval.peak '1.0001 KiB': not a whole number of bytes; expected a whole byte count"),
    (-1, "invalid eval.peak: negative; expected a size >= 0, found '-1'"),
    (True, f"invalid eval.peak; expected {UNITS}, found 'True'"),  # a TOML true is no 1 byte
    (1.5, f"invalid eval.peak; expected a size string in {UNITS}, found '1.5'"),
    (None, f"invalid eval.peak; expected a size string in {UNITS}, found 'None'"),
])
def test_a_bad_size_is_a_config_error_naming_what_it_is_for(value: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_size(value, what="eval.peak")
    assert info.value.one_line() == message


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

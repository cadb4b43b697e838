"""memgate.compare: regression rules, parsed and applied exactly at their boundary."""

from __future__ import annotations

from decimal import Decimal

import pytest

from memgate.compare import CompareRule, parse_rule
from memgate.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "percent", "absolute"),
    [
        ("peak_allocated:5%", Decimal(5), None),
        ("peak_allocated:+256MiB", None, 256 << 20),
        ("peak_allocated:2.5%+256MiB", Decimal("2.5"), 256 << 20),
        ("fragmentation:+0.02", None, 0.02),
        ("leaked:0.5%", Decimal("0.5"), None),
    ],
)
def test_parse_rule(text: str, percent: Decimal | None, absolute: float | None) -> None:
    rule = parse_rule(text)
    assert (rule.percent, rule.absolute) == (percent, absolute)


@pytest.mark.parametrize("text", ["peak_allocated", "peak_allocated:", "peak:5%", "peak_allocated:5", "peak_allocated:+5 parsecs",
                                  "peak_allocated:5%%", "peak_allocated:-5%"])
def test_bad_rules_are_rejected(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_rule(text)


def test_allowed_is_exact_for_bytes() -> None:
    rule = CompareRule("peak_allocated", Decimal("2.5"), 256 << 20, "x")
    assert rule.allowed(1000) == 1000 + (256 << 20)
    assert CompareRule("peak_allocated", Decimal("2.5"), None, "x").allowed(1000) == 1025
    assert CompareRule("peak_allocated", Decimal("2.5"), None, "x").allowed(999) == 1023  # floor of 1023.975


@pytest.mark.parametrize(
    ("text", "percent", "absolute"),
    [
        ("external_fragmentation:+0.05", None, 0.05),
        ("free_block_fragmentation:2.5%+0.01", Decimal("2.5"), 0.01),
        ("leak_undetermined:+1MiB", None, 1 << 20),
        ("allocated_at_dump:5%", Decimal(5), None),
        ("reserved_at_dump:+1GiB", None, 1 << 30),
        ("largest_free_block:+512MiB", None, 512 << 20),
    ],
)
def test_parse_rule_for_new_metrics(text: str, percent: Decimal | None, absolute: float | None) -> None:
    rule = parse_rule(text)
    assert (rule.percent, rule.absolute) == (percent, absolute)


@pytest.mark.parametrize("text", ["external_fragmentation:+nan", "external_fragmentation:+inf",
                                  "external_fragmentation:+1e-2", "external_fragmentation:+1MiB",
                                  "leak_undetermined:+0.5", "leak_horizon_steps:+1"])
def test_bad_rules_for_new_metrics_are_rejected(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_rule(text)


@pytest.mark.parametrize("text", ["peak_allocated:" + "9" * 400 + "%", "peak_allocated:1234567%",
                                  "peak_allocated:５%", "peak_allocated:NaN%", "peak_allocated:+" + "9" * 400 + "GiB",
                                  "fragmentation:+" + "9" * 400, "fragmentation:+inf", "fragmentation:+1e3",
                                  "x" * 100_000])
def test_hostile_numbers_in_a_rule_are_one_bounded_error(text: str) -> None:
    """float('9' * 400) is inf and a 400-digit percentage allows what no run reaches: refused, the rule shown cut."""
    with pytest.raises(ConfigError) as info:
        parse_rule(text)
    assert info.value.one_line().startswith("invalid compare rule '") and len(info.value.one_line()) < 400

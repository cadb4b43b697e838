"""Size limits written as a percentage of the device's capacity: from the profile where it records
it, else the budget's ``device_capacity``; neither is an error saying which to add."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import computed_cache

from memgate.budgets import Budget, budget_from_mapping, load_budget_file
from memgate.cli import main
from memgate.errors import ConfigError
from memgate.metric_cache import MetricCache
from memgate.metrics import DeviceMetrics
from memgate.session import measure

SAMPLE = Path(__file__).parent / "data" / "samples" / "ascend" / "msinsight_pta21_level1_rank0"
PEAK_RESERVED = 1600913408  # tests/test_plugin.py


def _cache(values: dict[str, Any], metadata: dict[str, Any] | None = None, devices: tuple[str, ...] = ("npu:0",),
           ) -> MetricCache:
    return computed_cache([DeviceMetrics(d, "blocks", "f", dict(values), {}, 10, None) for d in devices], metadata)


def _budget(**raw: Any) -> Budget:
    return budget_from_mapping({"name": "b", **raw}, origin="test")


def test_percent_parses_as_a_share() -> None:
    budget = _budget(peak_reserved="92%", op_caps={"mm*": "10 %"}, device_capacity="64 GiB")
    assert budget.shares == {"peak_reserved": 0.92, "op_caps[mm*]": 0.1}
    assert budget.device_capacity == 64 << 30
    assert budget.checks() == ["peak_reserved", "op_caps[mm*]"]
    assert budget.declared_limit("peak_reserved") == "92%"


@pytest.mark.parametrize("bad", ["0%", "-5%", "92 pct"])
def test_bad_percent(bad: str) -> None:
    with pytest.raises(ConfigError):
        _budget(peak_reserved=bad)


def test_percent_in_a_budget_file(tmp_path: Path) -> None:
    path = tmp_path / "memgate.toml"
    path.write_text('[[budgets]]\nname = "b"\npeak_reserved = "92%"\ndevice_capacity = "64 GiB"\n')
    [budget] = load_budget_file(path).budgets
    assert budget.shares == {"peak_reserved": 0.92}
    path.write_text('[[budgets]]\nname = "b"\npeak_reserved = "92%"\ndevice_capacity = "92%"\n')
    with pytest.raises(ConfigError, match="device_capacity"):
        load_budget_file(path)


def _sample_capacity() -> int | None:
    recorded = measure(SAMPLE)[0].profile.metadata.get("device_capacity_bytes") or {}
    value = recorded.get("npu:0")
    return int(value) if value else None


@pytest.mark.parametrize(("percent", "code"), [("75%", 0), ("74%", 1)])
def test_cli_percent_of_budget_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str], percent: str,
                                        code: int) -> None:
    if _sample_capacity() is not None:
        pytest.skip("the sample records its capacity")
    budgets = tmp_path / "b.toml"
    budgets.write_text(f'[[budgets]]\nname = "b"\npeak_reserved = "{percent}"\ndevice_capacity = "2 GiB"\n')
    report = tmp_path / "r.json"
    assert main(["check", str(SAMPLE), "--budgets", str(budgets), "--json", str(report)]) == code
    limit = int(int(percent[:-1]) / 100 * (2 << 30))
    [row] = json.loads(report.read_text())["budgets"]
    assert (row["limit"], row["limit_share"], row["value"]) == (limit, int(percent[:-1]) / 100, PEAK_RESERVED)
    assert f"limit {percent} of 2.00 GiB (device_capacity of budget 'b') = {limit} bytes" in row["message"]
    assert f"({percent})" in capsys.readouterr().out  # the table's limit column


def test_cli_no_capacity(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if _sample_capacity() is not None:
        pytest.skip("the sample records its capacity")
    budgets = tmp_path / "b.toml"
    budgets.write_text('[[budgets]]\nname = "b"\npeak_reserved = "75%"\n')
    assert main(["check", str(SAMPLE), "--budgets", str(budgets)]) == 2
    captured = capsys.readouterr()
    assert "75%" in captured.out  # the limit column shows the share it could not resolve
    assert "device_capacity" in captured.err


def test_pytest_percent(pytester: pytest.Pytester) -> None:
    if _sample_capacity() is not None:
        pytest.skip("the sample records its capacity")
    assert PEAK_RESERVED <= int(0.75 * (2 << 30))
    pytester.makefile(".toml", memgate='[[budgets]]\nname = "b"\npeak_reserved = "74%"\ndevice_capacity = "2 GiB"\n')
    result = pytester.runpytest(f"--memgate={SAMPLE}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*limit 74% of 2.00 GiB (device_capacity of budget 'b') = 1589137899 bytes*"])


def test_inspect_shows_headroom_to_capacity() -> None:
    from memgate.report import capacity_headroom, inspect_text
    dev = {"device": "npu:0", "component": "PTA", "metrics": {"peak_reserved_bytes": 3 << 30}, "not_measurable": {},
           "reconciliation": {"components": {}}}
    entry = {"path": "p", "format": "f", "rank": "0", "metadata": {"device_capacity_bytes": {"npu:0": 4 << 30}},
             "devices": [dev]}
    assert capacity_headroom(entry, dev) == (4 << 30, 1 << 30)
    assert "    capacity                 4.00 GiB (4294967296 B), headroom 1.00 GiB (25.0%) above the peak reserved" in (
        inspect_text(entry))
    assert capacity_headroom({**entry, "metadata": {}}, dev) is None

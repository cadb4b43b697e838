"""Size limits written as a percentage of the device's capacity: from the profile where it records
it, else the budget's ``device_capacity``; neither is an error saying which to add. End to end, through the
CLI and pytest; a share as a budget file or marker writes it is memgate.budgets' (tests/test_budgets.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memgate.cli import main
from memgate.session import measure

SAMPLE = Path(__file__).parent / "data" / "samples" / "ascend" / "msinsight_pta21_level1_rank0"
PEAK_RESERVED = 1600913408  # tests/test_plugin.py


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

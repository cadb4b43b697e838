"""`memgate diff` and `memgate suggest` on real profiles."""

from __future__ import annotations

import csv
import io
import json
import tomllib
from pathlib import Path

import pytest
from scale import scaled_copy

from memgate.budgets import parse_budget_table
from memgate.cli import main

EXAMPLE = Path(__file__).parents[1] / "examples" / "profiles" / "alexnet_3016828_20250109_ascend_pt"
MM_MAX = 150995456  # largest aten::mm block of the example (144 MiB), from operator_memory.csv


def _edit_ops(profile: Path, edit: dict[str, tuple[str, float]]) -> None:
    """Rename and/or resize operator_memory rows: {old name: (new name, size factor)}."""
    path = profile / "ASCEND_PROFILER_OUTPUT" / "operator_memory.csv"
    rows = list(csv.reader(io.StringIO(path.read_bytes().decode("utf-8"))))
    for row in rows[1:]:
        if row[0] in edit:
            name, factor = edit[row[0]]
            row[0], row[1] = name, repr(float(row[1]) * factor)
    path.write_bytes(("\r\n".join(",".join(r) for r in rows) + "\r\n").encode("utf-8"))


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    base = scaled_copy(EXAMPLE, tmp_path / "base" / "run_ascend_pt", 1.0)
    current = scaled_copy(EXAMPLE, tmp_path / "current" / "run_ascend_pt", 1.0)
    _edit_ops(current, {"aten::mm": ("aten::mm", 2.0), "aten::eq": ("aten::new_op", 1.0)})
    return base.parent, current.parent


def test_diff_names_the_operator_that_grew_and_the_new_one(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs[0]), str(runs[1])]) == 0
    out = capsys.readouterr().out.splitlines()
    grew = [line for line in out if "op grew:" in line]
    assert grew == ["  op grew: aten::mm 144.00 MiB -> 288.00 MiB (+144.00 MiB)"]
    assert "  new op:  aten::new_op 3.50 KiB" in out
    assert "  gone op: aten::eq (was 3.50 KiB)" in out


def test_diff_json_and_fail_rule(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs[0]), str(runs[1]), "--json", "--fail", "peak_allocated:5%"]) == 0
    diff = json.loads(capsys.readouterr().out)
    (device,) = diff["ranks"][0]["devices"]
    assert device["ops_grew"] == [{"op": "aten::mm", "base": MM_MAX, "current": 2 * MM_MAX, "delta": MM_MAX}]
    assert device["metrics"]["peak_allocated_bytes"]["delta"] == 0
    assert diff["regressions"][0]["passed"] is True


def test_diff_fails_on_a_grown_peak(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = scaled_copy(EXAMPLE, tmp_path / "b" / "run_ascend_pt", 1.0).parent
    heavy = scaled_copy(EXAMPLE, tmp_path / "h" / "run_ascend_pt", 1.1).parent
    assert main(["diff", str(base), str(heavy), "--fail", "peak_allocated:5%"]) == 1
    out = capsys.readouterr().out
    assert "FAILED peak_allocated 1.35 GiB exceeds baseline 1.23 GiB" in out


def test_diff_accepts_json_reports_and_baselines(runs: tuple[Path, Path], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "base.json"
    assert main(["inspect", str(runs[0]), "--json"]) == 0
    report.write_text(capsys.readouterr().out)
    assert main(["diff", str(report), str(runs[1])]) == 0
    assert "op grew: aten::mm" in capsys.readouterr().out


def test_diff_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(tmp_path / "nope"), str(EXAMPLE)]) == 2
    assert capsys.readouterr().err.startswith("memgate: error: ")
    assert main(["diff", str(EXAMPLE), str(EXAMPLE), "--fail", "peak:5"]) == 2


def test_suggest_prints_budgets_that_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["suggest", str(EXAMPLE), "--headroom", "10%", "--name", "alexnet"]) == 0
    text = capsys.readouterr().out
    table = tomllib.loads(text)["tool"]["memgate"]
    budgets = parse_budget_table(table, "suggested").budgets
    (budget,) = budgets
    assert budget.name == "alexnet"
    assert budget.limits["peak_allocated"] >= 1322299392 * 1.1
    assert budget.op_caps["aten::mm"] >= MM_MAX * 1.1
    (tmp_path / "pyproject.toml").write_text(text)
    assert main(["check", str(EXAMPLE), "--budgets", str(tmp_path / "pyproject.toml")]) == 0


def test_suggest_rejects_bad_headroom(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["suggest", str(EXAMPLE), "--headroom", "lots"]) == 2
    assert "headroom" in capsys.readouterr().err

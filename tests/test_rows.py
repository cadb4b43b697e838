"""memgate.rows: typed rows become the JSON report's rows with their keys in the report's order, and
come back unchanged from the JSON a test report carries (through pytest-xdist)."""

from __future__ import annotations

import json

import pytest

from memgate.budgets import budget_from_mapping
from memgate.compare import Regression
from memgate.errors import NotMeasurable, NotSelected
from memgate.rows import AgainstBaseline, CheckRow, Declared, ErrorRow, RankSpread, ReportPayload
from memgate.verdict import Outcome

BUDGET = budget_from_mapping({"name": "b", "peak_allocated": 100, "peak_reserved": "50%"}, origin="t")
BASE = ["profile", "rank", "budget", "metric", "limit", "value", "passed", "device"]


def _judged() -> CheckRow:
    outcome = Outcome("p", "0", "b", "peak_reserved", 50, 60, False, "npu:0", None, "m", (), "w", share=0.5)
    return CheckRow.judged(outcome)


def test_a_judged_row() -> None:
    row = _judged().as_json()
    assert list(row) == [*BASE, "message", "limit_share"]
    assert (row["limit"], row["value"], row["passed"], row["limit_share"]) == (50, 60, False, 0.5)


@pytest.mark.parametrize(("error", "key"), [(NotMeasurable("leaked is not measurable", file="p"), "error"),
                                            (NotSelected("not selected", file="p"), "skipped")])
def test_a_row_that_could_not_be_judged(error: NotMeasurable, key: str) -> None:
    row = CheckRow.unjudged(None, "root", BUDGET, "peak_reserved", error).as_json()
    assert list(row) == [*BASE, key, "message", "limit_text"]
    assert (row["profile"], row["rank"], row["limit"], row["limit_text"], row[key]) == (
        "root", "", 0, "50%", "p: " + error.message)


def test_rows_of_a_test_and_of_the_other_kinds_keep_their_order() -> None:
    spread = CheckRow("root", "0,1", "b", "rank_imbalance[peak_allocated]", 0.1, 0.2, False, "npu:0", "m",
                      spread=RankSpread("0", "1", 10, 8, "p0", "p1"))
    assert list(spread.of_test("memgate::x", Declared("memgate.toml", 3)).as_json()) == [
        *BASE, "message", "worst_rank", "best_rank", "worst_value", "best_value", "worst_profile", "best_profile",
        "test", "declared_in"]
    regression = Regression("0", "peak_allocated", 10, 12, 11, False, "npu:0", "m", baseline_commit="c0ffee")
    row = CheckRow.compared(regression, "p", "base.json").as_json()
    assert list(row) == [*BASE, "message", "baseline_value", "baseline", "attribution", "baseline_commit"]
    assert (row["budget"], row["limit"], row["baseline_value"], row["attribution"]) == ("baseline", 11, 10, None)


def test_rows_and_errors_come_back_from_their_json() -> None:
    rows = [_judged(), CheckRow.unjudged(None, "r", BUDGET, "peak_reserved", NotMeasurable("x")).of_test("t", None),
            CheckRow("r", "0", "baseline", "leaked", 1, 2, False, None, "m",
                     against=AgainstBaseline(1, "b.json", {"ops": []}, None)).of_test("t", Declared("f.py", None))]
    errors = [ErrorRow("p", "bad"), ErrorRow("", "marker", "tests/t.py::test_a", Declared("tests/t.py", 3)),
              ErrorRow("", "no profile", "memgate::root", None)]
    payload = ReportPayload("t", rows, errors[1], [{"path": "x"}], "kept", {"path": "y"})
    sent = json.loads(json.dumps(payload.as_json()))  # what a worker sends
    assert ReportPayload.from_json(sent) == payload
    assert [ErrorRow.from_json(e.as_json()) for e in errors] == errors
    assert list(errors[2].as_json()) == ["item", "test", "profile", "error", "declared_in"]
    assert errors[0].as_json() == {"profile": "p", "error": "bad"}


def test_an_empty_payload_says_nothing() -> None:
    assert ReportPayload().as_json() == {}
    assert ReportPayload(kept="k").as_json() == {"kept": "k"}

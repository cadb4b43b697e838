"""memgate.marks: a marker's keywords as its test's budget, a marked test's profile judged into rows,
its recording kept under a readable folder name, and its history compared by its node id."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import SAMPLES

from memgate.baselines import baseline_from_entries
from memgate.compare import parse_rule
from memgate.errors import ConfigError, MemgateError
from memgate.marks import (
    MarkedVerdict,
    artifact_name,
    compare_with_history,
    judge_marked_test,
    kept_path,
    marker_budget,
)
from memgate.rows import Declared

TRACE = SAMPLES / "torch" / "cpu_train_profile_memory.json"
WHERE = Declared("tests/test_a.py", 7)
TEST = "tests/test_a.py::test_b[x]"


def _budget(*args: Any, has_profile_dir: bool = True, **kwargs: Any) -> Any:
    return marker_budget(TEST, args, kwargs, WHERE, has_profile_dir=has_profile_dir, leak_horizon_steps=2)


def test_a_marker_budget_is_named_after_its_test() -> None:
    budget = _budget(peak_allocated="1 GiB")
    assert (budget.name, budget.leak_horizon_steps, budget.origin) == (TEST, 2, TEST)
    assert _budget(peak_allocated=1, name="small").name == f"{TEST} (small)"
    assert _budget(peak_allocated=1, profile="p", has_profile_dir=False).checks() == ["peak_allocated"]


@pytest.mark.parametrize(("args", "kwargs", "says"), [
    ((1,), {"peak_allocated": 1}, "takes keywords only, got (1,)"),
    ((), {"peak_alocated": 1}, "did you mean 'peak_allocated'"),
    ((), {"peak_allocated": 1, "profile": 3}, "invalid profile 3"),
    ((), {"rank_imbalance": {"peak_allocated": 0.1}}, "declare it in a budget file, not a marker"),
])
def test_a_bad_marker_names_its_test_file_and_line(args: tuple[Any, ...], kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as info:
        _budget(*args, **kwargs)
    assert info.value.one_line().startswith(f"tests/test_a.py:7: memgate marker of {TEST}: ")
    assert says in info.value.one_line()


def test_a_marker_needs_a_profile() -> None:
    with pytest.raises(ConfigError, match="needs a profile"):
        _budget(peak_allocated=1, has_profile_dir=False)


def test_recordings_are_kept_under_a_readable_unique_folder(tmp_path: Path) -> None:
    assert artifact_name("tests/a.py::test_b[x/y]").startswith("tests_a.py.test_b_x_y-")
    assert artifact_name("a::b") != artifact_name("a.b")  # read alike, two folders

    class Recorder:
        directory = tmp_path / "rec"

    assert kept_path("kept/t", Recorder(), tmp_path / "rec" / "trace.json") == str(Path("kept/t") / "trace.json")
    assert kept_path("kept/t", Recorder(), tmp_path / "rec") == "kept/t"
    assert kept_path("kept/t", Recorder(), tmp_path / "other") == str(tmp_path / "other")
    assert kept_path(None, Recorder(), "x") == "x"


def test_a_marked_profile_is_judged_into_rows_and_its_entry() -> None:
    verdict = judge_marked_test(TRACE, _budget(peak_allocated=1, op_caps={"aten::*": "1 GiB", "nothing*": 1}), None,
                                test=TEST, kept=None, keep_profiles=True, compare=None)
    assert [(r.metric, r.passed) for r in verdict.rows] == [("peak_allocated", False), ("op_caps[aten::*]", True),
                                                            ("op_caps[nothing*]", None)]
    assert [o.metric for o in verdict.failed] == ["peak_allocated"] and len(verdict.errors) == 1
    [entry] = verdict.profiles
    assert entry["path"] == str(TRACE) and entry["metadata"]["test"] == TEST
    failure = verdict.failure(top=1)
    assert failure is not None and failure[0].startswith("peak_allocated ")
    detail = failure[1].splitlines()
    # the failure's evidence first, then the error of the check that could not be judged
    assert detail[0].startswith("top 2 of 8 live blocks at the peak") and detail[-1].startswith("memgate: error: ")


def test_a_marked_test_with_nothing_to_judge_is_one_error_per_check(tmp_path: Path) -> None:
    verdict = judge_marked_test(tmp_path, _budget(peak_allocated=1, leaked=1), None, test=TEST, kept=None,
                                keep_profiles=False, compare=None)
    assert [(r.metric, r.profile, r.rank) for r in verdict.rows] == [("peak_allocated", str(tmp_path), ""),
                                                                    ("leaked", str(tmp_path), "")]
    assert len(verdict.errors) == 1 and verdict.failure(5) is None


def test_a_test_is_compared_with_its_own_history_only() -> None:
    def entry(path: str, peak: int) -> dict[str, Any]:
        return {"path": path, "format": "kineto", "rank": "0", "metadata": {},
                "devices": [{"device": "cpu", "metrics": {"peak_allocated_bytes": peak}}]}

    baseline = baseline_from_entries([entry("t::a", 100), entry("t::b", 1000)])
    said: list[str] = []
    rules = [parse_rule("peak_allocated:5%"), parse_rule("peak_allocated:+1")]
    found, errors = compare_with_history(entry("t::a", 106), rules, baseline, "base.json", test="t::a",
                                         missing=said.append)
    assert [r.message.split(" — ")[0] for r, _ in found] == [
        "peak_allocated 106 B exceeds baseline 100 B by 6 B (+6.0%), allowed +5%",
        "peak_allocated 106 B exceeds baseline 100 B by 6 B (+6.0%), allowed +1 B"]  # against t::a, never t::b
    assert {where for _, where in found} == {"base.json"} and not errors and not said
    found, errors = compare_with_history(entry("t::new", 1), rules, baseline, "base.json", test="t::new",
                                         missing=said.append)
    assert (found, errors, said) == ([], [], ["t::new is not in base.json"])  # once per test, not per rule

    def fail(why: str) -> None:
        raise ConfigError(f"{why} (--memgate-baseline-missing=fail)")

    found, errors = compare_with_history(entry("t::a", 1), rules, None, "no saved run", test="t::a", missing=fail)
    assert [e.one_line() for e in errors] == ["no saved run (--memgate-baseline-missing=fail)"]
    assert all(isinstance(e, MemgateError) for e in errors)


def test_the_failure_of_a_regression_names_its_baseline() -> None:
    from memgate.compare import Regression

    verdict = MarkedVerdict(regressions=[(Regression("0", "leaked", 1, 9, 2, False, "cpu", "leaked grew"), "b.json")])
    assert verdict.failure(5) == ("leaked grew", "baseline: b.json")

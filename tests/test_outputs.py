"""memgate.outputs: a run's results gathered from the payloads tests send, the end-of-run files written
from them, and the terminal summary that says what was written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memgate.outputs import RunOutputs, comparison_lines, json_report, repository_path
from memgate.rows import CheckRow, Declared, ErrorRow, ReportPayload
from memgate.settings import Settings


def _entry(path: str, peak: int = 100, **meta: Any) -> dict[str, Any]:
    return {"path": path, "format": "kineto", "rank": "0", "metadata": meta,
            "devices": [{"device": "cpu", "metrics": {"peak_allocated_bytes": peak}, "pool_of": {}}]}


def _row(profile: str, passed: bool, test: str = "memgate::x") -> CheckRow:
    return CheckRow(profile, "0", "b", "peak_allocated", 100, 50 if passed else 150, passed, "cpu",
                    "within" if passed else "exceeds").of_test(test, Declared("memgate.toml", 4))


def _outputs(tmp_path: Path, **settings: Any) -> RunOutputs:
    outputs = RunOutputs(Settings(**settings), tmp_path)
    outputs.add(ReportPayload("memgate::b", [_row("b", False)], profile=_entry("b", 150)), "failed")
    outputs.add(ReportPayload("memgate::a", [_row("a", True)], profile=_entry("a")), "passed")
    outputs.add(ReportPayload("t.py::test_m", marker_profiles=[_entry("/tmp/rec0", test="t.py::test_m")]), "passed")
    outputs.add(ReportPayload("t.py::test_bad", error=ErrorRow("", "bad marker", "t.py::test_bad")), "error")
    outputs.add(ReportPayload(kept="kept/t"), None)  # an unmarked test's recording: not counted
    return outputs


def test_payloads_are_gathered_sorted_and_counted(tmp_path: Path) -> None:
    outputs = _outputs(tmp_path)
    assert outputs.counts == {"failed": 1, "passed": 2, "error": 1}
    assert [r.profile for r in outputs.sorted_rows()] == ["a", "b"]
    assert [e["path"] for e in outputs.profile_entries()] == ["a", "b", "/tmp/rec0"]
    assert [e["path"] for e in outputs.history_entries()] == ["a", "b", "t.py::test_m"]  # a test by its node id
    assert outputs.kept == ["kept/t"]


def test_the_json_report_and_the_baseline_are_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memgate.outputs.git_commit", lambda directory: ("c" * 40, False))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    outputs = _outputs(tmp_path, json_path=tmp_path / "r.json", save_baseline=tmp_path / "base.json",
                       keep_traces=tmp_path / "kept")
    assert outputs.write()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report == json_report(outputs.profile_entries(), outputs.sorted_rows(), outputs.errors)
    assert [o["profile"] for o in report["budgets"]] == ["a", "b"] and report["errors"][0]["test"] == "t.py::test_bad"
    baseline = json.loads((tmp_path / "base.json").read_text())
    assert list(baseline["profiles"]) == ["0:a", "0:b", "0:t.py::test_m"]
    assert baseline["metadata"] == {"git_commit": "c" * 40, "git_dirty": False}
    summary = outputs.summary()
    assert ("section", "memgate") in summary
    assert summary[-3:] == [("line", f"memgate: JSON report written to {tmp_path / 'r.json'}"),
                            ("line", f"memgate: baseline written to {tmp_path / 'base.json'}"),
                            ("line", f"memgate: recordings of 1 test(s) kept in {tmp_path / 'kept'}")]


def test_an_unreadable_baseline_to_ratchet_is_kept_and_said(tmp_path: Path) -> None:
    (tmp_path / "base.json").write_text("{not json")
    outputs = _outputs(tmp_path, save_baseline=tmp_path / "base.json", ratchet=True)
    assert not outputs.write()  # the run's exit status says so
    assert (tmp_path / "base.json").read_text() == "{not json"
    [(kind, line)] = outputs.summary()[:1]
    assert kind == "error" and line.startswith("memgate: error: ") and line.endswith("(the baseline was not rewritten)")


def test_a_run_that_measured_nothing_saves_nothing_and_says_so(tmp_path: Path) -> None:
    outputs = RunOutputs(Settings(save_baseline=tmp_path / "b.json", autosave=True), tmp_path)
    assert outputs.write()
    assert not (tmp_path / "b.json").exists()
    assert [kind for kind, _ in outputs.summary()] == ["error", "line"]
    assert outputs.summary()[1][1].startswith("memgate: --memgate-autosave saved nothing")


def test_annotations_and_the_step_summary_in_github_actions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary.md"))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    outputs = _outputs(tmp_path)
    outputs.write()
    assert (tmp_path / "summary.md").read_text().startswith("### memgate: 1 failed, 2 passed, 1 error (2 checks)")
    annotations = [line for kind, line in outputs.summary() if line.startswith("::error")]
    assert annotations[0].startswith("::error file=memgate.toml,line=4,title=memgate memgate%3A%3Ax")
    assert len(annotations) == 2  # the failed row and the test's own error


def test_a_declared_file_is_named_from_the_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path.parent))
    assert repository_path("tests/t.py", tmp_path) == f"{tmp_path.name}/tests/t.py"
    monkeypatch.delenv("GITHUB_WORKSPACE")
    assert repository_path("tests/t.py", tmp_path) == "tests/t.py"
    assert repository_path("/elsewhere/t.py", tmp_path) == "/elsewhere/t.py"


def test_a_comparison_with_no_saved_run_names_the_configuration(tmp_path: Path) -> None:
    [line] = comparison_lines([_entry("a")], tmp_path / ".memgate", "")
    assert line.startswith("memgate: no saved run for configuration kineto-cpu-") and "--memgate-autosave" in line


def test_the_table_names_a_marked_tests_recording_by_its_kept_copy_else_by_the_test(tmp_path: Path) -> None:
    """A marked test's profile lives in pytest's temporary folder (``memgate_profile0``): the table names
    it by what outlives pytest, the kept copy under the rootdir, else the test's node id; a --memgate
    profile keeps its real name."""
    root = tmp_path / "project"
    kept = root / "memgate-recordings" / "tests_test_a.py.test_a-1234"
    kept.mkdir(parents=True)
    (kept / "torch_trace.json").write_text("{}")
    outputs = RunOutputs(Settings(), root)
    test_a, test_b = "tests/test_a.py::test_a", "tests/test_b.py::test_b"
    temp = tmp_path / "pytest-of-u" / "memgate_profile0"
    a_row = CheckRow(str(temp / "torch_trace.json"), "0", test_a, "peak_allocated", 100, 50, True, "cpu",
                     "within").of_test(test_a, None)  # a marker's row: its budget is the test
    outputs.add(ReportPayload(test_a, [a_row], kept=str(kept)), "passed")
    b_row = CheckRow(str(tmp_path / "pytest-of-u" / "memgate_profile1"), "0", test_b, "peak_allocated", 100, 50, True,
                     "cpu", "within").of_test(test_b, None)
    outputs.add(ReportPayload(test_b, [b_row]), "passed")
    outputs.add(ReportPayload("memgate::run_ascend_pt::b::peak_allocated", [_row(str(root / "prof" / "run_ascend_pt"),
                                                                                 True)]), "passed")
    table = [text for kind, text in outputs.summary() if kind == "line" and text.startswith("0 cpu")]
    assert [line.split()[-1] for line in table] == [
        "run_ascend_pt", "memgate-recordings/tests_test_a.py.test_a-1234/torch_trace.json", test_b]
    assert not any("memgate_profile" in line for line in table)

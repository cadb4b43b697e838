"""CI outputs as pure text: annotations on the declaring line, step summary counts in pytest's words."""

from __future__ import annotations

import pytest

from memgate.ci import counts_text, github_annotations, step_summary_markdown

MARKER_ROW = {"test": "tests/test_model.py::test_step[cpu]", "budget": "tests/test_model.py::test_step[cpu]",
              "metric": "peak_allocated", "rank": "0", "device": "cpu", "value": 2048, "limit": 1024,
              "passed": False, "message": "peak_allocated 2.00 KiB exceeds budget 1.00 KiB by 1.00 KiB (+100.0%) — rank 0 cpu",
              "declared_in": {"file": "tests/test_model.py", "line": 12}, "profile": "/tmp/x/torch_trace.json"}
FILE_ROW = {"test": "memgate::prof/run_ascend_pt::train::op_caps[cann::*]", "budget": "train", "metric": "op_caps[cann::*]",
            "rank": "3", "device": "npu:3", "value": None, "limit": 1024, "passed": None,
            "error": "prof/run_ascend_pt: op_caps[cann::*]: no operator name matches 'cann::*'",
            "message": "m", "declared_in": {"file": "/repo/memgate.toml", "line": 7}, "profile": "p"}
BAD_MARKER = {"item": "tests/test_a.py::test_b", "test": "tests/test_a.py::test_b", "profile": "",
              "error": "tests/test_a.py:3: memgate marker of tests/test_a.py::test_b: unknown budget key 'x'",
              "declared_in": {"file": "tests/test_a.py", "line": 3}}


def test_annotations_sit_on_the_declaring_line_and_name_the_test() -> None:
    lines = github_annotations([MARKER_ROW, FILE_ROW, {**MARKER_ROW, "passed": True}], [BAD_MARKER],
                               path_of=lambda f: f.removeprefix("/repo/"))
    assert lines == [
        ("::error file=tests/test_model.py,line=12,title=memgate tests/test_model.py%3A%3Atest_step[cpu] peak_allocated"
        "::peak_allocated 2.00 KiB exceeds budget 1.00 KiB by 1.00 KiB (+100.0%25) — rank 0 cpu"),
        ("::error file=memgate.toml,line=7,title=memgate memgate%3A%3Aprof/run_ascend_pt%3A%3Atrain%3A%3Aop_caps[cann"
        "%3A%3A*]::prof/run_ascend_pt: op_caps[cann::*]: no operator name matches 'cann::*'"),
        ("::error file=tests/test_a.py,line=3,title=memgate tests/test_a.py%3A%3Atest_b::tests/test_a.py:3: memgate "
        "marker of tests/test_a.py::test_b: unknown budget key 'x'"),
    ]


def test_annotation_without_a_test_or_a_place() -> None:
    row = {"budget": "b", "metric": "leaked", "rank": "1", "passed": False, "message": "leaked 1 B"}
    assert github_annotations([row]) == ["::error title=memgate b%3A%3Aleaked (rank 1)::leaked 1 B"]


@pytest.mark.parametrize(
    ("counts", "text"),
    [
        ({"passed": 2, "failed": 1}, "1 failed, 2 passed"),
        ({"error": 1}, "1 error"),
        ({"error": 2, "skipped": 1, "passed": 0}, "1 skipped, 2 errors"),
        ({"xfailed": 1, "xpassed": 1}, "1 xfailed, 1 xpassed"),
        ({}, "no tests ran"),
    ],
)
def test_counts_read_like_pytest(counts: dict[str, int], text: str) -> None:
    assert counts_text(counts) == text


def test_step_summary_rows_name_their_tests_and_errors_of_their_own() -> None:
    text = step_summary_markdown([MARKER_ROW, FILE_ROW], [BAD_MARKER], {"failed": 2, "error": 1})
    lines = text.splitlines()
    assert lines[0] == "### memgate: 2 failed, 1 error (2 checks)"
    assert lines[2:] == [
        "| result | test | rank | device | budget | metric | measured | limit |",
        "|---|---|---|---|---|---|---|---|",
        ("| ⚠️ error | `memgate::prof/run_ascend_pt::train::op_caps[cann::*]` | 3 | npu:3 | train | `op_caps[cann::*]` "
        "| – | 1.00 KiB |"),
        "| ❌ FAIL | `tests/test_model.py::test_step[cpu]` | 0 | cpu | marker | `peak_allocated` | 2.00 KiB | 1.00 KiB |",
        "| ⚠️ error | `tests/test_a.py::test_b` | – | – | – | – | – | – |",
        "",
        ("- `tests/test_a.py::test_b`: tests/test_a.py:3: memgate marker of tests/test_a.py::test_b: unknown budget "
        "key 'x'"),
    ]

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


def test_ci_outputs_format_every_metric_by_its_kind() -> None:
    from memgate.ci import github_annotations, step_summary_markdown, unit_of

    outcomes = [
        {"rank": "0", "device": "cuda:0", "budget": "b", "metric": "free_block_fragmentation", "value": 0.8568,
         "limit": 0.5, "passed": False, "message": "free_block_fragmentation 0.857 exceeds budget 0.500 by 0.357 "
                                                   "(+71.4%) — rank 0 cuda:0"},
        {"rank": "0", "device": "cpu", "budget": "b", "metric": "leak_undetermined", "value": 301868,
         "limit": 1 << 20, "passed": True, "message": "m"},
        {"rank": "0", "device": "cuda:0", "budget": "b", "metric": "largest_free_block", "value": 536870912,
         "limit": 1 << 30, "passed": True, "message": "m"},
    ]
    table = step_summary_markdown(outcomes)
    assert "| ❌ FAIL | – | 0 | cuda:0 | b | `free_block_fragmentation` | 0.857 | 0.500 |" in table
    assert "| ✅ pass | – | 0 | cpu | b | `leak_undetermined` | 294.79 KiB | 1.00 MiB |" in table
    assert "| ✅ pass | – | 0 | cuda:0 | b | `largest_free_block` | 512.00 MiB | 1.00 GiB |" in table
    assert github_annotations(outcomes) == [
        ("::error title=memgate b%3A%3Afree_block_fragmentation (rank 0)::free_block_fragmentation 0.857 exceeds "
        "budget 0.500 by 0.357 (+71.4%25) — rank 0 cuda:0")]
    assert [unit_of(m) for m in ("external_fragmentation", "free_block_fragmentation", "fragmentation",
                                 "leak_undetermined", "reserved_at_dump", "op_caps[aten::*]")] == [
        "ratio", "ratio", "ratio", "bytes", "bytes", "bytes"]

"""memgate.report: the JSON report's entries, the summary table both shells print (its row order, cells and
result words), the inspect text, and reports written atomically (never half a file, readable by others)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from memgate import __version__
from memgate.report import (
    build_report,
    capacity_headroom,
    inspect_text,
    result_word,
    summary_table,
    write_json_atomic,
    write_text_atomic,
)

GIB = 1 << 30
ROWS: list[dict[str, Any]] = [  # in no particular order
    {"profile": "/r/rank1/p", "rank": "1", "device": "npu:0", "budget": "train", "metric": "fragmentation",
     "limit": 0.1, "value": 0.1234, "passed": False},
    {"profile": "/r/rank0/p", "rank": "0", "device": "npu:0", "budget": "train", "metric": "op_caps[aten::*]",
     "limit": 1 << 20, "value": 2 << 20, "passed": False},
    {"profile": "/r/rank0/p", "rank": "0", "device": "npu:0", "budget": "train", "metric": "peak_allocated",
     "limit": 2 * GIB, "value": GIB, "passed": True, "limit_share": 0.5},
    {"profile": "/r/rank0/p", "rank": "0", "budget": "train", "metric": "leaked", "limit": 0, "value": None,
     "passed": False, "error": "not measurable"},
    {"profile": "/r/rank0/p", "rank": "0", "budget": "gpu", "metric": "peak_reserved", "limit": 1, "value": None,
     "passed": True, "skipped": True},
    {"profile": "/r/rank0/p", "rank": "0", "budget": "train", "metric": "peak_reserved", "limit": None,
     "limit_text": "75% of ?", "value": 5, "passed": False},
]


def test_the_summary_table_by_profile_budget_then_the_budget_keys_order() -> None:
    assert summary_table(ROWS) == [
        "rank     budget  metric            measured  limit           result        profile",
        "-------  ------  ----------------  --------  --------------  ------------  -------",
        "0        gpu     peak_reserved     -         1 B             not selected  rank0/p",
        "0 npu:0  train   peak_allocated    1.00 GiB  2.00 GiB (50%)  pass          rank0/p",
        "0        train   peak_reserved     5 B       75% of ?        FAIL          rank0/p",
        "0        train   leaked            -         0 B             error         rank0/p",
        "0 npu:0  train   op_caps[aten::*]  2.00 MiB  1.00 MiB        FAIL          rank0/p",  # op caps last
        "1 npu:0  train   fragmentation     0.123     0.100           FAIL          rank1/p",  # a ratio, not a size
    ]
    assert summary_table([]) == ["rank  budget  metric  measured  limit  result  profile",
                                 "----  ------  ------  --------  -----  ------  -------"]


def test_result_words() -> None:
    assert [result_word(row) for row in ROWS] == ["FAIL", "FAIL", "pass", "error", "not selected", "FAIL"]


def test_build_report_is_versioned() -> None:
    assert build_report([{"path": "p"}], iter([{"budget": "b"}])) == {
        "memgate_version": __version__, "profiles": [{"path": "p"}], "budgets": [{"budget": "b"}], "errors": []}


def test_inspect_shows_headroom_to_capacity() -> None:
    dev = {"device": "npu:0", "component": "PTA", "metrics": {"peak_reserved_bytes": 3 << 30}, "not_measurable": {},
           "reconciliation": {"components": {}}}
    entry = {"path": "p", "format": "f", "rank": "0", "metadata": {"device_capacity_bytes": {"npu:0": 4 << 30}},
             "devices": [dev]}
    assert capacity_headroom(entry, dev) == (4 << 30, 1 << 30)
    assert "    capacity                 4.00 GiB (4294967296 B), headroom 1.00 GiB (25.0%) above the peak reserved" in (
        inspect_text(entry))
    assert capacity_headroom({**entry, "metadata": {}}, dev) is None
    assert capacity_headroom({**entry, "metadata": {"device_capacity_bytes": {"npu:0": True}}}, dev) is None
    assert capacity_headroom(entry, {**dev, "metrics": {"peak_allocated_bytes": GIB}}) == (4 * GIB, 3 * GIB)


# ---- written atomically ----------------------------------------------------------------------------------


def test_a_report_is_written_whole_for_every_reader(tmp_path: Path) -> None:
    target = tmp_path / "out" / "report.json"  # its folder made as needed
    write_json_atomic(target, {"b": [1, 2], "a": "run\udcff"})
    assert target.read_text() == '{\n  "b": [\n    1,\n    2\n  ],\n  "a": "run\\udcff"\n}\n'
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600: a CI artifact is read by others
    write_text_atomic(target, "run\udcff\n")  # a path's byte that is not UTF-8: written as its escape
    assert target.read_bytes() == b"run\\udcff\n"
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]  # no temporary file left


def test_a_failed_write_leaves_no_temporary_file(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    with pytest.raises(OSError):
        write_text_atomic(tmp_path / "taken", "x")  # a folder is in the way of the rename
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]

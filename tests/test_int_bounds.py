"""Numbers at the edges of int64 and of Arrow's decimals: every loader refuses them with an InputError
naming the file and the place, never an internal error, a crash or a silently wrapped sum.

Byte counts past 2**56 (64 PiB, more than any device holds) are refused where they are read, and
counts that are added up (block sizes into curves, segment sizes into the reserved total, ddr + hbm)
must sum below 2**62: int64 sums past it wrap into plausible peaks. Step numbers past int64, and a
Kineto ts with an exponent Arrow's decimal conversion cannot take, are refused or read exactly.
(The checks themselves, memgate.model.check_bytes and check_byte_ranges, are tested in tests/test_model.py.)
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from helpers import edited_db, run_cli
from snapshot_reference import MODERN, raw

from memgate import discover
from memgate.errors import InputError

DB = Path(__file__).parent / "data" / "samples" / "ascend" / "msinsight_pta21_db_level0_rank0" / "ascend_pytorch_profiler_0.db"
MEMORY = {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1,
          "args": {"Addr": 1, "Bytes": 16, "Total Allocated": 16, "Total Reserved": 0, "Device Type": 0, "Device Id": -1}}


def _load_error(path: Path) -> InputError:
    (found,) = discover.discover(path.parent if path.name == "trace_view.json" else path)
    with pytest.raises(InputError) as info:
        discover.load(found)
    return info.value


def _kineto(tmp_path: Path, events: list[dict[str, Any]], text: str | None = None) -> Path:
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(text if text is not None else json.dumps({"traceEvents": events}))
    return path


def test_a_kineto_ts_with_a_huge_negative_exponent_reads_as_zero(tmp_path: Path) -> None:
    # pyarrow 26 crashes the process converting 1E-99999999 to a decimal type: run it in a child
    text = json.dumps({"traceEvents": [MEMORY]}).replace('"ts": 1,', '"ts": 1e-99999999,')
    done = run_cli(["inspect", "--json", _kineto(tmp_path, [], text)])
    assert done.rc == 0, done.stderr
    (profile,) = json.loads(done.stdout)["profiles"]
    assert profile["devices"][0]["metrics"]["peak_allocated_bytes"] == 16


def test_a_kineto_step_number_past_int64_is_refused(tmp_path: Path) -> None:
    step = {"ph": "X", "name": "ProfilerStep#9223372036854775808", "ts": 0, "dur": 5, "pid": 1, "tid": 1}
    err = _load_error(_kineto(tmp_path, [MEMORY, step]))
    assert (err.message, err.column) == ("step number out of range", "traceEvents[1].name")


def test_trace_view_step_number_and_huge_kb_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "tv" / "trace_view.json"
    path.parent.mkdir()
    counter = {"ph": "C", "name": "APP/HBM", "pid": 1, "tid": 0, "ts": "100.0", "args": {"KB": 5}}
    step = {"ph": "X", "name": "ProfilerStep#99999999999999999999", "ts": "0", "dur": 5, "pid": 1, "tid": 1}
    path.write_text(json.dumps([counter, step]))
    err = _load_error(path)
    assert (err.message, err.column) == ("step number out of range", "[1].name")
    path.write_text(json.dumps([counter]).replace('"KB": 5', '"KB": 1e999999999'))
    err = _load_error(path)
    assert err.column == "[0].args.KB" and err.message.startswith("memory counter out of range")


def _snapshot(tmp_path: Path, edit: Any) -> Path:
    data = raw(MODERN)
    edit(data)
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


def test_snapshot_step_number_and_byte_counts_past_their_ranges(tmp_path: Path) -> None:
    def huge_step(data: dict[str, Any]) -> None:
        data["external_annotations"] = [{"name": "ProfilerStep#99999999999999999999999", "stage": "START",
                                         "device": 0, "time_us": 1}]

    err = _load_error(_snapshot(tmp_path, huge_step))
    assert (err.message, err.column) == ("step number out of range", "external_annotations[0].name")

    def huge_entry(data: dict[str, Any]) -> None:
        entry = next(e for e in data["device_traces"][0] if e["action"] == "alloc")
        entry["size"] = 2**63 - 1

    err = _load_error(_snapshot(tmp_path, huge_entry))
    assert err.message == "byte count out of range" and err.column == "device_traces[0] size"

    def segments_summing_past_int64(data: dict[str, Any]) -> None:  # each one in range, their sum not
        segment = data["segments"][0]
        data["segments"] = [dict(segment, address=segment["address"] + k * 2**56, total_size=2**56,
                                 blocks=[dict(segment["blocks"][0], address=segment["address"] + k * 2**56,
                                              size=2**56, state="inactive")])
                            for k in range(80)]

    err = _load_error(_snapshot(tmp_path, segments_summing_past_int64))
    assert err.message == "byte counts out of range: they add up past int64"


def test_npu_mem_ddr_past_its_range_is_refused(tmp_path: Path) -> None:
    db = edited_db(DB, tmp_path / "ascend_pytorch_profiler_0.db",
                   "UPDATE NPU_MEM SET ddr = 9223372036854775807 WHERE rowid = (SELECT min(rowid) FROM NPU_MEM)")
    err = _load_error(db)
    assert (err.message, err.column, err.found) == ("byte count out of range", "NPU_MEM.ddr", str(2**63 - 1))

"""Steps that overlap or repeat are an InputError naming the file and both steps (memgate.model.check_steps,
tested on its own in tests/test_model.py), through every loader that reads the steps a writer recorded:
torch_npu trace_view.json ProfilerStep spans, the db's STEP_TIME, msMemScope STEP marks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import ASCEND, PTA271, SAMPLES, copy_sample, edited_db, read_lines, write_lines

from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.loaders import msmemscope
from memgate.loaders.ascend import ascend_db

# ---- through the loaders ------------------------------------------------------------------------------


def _trace_view(events: list[tuple[int, str, str]]) -> str:
    return json.dumps([{"ph": "X", "name": f"ProfilerStep#{n}", "pid": 1, "tid": 1, "ts": ts, "dur": dur,
                        "cat": "cpu_op"} for n, ts, dur in events])


def test_trace_view_steps(tmp_path: Path) -> None:
    root = copy_sample(PTA271, tmp_path / "run_ascend_pt")
    view = root / "trace_view.json"
    view.write_text(_trace_view([(13, "1764246877073569.640", "400000"), (14, "1764246877473569.640", "400000")]))
    assert [int(s) for s in load(discover(root)[0]).steps.ints("step").tolist()] == [13, 14]
    view.write_text(_trace_view([(13, "1764246877073569.640", "400000"), (14, "1764246877473569.639", "400000")]))
    with pytest.raises(InputError) as info:
        load(discover(root)[0])
    assert (info.value.file, info.value.column, info.value.message) == (str(view), "ProfilerStep",
                                                                         "steps 13 and 14 overlap")
    view.write_text(_trace_view([(13, "1764246877073569.640", "1"), (13, "1764246877473569.640", "1")]))
    with pytest.raises(InputError, match="step 13 appears twice"):
        load(discover(root)[0])


def _step_db(tmp_path: Path, *statements: str) -> Path:
    name = "ascend_pytorch_profiler_0.db"
    return edited_db(ASCEND / "msinsight_pta21_db_level0_rank0" / name, tmp_path / name, *statements)


def test_step_time_table(tmp_path: Path) -> None:
    path = _step_db(tmp_path, "INSERT INTO STEP_TIME SELECT id, startNs, endNs FROM STEP_TIME")
    with pytest.raises(InputError) as info:
        ascend_db.load(path)
    err = info.value
    assert (err.file, err.column, err.message) == (str(path), "STEP_TIME", "step 50 appears twice")
    assert err.found == "step 50 (rowid 1) and again (rowid 2)"
    (tmp_path / "b").mkdir()
    path = _step_db(tmp_path / "b", "INSERT INTO STEP_TIME SELECT id + 1, endNs - 1, endNs + 5 FROM STEP_TIME")
    with pytest.raises(InputError, match="steps 50 and 51 overlap") as info:
        ascend_db.load(path)
    assert "(rowid 1)" in (info.value.found or "") and "(rowid 2)" in (info.value.found or "")


def test_msmemscope_step_marked_twice(tmp_path: Path) -> None:
    lines = read_lines(SAMPLES / "msmemscope" / "example_compare_baseline.csv")
    lines[1:1] = [b"300,SYSTEM,STEP,1,1764753083997498270,3101864,3101864,0,N/A,,,\n",
                  b"301,SYSTEM,STEP,2,1764753084427763120,3101864,3101864,0,N/A,,,\n",
                  b"302,SYSTEM,STEP,1,1764753084487763120,3101864,3101864,0,N/A,,,\n"]
    path = tmp_path / "memscope_dump_1.csv"
    write_lines(path, lines)
    with pytest.raises(InputError) as info:
        msmemscope.load(path)
    err = info.value
    assert (err.file, err.line, err.column) == (str(path), 4, "Name")
    assert err.message == "step 1 appears twice in process 3101864"
    assert err.found == "STEP 1 at line 2 and at line 4"


@pytest.mark.parametrize("name", ["ProfilerStep#\u0663", "ProfilerStep#\uff13", "ProfilerStep#3\n", "ProfilerStep#"])
def test_a_step_name_is_ascii_digits_to_its_end(name: str) -> None:
    """torch writes ProfilerStep#<ASCII digits>; Python's \\d and $ would also take other scripts'
    digits (int() reads them) and a trailing newline."""
    import re

    from memgate.loaders.ascend import trace_view
    from memgate.loaders.kineto import kineto
    from memgate.loaders.snapshot import snapshot_steps

    for pattern in (kineto.STEP_NAME, trace_view.STEP_NAME):
        assert pattern.match(name) is None
    assert re.fullmatch(snapshot_steps.STEP_NAME.pattern.replace("$", r"\Z"), name) is None  # as RE2 reads it
    assert kineto.STEP_NAME.match("ProfilerStep#12").group(1) == "12"  # type: ignore[union-attr]

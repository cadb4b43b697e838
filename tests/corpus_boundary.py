"""Issue 11's CSV / sqlite / cross-file cases for the corpus (run by the block of tests/test_corpus.py
that names this module): each builds one wrong input from a real sample or a test writer and says what
the one memgate error must name. The classes: a header naming a column twice, a line longer than the
CSV block, a rank that is not ASCII digits, a VIEW / trigger named like a table (one over an endless
recursive query), files of one profile from another run, window or device, steps that repeat or
overlap, two profiler_info files in one profile.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from corpus import (
    DB_SAMPLE,
    MEMSCOPE_SAMPLE,
    PTA21_L1,
    PTA271,
    Case,
    Expect,
    cann_file,
    cann_prof,
    edit_rows,
    mm_db,
    read_rows,
    sample_dir,
    sample_file,
    small_trace,
)
from helpers import db_exec
from writers.mindspore import MsOptions
from writers.mindspore import write_profile as write_ms_profile

from memgate.readers.csvtable import BLOCK_BYTES

BOUNDARY: list[Case] = []


def case(id: str, fmt: str):  # type: ignore[no-untyped-def]
    def register(make):  # type: ignore[no-untyped-def]
        BOUNDARY.append(Case(id, fmt, make))
        return make
    return register


def _shift_us(text: str, by_us: int) -> str:
    if not text.strip():
        return text
    whole, _, rest = text.partition(".")
    return f"{int(whole) + by_us}.{rest}" if rest else str(int(whole) + by_us)


# ---- CSV shape -------------------------------------------------------------------------------------------

@case("npu-kernel-details-column-twice", "torch_npu")
def _column_twice(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "kernel_details.csv"

    def edit(rows: list[list[str]]) -> None:
        for row in rows:
            row.append(row[0])  # "Step Id" again at the end: the subset header match still passes
    edit_rows(path, edit)
    return Expect(root, path, line=1, column="Step Id", says=("names this column twice",))


@case("npu-operator-memory-cell-past-the-block", "torch_npu")
def _cell_past_the_block(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "operator_memory.csv"

    def edit(rows: list[list[str]]) -> None:
        rows[40][0] = "aten::" + "x" * (2 * BLOCK_BYTES)  # a Name of 8 MiB on line 41
    edit_rows(path, edit)
    return Expect(root, path, line=41, says=("longer than", "block"))


# ---- ranks -----------------------------------------------------------------------------------------------

@case("npu-profiler-info-rank-superscript-digit", "torch_npu")
def _rank_superscript(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "profiler_info_0.json"
    info = json.loads(path.read_text())
    info["rank_id"] = "²"  # str.isdigit() says yes, int() says no
    path.write_text(json.dumps(info))
    return Expect(root, path, column="rank_id", says=("rank_id is not a whole number", "'²'"))


@case("npu-two-profiler-info-files", "torch_npu")
def _two_infos(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    shutil.copyfile(root / "profiler_info_0.json", root / "profiler_info_3.json")
    return Expect(root, root / "profiler_info_3.json", says=("two profiler_info files",))


# ---- sqlite objects that are not tables ---------------------------------------------------------------------

def _db(tmp: Path, *sql: str) -> tuple[Path, Path]:
    path = sample_file(DB_SAMPLE / "ascend_pytorch_profiler_0.db", tmp)
    db_exec(path, *sql)
    return path.parent, path


@case("db-view-named-like-a-table", "ascend_db")
def _db_view(tmp: Path) -> Expect:
    root, path = _db(tmp, "DROP TABLE OP_MEMORY", "CREATE VIEW OP_MEMORY AS SELECT * FROM MEMORY_RECORD")
    return Expect(root, path, column="OP_MEMORY", says=("OP_MEMORY is a view, not a table",))


@case("db-view-over-an-endless-recursive-query", "ascend_db")
def _db_endless(tmp: Path) -> Expect:
    root, path = _db(tmp, "DROP TABLE MEMORY_RECORD",
                     "CREATE VIEW MEMORY_RECORD AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                     "SELECT x AS component, x AS timestamp, x AS totalAllocated, x AS totalReserved, "
                     "x AS totalActive, x AS streamPtr, 0 AS deviceId FROM c")
    return Expect(root, path, column="MEMORY_RECORD", says=("MEMORY_RECORD is a view, not a table",))


@case("db-trigger-named-like-a-table", "ascend_db")
def _db_trigger(tmp: Path) -> Expect:
    root, path = _db(tmp, "DROP TABLE STRING_IDS",
                     "CREATE TRIGGER STRING_IDS AFTER INSERT ON OP_MEMORY BEGIN SELECT 1; END")
    return Expect(root, path, column="STRING_IDS", says=("STRING_IDS is a trigger, not a table",))


@case("db-meta-data-rank-arabic-indic-digit", "ascend_db")
def _db_rank(tmp: Path) -> Expect:
    root, path = _db(tmp, "INSERT INTO META_DATA VALUES ('rank_id', '٣')")
    renamed = path.rename(path.with_name("ascend_pytorch_profiler.db"))  # no suffix: META_DATA names the rank
    return Expect(root, renamed, column="META_DATA.rank_id", says=("not a whole number",))


@case("db-step-time-step-twice", "ascend_db")
def _db_step_twice(tmp: Path) -> Expect:
    root, path = _db(tmp, "INSERT INTO STEP_TIME SELECT id, startNs, endNs FROM STEP_TIME")
    return Expect(root, path, column="STEP_TIME", says=("step 50 appears twice", "rowid 1", "rowid 2"))


@case("msmemscope-db-view-named-like-the-dump", "msmemscope")
def _mm_view(tmp: Path) -> Expect:
    path = mm_db(tmp)
    db_exec(path, "ALTER TABLE memscope_dump RENAME TO dump_rows", "CREATE VIEW memscope_dump AS SELECT * FROM dump_rows")
    return Expect(path.parent, path, column="memscope_dump", says=("memscope_dump is a view, not a table",))


@case("msmemscope-step-marked-twice", "msmemscope")
def _mm_step_twice(tmp: Path) -> Expect:
    path = sample_file(MEMSCOPE_SAMPLE, tmp, "memscope_dump_20250428113810.csv")
    rows = read_rows(path)
    pid, ts = rows[2][5], rows[2][4]
    lines = path.read_bytes().splitlines(keepends=True)
    mark = f"900,SYSTEM,STEP,3,{ts},{pid},{pid},0,N/A,,,\n".encode()
    lines[2:2] = [mark, mark.replace(b"900,", b"901,", 1)]
    path.write_bytes(b"".join(lines))
    return Expect(path.parent, path, line=4, column="Name", says=("step 3 appears twice", "line 3", "line 4"))


# ---- files of one profile that cannot belong together -------------------------------------------------------

@case("npu-operator-memory-of-another-run", "torch_npu")
def _npu_other_run(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "operator_memory.csv"

    def edit(rows: list[list[str]]) -> None:
        columns = [rows[0].index(c) for c in ("Allocation Time(us)", "Release Time(us)", "Active Release Time(us)")]
        for row in rows[1:]:
            for k in columns:
                row[k] = _shift_us(row[k], -86_400 * 10**6)  # the day before
    edit_rows(path, edit)
    return Expect(root, path, says=("do not overlap in time", "memory_record.csv"))


@case("npu-operator-memory-of-another-device", "torch_npu")
def _npu_other_device(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "operator_memory.csv"

    def edit(rows: list[list[str]]) -> None:
        k = rows[0].index("Device Type")
        for row in rows[1:]:
            row[k] = "NPU:7"
    edit_rows(path, edit)
    return Expect(root, path, says=("name different devices", "npu:7", "npu:0"))


@case("mindspore-allocator-record-of-another-window", "mindspore")
def _ms_other_window(tmp: Path) -> Expect:
    prof = write_ms_profile(small_trace(), tmp / "ms", MsOptions(rank=0, memory_record=False))
    record = prof / "FRAMEWORK" / "cpu_ms_memory_record_0.txt"

    def edit(rows: list[list[str]]) -> None:
        for row in rows[1:]:
            row[0] = str(int(row[0]) + 3600 * 10**9)
    edit_rows(record, edit)
    return Expect(prof, prof / "ASCEND_PROFILER_OUTPUT" / "operator_memory.csv",
                  says=("do not overlap in time", "cpu_ms_memory_record_0.txt"))


@case("cann-operator-memory-of-another-device", "cann")
def _cann_other_device(tmp: Path) -> Expect:
    prof = cann_prof(tmp)
    path = cann_file(prof, "operator_memory")

    def edit(rows: list[list[str]]) -> None:
        for row in rows[1:]:
            row[0] = "5"
    edit_rows(path, edit)
    return Expect(prof, path, says=("name different devices", "npu:5"))

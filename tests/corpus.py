"""A corpus of malformed profiler files for every format, built at test time under a temp dir.

Each :class:`Case` derives one broken input from a real sample (``tests/data/samples``) or from a
test writer (``tests/writers``) -- nothing binary is committed -- and says what the error must
name: the file, and where one exists the 1-based line, the JSON path / db table (``column``) and
fragments of the message. ``tests/test_corpus.py`` runs every case through the loader API, the
CLI and (a sample) pytest.

Kinds of damage: truncation at arbitrary bytes (CSV mid-row, JSON mid-array, gzip mid-stream,
sqlite mid-page, pickle mid-stream), encodings (UTF-16, Latin-1 bytes; a UTF-8 BOM is *accepted*,
see ``ACCEPTED``), binary garbage, swapped / duplicated / extra / missing columns, NaN / inf /
negative / overflowing numbers, timestamps out of order or in the wrong unit, 0-byte files,
directories and symlink loops where files are expected, unreadable files (simulated in-process:
the tests run as root, where chmod does not stop reads), sqlite with missing tables or wrong
column types, JSON nested a million deep, pickles that try to import or call code (each would
create a side-effect file that must never appear) and pickle memory bombs.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import pickle
import random
import shutil
import stat
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from groundtruth import Block, Trace
from helpers import PTA21_L0, PTA21_L1, PTA271, SAMPLES, copy_sample, db_exec
from writers.ascend_db import write_msprof_db, write_torch_db
from writers.cann import CannOptions, write_prof
from writers.kineto import KinetoOptions, write_trace
from writers.mindspore import MsOptions, write_memory_block, write_tracker_dump
from writers.mindspore import write_profile as write_ms_profile
from writers.msmemscope import write_csv as write_mm_csv
from writers.msmemscope import write_db as write_mm_db
from writers.snapshot import SnapshotOptions, write_snapshot
from writers.torch_npu import NpuOptions
from writers.torch_npu import write_profile as write_npu_profile

TORCH = SAMPLES / "torch"
MSMEMSCOPE = SAMPLES / "msmemscope"
DB_SAMPLE = SAMPLES / "ascend" / "msinsight_pta21_db_level0_rank0"
SNAPSHOT_SAMPLE = TORCH / "snapshot_modern_small_cs336.pickle"
KINETO_SAMPLE = TORCH / "cpu_train_profile_memory.json"
MEMSCOPE_SAMPLE = MSMEMSCOPE / "smoke_memscope_dump_20250428113810.csv"
DEEP = 1_000_000  # nesting levels of the deep-JSON / deep-pickle cases


@dataclass(frozen=True)
class Expect:
    """What memgate is pointed at and what its error must say."""

    root: Path
    file: Path  # the file (or directory) the error names
    line: int | None = None  # 1-based line the error names (None: no line to name)
    column: str | None = None  # a fragment of the error's column: CSV column, JSON path, db table
    says: tuple[str, ...] = ()  # fragments of the one-line message (case-insensitive)
    deny: Path | None = None  # reads of this file fail with PermissionError (simulated in-process)
    deny_access: bool = True  # ... and os.access says no (chmod 000); False: only open() fails (ACL, EIO)
    side_effect: Path | None = None  # a file that code smuggled into the input would create


@dataclass(frozen=True)
class Case:
    id: str
    format: str  # the format the input belongs to (every registered format has cases)
    make: Callable[[Path], Expect]
    defect: str | None = None  # a known defect outside the files this suite may fix: xfail(strict)
    isolate: bool = False  # run in a memory-capped subprocess (an unguarded parser could take GBs)
    pytest_sample: bool = False  # also run through `pytest --memgate`


CASES: list[Case] = []


def case(id: str, fmt: str, *, defect: str | None = None, isolate: bool = False,
         pytest_sample: bool = False) -> Callable[[Callable[[Path], Expect]], Callable[[Path], Expect]]:
    def register(make: Callable[[Path], Expect]) -> Callable[[Path], Expect]:
        CASES.append(Case(id, fmt, make, defect, isolate, pytest_sample))
        return make
    return register


# ---- building blocks ------------------------------------------------------------------------------

T0 = 1_736_408_883_573_957_000


def small_trace(*, ge: bool = True) -> Trace:
    """One device, two steps, a block from before the window and one never freed."""
    blocks = [Block(3 << 20, T0, T0 + 20_000_000, "aten::mm"), Block(5 << 20, T0 + 1_000, None, "aten::add"),
              Block(2 << 20, None, T0 + 10_000_000, "")]
    if ge:
        blocks.append(Block(1 << 20, T0 + 2_000, T0 + 30_000_000, "cann::Conv", component="GE"))
    return Trace(device_id=0, hidden_baseline=1 << 20 if ge else 0, t_start=T0, t_end=T0 + 50_000_000,
                 blocks=tuple(blocks), steps=((7, T0, T0 + 25_000_000), (8, T0 + 25_000_000, T0 + 50_000_000)))


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def sample_dir(sample: Path, tmp: Path) -> Path:
    return copy_sample(sample, tmp / f"{sample.name}_ascend_pt")


def sample_file(sample: Path, tmp: Path, name: str | None = None) -> Path:
    dest = _mkdir(tmp / "in") / (name or sample.name)
    shutil.copyfile(sample, dest)
    dest.chmod(0o644)
    return dest


def npu_profile(tmp: Path) -> Path:
    return write_npu_profile(small_trace(), _mkdir(tmp / "npu"), NpuOptions())


def npu_out(tmp: Path) -> Path:
    return npu_profile(tmp) / "ASCEND_PROFILER_OUTPUT"


def torch_db(tmp: Path) -> Path:
    return write_torch_db(small_trace(), _mkdir(tmp / "db"), rank=0)


def msprof_db(tmp: Path) -> Path:
    return write_msprof_db(small_trace(), _mkdir(tmp / "msprof"))


def mm_csv(tmp: Path) -> Path:
    return write_mm_csv(small_trace(ge=False), _mkdir(tmp / "mm") / "memscope_dump_20251203120000.csv")


def mm_db(tmp: Path) -> Path:
    return write_mm_db(small_trace(ge=False), _mkdir(tmp / "mm") / "memscope_dump_20251203120000.db")


def ms_profile(tmp: Path) -> Path:
    return write_ms_profile(small_trace(), _mkdir(tmp / "ms"), MsOptions(rank=0))


def ms_out(tmp: Path) -> Path:
    return ms_profile(tmp) / "ASCEND_PROFILER_OUTPUT"


def cann_prof(tmp: Path) -> Path:
    return write_prof([small_trace()], _mkdir(tmp / "cann"), CannOptions(static_graph=True))


def cann_file(prof: Path, kind: str) -> Path:
    return next((prof / "mindstudio_profiler_output").glob(f"{kind}_2*.csv"))


def snapshot_file(tmp: Path) -> Path:
    return write_snapshot(small_trace(ge=False), _mkdir(tmp / "snap"), SnapshotOptions())


def kineto_file(tmp: Path, *, gz: bool = False) -> Path:
    return write_trace(small_trace(ge=False), _mkdir(tmp / "kineto"), KinetoOptions(gz=gz))


def recording_dir(tmp: Path, *, trace: Trace | None = None) -> Path:
    """A snapshot beside a Kineto trace of the same run (one recording, one profile)."""
    root = _mkdir(tmp / "rec")
    write_snapshot(small_trace(ge=False), root, SnapshotOptions())
    write_trace(trace or small_trace(ge=False), root, KinetoOptions())
    return root


def timeline_file(tmp: Path) -> Path:
    """What ``prof.export_memory_timeline("*.json")`` writes: [times_us, sizes by category]."""
    path = _mkdir(tmp / "timeline") / "run_memory_timeline.json"
    path.write_text(json.dumps([[1_000, 2_000, 3_000], [[1, 2], [3, 4], [5, 6]]]))
    return path


# ---- byte and cell surgery ----------------------------------------------------------------------

def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def cut_mid_line(path: Path, line: int) -> int:
    """Truncate inside 1-based ``line`` (half of it kept, no line break); return the byte offset."""
    data = lines_of(path)
    at = sum(len(x) for x in data[: line - 1]) + len(data[line - 1].rstrip(b"\r\n")) // 2
    path.write_bytes(path.read_bytes()[:at])
    return at


def eol(path: Path) -> str:
    return "\r\n" if b"\r\n" in path.read_bytes()[:4096] else "\n"


def read_rows(path: Path) -> list[list[str]]:
    with open(path, encoding="utf-8-sig", newline="") as fh:
        return list(csv.reader(fh))


def write_rows(path: Path, rows: Sequence[Sequence[str]], line_end: str) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        csv.writer(fh, lineterminator=line_end).writerows(rows)


def edit_rows(path: Path, edit: Callable[[list[list[str]]], None]) -> None:
    line_end = eol(path)
    rows = read_rows(path)
    edit(rows)
    write_rows(path, rows, line_end)


def first_row(path: Path, column: str, value: str) -> int:
    """0-based index (in read_rows, header = 0) of the first row whose ``column`` is ``value``."""
    rows = read_rows(path)
    k = rows[0].index(column)
    return next(i for i, r in enumerate(rows) if i and r[k] == value)


def set_cell(path: Path, row: int, column: str, value: str) -> int:
    """Set one cell (``row`` 0-based as in read_rows); return its 1-based line (rows are one line each)."""
    def edit(rows: list[list[str]]) -> None:
        rows[row][rows[0].index(column)] = value
    edit_rows(path, edit)
    return row + 1


def set_header(path: Path, header: list[str]) -> None:
    def edit(rows: list[list[str]]) -> None:
        rows[0] = header
    edit_rows(path, edit)


def garbage(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def loop(path: Path) -> None:
    """Replace ``path`` by a symlink to itself (a symlink loop)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    path.symlink_to(path.name)


def _as_dir(path: Path) -> None:
    """Replace a file by a directory of the same name."""
    path.unlink()
    path.mkdir()
    (path / "part-0").write_text("x\n")


# =================================================================================================
# torch_npu text export
# =================================================================================================

@case("npu-csv-cut-mid-row", "torch_npu", pytest_sample=True)
def npu_csv_cut_mid_row(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "memory_record.csv"
    cut_mid_line(path, 5001)
    return Expect(root, path, 5001, None, ("truncated",))


@case("npu-csv-cut-mid-row-newline", "torch_npu")
def npu_csv_cut_row_newline(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "operator_memory.csv"
    data = lines_of(path)
    data[30] = data[30][: len(data[30]) // 3] + b"\r\n"  # a writer killed mid-row, then a line break
    path.write_bytes(b"".join(data[:31]))
    return Expect(root, path, 31, None, ("fields",))


@case("npu-csv-utf16", "torch_npu", pytest_sample=True)
def npu_csv_utf16(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "memory_record.csv"
    path.write_bytes(path.read_text("utf-8").encode("utf-16"))  # with its BOM, as Excel saves it
    return Expect(root, path, 1, None, ("UTF-8",))


@case("npu-csv-header-lone-cr", "torch_npu")
def npu_csv_lone_cr(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "memory_record.csv"
    path.write_bytes(path.read_bytes().replace(b"Component,", b"Compo\rnent,", 1))  # a stray CR in the header
    return Expect(root, path, 1, None, ())


@case("npu-csv-latin1-header", "torch_npu")
def npu_csv_latin1_header(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "npu_module_mem.csv"
    data = path.read_bytes()
    path.write_bytes(data.replace(b"Component", "Compon\u00e9nt".encode("latin-1"), 1))
    return Expect(root, path, 1, None, ("UTF-8",))


@case("npu-csv-latin1-row", "torch_npu")
def npu_csv_latin1_row(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "operator_memory.csv"
    data = lines_of(path)
    k = next(i for i, line in enumerate(data) if i >= 99 and line.startswith(b"aten::"))
    data[k] = data[k].replace(b"aten::", "at\u00e9n::".encode("latin-1"), 1)
    path.write_bytes(b"".join(data))
    return Expect(root, path, k + 1, None, ("UTF-8",))


@case("npu-csv-binary-garbage", "torch_npu")
def npu_csv_garbage(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "memory_record.csv"
    path.write_bytes(garbage(20_000, seed=1))
    return Expect(root, path, 1, None, ())


@case("npu-csv-swapped-columns", "torch_npu")
def npu_csv_swapped(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "memory_record.csv"

    def swap(rows: list[list[str]]) -> None:
        for r in rows:  # header and cells together: the data is consistent, the layout is not
            r[2], r[3] = r[3], r[2]
    edit_rows(path, swap)
    return Expect(root, path, 1, None, ("out of order",))


@case("npu-csv-duplicated-column", "torch_npu")
def npu_csv_duplicated(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "operator_memory.csv"

    def dup(rows: list[list[str]]) -> None:
        for r in rows:
            r.insert(2, r[1])
    edit_rows(path, dup)
    return Expect(root, path, 1, None, ())


@case("npu-csv-missing-column", "torch_npu")
def npu_csv_missing(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "operator_memory.csv"

    def drop(rows: list[list[str]]) -> None:
        for r in rows:
            del r[1]
    edit_rows(path, drop)
    return Expect(root, path, 1, "Size(KB)", ("missing column",))


@case("npu-csv-extra-cell", "torch_npu")
def npu_csv_extra_cell(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "memory_record.csv"
    row = first_row(path, "Component", "PTA")

    def extra(rows: list[list[str]]) -> None:
        rows[row].append("1.0")
    edit_rows(path, extra)
    return Expect(root, path, row + 1, None, ("fields",))


@case("npu-size-nan", "torch_npu")
def npu_size_nan(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "operator_memory.csv"
    line = set_cell(path, 40, "Size(KB)", "nan")
    return Expect(root, path, line, "Size(KB)", ("'nan'",))


@case("npu-reserved-inf", "torch_npu")
def npu_reserved_inf(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "memory_record.csv"
    line = set_cell(path, first_row(path, "Component", "PTA"), "Total Reserved(MB)", "inf")
    return Expect(root, path, line, "Total Reserved(MB)", ("'inf'",))


@case("npu-allocated-1e400", "torch_npu")
def npu_allocated_1e400(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "memory_record.csv"
    line = set_cell(path, first_row(path, "Component", "PTA"), "Total Allocated(MB)", "1e400")
    return Expect(root, path, line, "Total Allocated(MB)", ("1e400",))


@case("npu-size-20-digits", "torch_npu")
def npu_size_overflow(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "operator_memory.csv"
    line = set_cell(path, 3, "Size(KB)", "99999999999999999999")
    return Expect(root, path, line, "Size(KB)", ("99999999999999999999",))


@case("npu-reserved-negative", "torch_npu")
def npu_reserved_negative(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "memory_record.csv"
    line = set_cell(path, first_row(path, "Component", "PTA"), "Total Reserved(MB)", "-10372.0")
    return Expect(root, path, line, "Total Reserved(MB)", ("-10372.0",))


@case("npu-time-in-ns-not-us", "torch_npu")
def npu_time_wrong_unit(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "memory_record.csv"
    row = first_row(path, "Component", "PTA")
    value = read_rows(path)[row][1].strip()
    line = set_cell(path, row, "Timestamp(us)", value.replace(".", "") + "000\t")  # ns digits in the µs column
    return Expect(root, path, line, "Timestamp(us)", ())


@case("npu-release-before-alloc", "torch_npu", pytest_sample=True)
def npu_release_before_alloc(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "operator_memory.csv"
    rows = read_rows(path)
    alloc = rows[10][2]
    line = set_cell(path, 10, "Release Time(us)", str(int(alloc.split(".")[0]) - 5_000_000) + ".000\t")
    return Expect(root, path, line, "Release Time(us)", ("before",))


@case("npu-csv-empty", "torch_npu")
def npu_csv_empty(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "kernel_details.csv"
    path.write_bytes(b"")
    return Expect(root, path, None, None, ("empty", "0 bytes"))


@case("npu-csv-is-a-directory", "torch_npu")
def npu_csv_dir(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "operator_memory.csv"
    _as_dir(path)
    return Expect(root, path, None, None, ("not a regular file",))


@case("npu-csv-symlink-loop", "torch_npu")
def npu_csv_loop(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "memory_record.csv"
    loop(path)
    return Expect(root, path, None, None, ("symlink",))


@case("npu-csv-unreadable-open", "torch_npu")
def npu_csv_unreadable_open(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "memory_record.csv"
    return Expect(root, path, None, None, ("permission denied",), deny=path, deny_access=False)


@case("npu-step-not-a-number", "torch_npu")
def npu_step_nan(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)  # no kernel_details / trace_view: step numbers come from this file
    path = root / "step_trace_time.csv"
    line = set_cell(path, 1, "Step", "thirteen")
    return Expect(root, path, line, "Step", ("'thirteen'",))


@case("npu-profiler-info-deep", "torch_npu")
def npu_info_deep(tmp: Path) -> Expect:
    root = sample_dir(PTA271, tmp)
    path = root / "profiler_info_0.json"
    path.write_bytes(b'{"config": ' + b"[" * DEEP + b"]" * DEEP + b"}")
    return Expect(root, path, None, None, ("nested",))


@case("npu-profiler-info-binary", "torch_npu")
def npu_info_binary(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L1, tmp)
    path = root / "profiler_info_0.json"
    path.write_bytes(b"\x00\xff" + garbage(500, seed=2))
    return Expect(root, path, None, None, ())


@case("npu-trace-view-cut-in-string", "torch_npu")
def npu_trace_cut_string(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L0, tmp)
    path = root / "trace_view.json"
    data = path.read_bytes()
    at = data.index(b'"name"', len(data) // 3) + 3  # inside a key string
    path.write_bytes(data[:at])
    return Expect(root, path, data[:at].count(b"\n") + 1, "[", ("truncated",))


@case("npu-trace-view-cut-after-comma", "torch_npu")
def npu_trace_cut_comma(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L0, tmp)
    path = root / "trace_view.json"
    data = path.read_bytes()
    at = data.index(b"},", (len(data) * 4) // 5) + 2
    path.write_bytes(data[:at])
    return Expect(root, path, data[:at].count(b"\n") + 1, "[", ("truncated",))


@case("npu-trace-view-an-object", "torch_npu")
def npu_trace_object(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L0, tmp)
    path = root / "trace_view.json"
    path.write_bytes(b'\n  {"0": {"ph": "C", "name": "APP/HBM", "args": {"KB": 1}}}')
    return Expect(root, path, 1, None, ("JSON array", "JSON object"))


@case("npu-trace-view-a-string", "torch_npu")
def npu_trace_string(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L0, tmp)
    path = root / "trace_view.json"
    path.write_bytes(b'"[not an array]"\n')
    return Expect(root, path, 1, None, ("JSON array",))


@case("npu-trace-view-deep", "torch_npu", isolate=True)
def npu_trace_deep(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L0, tmp)
    path = root / "trace_view.json"
    path.write_bytes(b"[" + b"[" * DEEP + b"]" * DEEP + b"]")
    return Expect(root, path, None, "[0]", ("nested deeper",))


@case("npu-trace-view-kb-1e400", "torch_npu")
def npu_trace_kb_inf(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L0, tmp)
    path = root / "trace_view.json"
    data = path.read_bytes()
    at = data.index(b'"KB":')
    end = at + 5 + len(data[at + 5:].split(b"}", 1)[0])
    path.write_bytes(data[:at] + b'"KB": 1e400' + data[end:])
    return Expect(root, path, None, "[", ("overflow",))


@case("npu-trace-view-ts-huge", "torch_npu")
def npu_trace_ts_huge(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L0, tmp)
    path = root / "trace_view.json"
    data = path.read_bytes()
    at = data.index(b'"ts":', data.index(b'"name": "ProfilerStep#') if b'"name": "ProfilerStep#' in data
                    else data.index(b"ProfilerStep#"))
    value_end = data.index(b",", at)
    path.write_bytes(data[:at] + b'"ts": "99999999999999999999999.5"' + data[value_end:])
    return Expect(root, path, None, ".ts", ("range",))


@case("npu-trace-view-unreadable", "torch_npu")
def npu_trace_unreadable(tmp: Path) -> Expect:
    root = sample_dir(PTA21_L0, tmp)
    path = root / "trace_view.json"
    return Expect(root, path, None, None, ("permission denied",), deny=path)


# =================================================================================================
# Ascend sqlite (torch_npu db and CANN msprof db)
# =================================================================================================

def _db_sample(tmp: Path) -> Path:
    return sample_file(DB_SAMPLE / "ascend_pytorch_profiler_0.db", tmp)


@case("db-cut-mid-page", "ascend_db", pytest_sample=True)
def db_cut_mid_page(tmp: Path) -> Expect:
    path = _db_sample(tmp)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 1000])
    return Expect(path, path, None, None, ("truncated",))


@case("db-cut-in-header", "ascend_db")
def db_cut_header(tmp: Path) -> Expect:
    path = torch_db(tmp)
    path.write_bytes(path.read_bytes()[:60])
    return Expect(path, path, None, None, ("truncated", "100-byte"))


@case("db-garbage-pages", "ascend_db")
def db_garbage_pages(tmp: Path) -> Expect:
    path = _db_sample(tmp)
    data = bytearray(path.read_bytes())
    page = struct.unpack(">H", data[16:18])[0]
    data[page:] = garbage(len(data) - page, seed=3)  # every page after the first is noise
    path.write_bytes(bytes(data))
    return Expect(path, path, None, None, ())


@case("db-binary-garbage", "ascend_db")
def db_binary_garbage(tmp: Path) -> Expect:
    path = _mkdir(tmp / "db") / "ascend_pytorch_profiler_0.db"
    path.write_bytes(b"SQLite format 3\x00" + garbage(8192, seed=4))
    return Expect(path, path, None, None, ())


@case("db-missing-memory-tables", "ascend_db")
def db_missing_tables(tmp: Path) -> Expect:
    path = torch_db(tmp)
    db_exec(path, "DROP TABLE MEMORY_RECORD", "DROP TABLE OP_MEMORY")
    return Expect(path, path, None, "MEMORY_RECORD", ("missing table",))


@case("db-missing-string-ids", "ascend_db")
def db_missing_strings(tmp: Path) -> Expect:
    path = torch_db(tmp)
    db_exec(path, "DROP TABLE STRING_IDS")
    return Expect(path, path, None, "STRING_IDS", ("missing table",))


@case("db-text-in-integer-column", "ascend_db")
def db_wrong_type(tmp: Path) -> Expect:
    path = torch_db(tmp)
    db_exec(path, "UPDATE MEMORY_RECORD SET totalAllocated = 'lots' WHERE rowid = 2")
    return Expect(path, path, None, "MEMORY_RECORD.totalAllocated", ("rowid 2", "wrong type"))


@case("db-real-inf", "ascend_db")
def db_inf(tmp: Path) -> Expect:
    path = torch_db(tmp)
    db_exec(path, "UPDATE OP_MEMORY SET size = 1e400 WHERE rowid = 1")
    return Expect(path, path, None, "OP_MEMORY.size", ("rowid 1",))


@case("db-negative-reserved", "ascend_db")
def db_negative(tmp: Path) -> Expect:
    path = torch_db(tmp)
    db_exec(path, "UPDATE MEMORY_RECORD SET totalReserved = -4096 WHERE rowid = 3")
    return Expect(path, path, None, "MEMORY_RECORD.totalReserved", ("rowid 3",))


@case("db-step-ends-before-start", "ascend_db")
def db_step_order(tmp: Path) -> Expect:
    path = torch_db(tmp)
    db_exec(path, "UPDATE STEP_TIME SET endNs = startNs - 1 WHERE rowid = 1")
    return Expect(path, path, None, "STEP_TIME", ("before it starts",))


@case("db-missing-column", "ascend_db")
def db_missing_column(tmp: Path) -> Expect:
    path = torch_db(tmp)
    db_exec(path, "ALTER TABLE OP_MEMORY DROP COLUMN size")
    return Expect(path, path, None, "OP_MEMORY.size", ("no column",))


@case("db-empty-file", "ascend_db")
def db_empty(tmp: Path) -> Expect:
    path = torch_db(tmp)
    path.write_bytes(b"")
    return Expect(path, path, None, None, ("empty",))


@case("db-unreadable", "ascend_db")
def db_unreadable(tmp: Path) -> Expect:
    path = torch_db(tmp)
    return Expect(path, path, None, None, ("permission denied",), deny=path)


@case("db-unreadable-open", "ascend_db")
def db_unreadable_open(tmp: Path) -> Expect:
    path = torch_db(tmp)
    return Expect(path, path, None, None, ("permission denied",), deny=path, deny_access=False)


@case("msprof-unknown-event-type", "ascend_db")
def msprof_type(tmp: Path) -> Expect:
    path = msprof_db(tmp)
    db_exec(path, "UPDATE NPU_OP_MEM SET type = 77 WHERE rowid = 2")
    return Expect(path, path, None, "NPU_OP_MEM", ("rowid 2",))


@case("msprof-timestamp-overflow-text", "ascend_db")
def msprof_ts_text(tmp: Path) -> Expect:
    path = msprof_db(tmp)
    db_exec(path, "UPDATE NPU_OP_MEM SET timestampNs = '99999999999999999999' WHERE rowid = 1")
    return Expect(path, path, None, "NPU_OP_MEM.timestampNs", ("rowid 1",))


# =================================================================================================
# msMemScope
# =================================================================================================

@case("memscope-cut-mid-row", "msmemscope")
def mm_cut(tmp: Path) -> Expect:
    path = sample_file(MEMSCOPE_SAMPLE, tmp)
    cut_mid_line(path, 200)
    return Expect(path, path, 200, None, ("truncated",))


@case("memscope-utf16", "msmemscope")
def mm_utf16(tmp: Path) -> Expect:
    path = sample_file(MEMSCOPE_SAMPLE, tmp)
    path.write_bytes(path.read_text("utf-8").encode("utf-16"))
    # UTF-16 text no longer starts with the msMemScope header: no format claims it by content, and
    # the file, named as msMemScope names its dumps, goes to its loader, which names the encoding.
    return Expect(path, path, 1, None, ("header is not utf-8 text",))


def _mm_first_malloc_attr(tmp: Path, attr: str, says: str) -> Expect:
    path = mm_csv(tmp)
    line = set_cell(path, first_row(path, "Event", "MALLOC"), "Attr", attr)
    return Expect(path, path, line, "Attr", (says,))


@case("memscope-attr-malformed", "msmemscope")
def mm_attr(tmp: Path) -> Expect:
    return _mm_first_malloc_attr(tmp, "{size:12,addr", "Attr")


@case("memscope-attr-repeated-key", "msmemscope")
def mm_attr_repeated(tmp: Path) -> Expect:
    # the same key twice with another value: no telling which is meant (with the same value: read)
    return _mm_first_malloc_attr(tmp, "{addr:0x1000,size:4096,size:999999999,owner:,MID:1}",
                                 "Attr repeats size with another value")


@case("memscope-timestamp-20-digits", "msmemscope")
def mm_ts(tmp: Path) -> Expect:
    path = mm_csv(tmp)
    row = first_row(path, "Event", "MALLOC")
    line = set_cell(path, row, "Timestamp(ns)", "99999999999999999999")
    return Expect(path, path, line, "Timestamp(ns)", ())


@case("memscope-ptr-wider-than-64-bits", "msmemscope")
def mm_ptr(tmp: Path) -> Expect:
    path = mm_csv(tmp)
    row = first_row(path, "Event", "FREE")
    line = set_cell(path, row, "Ptr", "0x1" + "f" * 17)
    return Expect(path, path, line, "Ptr", ("64-bit", "0x1fff"))


@case("memscope-size-negative-malloc", "msmemscope")
def mm_size_negative(tmp: Path) -> Expect:
    path = mm_csv(tmp)
    row = first_row(path, "Event", "MALLOC")
    attr = read_rows(path)[row][9]
    line = set_cell(path, row, "Attr", attr.replace("size:", "size:-", 1))
    return Expect(path, path, line, "Attr", ("size",))


@case("memscope-db-missing-table", "msmemscope")
def mm_db_table(tmp: Path) -> Expect:
    path = mm_db(tmp)
    db_exec(path, "ALTER TABLE memscope_dump RENAME TO something_else")
    return Expect(path, path, None, "memscope_dump", ("missing table",))


@case("memscope-db-wrong-type", "msmemscope")
def mm_db_type(tmp: Path) -> Expect:
    path = mm_db(tmp)
    db_exec(path, "UPDATE memscope_dump SET \"Timestamp(ns)\" = 1.5e300 WHERE rowid = 4")
    return Expect(path, path, None, "memscope_dump", ("rowid 4",))


@case("memscope-db-cut-mid-page", "msmemscope")
def mm_db_cut(tmp: Path) -> Expect:
    path = mm_db(tmp)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 700])
    return Expect(path, path, None, None, ("truncated",))


@case("memscope-unreadable-open", "msmemscope")
def mm_unreadable(tmp: Path) -> Expect:
    path = sample_file(MEMSCOPE_SAMPLE, tmp)
    return Expect(path, path, None, None, ("permission denied",), deny=path, deny_access=False)


# =================================================================================================
# MindSpore
# =================================================================================================

@case("ms-memory-record-cut-mid-row", "mindspore")
def ms_cut(tmp: Path) -> Expect:
    out = ms_out(tmp)
    path = out / "memory_record.csv"
    n = len(lines_of(path))
    cut_mid_line(path, n - 1)
    return Expect(out.parent, path, n - 1, None, ("truncated",))


@case("ms-operator-memory-release-before-alloc", "mindspore")
def ms_order(tmp: Path) -> Expect:
    out = ms_out(tmp)
    path = out / "operator_memory.csv"
    rows = read_rows(path)
    row = next(i for i, r in enumerate(rows) if i and r[3] not in ("N/A", "") and r[2] not in ("N/A", ""))
    line = set_cell(path, row, "Release Time(us)", "1.000")
    return Expect(out.parent, path, line, "Release Time(us)", ("released before",))


@case("ms-memory-record-nan", "mindspore")
def ms_nan(tmp: Path) -> Expect:
    out = ms_out(tmp)
    path = out / "memory_record.csv"
    line = set_cell(path, 2, "Total Reserved(MB)", "NaN")
    return Expect(out.parent, path, line, "Total Reserved(MB)", ("'NaN'",))


@case("ms-memory-record-swapped-header", "mindspore")
def ms_swapped(tmp: Path) -> Expect:
    out = ms_out(tmp)
    path = out / "memory_record.csv"
    rows = read_rows(path)
    header = rows[0][:]
    header[2], header[3] = header[3], header[2]
    set_header(path, header)
    # The header no longer is MindSpore's: the *_ascend_ms directory is still claimed by name.
    return Expect(out.parent, path, 1, None, ())


@case("ms-cpu-record-empty", "mindspore")
def ms_cpu_empty(tmp: Path) -> Expect:
    prof = write_ms_profile(small_trace(), _mkdir(tmp / "ms"), MsOptions(rank=0, memory_record=False))
    path = next((prof / "FRAMEWORK").glob("cpu_ms_memory_record_*.txt"))
    path.write_bytes(b"")
    return Expect(prof, path, None, None, ("empty",))


@case("ms-npu-module-mem-latin1", "mindspore")
def ms_module_latin1(tmp: Path) -> Expect:
    out = ms_out(tmp)
    path = out / "npu_module_mem.csv"
    data = lines_of(path)
    data[3] = data[3].replace(b"NPU:", b"NP\xdc:", 1)
    path.write_bytes(b"".join(data))
    return Expect(out.parent, path, 4, None, ("UTF-8",))


@case("ms-tracker-negative-size", "mindspore")
def ms_tracker_negative(tmp: Path) -> Expect:
    path = write_tracker_dump(small_trace(), _mkdir(tmp / "tracker"), 0)
    line = set_cell(path, 2, "Size(KB)", "-1024.0")
    return Expect(path, path, line, "Size(KB)", ("negative",))


@case("ms-memory-block-garbage-rows", "mindspore")
def ms_block_garbage(tmp: Path) -> Expect:
    folder = _mkdir(tmp / "rank_3")
    path = write_memory_block(small_trace(), folder)
    data = lines_of(path)
    path.write_bytes(b"".join(data[:3]) + garbage(3000, seed=5).replace(b"\n", b"") + b"\n")
    return Expect(path, path, None, None, ())


@case("ms-memory-block-end-before-start", "mindspore")
def ms_block_order(tmp: Path) -> Expect:
    folder = _mkdir(tmp / "rank_3")
    path = write_memory_block(small_trace(), folder)
    rows = read_rows(path)
    row = next(i for i, r in enumerate(rows) if i and int(r[0]) > 1)
    line = set_cell(path, row, "end_time_stamp", "0")
    return Expect(path, path, line, "end_time_stamp", ("ends before it starts",))


@case("ms-unreadable-open", "mindspore")
def ms_unreadable(tmp: Path) -> Expect:
    out = ms_out(tmp)
    path = out / "operator_memory.csv"
    return Expect(out.parent, path, None, None, ("permission denied",), deny=path, deny_access=False)


# =================================================================================================
# CANN msprof text export
# =================================================================================================

@case("cann-operator-memory-cut-mid-row", "cann", pytest_sample=True)
def cann_cut(tmp: Path) -> Expect:
    prof = cann_prof(tmp)
    path = cann_file(prof, "operator_memory")
    cut_mid_line(path, 3)
    return Expect(prof, path, 3, None, ("truncated",))


@case("cann-npu-mem-inf", "cann")
def cann_inf(tmp: Path) -> Expect:
    prof = cann_prof(tmp)
    path = cann_file(prof, "npu_mem")
    line = set_cell(path, 1, "memory(KB)", "inf")
    return Expect(prof, path, line, "memory(KB)", ("'inf'",))


@case("cann-memory-record-swapped", "cann")
def cann_swapped(tmp: Path) -> Expect:
    prof = cann_prof(tmp)
    path = cann_file(prof, "memory_record")

    def swap(rows: list[list[str]]) -> None:
        for r in rows:
            r[3], r[4] = r[4], r[3]
    edit_rows(path, swap)
    return Expect(prof, path, 1, None, ())


@case("cann-device-id-20-digits", "cann")
def cann_device_overflow(tmp: Path) -> Expect:
    prof = cann_prof(tmp)
    path = cann_file(prof, "npu_module_mem")
    line = set_cell(path, 1, "Device_id", "99999999999999999999")
    return Expect(prof, path, line, "Device_id", ())


@case("cann-static-op-mem-garbage", "cann")
def cann_static_garbage(tmp: Path) -> Expect:
    prof = cann_prof(tmp)
    path = cann_file(prof, "static_op_mem")
    path.write_bytes(garbage(4096, seed=6))
    return Expect(prof, path, 1, None, ())


@case("cann-output-file-is-a-directory", "cann")
def cann_dir(tmp: Path) -> Expect:
    prof = cann_prof(tmp)
    path = cann_file(prof, "memory_record")
    _as_dir(path)
    # A directory with a file's name is not a file of the export: nothing claims it, and the
    # export's other files are still read.
    return Expect(prof, path, None, None, ("not a regular file",))


@case("cann-unreadable", "cann")
def cann_unreadable(tmp: Path) -> Expect:
    prof = cann_prof(tmp)
    path = cann_file(prof, "operator_memory")
    return Expect(prof, path, None, None, ("permission denied",), deny=path)


@case("cann-unreadable-open", "cann")
def cann_unreadable_open(tmp: Path) -> Expect:
    prof = cann_prof(tmp)
    path = cann_file(prof, "npu_mem")
    return Expect(prof, path, None, None, ("permission denied",), deny=path, deny_access=False)


# =================================================================================================
# PyTorch snapshot pickles
# =================================================================================================

# Pickle opcodes (pickletools names) used to write hostile streams by hand.
PROTO2 = b"\x80\x02"
STOP, MARK, EMPTY_DICT, EMPTY_LIST = b".", b"(", b"}", b"]"
SETITEM, APPEND, TUPLE1, TUPLE, REDUCE, DUP = b"s", b"a", b"\x85", b"t", b"R", b"2"
STACK_GLOBAL, NEWOBJ, OBJ, BINPERSID = b"\x93", b"\x81", b"o", b"Q"


def _unicode(text: str) -> bytes:
    raw = text.encode("utf-8")
    return b"X" + struct.pack("<I", len(raw)) + raw  # BINUNICODE


def _snapshot_head() -> bytes:
    """PROTO 2, a dict and its first key: the head memgate's snapshot detector claims."""
    return PROTO2 + EMPTY_DICT + _unicode("segments")


def _touch(target: Path) -> str:
    return f"touch {target}"


def _argv(target: Path) -> bytes:
    """The list ["touch", target] as pickle opcodes."""
    return EMPTY_LIST + _unicode("touch") + APPEND + _unicode(str(target)) + APPEND


def _evil_pickle(tmp: Path, body: Callable[[Path], bytes], name: str) -> Expect:
    side = tmp / f"PWNED-{name}"
    path = _mkdir(tmp / "snap") / "snapshot.pickle"
    path.write_bytes(_snapshot_head() + body(side) + SETITEM + STOP)
    return Expect(path, path, None, None, ("refused",), side_effect=side)


# The hostile pickles that plain pickle.load would run (NEWOBJ only builds Popen.__new__; persistent
# ids and extension codes need a handler / registration): tests/test_corpus.py proves it on each.
RUNS_CODE = ("pickle-global-reduce-os-system", "pickle-stack-global-exec", "pickle-inst-subprocess",
             "pickle-obj-os-system")


@case("pickle-global-reduce-os-system", "torch_snapshot", pytest_sample=True)
def pickle_global(tmp: Path) -> Expect:
    # GLOBAL 'os system', the argument tuple, REDUCE: pickle.load would run the command.
    return _evil_pickle(tmp, lambda side: b"cos\nsystem\n" + _unicode(_touch(side)) + TUPLE1 + REDUCE, "global")


@case("pickle-stack-global-exec", "torch_snapshot")
def pickle_stack_global(tmp: Path) -> Expect:
    def body(side: Path) -> bytes:
        code = f"open({str(side)!r}, 'w').close()"
        return _unicode("builtins") + _unicode("exec") + STACK_GLOBAL + _unicode(code) + TUPLE1 + REDUCE
    return _evil_pickle(tmp, body, "stack-global")


@case("pickle-inst-subprocess", "torch_snapshot")
def pickle_inst(tmp: Path) -> Expect:
    # INST: MARK, args, 'i module\nname\n' -> subprocess.call(["touch", side])
    return _evil_pickle(tmp, lambda side: MARK + _argv(side) + b"isubprocess\ncall\n", "inst")


@case("pickle-obj-os-system", "torch_snapshot")
def pickle_obj(tmp: Path) -> Expect:
    # OBJ: MARK, callable, args..., 'o' -> callable(*args)
    return _evil_pickle(tmp, lambda side: MARK + b"cos\nsystem\n" + _unicode(_touch(side)) + OBJ, "obj")


@case("pickle-newobj-popen", "torch_snapshot")
def pickle_newobj(tmp: Path) -> Expect:
    # NEWOBJ: cls, args tuple, 0x81 -> cls.__new__(cls, *args); BUILD would then call __setstate__
    return _evil_pickle(tmp, lambda side: b"csubprocess\nPopen\n" + MARK + _argv(side) + TUPLE + NEWOBJ, "newobj")


@case("pickle-persistent-load", "torch_snapshot")
def pickle_persid(tmp: Path) -> Expect:
    # BINPERSID: pickle.Unpickler.persistent_load decides what an id means (torch.load loads storages).
    return _evil_pickle(tmp, lambda side: _unicode(_touch(side)) + BINPERSID, "persid")


@case("pickle-ext1-extension-registry", "torch_snapshot")
def pickle_ext(tmp: Path) -> Expect:
    # EXT1: a code in copyreg's extension registry stands for a (module, name) pair; an unregistered
    # code is refused, a registered one goes through find_class (refused too).
    expect = _evil_pickle(tmp, lambda side: b"\x82\x01" + _unicode(_touch(side)) + TUPLE1 + REDUCE, "ext1")
    return replace(expect, says=("extension code",))


@case("pickle-cut-mid-stream", "torch_snapshot")
def pickle_cut(tmp: Path) -> Expect:
    path = sample_file(SNAPSHOT_SAMPLE, tmp)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    return Expect(path, path, None, None, ("truncated",))


@case("pickle-binbytes8-huge-length", "torch_snapshot")
def pickle_binbytes8(tmp: Path) -> Expect:
    path = _mkdir(tmp / "snap") / "snapshot.pickle"
    # BINBYTES8 declaring 2**62 bytes (pickle.load would try to allocate them), then nothing.
    path.write_bytes(_snapshot_head() + b"\x8e" + struct.pack("<Q", 1 << 62) + b"xxxx")
    return Expect(path, path, None, None, ())


@case("pickle-long4-huge-length", "torch_snapshot")
def pickle_long4(tmp: Path) -> Expect:
    path = _mkdir(tmp / "snap") / "snapshot.pickle"
    path.write_bytes(_snapshot_head() + b"\x8b" + struct.pack("<i", 0x7FFFFFFF) + b"\x01" * 64)
    return Expect(path, path, None, None, ())


@case("pickle-deep-nesting", "torch_snapshot")
def pickle_deep(tmp: Path) -> Expect:
    path = _mkdir(tmp / "snap") / "snapshot.pickle"
    # segments = [[[[...]]]] a million deep (EMPTY_LIST + ... + APPEND, built without recursion)
    body = EMPTY_LIST * DEEP + APPEND * (DEEP - 1)
    path.write_bytes(_snapshot_head() + body + SETITEM + _unicode("device_traces") + EMPTY_LIST + SETITEM + STOP)
    return Expect(path, path, None, "segments", ())


@case("pickle-repeated-dup", "torch_snapshot")
def pickle_dup(tmp: Path) -> Expect:
    path = _mkdir(tmp / "snap") / "snapshot.pickle"
    # 4 million DUPs of one list: 32 MB of stack references from 4 MB of file, never a STOP.
    path.write_bytes(_snapshot_head() + EMPTY_LIST + DUP * 4_000_000)
    return Expect(path, path, None, None, ())


@case("pickle-nan-and-overflow-sizes", "torch_snapshot")
def pickle_values(tmp: Path) -> Expect:
    path = snapshot_file(tmp)
    data = pickle.loads(path.read_bytes())
    data["segments"][0]["total_size"] = float("nan")
    data["segments"][0]["blocks"][0]["size"] = 1 << 70
    path.write_bytes(pickle.dumps(data, protocol=4))
    return Expect(path, path, None, "segments[0]", ())


def _snapshot_entry_twice(tmp: Path, action: str, says: str) -> Expect:
    # an address's action written again 1 µs later: an alloc of a live address, a free of a freed one
    path = snapshot_file(tmp)
    data = pickle.loads(path.read_bytes())
    trace = data["device_traces"][0]
    at = next(i for i, e in enumerate(trace) if e["action"] == action)
    trace.insert(at + 1, {**trace[at], "time_us": trace[at]["time_us"] + 1})
    path.write_bytes(pickle.dumps(data, protocol=4))
    return Expect(path, path, None, f"device_traces[0][{at + 1}]", (says,))


@case("pickle-alloc-twice-same-address", "torch_snapshot")
def pickle_alloc_twice(tmp: Path) -> Expect:
    return _snapshot_entry_twice(tmp, "alloc", "allocated twice")


@case("pickle-free-twice-same-address", "torch_snapshot")
def pickle_free_twice(tmp: Path) -> Expect:
    return _snapshot_entry_twice(tmp, "free_requested", "freed twice")


@case("pickle-free-of-a-petabyte-at-an-unknown-address", "torch_snapshot")
def pickle_huge_free(tmp: Path) -> Expect:
    # a free of memory from before the window, of 10^15 bytes: more than the segments ever reserve
    path = snapshot_file(tmp)
    data = pickle.loads(path.read_bytes())
    trace = data["device_traces"][0]
    trace.insert(1, {**trace[0], "action": "free_requested", "addr": 1 << 44, "size": 10**15})
    path.write_bytes(pickle.dumps(data, protocol=4))
    return Expect(path, path, None, "device_traces[0]", ("more memory allocated than the segments reserve",))


@case("pickle-negative-trace-size", "torch_snapshot")
def pickle_negative(tmp: Path) -> Expect:
    path = snapshot_file(tmp)
    data = pickle.loads(path.read_bytes())
    entry = next(e for e in data["device_traces"][0] if e["action"] == "alloc")
    entry["size"] = -entry["size"]
    path.write_bytes(pickle.dumps(data, protocol=4))
    return Expect(path, path, None, "device_traces[0]", ())


@case("pickle-unreadable", "torch_snapshot")
def pickle_unreadable(tmp: Path) -> Expect:
    path = snapshot_file(tmp)
    return Expect(path, path, None, None, ("permission denied",), deny=path)


# =================================================================================================
# Kineto / torch.profiler traces
# =================================================================================================

@case("kineto-cut-mid-array", "kineto")
def kineto_cut(tmp: Path) -> Expect:
    path = sample_file(KINETO_SAMPLE, tmp)
    data = path.read_bytes()
    at = data.index(b"{", len(data) // 2) + 10
    path.write_bytes(data[:at])
    return Expect(path, path, data[:at].count(b"\n") + 1, "traceEvents[", ("truncated",))


@case("kineto-gz-cut-mid-stream", "kineto", pytest_sample=True)
def kineto_gz_cut(tmp: Path) -> Expect:
    path = _mkdir(tmp / "kineto") / "train.pt.trace.json.gz"
    data = gzip.compress(KINETO_SAMPLE.read_bytes())
    path.write_bytes(data[: len(data) * 3 // 4])  # the head still reads: the stream ends later
    return Expect(path, path, None, None, ("gzip",))


@case("kineto-gz-garbage-after-header", "kineto")
def kineto_gz_garbage(tmp: Path) -> Expect:
    path = kineto_file(tmp, gz=True)
    data = path.read_bytes()
    path.write_bytes(data[:10] + garbage(len(data), seed=7))
    return Expect(path, path, None, None, ())


@case("kineto-trace-events-an-object", "kineto")
def kineto_events_object(tmp: Path) -> Expect:
    path = kineto_file(tmp)
    text = path.read_text("utf-8")
    path.write_text(text.replace('"traceEvents": [', '"traceEvents": {"0": [', 1).rstrip().removesuffix("}")
                    + "}}\n", "utf-8")
    return Expect(path, path, None, "traceEvents", ())


@case("kineto-deep", "kineto", isolate=True)
def kineto_deep(tmp: Path) -> Expect:
    path = _mkdir(tmp / "kineto") / "deep.pt.trace.json"
    path.write_bytes(b'{"traceEvents": [' + b"[" * DEEP + b"]" * DEEP + b"]}")
    return Expect(path, path, None, "traceEvents", ("nested",))


@case("kineto-bytes-huge-integer", "kineto", isolate=True)
def kineto_bigint(tmp: Path) -> Expect:
    path = kineto_file(tmp)
    text = path.read_text("utf-8")
    path.write_text(text.replace('"Bytes": ', '"Bytes": ' + "9" * 5000, 1), "utf-8")
    return Expect(path, path, None, "traceEvents", ())


@case("kineto-number-across-reads", "kineto", isolate=True)
def kineto_number_across_reads(tmp: Path) -> Expect:
    """7000 digits across the 64 KiB reads ijson makes, under 4000 in each: too long as a whole
    (ijson's C backend crashes on an integer of 4300 digits)."""
    path = kineto_file(tmp)
    text = path.read_bytes()
    at = text.index(b'"Bytes": ') + len(b'"Bytes": ')
    head, sep, tail = text.partition(b'"traceEvents": [')
    pad = (64 << 10) - 3500 - at  # blanks before the events: the number starts 3500 bytes before a read's end
    assert pad >= 0
    text = head + sep + b" " * pad + tail
    at += pad
    text = text[:at] + b"7" * 7000 + text[at:]
    path.write_bytes(text)
    return Expect(path, path, 1 + text[:at].count(b"\n"), f"(byte {at})", ("number over 4000 bytes",))


@case("kineto-bytes-nan", "kineto")
def kineto_nan(tmp: Path) -> Expect:
    path = kineto_file(tmp)
    text = path.read_text("utf-8")
    path.write_text(text.replace('"Bytes": ', '"Bytes": NaN, "x": ', 1), "utf-8")
    return Expect(path, path, None, "traceEvents", ())


@case("kineto-bytes-1e400", "kineto")
def kineto_inf(tmp: Path) -> Expect:
    path = kineto_file(tmp)
    text = path.read_text("utf-8")
    path.write_text(text.replace('"Bytes": ', '"Bytes": 1e400, "x": ', 1), "utf-8")
    return Expect(path, path, None, "traceEvents", ())


@case("kineto-ts-in-ns", "kineto")
def kineto_ts_ns(tmp: Path) -> Expect:
    path = kineto_file(tmp)
    text = path.read_text("utf-8")
    # ts in ns since the epoch where µs relative to baseTimeNanoseconds belong: past int64 ns
    at = text.index('"ts": ', text.index('"[memory]"'))
    end = text.index(",", at)
    path.write_text(text[:at] + '"ts": 1736408883573957000.000' + text[end:], "utf-8")
    return Expect(path, path, None, "traceEvents", ())


def _kineto_event_twice(tmp: Path, alloc: bool, says: str) -> Expect:
    # a [memory] event written again 1 ns later: an alloc of a live address, a free of a freed one
    path = kineto_file(tmp)
    trace = json.loads(path.read_text("utf-8"))
    events = trace["traceEvents"]
    at = next(i for i, e in enumerate(events) if e.get("name") == "[memory]" and (e["args"]["Bytes"] > 0) == alloc)
    again = json.loads(json.dumps(events[at]))
    again["ts"] = float(Decimal(str(events[at]["ts"])) + Decimal("0.001"))
    events.insert(at + 1, again)
    path.write_text(json.dumps(trace), "utf-8")
    return Expect(path, path, None, f"traceEvents[{at + 1}]", (says,))


@case("kineto-alloc-twice-same-address", "kineto")
def kineto_alloc_twice(tmp: Path) -> Expect:
    return _kineto_event_twice(tmp, True, "allocated twice")


@case("kineto-free-twice-same-address", "kineto")
def kineto_free_twice(tmp: Path) -> Expect:
    return _kineto_event_twice(tmp, False, "freed twice")


@case("kineto-empty-file", "kineto")
def kineto_empty(tmp: Path) -> Expect:
    path = kineto_file(tmp)
    path.write_bytes(b"")
    return Expect(path, path, None, None, ())


@case("kineto-unreadable", "kineto")
def kineto_unreadable(tmp: Path) -> Expect:
    path = kineto_file(tmp)
    return Expect(path, path, None, None, ("permission denied",), deny=path)


@case("timeline-deep", "torch_memory_timeline", isolate=True)
def timeline_deep(tmp: Path) -> Expect:
    path = _mkdir(tmp / "tl") / "run_memory_timeline.json"
    path.write_bytes(b"[[1, 2], " + b"[" * DEEP + b"]" * DEEP + b"]")
    return Expect(path, path, None, None, ("nested",))


@case("timeline-huge-integer", "torch_memory_timeline", isolate=True)
def timeline_bigint(tmp: Path) -> Expect:
    path = _mkdir(tmp / "tl") / "run_memory_timeline.json"
    path.write_bytes(b"[[1, " + b"7" * 5000 + b"], [[1], [2]]]")
    return Expect(path, path, None, None, ())


@case("timeline-garbage", "torch_memory_timeline")
def timeline_garbage(tmp: Path) -> Expect:
    path = _mkdir(tmp / "tl") / "run_memory_timeline.json"
    path.write_bytes(b"[[1, 2, 3], [[1, 2], [3]]" + garbage(100, seed=8))
    return Expect(path, path, None, None, ())


@case("timeline-rows-differ", "torch_memory_timeline")
def timeline_width(tmp: Path) -> Expect:
    path = _mkdir(tmp / "tl") / "run_memory_timeline.json"
    path.write_text(json.dumps([[1, 2], [[1, 2, 3], [4]]]))
    return Expect(path, path, None, "[1][1]", ("width",))


# =================================================================================================
# Discovery (a root that is not a profile at all)
# =================================================================================================

@case("root-symlink-loop", "discover")
def root_loop(tmp: Path) -> Expect:
    root = tmp / "prof"
    root.symlink_to("prof")
    return Expect(root, root, None, None, ())


@case("root-dir-of-symlink-loops", "discover")
def root_dir_loops(tmp: Path) -> Expect:
    root = _mkdir(tmp / "run")
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    (root / "self").symlink_to(".")
    return Expect(root, root, None, None, ("no profile found",))


@case("root-empty-file", "discover")
def root_empty_file(tmp: Path) -> Expect:
    root = _mkdir(tmp / "run") / "snapshot.pickle"
    root.write_bytes(b"")
    return Expect(root, root, None, None, ())


# ---- inputs that must be ACCEPTED --------------------------------------------------------------

@dataclass(frozen=True)
class Accepted:
    id: str
    make: Callable[[Path], tuple[Path, Path]]  # (the damaged copy, the original it must equal)


def _bom(path: Path) -> None:
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())


def accepted_npu_bom(tmp: Path) -> tuple[Path, Path]:
    root = sample_dir(PTA271, tmp)
    for name in ("memory_record.csv", "operator_memory.csv", "npu_module_mem.csv", "kernel_details.csv"):
        _bom(root / name)
    return root, PTA271


def accepted_memscope_bom(tmp: Path) -> tuple[Path, Path]:
    path = sample_file(MEMSCOPE_SAMPLE, tmp)
    _bom(path)
    return path, MEMSCOPE_SAMPLE


def accepted_cann_bom(tmp: Path) -> tuple[Path, Path]:
    prof = cann_prof(tmp / "a")
    original = cann_prof(tmp / "b")
    for path in (prof / "mindstudio_profiler_output").glob("*.csv"):
        _bom(path)
    return prof, original


def accepted_trace_view_bom(tmp: Path) -> tuple[Path, Path]:
    root = sample_dir(PTA21_L0, tmp)
    _bom(root / "trace_view.json")
    return root, PTA21_L0


def accepted_out_of_order_rows(tmp: Path) -> tuple[Path, Path]:
    """memory_record rows in reverse order: the loader sorts by time (no data lost, no error)."""
    root = sample_dir(PTA21_L1, tmp)
    path = root / "memory_record.csv"
    data = lines_of(path)
    path.write_bytes(data[0] + b"".join(reversed(data[1:])))
    return root, PTA21_L1


ACCEPTED = [
    Accepted("npu-csv-utf8-bom", accepted_npu_bom),
    Accepted("memscope-utf8-bom", accepted_memscope_bom),
    Accepted("cann-utf8-bom", accepted_cann_bom),
    Accepted("trace-view-utf8-bom", accepted_trace_view_bom),
    Accepted("npu-rows-out-of-order", accepted_out_of_order_rows),
]


def writable(path: Path) -> None:
    """Let tmp cleanup remove what a case made read-only."""
    for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | stat.S_IWUSR | stat.S_IRUSR | (stat.S_IXUSR if p.is_dir() else 0))



@case("recording-of-two-runs", "torch_recording")
def recording_of_two_runs(tmp: Path) -> Expect:
    """A trace of another run beside the snapshot: their peaks disagree, an error naming both files."""
    base = small_trace(ge=False)
    other = dataclasses.replace(base, blocks=tuple(dataclasses.replace(b, size=b.size * 2) for b in base.blocks))
    root = recording_dir(tmp, trace=other)
    return Expect(root, root / "snapshot.pickle", None, "device_traces", ("trace.pt.trace.json", "disagree"))


# =================================================================================================
# MindSpore 2.10: the real memory tracker header (tests/data/samples/mindspore), rows as mem_tracker.cc writes them
# =================================================================================================

MS210 = SAMPLES / "mindspore"
MS210_TRACKER = MS210 / "ms210_memtracker_cpu_graph" / "memory_block.csv"
MS210_CPU_RECORD = next((MS210 / "ms210_cpu_graph_old").glob("*_ascend_ms")) / "FRAMEWORK" / "cpu_ms_memory_record_0.txt"
MS_NEVER_FREED = str((1 << 63) - 1)
# Rows as MemoryTrackerEnabled::DumpMemoryBlock streams them (one counter for tasks, allocations and frees;
# pointers as std::ostream prints them; bools 0/1; file_name..python_stack empty for a block no tensor was
# bound to, user_tasks "{t1-t2}"), each cell followed by a comma. Sizes in bytes.
MS210_STACK = "File:/work/train.py;Line:41;Function:train_step|File:/work/train.py;Line:30;Function:construct|"
MS210_ROWS = (
    ("2", MS_NEVER_FREED, "0x12c0a0000000", "0", "DefaultAscendMemoryPool", "524288", "524288", "524288",
     "mindspore/ccsrc/backend/ms_backend/runtime/actors/base/data_prepare_actor.cc", "72", "Weight", "1",
     "1_Default/data-0", "Default/data-0", "", "{3-5}", "5", MS210_STACK, "1", "0"),
    ("4", "7", "0x12c0a0080000", "0", "DefaultAscendMemoryPool", "131072", "655360", "655360",
     "mindspore/ccsrc/backend/ms_backend/runtime/actors/base/kernel_actor.cc", "133", "Kernel", "3",
     "3_Default/MatMul-op0", "Default/MatMul-op0", "kernel_graph0", "{5}", "5", MS210_STACK, "0", "0"),
    ("6", "8", "0x12c0a00a0000", "1", "DefaultAscendMemoryPool", "512", "655872", "655872",
     "", "", "", "", "", "", "", "", "", "", "0", "1"),
    ("9", "10", "0", "0", "Ascend", "2097152", "0", "655872", "", "", "", "", "", "", "", "", "", "", "0", "0"),
)


def ms210_memory_block(folder: Path, rows: Sequence[Sequence[str]] = MS210_ROWS) -> Path:
    """The 2.10 sample's memory_block.csv (its header byte for byte) with ``rows`` under it."""
    path = _mkdir(folder) / "memory_block.csv"
    body = b"".join(",".join(r).encode() + b",\n" for r in rows)
    path.write_bytes(MS210_TRACKER.read_bytes() + body)
    return path


@case("ms210-memory-block-cut-mid-row", "mindspore")
def ms210_block_cut(tmp: Path) -> Expect:
    path = ms210_memory_block(tmp / "rank_0")
    cut_mid_line(path, 3)
    return Expect(path, path, 3, None, ("truncated",))


@case("ms210-memory-block-bad-size", "mindspore")
def ms210_block_bad_size(tmp: Path) -> Expect:
    path = ms210_memory_block(tmp / "rank_0")
    data = lines_of(path)
    cells = data[2].split(b",")
    cells[5] = b"131072.5"  # size is a size_t: digits only
    data[2] = b",".join(cells)
    path.write_bytes(b"".join(data))
    return Expect(path, path, 3, "size", ("131072.5",))


@case("ms210-memory-block-missing-column", "mindspore")
def ms210_block_missing_column(tmp: Path) -> Expect:
    """is_small dropped from the header and every row: no known header generation matches."""
    path = ms210_memory_block(tmp / "rank_0")
    out = []
    for line in lines_of(path):
        cells = line.rstrip(b"\n").split(b",")
        out.append(b",".join(cells[:19] + cells[20:]) + b"\n")
    path.write_bytes(b"".join(out))
    return Expect(path, path, 1, "is_small", ("missing column",))


@case("ms210-cpu-record-bad-size", "mindspore")
def ms210_cpu_record_bad_cell(tmp: Path) -> Expect:
    """The CPU target's FRAMEWORK/cpu_ms_memory_record_0.txt with a negative Total Allocated."""
    root = copy_sample(MS210_CPU_RECORD.parent.parent, tmp / MS210_CPU_RECORD.parent.parent.name)
    path = root / "FRAMEWORK" / MS210_CPU_RECORD.name
    line = set_cell(path, 5, "Total Allocated(Byte)", "-512")
    return Expect(root, path, line, "Total Allocated(Byte)", ("-512",))


# ---- contradictions between parts of one file (issue: the input boundary, round 3) ------------------

_CUDA = SAMPLES / "torch_cuda"


def _edited_snapshot(tmp: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    data = pickle.loads((_CUDA / "h200_record_leak" / "cuda_snapshot.pickle").read_bytes())  # our own sample
    edit(data)
    path = _mkdir(tmp / "in") / "cuda_snapshot.pickle"
    path.write_bytes(pickle.dumps(data))
    return path


@case("snapshot-maps-more-than-it-holds", "torch_snapshot")
def snapshot_maps_more_than_it_holds(tmp: Path) -> Expect:
    def edit(data: dict[str, Any]) -> None:
        trace = data["device_traces"][0]
        trace.insert(1, {**trace[0], "action": "segment_map", "addr": 1 << 40, "size": 8 << 30})

    path = _edited_snapshot(tmp, edit)
    return Expect(path, path, None, "device_traces[0]", ("maps more segment memory",))


@case("snapshot-step-ends-before-it-starts", "torch_snapshot")
def snapshot_step_ends_before_it_starts(tmp: Path) -> Expect:
    at: list[int] = []

    def edit(data: dict[str, Any]) -> None:
        notes = data["external_annotations"]
        start = next(a for a in notes if a["name"] == "ProfilerStep#2" and a["stage"] == "START")
        end = next(a for a in notes if a["name"] == "ProfilerStep#2" and a["stage"] == "END")
        start["time_us"], end["time_us"] = end["time_us"], start["time_us"]
        at.append(notes.index(end))

    path = _edited_snapshot(tmp, edit)
    return Expect(path, path, None, f"external_annotations[{at[0]}].time_us", ("ends before it starts",))


@case("kineto-gpu-listed-twice", "kineto")
def kineto_gpu_listed_twice(tmp: Path) -> Expect:
    source = next((_CUDA / "h200_trace_leak").glob("*.pt.trace.json"))
    doc = json.loads(source.read_text())
    first = doc["deviceProperties"][0]
    doc["deviceProperties"].append({**first, "totalGlobalMem": first["totalGlobalMem"] // 2})
    path = _mkdir(tmp / "in") / source.name
    path.write_text(json.dumps(doc))
    return Expect(path, path, None, f"deviceProperties[{len(doc['deviceProperties']) - 1}].totalGlobalMem",
                  ("listed twice",))


@case("recording-snapshot-of-another-run", "torch_recording")
def recording_snapshot_of_another_run(tmp: Path) -> Expect:
    root = _mkdir(tmp / "rec")
    shutil.copy(_CUDA / "h200_record_leak" / "torch_trace.json", root / "torch_trace.json")
    shutil.copy(_CUDA / "h200_record_clean" / "cuda_snapshot.pickle", root / "cuda_snapshot.pickle")
    return Expect(root, root / "cuda_snapshot.pickle", None, "device_traces", ("torch_trace.json", "disagree"))

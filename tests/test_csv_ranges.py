"""The CSV reader's byte ranges (read in parallel) agree with one sequential read, byte for byte, and
their errors name the same file, line, column and cell; cells Arrow's number parser would accept but
the schema patterns refuse (``+5``, ``.5``, ``5e3``, `` 5``, ``nan``) are refused in every range.
Plus the fused check-and-convert paths (:class:`memgate.readers.numtext.Parsed`) against the plain
conversions."""

from __future__ import annotations

import contextlib
import csv
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memgate.errors import InputError
from memgate.loaders.ascend import torch_npu
from memgate.readers import convert, csvcheck, csvtable, numtext
from memgate.readers.csvtable import CsvTable, read_csv
from memgate.schemas import load_schema

RECORD = load_schema("torch_npu.memory_record")
OPS = load_schema("torch_npu.operator_memory")
RECORD_HEADER: list[str] = RECORD["x-memgate-headers"]["2.1+"]
OPS_HEADER: list[str] = OPS["x-memgate-headers"]["2.1+"]


@contextmanager
def ranges_of(size: int) -> Iterator[None]:
    """Read files in byte ranges of about ``size`` bytes (the real size is 32 MiB)."""
    with mock.patch.object(csvtable, "RANGE_BYTES", size):
        yield


def record_rows(n: int, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        component = ["APP", "PTA", "GE", "PTA+GE"][int(rng.integers(4))]
        t = f"{1764246877082330 + 20 * i}.{int(rng.integers(1000)):03d}\t"
        mb = [f"{int(rng.integers(1, 1 << 30)) / 1024**2!r}" for _ in range(3)]
        if component == "APP":
            rows.append([component, t, "", mb[1], "", "", "NPU:0"])
        elif component == "GE":
            rows.append([component, t, mb[0], mb[1], "", "", "NPU:1"])
        else:
            rows.append([component, t, mb[0], mb[1], mb[2], "2", "NPU:0"])
    return rows


def ops_rows(n: int, seed: int = 0) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        alloc = 1764246877074439300 + 1000 * i + int(rng.integers(1000))
        life = int(rng.integers(1, 10**9))
        kb = f"{int(rng.integers(1, 1 << 20)) / 2:.1f}"

        def us(ns: int) -> str:
            return f"{ns // 1000}.{ns % 1000:03d}\t"

        totals = [f"{int(rng.integers(1, 1 << 32)) / 1024**2!r}" for _ in range(6)]
        rows.append([f"aten::op{i % 7}", kb, us(alloc), us(alloc + life), us(alloc + life - 1), us(life), us(life - 1),
                     *totals, "2", "NPU:0"])
    return rows


def write(path: Path, header: list[str], rows: list[list[str]], newline: str = "\n") -> Path:
    path.write_bytes("".join(",".join(r) + newline for r in [header, *rows]).encode())
    return path


def same_table(a: CsvTable, b: CsvTable) -> None:
    assert (a.num_rows, a.header, a.variant, a.text_columns) == (b.num_rows, b.header, b.variant, b.text_columns)
    assert a.columns.keys() == b.columns.keys()
    for name in a.columns:
        left, right = a.column(name), b.column(name)
        if pa.types.is_dictionary(left.type):
            left, right = left.cast(left.type.value_type), right.cast(right.type.value_type)
        assert left.type == right.type, name
        assert left.to_pylist() == right.to_pylist(), name


def error_of(path: Path, schema: dict[str, object], plan: dict[str, csvcheck.Converter] | None = None) -> InputError:
    with pytest.raises(InputError) as info:
        read_csv(path, schema, plan)  # type: ignore[arg-type]
    return info.value


def fields(err: InputError) -> tuple[object, ...]:
    return err.file, err.line, err.column, err.message, err.expected, err.found


# -- ranges agree with one read ------------------------------------------------------------------------

@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("size", [1, 200, 4096])
def test_ranges_agree_with_one_read(tmp_path: Path, newline: str, size: int) -> None:
    for header, rows, schema, plan in ((RECORD_HEADER, record_rows(3000), RECORD, torch_npu.MEMORY_RECORD_COLUMNS),
                                       (OPS_HEADER, ops_rows(1500), OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)):
        path = write(tmp_path / schema["x-memgate-file"], header, rows, newline)  # type: ignore[operator]
        assert len(csvtable._cuts(path, path.stat().st_size)) == 1
        whole_plan, whole_text = read_csv(path, schema, plan), read_csv(path, schema)
        with ranges_of(size):
            assert len(csvtable._cuts(path, path.stat().st_size)) > 10
            same_table(read_csv(path, schema, plan), whole_plan)
            same_table(read_csv(path, schema), whole_text)


@pytest.mark.parametrize("size", [None, 1, 700, 50_000])
def test_joined_columns_equal_the_chunks_joined(tmp_path: Path, size: int | None) -> None:
    """operator_memory's int columns joined while the file is read (its size estimated from the bytes
    read so far, grown when a guess falls short) equal the Arrow chunks joined at the end."""
    rows = ops_rows(1500, seed=3)
    for i in range(0, len(rows), 7):  # blocks still live: no release times
        rows[i][3:7] = ["", "", "", ""]
    path = write(tmp_path / "operator_memory.csv", OPS_HEADER, rows)
    ints = torch_npu.OPERATOR_MEMORY_INTS
    with ranges_of(size) if size is not None else contextlib.nullcontext():
        joined = read_csv(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS, joined=ints)
        chunked = read_csv(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)
    assert not set(ints) & set(joined.columns)
    for name in ints:
        (values, missing), (want_values, want_missing) = joined.pop_ints(name), chunked.pop_ints(name)
        assert values.tolist() == want_values.tolist() and missing.tolist() == want_missing.tolist(), name
        assert missing.any() == (name in ("Release Time(us)", "Active Release Time(us)")), name


def test_loader_output_is_the_same_in_ranges(tmp_path: Path) -> None:
    record = write(tmp_path / "memory_record.csv", RECORD_HEADER, record_rows(2000, seed=1))
    ops = write(tmp_path / "operator_memory.csv", OPS_HEADER, ops_rows(1000, seed=2))
    whole = (torch_npu.read_memory_record(record), torch_npu.read_operator_memory(ops))
    with ranges_of(512):
        parts = (torch_npu.read_memory_record(record), torch_npu.read_operator_memory(ops))
    for (d1, c1, f1), (d2, c2, f2) in zip(whole[0], parts[0], strict=True):
        assert (d1, c1) == (d2, c2)
        assert f1.to_pandas().equals(f2.to_pandas())
    for (d1, b1), (d2, b2) in zip(whole[1], parts[1], strict=True):
        assert d1 == d2
        assert b1.to_pandas().equals(b2.to_pandas())


def test_a_quoted_line_break_in_a_later_range_reads_like_one_stream(tmp_path: Path) -> None:
    rows = ops_rows(400)
    rows[250][0] = '"aten::mm\nsecond line"'
    path = write(tmp_path / "operator_memory.csv", OPS_HEADER, rows)
    whole, whole_plan = read_csv(path, OPS), read_csv(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)
    assert whole.column("Name")[250].as_py() == "aten::mm\nsecond line"
    with ranges_of(300):
        same_table(read_csv(path, OPS), whole)
        same_table(read_csv(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS), whole_plan)
    # an error after the quoted cell names its line (the cell spans two lines)
    rows[300][1] = "0.5KB"
    write(path, OPS_HEADER, rows)
    whole_error = error_of(path, OPS)
    assert (whole_error.line, whole_error.column) == (303, "Size(KB)")
    with ranges_of(300):
        assert fields(error_of(path, OPS)) == fields(whole_error)


# -- errors in later ranges --------------------------------------------------------------------------

@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("row", [0, 1, 777, 1999])
def test_a_bad_cell_in_a_later_range_names_its_line(tmp_path: Path, newline: str, row: int) -> None:
    rows = record_rows(2000)
    rows[row][1] = "1764246877082702.44x\t"
    path = write(tmp_path / "memory_record.csv", RECORD_HEADER, rows, newline)
    whole = error_of(path, RECORD, torch_npu.MEMORY_RECORD_COLUMNS)
    assert (whole.file, whole.line, whole.column) == (str(path), row + 2, "Timestamp(us)")
    for size in (1, 100, 5000):
        with ranges_of(size):
            assert fields(error_of(path, RECORD, torch_npu.MEMORY_RECORD_COLUMNS)) == fields(whole)
            assert fields(error_of(path, RECORD)) == fields(whole)


def test_the_first_bad_cell_of_the_file_wins_across_ranges(tmp_path: Path) -> None:
    rows = record_rows(3000)
    rows[2500][3] = "1.5MB"
    rows[1200][6] = "GPU:0"
    path = write(tmp_path / "memory_record.csv", RECORD_HEADER, rows)
    with ranges_of(1000):
        err = error_of(path, RECORD, torch_npu.MEMORY_RECORD_COLUMNS)
    assert (err.line, err.column, err.found) == (1202, "Device Type", "'GPU:0'")


def test_a_number_out_of_range_in_a_later_range_names_its_line(tmp_path: Path) -> None:
    rows = ops_rows(1000)
    rows[800][1] = "1e400"
    path = write(tmp_path / "operator_memory.csv", OPS_HEADER, rows)
    whole = error_of(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)
    assert (whole.line, whole.column, whole.message) == (802, "Size(KB)", "number out of range")
    with ranges_of(2000):
        assert fields(error_of(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)) == fields(whole)


@pytest.mark.parametrize(("column", "cell"), [(7, "8796093022208"), (1, "9007199254740992"), (1, "-9007199254740992")])
def test_exactly_2_to_the_63_bytes_is_out_of_range(tmp_path: Path, column: int, cell: str) -> None:
    # 2**63 - 1 rounds up to 2**63 as a float: a bound compared as a float let 2**63 wrap to -2**63
    rows = ops_rows(50)
    rows[30][column] = cell
    path = write(tmp_path / "operator_memory.csv", OPS_HEADER, rows)
    err = error_of(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)
    assert (err.line, err.column, err.message) == (32, OPS_HEADER[column], "number out of range")
    rows[30][column] = "8796093022207"  # 2**63 - 2**20 bytes: the largest MB count that fits
    write(path, OPS_HEADER, rows)
    total = read_csv(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS).column(OPS_HEADER[column])
    assert total[30].as_py() == 2**63 - 2**20 if column == 7 else 8796093022207 * 1024


def test_a_ragged_row_in_a_later_range_names_its_line(tmp_path: Path) -> None:
    rows = record_rows(2000)
    rows[1500] = rows[1500][:-1]
    path = write(tmp_path / "memory_record.csv", RECORD_HEADER, rows)
    whole = error_of(path, RECORD)
    assert (whole.line, whole.found) == (1502, "6 columns")
    with ranges_of(3000):
        assert fields(error_of(path, RECORD)) == fields(whole)


@pytest.mark.parametrize("size", [None, 20_000])
def test_a_quote_never_closed_names_its_line(tmp_path: Path, size: int | None) -> None:
    # in one Arrow block: too few fields; over several, Arrow's chunker loses step ("out of sync")
    rows = ops_rows(3000)
    rows[2000][1] = '"32.5'
    path = write(tmp_path / "operator_memory.csv", OPS_HEADER, rows)
    with ranges_of(size) if size else contextlib.nullcontext():
        err = error_of(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)
        assert (err.line, err.found) == (2002, "2 columns")
        with mock.patch.object(csvtable, "BLOCK_BYTES", 4096):
            err = error_of(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)
    assert (err.line, err.found) == (2002, "2 columns from here") and "never closed" in err.message


def test_a_cell_past_the_csv_modules_field_limit_is_read_on_the_error_paths(tmp_path: Path) -> None:
    # a 200 KB name is a valid cell; finding a later row's line re-reads the file with the csv module,
    # whose default limit is 128 KiB a field (and is left as it was)
    rows = ops_rows(300)
    rows[10][0] = "aten::" + "x" * 200_000
    rows[20][1] = '"32.5\n"'  # a quoted line break: lines are counted by the csv module
    rows[250][1] = "abc"
    path = write(tmp_path / "operator_memory.csv", OPS_HEADER, rows)
    err = error_of(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)
    assert (err.line, err.column, err.found) == (253, "Size(KB)", "'abc'")
    rows[250] = rows[250][:-1]
    write(path, OPS_HEADER, rows)
    err = error_of(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)
    assert (err.line, err.found) == (253, "14 columns")
    assert csv.field_size_limit() == 131072


def test_a_bad_cell_comes_before_a_later_ragged_row(tmp_path: Path) -> None:
    # the bad cell's line is found in a file whose later row cannot be parsed (one read and ranges)
    rows = ops_rows(2000)
    rows[10][1] = "abc"
    rows[1500] = rows[1500][:-1]
    rows[5][0] = '"aten::a\nb"'  # a quoted line break: the line is not the row number plus 2
    path = write(tmp_path / "operator_memory.csv", OPS_HEADER, rows)
    with mock.patch.object(csvtable, "BLOCK_BYTES", 4096):  # the two in different Arrow blocks
        whole = error_of(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)
        assert (whole.line, whole.column) == (13, "Size(KB)")
        with ranges_of(20_000):
            assert fields(error_of(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)) == fields(whole)


def test_a_long_line_in_a_later_range_names_its_line(tmp_path: Path) -> None:
    rows = record_rows(3000)
    rows[2000][5] = "1" * 20_000
    path = write(tmp_path / "memory_record.csv", RECORD_HEADER, rows)
    line = path.read_bytes().split(b"\n")[2001]
    with mock.patch.object(csvtable, "BLOCK_BYTES", 4096), ranges_of(10_000):
        assert len(csvtable._cuts(path, path.stat().st_size)) > 5
        err = error_of(path, RECORD)
    assert (err.line, err.found) == (2002, f"a line of {len(line)} bytes")


def test_bad_utf8_in_a_later_range_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path / "memory_record.csv", RECORD_HEADER, record_rows(2000))
    data = bytearray(path.read_bytes())
    at = data.index(b"PTA", len(data) * 3 // 4)
    data[at + 1] = 0xFF
    path.write_bytes(bytes(data))
    whole = error_of(path, RECORD)
    assert whole.line == data[:at].count(b"\n") + 1
    with ranges_of(1000):
        assert fields(error_of(path, RECORD)) == fields(whole)


@pytest.mark.parametrize("column", OPS_HEADER)
@pytest.mark.parametrize("plan", [None, torch_npu.OPERATOR_MEMORY_COLUMNS], ids=["text", "loader"])
@pytest.mark.parametrize("size", [None, 1000], ids=["one-read", "ranges"])
def test_a_byte_that_is_not_utf8_is_refused_in_any_column(tmp_path: Path, column: str,
                                                          plan: dict[str, csvcheck.Converter] | None,
                                                          size: int | None) -> None:
    # Cells are read as bytes; number columns are proven ASCII, encoded columns (device, stream, op
    # names) have their distinct values checked, the rest is checked whole: a bad byte is found in each.
    rows = ops_rows(3000)
    at = 2500
    cell = rows[at][OPS_HEADER.index(column)]
    path = write(tmp_path / "operator_memory.csv", OPS_HEADER, rows)
    data = path.read_bytes()
    start = data.index(("\n" + ",".join(rows[at]) + "\n").encode()) + 1
    offset = start + len(",".join(rows[at][:OPS_HEADER.index(column)])) + (1 if OPS_HEADER.index(column) else 0)
    assert data[offset:offset + len(cell)] == cell.encode()
    path.write_bytes(data[:offset + 1] + b"\xe9" + data[offset + 1:])  # a Latin-1 byte inside the cell
    with ranges_of(size) if size else contextlib.nullcontext():
        err = error_of(path, OPS, plan)
    assert err.line == at + 2 and err.message.startswith("file is not UTF-8 text"), fields(err)


# -- what Arrow accepts and the patterns do not ------------------------------------------------------

TIME_LAX = ["+5", ".5", "5.", "5e3", "5E3", " 5", "5 ", "nan", "NaN", "inf", "-5", "5.\t", "\t5", "5\t\t", "1.2.3",
            "0x10", "5,0", "٥"]
FLOAT_LAX = ["+5", ".5", "5.", " 5", "5 ", "nan", "inf", "-inf", "5.e3", ".5e3", "\t5", "5\t", "1_0", "--5", "5e", "e5"]


@pytest.mark.parametrize("ranges", [False, True])
@pytest.mark.parametrize("cell", TIME_LAX)
def test_lax_time_cells_are_refused(tmp_path: Path, cell: str, ranges: bool) -> None:
    rows = ops_rows(600)
    rows[450][5] = f'"{cell}"' if "," in cell else cell  # Duration(us): checked, not kept
    rows[500][2] = f'"{cell}"' if "," in cell else cell  # Allocation Time(us): kept as int64 ns
    path = write(tmp_path / "operator_memory.csv", OPS_HEADER, rows)
    with ranges_of(2000 if ranges else 1 << 30):
        err = error_of(path, OPS, torch_npu.OPERATOR_MEMORY_COLUMNS)
    assert (err.file, err.line, err.column) == (str(path), 452, "Duration(us)"), str(err)
    assert err.found == repr(cell) and err.expected == "a timestamp in us"


@pytest.mark.parametrize("ranges", [False, True])
@pytest.mark.parametrize("cell", FLOAT_LAX)
def test_lax_float_cells_are_refused(tmp_path: Path, cell: str, ranges: bool) -> None:
    rows = record_rows(1500)
    rows[1200][3] = cell  # Total Reserved(MB), filled on every row
    path = write(tmp_path / "memory_record.csv", RECORD_HEADER, rows)
    with ranges_of(3000 if ranges else 1 << 30):
        err = error_of(path, RECORD, torch_npu.MEMORY_RECORD_COLUMNS)
    assert (err.file, err.line, err.column, err.found) == (str(path), 1202, "Total Reserved(MB)", repr(cell)), str(err)


@pytest.mark.parametrize("cell", ["5e3", "-5", "1E+07", "0.5", "12"])
def test_float_text_the_pattern_allows_is_read(tmp_path: Path, cell: str) -> None:
    rows = record_rows(1500)
    rows[1200][3] = cell
    path = write(tmp_path / "memory_record.csv", RECORD_HEADER, rows)
    with ranges_of(3000):
        table = read_csv(path, RECORD, torch_npu.MEMORY_RECORD_COLUMNS)
    assert table.column("Total Reserved(MB)")[1200].as_py() == round(float(cell) * 2**20)


# -- fused check and conversion ----------------------------------------------------------------------

_TIME = re.compile(r"[0-9]+(\.[0-9]+)?\t?")
time_cells = st.one_of(
    st.builds(lambda i, f, tab: i + f + tab, st.integers(0, 10**18).map(str),
              st.one_of(st.just(""), st.integers(0, 10**6).map(lambda n: f".{n}")), st.sampled_from(("", "\t"))),
    st.text("0123456789.\t-+eE nai", max_size=8),
)


@settings(max_examples=300)
@given(st.lists(st.one_of(time_cells, st.none()), min_size=1, max_size=30))
def test_time_text_proof_agrees_with_the_pattern(cells: list[str | None]) -> None:
    col = pa.array(cells, type=pa.string())
    matches = all(c is None or _TIME.fullmatch(c) for c in cells)
    assert numtext._time_text(col) <= matches  # never proves a bad cell valid
    if any(c is not None for c in cells) and matches:
        assert numtext.proven_valid(col, numtext._TIME_TEXT)


@settings(max_examples=200)
@given(st.lists(st.one_of(time_cells, st.none()), min_size=1, max_size=30))
def test_fused_time_conversion_equals_the_plain_one(cells: list[str | None]) -> None:
    if not all(c is None or _TIME.fullmatch(c) for c in cells):
        return
    col = pa.array(cells, type=pa.string())
    proof = numtext.prove(col, numtext._TIME_TEXT)
    try:
        plain = convert.us_to_ns(col).to_pylist()
    except convert.OutOfRange:
        with pytest.raises(convert.OutOfRange):
            convert.ToNs(3)(col, proof)
        return
    assert convert.ToNs(3)(col, proof).to_pylist() == plain
    assert convert.ToNs(3)(col).to_pylist() == plain


@given(st.lists(st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr), st.none()),
                min_size=1, max_size=30))
def test_fused_bytes_conversion_equals_the_plain_one(cells: list[str | None]) -> None:
    col = pa.array(cells, type=pa.string())
    proof = numtext.prove(col, numtext._FLOAT_TEXT)
    try:
        plain = convert.unit_to_bytes(col, 1024).to_pylist()
    except convert.OutOfRange:
        return
    assert convert.ToBytes(1024)(col, proof).to_pylist() == plain


def test_range_cuts_fall_after_line_breaks(tmp_path: Path) -> None:
    path = write(tmp_path / "memory_record.csv", RECORD_HEADER, record_rows(500), "\r\n")
    data = path.read_bytes()
    with ranges_of(700):
        cuts = csvtable._cuts(path, len(data))
    assert cuts[0] == 0 and cuts == sorted(set(cuts)) and len(cuts) > 10
    assert all(data[c - 1:c] == b"\n" for c in cuts[1:])
    with tempfile.TemporaryDirectory() as tmp:
        lone_cr = Path(tmp) / "memory_record.csv"
        lone_cr.write_bytes(data.replace(b"\r\n", b"\r"))
        with ranges_of(700):
            assert csvtable._cuts(lone_cr, lone_cr.stat().st_size) == [0]  # no line start known: one range


# -- the loader reads operator_memory.csv while memory_record.csv's series are split ------------------

def _profile(tmp_path: Path, record: list[list[str]], ops: list[list[str]]) -> Path:
    out = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    write(out / "memory_record.csv", RECORD_HEADER, record)
    write(out / "operator_memory.csv", OPS_HEADER, ops)
    return out.parent


def test_memory_record_errors_come_first(tmp_path: Path) -> None:
    record, ops = record_rows(500), ops_rows(500)
    record[300][6] = "GPU:0"
    ops[10][1] = "1KB"
    with pytest.raises(InputError) as info:
        torch_npu.load(_profile(tmp_path, record, ops))
    assert (Path(str(info.value.file)).name, info.value.line, info.value.column) == ("memory_record.csv", 302,
                                                                                   "Device Type")


def test_operator_memory_errors_are_reported(tmp_path: Path) -> None:
    ops = ops_rows(500)
    ops[10][1] = "1KB"
    with pytest.raises(InputError) as info:
        torch_npu.load(_profile(tmp_path, record_rows(500), ops))
    assert (Path(str(info.value.file)).name, info.value.line, info.value.column) == ("operator_memory.csv", 12,
                                                                                   "Size(KB)")


def test_a_profile_loads_the_same_in_ranges(tmp_path: Path) -> None:
    root = _profile(tmp_path, record_rows(1000, seed=3), ops_rows(800, seed=4))
    whole = torch_npu.load(root)
    with ranges_of(700):
        parts = torch_npu.load(root)
    assert [d.device for d in whole.devices] == [d.device for d in parts.devices]
    for a, b in zip(whole.devices, parts.devices, strict=True):
        assert a.blocks.to_pandas().equals(b.blocks.to_pandas())
        assert a.series.keys() == b.series.keys()
        for name in a.series:
            assert a.series[name].frame.to_pandas().equals(b.series[name].frame.to_pandas())


def test_a_forked_child_reads_in_ranges(tmp_path: Path) -> None:
    """A process pool's worker forked after the parent read a file in ranges gets threads of its own."""
    import multiprocessing

    path = write(tmp_path / "memory_record.csv", RECORD_HEADER, record_rows(500))
    with ranges_of(2000):
        rows = read_csv(path, RECORD).num_rows
        assert csvtable._POOL is not None
        with multiprocessing.get_context("fork").Pool(1) as pool:
            assert pool.apply_async(_rows_in_ranges, (path,)).get(timeout=60) == rows


def _rows_in_ranges(path: Path) -> int:
    with ranges_of(2000):
        return read_csv(path, RECORD).num_rows

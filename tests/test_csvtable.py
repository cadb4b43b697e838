"""The vectorized CSV validator agrees with jsonschema validating the same rows one by one.

``memgate.readers.csvtable.read_csv`` checks whole columns with pyarrow compute; the reference is
``jsonschema.Draft202012Validator`` over each row as the ``csv`` module reads it (cells as text,
empty = null). jsonschema evaluates ``pattern`` with Python's ``re.search``, so ``$`` also matches
before one final newline: ``"12\\n"`` matches ``^[0-9]+$`` there, and must in memgate too.
The exact text conversions of ``memgate.readers.convert`` on their own: tests/test_convert.py.
"""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from memgate.errors import InputError
from memgate.readers.convert import unit_text_to_bytes
from memgate.readers.csvtable import read_csv
from memgate.schemas import load_schema, schema_names

TORCH_NPU = [n for n in schema_names() if n.startswith("torch_npu.")]

# Cells that are wrong in ways real files go wrong: units and signs, stray whitespace, trailing
# newlines, full-width / Arabic-Indic digits, near-miss enum values, a timestamp with two TABs.
TRICKY = ("", " ", "\t", "\n", "12\n", "12\n\n", "12\r\n", "1.5\t", "1.5\t\t", "-0.5", "1e-05", "1E+16", ".5", "5.",
          "+1", "0x1F", "NaN", "inf", "1,5", "١٢٣", "１２", "NPU:０", "NPU:0\n", "npu:0", "NPU:", "PTA ", "pta",
          "PTA\n", "APP+GE", "4294967295", "1764246877082702.440\t", "1764246877082702.440\t\n",
          "1764246877082702\t", "naïve ✓", "Ω", '"quoted"', "a,b")
junk_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6)


_DIGITS = st.integers(0, 10**17).map(str)
_FRACTION = st.one_of(st.just(""), st.integers(0, 10**6).map(lambda n: f".{n:03d}"))
# Fast generators for the pattern families the row schemas use (from_regex costs ms per cell);
# any other pattern falls back to from_regex.
_BY_PATTERN: dict[str, st.SearchStrategy[str]] = {
    "^[0-9]+(\\.[0-9]+)?\\t?$": st.builds(lambda i, f, tab: i + f + tab, _DIGITS, _FRACTION, st.sampled_from(("", "\t"))),
    "^-?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?$": st.one_of(
        st.floats(allow_nan=False, allow_infinity=False).map(repr),
        st.builds(lambda sign, i, f: sign + i + f, st.sampled_from(("", "-")), _DIGITS, _FRACTION)),
    "^[0-9]+$": _DIGITS,
    "^NPU:[0-9]+$": st.integers(0, 64).map(lambda n: f"NPU:{n}"),
}


def _valid_cell(prop: dict[str, Any]) -> st.SearchStrategy[str | None]:
    options: list[st.SearchStrategy[str | None]] = []
    types = prop.get("type", ["string", "null"])
    if "null" in (types if isinstance(types, list) else [types]):
        options.append(st.none())
    if "enum" in prop:
        options.append(st.sampled_from([v for v in prop["enum"] if v is not None]))
    elif "pattern" in prop:
        pattern = prop["pattern"]
        cell = _BY_PATTERN[pattern] if pattern in _BY_PATTERN else st.from_regex(pattern, fullmatch=True)
        # Python's "$" (jsonschema's) also matches before one final newline: valid too.
        options.append(cell)
        options.append(cell.map(lambda v: v + "\n"))
    else:
        options.append(junk_text.filter(lambda s: s != ""))
    return st.one_of(options)


def _cells(prop: dict[str, Any] | None) -> st.SearchStrategy[str | None]:
    """Mostly valid cells; about one in eight is tricky or random text."""
    wrong = st.one_of(st.sampled_from(TRICKY), junk_text).map(lambda v: None if v == "" else v)
    if prop is None:
        return wrong
    valid = _valid_cell(prop)
    return st.integers(0, 7).flatmap(lambda k: wrong if k == 0 else valid)


def tables(name: str) -> st.SearchStrategy[tuple[list[str], list[list[str | None]]]]:
    """(header, rows) for one schema: a header generation it lists, and rows of cells."""
    schema = load_schema(name)
    props = schema["properties"]
    extra = ["Name", "Type", "Input Shapes", "Block Dim"]
    column_cells = {c: _cells(props.get(c)) for c in [*props, *extra]}

    @st.composite
    def draw_table(draw: st.DrawFn) -> tuple[list[str], list[list[str | None]]]:
        header = list(draw(st.sampled_from(list(schema["x-memgate-headers"].values()))))
        if schema.get("additionalProperties", False):
            # Files such as kernel_details.csv carry many more columns, in any order; schema-known
            # columns of another header generation may be present too.
            others = [c for c in props if c not in header] + extra
            header += draw(st.lists(st.sampled_from(others), unique=True, max_size=3))
            header = list(draw(st.permutations(header)))
        row = st.tuples(*(column_cells[c] for c in header)).map(list)
        return header, draw(st.lists(row, min_size=1, max_size=8))

    return draw_table()


TABLES = {name: tables(name) for name in TORCH_NPU}
VALIDATORS = {name: Draft202012Validator(load_schema(name)) for name in TORCH_NPU}


def _csv_text(header: list[str], rows: list[list[str | None]], newline: str, quote_all: bool) -> str:
    def cell(value: str | None) -> str:
        if value is None:
            return ""
        if quote_all or any(ch in value for ch in ',"\r\n'):
            return '"' + value.replace('"', '""') + '"'
        return value

    return "".join(",".join(cell(v) for v in line) + newline for line in [header, *rows])


def _first_jsonschema_error(path: Path, validator: Draft202012Validator) -> tuple[int, str] | None:
    """(1-based line where the row starts, column) of the first row jsonschema rejects, else None."""
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        start = reader.line_num + 1
        for record in reader:
            row = {k: (v if v != "" else None) for k, v in zip(header, record, strict=True)}
            bad = {e.path[0] for e in validator.iter_errors(row) if e.path}
            if bad:
                return start, min(bad, key=header.index)
            start = reader.line_num + 1
    return None


@pytest.mark.parametrize("name", TORCH_NPU)
@given(data=st.data(), newline=st.sampled_from(("\n", "\r\n")), quote_all=st.booleans())
def test_vectorized_validator_agrees_with_jsonschema(name: str, data: st.DataObject, newline: str,
                                                     quote_all: bool) -> None:
    _agrees_with_jsonschema(name, data, newline, quote_all)


@pytest.mark.parametrize("name", TORCH_NPU)
@given(data=st.data(), newline=st.sampled_from(("\n", "\r\n")), quote_all=st.booleans(), size=st.integers(1, 300))
def test_byte_ranges_agree_with_jsonschema(name: str, data: st.DataObject, newline: str, quote_all: bool,
                                           size: int) -> None:
    """The same, the file read in byte ranges of about ``size`` bytes (a few lines each)."""
    from memgate.readers import csvtable

    with mock.patch.object(csvtable, "RANGE_BYTES", size):
        _agrees_with_jsonschema(name, data, newline, quote_all)


def _agrees_with_jsonschema(name: str, data: st.DataObject, newline: str, quote_all: bool) -> None:
    schema = load_schema(name)
    header, rows = data.draw(TABLES[name])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / schema["x-memgate-file"]
        path.write_text(_csv_text(header, rows, newline, quote_all), encoding="utf-8", newline="")
        expected = _first_jsonschema_error(path, VALIDATORS[name])
        try:
            table = read_csv(path, schema)
        except InputError as exc:
            assert expected is not None, f"memgate rejected a valid file: {exc}"
            assert (exc.line, exc.column) == expected, str(exc)
            assert exc.file == str(path) and exc.expected and exc.found
        else:
            assert expected is None, f"memgate accepted a row jsonschema rejects at {expected}"
            assert table.num_rows == len(rows)
            for column in table.table.column_names:
                assert table.column(column).to_pylist() == [r[header.index(column)] for r in rows]


def test_error_names_the_line_after_a_cell_spanning_lines(tmp_path: Path) -> None:
    path = tmp_path / "operator_memory.csv"
    schema = load_schema("torch_npu.operator_memory")
    ok = ["aten::mm", "0.5", "1764246877074330.300\t"] + [""] * 10 + ["2", "NPU:0"]
    bad = list(ok)
    bad[1] = "0.5KB"
    multi = list(ok)
    multi[0] = "aten::mm\nsecond line"
    path.write_text(_csv_text(schema["x-memgate-headers"]["2.1+"], [ok, multi, ok, bad], "\n", False), newline="")
    with pytest.raises(InputError) as info:
        read_csv(path, schema)
    assert (info.value.line, info.value.column, info.value.found) == (6, "Size(KB)", "'0.5KB'")


# -- header and line shape (issue 11) ------------------------------------------------------------------

KERNEL_HEADER = ["Step Id", "Device_id", "Name", "Start Time(us)", "Duration(us)"]


@pytest.mark.parametrize(("name", "header", "twice", "fields"), [
    ("torch_npu.kernel_details", [*KERNEL_HEADER, "Step Id"], "Step Id", (1, 6)),  # passes the subset match
    ("torch_npu.kernel_details", [*KERNEL_HEADER, "Name"], "Name", (3, 6)),  # a column the schema does not know
    ("torch_npu.memory_record", ["Component", "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)",
                                 "Total Active(MB)", "Stream Ptr", "Device Type", "Component"], "Component", (1, 8)),
])
def test_a_column_named_twice_is_an_error(tmp_path: Path, name: str, header: list[str], twice: str,
                                          fields: tuple[int, int]) -> None:
    path = tmp_path / "file.csv"
    row = ["1"] * len(header)
    path.write_text(_csv_text(header, [row], "\n", False))
    with pytest.raises(InputError) as info:
        read_csv(path, load_schema(name))
    err = info.value
    assert (err.file, err.line, err.column) == (str(path), 1, twice)
    assert err.message == f"the header names this column twice (fields {fields[0]} and {fields[1]})"


def test_a_header_line_past_the_cap_is_an_error(tmp_path: Path) -> None:
    from memgate.readers import csvtable

    path = tmp_path / "kernel_details.csv"
    path.write_bytes(b"Step Id," + b"x" * csvtable.HEADER_BYTES + b"\n1,2\n")
    with pytest.raises(InputError, match="header line longer than") as info:
        read_csv(path, load_schema("torch_npu.kernel_details"))
    assert info.value.line == 1


def _kernel_rows(lengths: dict[int, int], rows: int) -> list[list[str | None]]:
    """Rows of KERNEL_HEADER; the row at 0-based index i has a Name cell of ``lengths[i]`` bytes."""
    return [["1", "0", "x" * lengths.get(i, 4), "1764246877074330.300", "1.5"] for i in range(rows)]


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_line_longer_than_the_block_names_its_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    newline: str) -> None:
    from memgate.readers import csvtable

    monkeypatch.setattr(csvtable, "BLOCK_BYTES", 4096)
    path = tmp_path / "kernel_details.csv"
    # row 3 (line 5) is 3000 bytes: it crosses a block boundary but spans no whole block, so Arrow
    # parses it; row 6 (line 8) is 10000 bytes: it spans a whole block, which Arrow cannot split.
    path.write_text(_csv_text(KERNEL_HEADER, _kernel_rows({3: 3000, 6: 10_000}, 10), newline, False), newline="")
    line8 = path.read_bytes().split(newline.encode())[7]
    with pytest.raises(InputError) as info:
        read_csv(path, load_schema("torch_npu.kernel_details"))
    err = info.value
    assert (err.file, err.line, err.found) == (str(path), 8, f"a line of {len(line8)} bytes")
    assert "block" in err.message and err.expected == "lines shorter than 4096 bytes"
    # without the long row the file reads, the 3000-byte line included
    path.write_text(_csv_text(KERNEL_HEADER, _kernel_rows({3: 3000}, 10), newline, False), newline="")
    assert read_csv(path, load_schema("torch_npu.kernel_details")).num_rows == 10


def test_a_cell_of_megabytes_at_the_real_block_size(tmp_path: Path) -> None:
    from memgate.readers import csvtable

    path = tmp_path / "kernel_details.csv"
    size = 2 * csvtable.BLOCK_BYTES + 1
    path.write_text(_csv_text(KERNEL_HEADER, _kernel_rows({1: size}, 3), "\n", False))
    with pytest.raises(InputError) as info:
        read_csv(path, load_schema("torch_npu.kernel_details"))
    assert (info.value.line, info.value.found) == (3, f"a line of {size + len('1,0,,1764246877074330.300,1.5')} bytes")


@settings(max_examples=60, deadline=None)
@given(data=st.data(), mutate=st.one_of(st.none(), st.tuples(st.integers(0, 7), _cells(None))))
def test_twin_columns_are_checked_and_converted_as_each_alone(data: st.DataObject,
                                                             mutate: tuple[int, str | None] | None) -> None:
    """A column equal cell for cell to an earlier one under the same property takes that column's
    check and conversion (torch_npu writes allocated and active from one value): errors still name
    the leftmost bad cell, and a twin that differs in one cell is checked on its own."""
    from memgate.loaders.ascend.torch_npu import MEMORY_RECORD_COLUMNS

    name = "torch_npu.memory_record"
    schema = load_schema(name)
    header, rows = data.draw(TABLES[name])
    if "Total Active(MB)" not in header:
        return
    source, twin = header.index("Total Allocated(MB)"), header.index("Total Active(MB)")
    for row in rows:
        row[twin] = row[source]
    if mutate is not None and mutate[0] < len(rows):
        rows[mutate[0]][twin] = mutate[1]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / schema["x-memgate-file"]
        path.write_text(_csv_text(header, rows, "\n", False), encoding="utf-8", newline="")
        expected = _first_jsonschema_error(path, VALIDATORS[name])
        try:
            table = read_csv(path, schema, MEMORY_RECORD_COLUMNS)
        except InputError as exc:
            if expected is None:  # valid text, but a number int64 cannot hold (no schema bounds it)
                assert exc.message == "number out of range", str(exc)
            else:
                assert (exc.line, exc.column) == expected, str(exc)
        else:
            assert expected is None, f"memgate accepted a row jsonschema rejects at {expected}"
            for column, at in (("Total Allocated(MB)", source), ("Total Active(MB)", twin)):
                alone = unit_text_to_bytes(pa.array([r[at] for r in rows], type=pa.string()), 1 << 20)
                assert table.column(column).to_pylist() == [None if pd.isna(v) else v for v in alone]

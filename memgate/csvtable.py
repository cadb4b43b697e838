"""Read a profiler CSV as text columns and validate every row against its JSON Schema.

The check is vectorized over columns with pyarrow compute (no per-row Python loop) and implements
the subset of JSON Schema the row schemas use: ``type`` string/null, ``pattern``, ``enum``,
``required`` and ``additionalProperties``. ``tests/test_csvtable.py`` shows it agrees with
``jsonschema`` validating the same rows one by one.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from memgate import convert
from memgate.errors import InputError

_HEADER_UNIT = re.compile(r"^(?P<base>.*?)\((?P<unit>[^()]*)\)$")
_ARROW_ROW = re.compile(r"Row #(\d+)")


@dataclass(frozen=True)
class CsvTable:
    """Validated text columns of one CSV file; cells are raw strings, null when empty."""

    path: Path
    header: tuple[str, ...]
    variant: str  # which header generation matched (a key of x-memgate-headers)
    table: pa.Table

    def column(self, name: str) -> pa.ChunkedArray:
        return self.table.column(name)

    def has(self, name: str) -> bool:
        return name in self.table.column_names

    def line_of(self, row: int) -> int:
        """1-based file line where a 0-based data row starts.

        A row is one line unless a quoted cell holds a line break; only then (this runs on error
        paths) is the file read again with the csv module to count the lines earlier rows span.
        """
        if _count_lines(self.path) == self.num_rows + 1:
            return row + 2
        with open(self.path, encoding="utf-8-sig", errors="replace", newline="") as fh:
            reader = csv.reader(fh)
            next(reader, None)
            start = reader.line_num + 1
            for index, _ in enumerate(reader):
                if index == row:
                    break
                start = reader.line_num + 1
        return start

    # Column conversions that name the cell when a number does not fit (convert.OutOfRange).
    def bytes(self, name: str, bytes_per_unit: float) -> pd.Series:
        return self._convert(name, lambda col: convert.unit_text_to_bytes(col, bytes_per_unit))

    def ns_from_us(self, name: str) -> pd.Series:
        return self._convert(name, convert.us_text_to_ns)

    def ns(self, name: str) -> pd.Series:
        return self._convert(name, convert.ns_text_to_ns)

    def ints(self, name: str) -> pd.Series:
        return self._convert(name, convert.int_text)

    def _convert(self, name: str, fn: Callable[[pa.ChunkedArray], pd.Series]) -> pd.Series:
        try:
            return fn(self.column(name))
        except convert.OutOfRange as exc:
            raise InputError(exc.message, file=self.path, line=self.line_of(exc.row), column=name,
                             expected=exc.expected, found=exc.found) from None

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)


def _count_lines(path: Path) -> int:
    """Line breaks in the file (CRLF, LF or a lone CR, as the csv module and Arrow count them)."""
    count, after_cr = 0, False
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            count += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            if after_cr and chunk.startswith(b"\n"):
                count -= 1
            after_cr = chunk.endswith(b"\r")
    return count


def read_header(path: Path) -> list[str]:
    """The header fields of a CSV file, BOM, CR and a trailing phantom column removed."""
    check_readable(path)
    with open(path, "rb") as fh:
        first = fh.readline()
    try:
        text = first.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError("header is not UTF-8 text", file=path, line=1, found=repr(first[:40])) from None
    try:
        fields = next(csv.reader([text.rstrip("\r\n")]), [])
    except csv.Error as exc:  # e.g. a lone CR inside the header line
        raise InputError(f"malformed header: {exc}", file=path, line=1, expected="one line of comma-separated names",
                         found=repr(first[:60])) from None
    if fields and fields[-1] == "":
        fields = fields[:-1]  # MindSpore C++ writers end every line with a comma
    return fields


def check_readable(path: Path) -> None:
    if not path.exists():
        raise InputError("no such file", file=path)
    if not path.is_file():
        raise InputError("not a regular file", file=path)
    if not os.access(path, os.R_OK):
        raise InputError("file is not readable (permission denied)", file=path)
    if path.stat().st_size == 0:
        raise InputError("empty file (0 bytes)", file=path)


def match_header(path: Path, header: list[str], schema: dict[str, Any]) -> tuple[str, list[str]]:
    """Pick the header generation of ``schema`` this file was written with, or explain why none fits."""
    variants: dict[str, list[str]] = schema["x-memgate-headers"]
    subset = bool(schema.get("additionalProperties", False))
    for name, columns in variants.items():
        if (set(columns) <= set(header)) if subset else (header == columns):
            return name, columns
    return "", _explain_header(path, header, schema)


def _explain_header(path: Path, header: list[str], schema: dict[str, Any]) -> list[str]:
    known: dict[str, Any] = schema["properties"]
    by_base = {_split_unit(c)[0]: c for c in known}
    for column in header:
        base, unit = _split_unit(column)
        expected = by_base.get(base)
        if column not in known and expected is not None and unit is not None:
            raise InputError(
                f"unit {unit!r} is not allowed in this file",
                file=path, line=1, column=column, expected=repr(expected),
            )
    variants = schema["x-memgate-headers"]
    best = min(variants.values(), key=lambda cols: len(set(cols) ^ set(header)))
    missing = [c for c in best if c not in header]
    if missing:
        raise InputError(
            f"missing column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}",
            file=path, line=1, column=missing[0], expected=f"header {','.join(best)}",
        )
    extra = [c for c in header if c not in best]
    raise InputError(
        f"unknown header: unexpected column{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))}"
        if extra else "unknown header (columns out of order or duplicated)",
        file=path, line=1, column=extra[0] if extra else None,
        expected=" or ".join(f"[{k}] {','.join(v)}" for k, v in variants.items()),
    )


def _split_unit(column: str) -> tuple[str, str | None]:
    m = _HEADER_UNIT.match(column)
    return (m.group("base"), m.group("unit")) if m else (column, None)


def read_csv(path: Path, schema: dict[str, Any]) -> CsvTable:
    """Read ``path`` as text, check its header against ``schema`` and validate every row."""
    header = read_header(path)
    variant, _ = match_header(path, header, schema)
    if variant == "":  # pragma: no cover - match_header raised
        raise AssertionError
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) != b"\n":
            raise InputError("truncated last line (the file does not end with a line break)", file=path,
                             line=_count_lines(path) + 1, expected="every line, the last too, to end with a line break")
    with open(path, encoding="utf-8-sig", errors="replace") as fh:
        phantom = len(next(csv.reader([fh.readline()]))) > len(header)
    names = header + ([""] if phantom else [])
    names = [n if n else f"__phantom_{i}" for i, n in enumerate(names)]
    # Every column the schema describes, in file order: the first bad cell of a row is the leftmost
    # one, and a known column outside the matched header generation is still validated.
    known = schema["properties"]
    wanted = [c for c in header if c in known] if schema.get("additionalProperties", False) else header
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1, use_threads=True),
            parse_options=pacsv.ParseOptions(newlines_in_values=False, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(
                column_types={n: pa.string() for n in names},
                include_columns=wanted,
                strings_can_be_null=True,
                null_values=[""],
                quoted_strings_can_be_null=True,
            ),
        )
    except pa.ArrowInvalid as exc:
        raise _arrow_error(path, exc, len(names)) from None
    except UnicodeDecodeError:
        raise _encoding_error(path) from None
    if table.num_rows == 0:
        raise InputError("header only: the file has no data rows", file=path, line=2)
    result = CsvTable(path=path, header=tuple(header), variant=variant, table=table)
    validate_columns(result, schema)
    return result


def _arrow_error(path: Path, exc: Exception, fields: int) -> InputError:
    """Turn pyarrow's parse error into one naming the line (pyarrow's message often has no row)."""
    text = str(exc)
    if "UTF8" in text or "utf8" in text.lower():
        return _encoding_error(path)
    if "Expected" in text and "columns" in text:
        line, count = _first_ragged_line(path, fields)
        return InputError("wrong number of fields (truncated or malformed row)", file=path, line=line,
                          expected=f"{fields} columns", found=f"{count} columns" if count is not None else None)
    m = _ARROW_ROW.search(text)
    return InputError(f"cannot parse CSV: {text.splitlines()[0]}", file=path, line=int(m.group(1)) if m else None)


def _first_ragged_line(path: Path, fields: int) -> tuple[int | None, int | None]:
    """The first line whose field count differs from the header's (error path only)."""
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as fh:
        reader = csv.reader(fh)
        for row in reader:
            if len(row) != fields and reader.line_num > 1:
                return reader.line_num, len(row)
    return None, None


def _encoding_error(path: Path) -> InputError:
    """Name the first line and byte that are not UTF-8 (error path only)."""
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return InputError(f"file is not UTF-8 text (byte {exc.start + 1} of the line)", file=path, line=number,
                                  expected="UTF-8 text", found=repr(raw[exc.start:exc.start + 4]))
    return InputError("file is not UTF-8 text", file=path, expected="UTF-8 text")


def re2_pattern(pattern: str) -> str:
    """Translate an anchored Python/ECMA pattern to RE2 with the same meaning.

    Python's ``$`` also matches before one final newline; RE2's does not.
    """
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        return pattern[:-1] + "\n?$"
    return pattern


def describe(prop: dict[str, Any]) -> str:
    """What a cell should look like, in words, for error messages."""
    unit = prop.get("x-unit")
    pattern = prop.get("pattern", "")
    if "enum" in prop:
        return "one of " + ", ".join(repr(v) for v in prop["enum"] if v is not None)
    if pattern.startswith(("^-?[0-9]+(\\.", "^[0-9]+(\\.")):
        what = "a timestamp" if unit == "us" and "\\t" in pattern else "a decimal number"
    elif pattern in ("^[0-9]+$", "^-?[0-9]+$"):
        what = "an integer"
    elif pattern:
        what = f"text matching {pattern}"
    else:
        what = "text"
    return f"{what} in {unit}" if unit else what


def validate_columns(table: CsvTable, schema: dict[str, Any]) -> None:
    """Raise InputError at the first cell (in file order) that ``schema`` rejects."""
    first: tuple[int, str, str, str] | None = None  # row, column, problem, expected
    props: dict[str, Any] = schema["properties"]
    for name in table.table.column_names:
        prop = props.get(name)
        if prop is None:
            continue
        col = table.column(name)
        bad_row, problem = _first_bad(col, prop)
        if bad_row is not None and (first is None or bad_row < first[0]):
            first = (bad_row, name, problem, describe(prop))
    if first is not None:
        row, name, problem, expected = first
        value = table.column(name)[row].as_py()
        raise InputError(problem, file=table.path, line=table.line_of(row), column=name,
                         expected=expected, found=repr(value) if value is not None else "an empty cell")


def _first_bad(col: pa.ChunkedArray, prop: dict[str, Any]) -> tuple[int | None, str]:
    types = prop.get("type", ["string", "null"])
    nullable = "null" in types if isinstance(types, list) else types == "null"
    candidates: list[tuple[int, str]] = []
    if not nullable and col.null_count:
        candidates.append((_first_true(pc.is_null(col)), "empty cell"))
    if "enum" in prop:
        allowed = pa.array([v for v in prop["enum"] if v is not None], type=pa.string())
        bad = pc.and_(pc.invert(pc.is_in(col, value_set=allowed)), pc.is_valid(col))
        if pc.any(bad).as_py():
            candidates.append((_first_true(bad), "value not allowed"))
    if "pattern" in prop:
        ok = pc.match_substring_regex(col, re2_pattern(prop["pattern"]))
        bad = pc.invert(pc.fill_null(ok, True))
        if pc.any(bad).as_py():
            candidates.append((_first_true(bad), "malformed value"))
    if not candidates:
        return None, ""
    return min(candidates)


def _first_true(mask: pa.ChunkedArray) -> int:
    return int(pc.index(mask, True).as_py())


def rows_as_dicts(table: CsvTable) -> list[dict[str, str | None]]:
    """The rows as the JSON objects the schemas describe (used by tests and `memgate validate`)."""
    return table.table.to_pylist()

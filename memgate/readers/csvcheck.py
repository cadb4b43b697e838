"""Check a block of CSV cells against the row schema's properties, and convert the planned columns.

The check is vectorized over columns with pyarrow compute (no per-row Python loop) and implements
the subset of JSON Schema the row schemas use: ``type`` string/null, ``pattern``, ``enum``,
``required`` and ``additionalProperties``. ``tests/test_csvtable.py`` shows it agrees with
``jsonschema`` validating the same rows one by one. Each number cell is read once: the check's parse
of a number column (:class:`memgate.readers.numtext.Parsed`) serves its conversion.

A bad cell is raised as :class:`CellError` at its row within the block; the reader of the file
(:mod:`memgate.readers.csvtable`) knows which line of the file that is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memgate.errors import InputError
from memgate.readers import convert
from memgate.readers.numtext import Parsed, prove
from memgate.schemas import re2_pattern

# Converts one text column of one block to what the loader keeps (e.g. int64 ns); raises
# convert.OutOfRange with the row within that block.
Converter = Callable[[pa.Array], pa.Array]
Checks = list[tuple[str, dict[str, Any]]]  # (column, its schema property), in file order


def keep_text(col: pa.Array) -> pa.Array:
    """The converter that keeps a column as its text."""
    return col


class NotUtf8(Exception):
    """A block holds a cell that is not UTF-8 (the file's first such line is found by the caller)."""


class CellError(Exception):
    """A bad cell at a 0-based row of a block or range (its file line is found by the caller)."""

    def __init__(self, row: int, column: str, problem: str, expected: str | None, found: str | None) -> None:
        super().__init__(problem)
        self.row, self.column, self.problem, self.expected, self.found = row, column, problem, expected, found

    def error(self, path: Path, line: int | None) -> InputError:
        return InputError(self.problem, file=path, line=line, column=self.column, expected=self.expected,
                          found=self.found)


def check_convert(batch: pa.RecordBatch, checks: Checks, plan: dict[str, Converter]) -> dict[str, pa.Array]:
    """Validate one block, then convert its planned columns, each cell read once where the check's
    work serves the conversion (:class:`convert.FromParsed`); :class:`CellError` names the row."""
    first: tuple[int, str, str, str] | None = None  # row, column, problem, expected
    raw = dict(zip(batch.schema.names, batch.columns))
    # A column equal cell for cell to an earlier one under the same property (torch_npu writes its
    # allocated and active totals from one value when nothing waits to be freed) gets that column's
    # check and conversion: comparing two columns costs a fraction of checking one.
    twin_of: dict[str, str] = {}
    for at, (name, prop) in enumerate(checks):
        twin = next((other for other, other_prop in checks[:at]
                     if other not in twin_of and other_prop == prop and raw[other].equals(raw[name])), None)
        if twin is not None:
            twin_of[name] = twin
    columns, found = _texts(raw, checks, plan, twin_of)
    parsed: dict[str, Parsed] = {}
    results: dict[str, tuple[int | None, str, Parsed | None]] = {}
    for name, prop in checks:
        if name not in twin_of:
            proof, encoded = found.get(name, (None, None))
            results[name] = first_bad_parsed(columns[name], prop, proof, tried=True, encoded=encoded)
        bad_row, problem, proof = results[twin_of.get(name, name)]
        if proof is not None:
            parsed[name] = proof
        if bad_row is not None and (first is None or bad_row < first[0]):
            first = (bad_row, name, problem, describe(prop))
    if first is not None:
        row, name, problem, expected = first
        value = columns[name][row].as_py()
        raise CellError(row, name, problem, expected, repr(value) if value is not None else "an empty cell")
    out: dict[str, pa.Array] = {}
    for name, converter in plan.items():
        twin = twin_of.get(name)
        if twin is not None and twin in out and plan[twin] == converter:
            out[name] = out[twin]
            continue
        column = columns[name]
        encoded = found.get(name, (None, None))[1]
        known = parsed.get(name) or (Parsed(encoded=encoded) if encoded is not None else None)
        try:
            if isinstance(converter, convert.FromParsed):
                out[name] = converter(column, known)
            else:
                out[name] = converter(column)
        except convert.OutOfRange as exc:
            raise CellError(exc.row, name, exc.message, exc.expected, exc.found) from None
    return out


def _texts(raw: dict[str, pa.Array], checks: Checks, plan: dict[str, Converter],
           twin_of: dict[str, str]) -> tuple[dict[str, pa.Array], dict[str, tuple[Parsed | None, pa.Array | None]]]:
    """The block's columns as text, and for each column what reading it found: the proof of a
    number column (:func:`numtext.prove`), the dictionary encoding of a column of few distinct
    values or of one converted to categories.

    Arrow reads the cells as bytes. A proven column is ASCII (digits, dots, signs, TABs): its bytes
    are text as they are. Of an encoded column only the distinct values are checked to be UTF-8;
    every other column is checked whole. All before any cell of the block is judged, as when
    Arrow's parse checked the text. Raises :class:`NotUtf8`.
    """
    props = dict(checks)
    columns: dict[str, pa.Array] = {}
    found: dict[str, tuple[Parsed | None, pa.Array | None]] = {}
    for name, column in raw.items():
        if name in twin_of:
            continue
        if pa.types.is_binary(column.type):
            view, prop = column.view(pa.string()), props.get(name, {})
            proof = prove(view, prop["pattern"]) if "pattern" in prop else None
            encoded = None
            if proof is None and (isinstance(plan.get(name), convert.ToCategories)
                                  or (("pattern" in prop or "enum" in prop) and _few_distinct(view))):
                encoded = pc.dictionary_encode(view)
            try:
                if proof is None:
                    (encoded.dictionary if encoded is not None else view).validate(full=True)
            except pa.ArrowInvalid:
                raise NotUtf8 from None
            column = view
            found[name] = (proof, encoded)
        columns[name] = column
    for name, twin in twin_of.items():
        columns[name] = columns[twin]
    return columns, found



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


def first_bad(col: pa.ChunkedArray | pa.Array, prop: dict[str, Any]) -> tuple[int | None, str]:
    """(row, problem) of the first cell ``prop`` rejects, or (None, "").

    A column of few distinct values (device, component, a reserved total that rarely moves) is
    checked on its distinct values, null included; only when one of them fails is every cell
    checked, to name the first bad row.
    """
    row, problem, _ = first_bad_parsed(col, prop)
    return row, problem


def first_bad_parsed(col: pa.ChunkedArray | pa.Array, prop: dict[str, Any], proof: Parsed | None = None,
                      tried: bool = False, encoded: pa.Array | None = None) -> tuple[int | None, str, Parsed | None]:
    """:func:`first_bad`, with what proving the column valid computed (for its conversion);
    ``tried``: ``proof`` is what :func:`numtext.prove` gave already, and ``encoded`` the column's
    dictionary encoding where it has few distinct values (None: it was not encoded)."""
    if not tried:
        proof = prove(col, prop["pattern"]) if "pattern" in prop and isinstance(col, pa.Array) else None
    if proof is not None:  # left to check: empty cells, enum
        prop = {key: value for key, value in prop.items() if key != "pattern"}
    few = (encoded is not None) if tried else (("pattern" in prop or "enum" in prop) and _few_distinct(col))
    if ("pattern" in prop or "enum" in prop) and few:
        if encoded is None and isinstance(col, pa.Array):
            encoded = pc.dictionary_encode(col)
        distinct = encoded.dictionary if encoded is not None else pc.unique(col)
        if col.null_count and encoded is not None:
            distinct = pa.concat_arrays([distinct, pa.nulls(1, distinct.type)])
        if check_cells(distinct, prop)[0] is None:
            return None, "", Parsed(encoded=encoded) if encoded is not None else proof
    row, problem = check_cells(col, prop)
    return row, problem, proof


def _few_distinct(col: pa.ChunkedArray | pa.Array, sample: int = 1024, most: int = 64) -> bool:
    return len(col) > sample and len(pc.unique(col.slice(0, sample))) <= most


def check_cells(col: pa.ChunkedArray | pa.Array, prop: dict[str, Any]) -> tuple[int | None, str]:
    """(row, problem) of the first cell ``prop`` rejects, every cell checked; (None, "") when none is."""
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


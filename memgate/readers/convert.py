"""Exact conversions from the writers' text cells to int64 bytes and ns.

A float64 cannot hold a µs timestamp like ``1764246877082702.440`` exactly, so timestamps are
parsed digit by digit into int64 ns. Sizes in MB/KB are binary fractions that float64 holds
exactly (torch_npu writes ``bytes / 1024**2``), so ``round(value * unit)`` recovers the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memgate.errors import InputError
from memgate.lazy import lazy_module
from memgate.readers.numtext import Parsed, fixed_column

if TYPE_CHECKING:
    import pandas as pd
else:  # only the Series helpers need it; the Kineto loader converts in Arrow and never imports pandas
    pd = lazy_module("pandas", globals(), "pd")

ArrowColumn: TypeAlias = "pa.Array | pa.ChunkedArray"
_TIME = r"^(?P<int>[0-9]+)(?:\.(?P<frac>[0-9]*))?"
_INT64_MAX = 2**63 - 1


class OutOfRange(InputError):
    """A number that passed its pattern but does not fit int64 bytes / ns (1e400 MB, 25-digit µs).

    Carries the 0-based row; :class:`memgate.readers.csvtable.CsvTable` turns it into file, line and column.
    """

    def __init__(self, row: int, value: object, expected: str) -> None:
        super().__init__("number out of range", expected=expected, found=repr(value))
        self.row = row


def us_text_to_ns(col: pa.ChunkedArray | pa.Array) -> pd.Series:
    """``"1764246877082702.440\\t"`` (µs) → 1764246877082702440 (ns); nulls stay null.

    Digits past the third decimal (sub-ns) are dropped.
    """
    return int64_series(us_to_ns(col))


def ns_text_to_ns(col: pa.ChunkedArray | pa.Array) -> pd.Series:
    return int64_series(ns_to_ns(col))


def unit_text_to_bytes(col: pa.ChunkedArray | pa.Array, bytes_per_unit: float) -> pd.Series:
    """Decimal text in a unit (MB, KB, ...) → int64 bytes, rounded to the nearest byte."""
    return int64_series(unit_to_bytes(col, bytes_per_unit))


def int_text(col: pa.ChunkedArray | pa.Array) -> pd.Series:
    return int64_series(to_int(col))


# ---- Arrow-level conversions (text column in, int64 column out) ------------------------------------
# The CSV reader applies these per block while it streams a file, so only int64 columns are kept.


def us_to_ns(col: ArrowColumn) -> ArrowColumn:
    return _decimal_text_to_int(col, decimals=3)


def ns_to_ns(col: ArrowColumn) -> ArrowColumn:
    return _decimal_text_to_int(col, decimals=0)


def _decimal_text_to_int(col: ArrowColumn, decimals: int) -> ArrowColumn:
    fast = _fixed_decimal(col, decimals)
    if fast is not None:
        return fast
    fast = _decimal_cast(col, decimals)
    if fast is not None:
        return fast
    return _decimal_text_to_int_regex(col, decimals)


def _fixed_decimal(col: ArrowColumn, decimals: int) -> ArrowColumn | None:
    """The usual case: every cell printed with one layout (:mod:`memgate.readers.numtext`)."""
    chunks = col.chunks if isinstance(col, pa.ChunkedArray) else [col]
    done = []
    for chunk in chunks:
        fixed = fixed_column(chunk)
        values = fixed.scaled_ints(decimals) if fixed is not None else None
        if values is None:
            return None
        done.append(values)
    return pa.chunked_array(done, type=pa.int64()) if isinstance(col, pa.ChunkedArray) else done[0]


def _decimal_cast(col: ArrowColumn, decimals: int) -> ArrowColumn | None:
    """The common case in C: Arrow's string→decimal cast parses plain digits (and torch_npu's TAB)
    exactly, ~5x faster than the regex extraction. None (use the general path, which also locates
    errors) when a cell has more decimals than ``decimals`` or the value is past int64.

    The cells have passed their schema pattern (digits, an optional fraction, an optional TAB).
    """
    try:
        exact = pc.cast(pc.utf8_rtrim(col, "\t"), pa.decimal128(22, decimals))
        scaled = pc.multiply_checked(exact, pa.scalar(10**decimals, pa.decimal128(4, 0))) if decimals else exact
        return pc.cast(scaled, pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _decimal_text_to_int_regex(col: ArrowColumn, decimals: int) -> ArrowColumn:
    parts = pc.extract_regex(col, _TIME)
    integer = pc.struct_field(parts, "int")
    scale = 10**decimals
    # int64 ns end at 9223372036854775807: a longer integer part cannot be a time.
    too_big = pc.greater(pc.cast(integer, pa.float64()), _INT64_MAX / scale)
    if pc.any(too_big).as_py():
        row = int(pc.index(too_big, True).as_py())
        raise OutOfRange(row, col[row].as_py(), f"a time below {_INT64_MAX // scale} (int64 ns)")
    whole = pc.cast(integer, pa.int64())
    if decimals == 0:
        return whole
    frac = pc.fill_null(pc.struct_field(parts, "frac"), "")
    frac = pc.utf8_slice_codeunits(pc.utf8_rpad(frac, decimals, "0"), 0, decimals)
    try:
        return pc.add_checked(pc.multiply_checked(whole, scale), pc.cast(frac, pa.int64()))
    except pa.ArrowInvalid:  # within a few ns of the int64 end, past the float check above
        near = pc.greater_equal(whole, _INT64_MAX // scale)
        row = int(pc.index(near, True).as_py())
        raise OutOfRange(row, col[row].as_py(), f"a time below {_INT64_MAX // scale} (int64 ns)") from None


def unit_to_bytes(col: ArrowColumn, bytes_per_unit: float, floats: ArrowColumn | None = None) -> pa.Array:
    """``floats``: the column already cast to float64 (by its check), else it is cast here."""
    if floats is None:
        try:
            floats = pc.cast(col, pa.float64())
        except pa.ArrowInvalid:  # a checked cell ending in the one line break its pattern's "$" admits ("12\n")
            floats = pc.cast(pc.utf8_rtrim(col, "\n"), pa.float64())
    values = np.asarray(floats.to_numpy(zero_copy_only=False), dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = np.rint(values * bytes_per_unit)
    missing = np.asarray(pc.is_null(floats).to_numpy(zero_copy_only=False), dtype=bool)
    # below 2**63, compared as a float: _INT64_MAX rounds up to 2**63 in float64, which would let
    # exactly 2**63 bytes through to wrap to -2**63
    bad = ~missing & ~(np.abs(np.nan_to_num(scaled, nan=np.inf)) < 2.0**63)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise OutOfRange(row, col[row].as_py(), "a finite size below 8 EiB")
    return pa.array(np.where(missing, 0, scaled).astype(np.int64), mask=missing if missing.any() else None)


class FromParsed:
    """A converter that reuses what the check of its column computed (a :class:`Parsed`), so each
    cell is read once; called without one, it reads the text itself."""

    def __call__(self, col: pa.Array, parsed: Parsed | None = None) -> pa.Array:
        raise NotImplementedError


@dataclass(frozen=True)
class ToNs(FromParsed):
    """Decimal time text with ``decimals`` decimals (3: µs) → int64 ns, as :func:`us_to_ns`."""

    decimals: int = 3

    def __call__(self, col: pa.Array, parsed: Parsed | None = None) -> pa.Array:
        if parsed is not None and parsed.fixed is not None:
            values = parsed.fixed.scaled_ints(self.decimals)
            if values is not None:
                return values
        result: pa.Array = _decimal_text_to_int(col, self.decimals)
        return result


@dataclass(frozen=True)
class ToBytes(FromParsed):
    """Decimal text in a unit → int64 bytes, as :func:`unit_to_bytes`."""

    bytes_per_unit: float

    def __call__(self, col: pa.Array, parsed: Parsed | None = None) -> pa.Array:
        return unit_to_bytes(col, self.bytes_per_unit, parsed.floats if parsed is not None else None)


@dataclass(frozen=True)
class ToCategories(FromParsed):
    """Text → dictionary array; ``labels``: device labels, as :func:`label_categories`."""

    labels: bool = False

    def __call__(self, col: pa.Array, parsed: Parsed | None = None) -> pa.Array:
        encoded = parsed.encoded if parsed is not None and parsed.encoded is not None else pc.dictionary_encode(col)
        if not self.labels:
            return encoded
        return _relabel(encoded)


def to_int(col: ArrowColumn) -> ArrowColumn:
    """Integer text (already pattern-checked: ``-?[0-9]+``) → int64; OutOfRange names the first
    value past int64 (a 19-digit value that fits is fine: ns timestamps have 19 digits)."""
    try:
        return pc.cast(col, pa.int64())
    except pa.ArrowInvalid:
        negative = pc.starts_with(col, "-")
        digits = pc.utf8_ltrim(pc.utf8_ltrim(col, "-"), "0")
        length = pc.utf8_length(digits)
        limit = pc.if_else(negative, str(_INT64_MAX + 1), str(_INT64_MAX))  # int64 runs from -2**63 to 2**63-1
        fits = pc.or_(pc.less(length, 19), pc.and_(pc.equal(length, 19), pc.less_equal(digits, limit)))
        row = int(pc.index(pc.fill_null(fits, True), False).as_py())
        raise OutOfRange(row, col[row].as_py(), f"an integer from {-_INT64_MAX - 1} to {_INT64_MAX} (int64)") from None


def text(col: pa.ChunkedArray | pa.Array) -> pd.Series:
    """Text cells as a pandas ``string`` Series, converted in C (no Python str per cell)."""
    mapper = {pa.string(): pd.StringDtype(), pa.large_string(): pd.StringDtype()}.get
    return pd.Series(col.to_pandas(types_mapper=mapper), dtype="string")


def device_labels(col: pa.ChunkedArray | pa.Array) -> pd.Series:
    """``NPU:0`` → ``npu:0`` for a whole column (stripped, lower-case)."""
    return text(labels(col))


def labels(col: ArrowColumn) -> ArrowColumn:
    return pc.utf8_lower(pc.utf8_trim_whitespace(col))


def label_categories(col: pa.Array) -> pa.Array:
    """Device labels of one block as a dictionary array (a few distinct values, millions of rows):
    encoded first, so only the distinct values are trimmed and lower-cased."""
    return _relabel(pc.dictionary_encode(col))


def _relabel(encoded: pa.DictionaryArray) -> pa.DictionaryArray:
    relabeled = pc.dictionary_encode(labels(encoded.dictionary))  # "NPU:0" and "npu:0 " become one
    return pa.DictionaryArray.from_arrays(pc.take(relabeled.indices, encoded.indices), relabeled.dictionary)


def categories(col: pa.Array) -> pa.Array:
    return pc.dictionary_encode(col)


def int64_series(values: ArrowColumn) -> pd.Series:
    """An int64 Arrow column as a nullable ``Int64`` Series (see :func:`int64_parts`)."""
    data, missing = int64_parts(values)
    return pd.Series(pd.arrays.IntegerArray(data, missing), copy=False)


def int64_or_zero(arr: pa.Array | None, n: int) -> np.ndarray:
    """A checked integer column (or None: absent) as ``n`` int64 values, 0 where missing."""
    if arr is None or pa.types.is_null(arr.type):
        return np.zeros(n, dtype=np.int64)
    return np.asarray(pc.fill_null(arr, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def int64_parts(values: ArrowColumn) -> tuple[np.ndarray, np.ndarray]:
    """(values, missing) of an int64 Arrow column, 0 where missing, copied once: each chunk's buffers
    are read in place (pandas' own conversion concatenates the chunks, then copies the result)."""
    chunks = int64_chunks(values)
    data = np.concatenate([part for part, _ in chunks]) if chunks else np.zeros(0, dtype=np.int64)
    missing = np.zeros(len(data), dtype=bool)
    start = 0
    for part, absent in chunks:
        if absent is not None:
            missing[start:start + len(part)] = absent
        start += len(part)
    if missing.any():
        data[missing] = 0
    return data, missing


def int64_chunks(values: ArrowColumn) -> list[tuple[np.ndarray, np.ndarray | None]]:
    """Each chunk of an int64 Arrow column as (values read in place, missing mask or None when none
    is); a missing value's slot holds any number."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    return [(_int64_view(c), ~_valid_bits(c) if c.null_count else None) for c in chunks]


def _int64_view(chunk: pa.Array) -> np.ndarray:
    buffer = chunk.buffers()[1]
    if buffer is None:  # all null
        return np.zeros(len(chunk), dtype=np.int64)
    return np.frombuffer(buffer, dtype=np.int64, count=len(chunk), offset=chunk.offset * 8)


def _valid_bits(chunk: pa.Array) -> np.ndarray:
    bits = np.unpackbits(np.frombuffer(chunk.buffers()[0], dtype=np.uint8), bitorder="little")
    return bits[chunk.offset:chunk.offset + len(chunk)].astype(bool)


def na_to_null(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """``N/A`` (MindSpore, msMemScope) is a missing value: null before any number is parsed."""
    return pc.if_else(pc.equal(col, "N/A"), pa.scalar(None, pa.string()), col)

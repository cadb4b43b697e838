"""The columns of the normalized model: numpy arrays, no pandas.

A :class:`Table` is named columns of one length. A number column (:class:`Ints`) is int64 values
with a missing mask; a text column (:class:`Texts`) is codes into its distinct names, -1 where
missing (what a pandas categorical or an Arrow dictionary array holds). Reconciliation and metrics
read these arrays directly. pandas is not imported to build, read or cache a table: importing it
costs ~0.4 s, several times a small profile's whole load. :meth:`Table.to_pandas` is the view for
people (tests, notebooks): ``Int64`` and ``string`` columns.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memgate.lazy import lazy_module

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa
else:  # imported on first use: pytest loads the plugin, and so this module, on every run
    np = lazy_module("numpy", globals(), "np")
    pd = lazy_module("pandas", globals(), "pd")
    pa = lazy_module("pyarrow", globals(), "pa")


@dataclass(frozen=True, eq=False)
class Ints:
    """A nullable int64 column: ``values`` (0 where missing) and ``missing`` (None: none missing)."""

    values: np.ndarray
    missing: np.ndarray | None = None

    @classmethod
    def of(cls, values: Any, missing: Any = None) -> Ints:
        """From int64 values and a missing mask; values under the mask are set to 0."""
        data = np.asarray(values, dtype=np.int64)
        if missing is None:
            return cls(data)
        mask = np.asarray(missing, dtype=bool)
        if len(mask) != len(data):
            raise ValueError(f"{len(data)} values, {len(mask)} mask entries")
        if not mask.any():
            return cls(data)
        if data[mask].any():
            data = np.where(mask, 0, data)
        return cls(data, mask)

    @classmethod
    def absent(cls, n: int) -> Ints:
        """``n`` missing values."""
        return cls(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool))

    @classmethod
    def of_optional(cls, values: Iterable[int | None]) -> Ints:
        items = list(values)
        missing = np.fromiter((v is None for v in items), dtype=bool, count=len(items))
        return cls.of(np.fromiter((0 if v is None else v for v in items), dtype=np.int64, count=len(items)), missing)

    def __len__(self) -> int:
        return len(self.values)

    def present(self) -> np.ndarray:
        """Where a value is known (bool per row)."""
        return np.ones(len(self.values), dtype=bool) if self.missing is None else ~self.missing

    def isna(self) -> np.ndarray:
        return np.zeros(len(self.values), dtype=bool) if self.missing is None else self.missing

    def any_present(self) -> bool:
        return len(self.values) > 0 and (self.missing is None or not bool(self.missing.all()))

    def known(self) -> np.ndarray:
        """The known values, in row order."""
        return self.values if self.missing is None else self.values[~self.missing]

    def filled(self, fill: int) -> np.ndarray:
        """The values with ``fill`` where missing (the array itself when nothing is)."""
        if self.missing is None or fill == 0:
            return self.values
        return np.where(self.missing, fill, self.values)

    def floats(self) -> np.ndarray:
        """float64 values, NaN where missing."""
        out = self.values.astype(np.float64)
        if self.missing is not None:
            out[self.missing] = np.nan
        return out

    def take(self, rows: np.ndarray) -> Ints:
        if self.missing is None:
            return Ints(self.values[rows])
        return Ints.of(self.values[rows], self.missing[rows])

    def item(self, row: int) -> int | None:
        return None if self.missing is not None and self.missing[row] else int(self.values[row])

    def tolist(self) -> list[int | None]:
        values = self.values.tolist()
        if self.missing is None:
            return values  # type: ignore[no-any-return]
        return [None if gone else v for v, gone in zip(values, self.missing.tolist())]


@dataclass(frozen=True, eq=False)
class Texts:
    """A nullable text column: ``codes`` (int32, -1 where missing) into ``names`` (distinct str, as
    a numpy object array; a name no row uses may be there)."""

    codes: np.ndarray
    names: np.ndarray

    @classmethod
    def of(cls, values: Iterable[str | None]) -> Texts:
        """From Python strings (None: missing), coded in order of first appearance."""
        index: dict[str, int] = {}
        setdefault = index.setdefault
        codes = [-1 if v is None else setdefault(v, len(index)) for v in values]
        return cls(np.array(codes, dtype=np.int32), _names(index))

    @classmethod
    def repeat(cls, value: str | None, n: int) -> Texts:
        if value is None:
            return cls(np.full(n, -1, dtype=np.int32), _names(()))
        return cls(np.zeros(n, dtype=np.int32), _names((value,)))

    @classmethod
    def coded(cls, codes: Any, names: Sequence[str]) -> Texts:
        """From codes into ``names``, which are made distinct here (codes of a repeated name merged)."""
        codes = np.asarray(codes, dtype=np.int32)
        index: dict[str, int] = {}
        remap = np.fromiter((index.setdefault(str(n), len(index)) for n in names), dtype=np.int32, count=len(names))
        if len(index) < len(names):
            codes = np.where(codes >= 0, remap[np.maximum(codes, 0)], -1).astype(np.int32)
        return cls(codes, _names(index))

    @classmethod
    def concat(cls, parts: Sequence[Texts]) -> Texts:
        """The parts one after another, over the union of their names."""
        if len(parts) == 1:
            return parts[0]
        index: dict[str, int] = {}
        pieces = []
        for part in parts:
            remap = np.fromiter((index.setdefault(n, len(index)) for n in part.names.tolist()),
                                dtype=np.int32, count=len(part.names))
            pieces.append(np.where(part.codes >= 0, remap[np.maximum(part.codes, 0)] if len(remap) else -1, -1))
        return cls(np.concatenate(pieces).astype(np.int32) if pieces else np.zeros(0, dtype=np.int32), _names(index))

    def __len__(self) -> int:
        return len(self.codes)

    def present(self) -> np.ndarray:
        return self.codes >= 0

    def isna(self) -> np.ndarray:
        return self.codes < 0

    def isin(self, values: Iterable[str]) -> np.ndarray:
        """Where a row's value is one of ``values`` (never where missing)."""
        wanted = set(values)
        hits = [i for i, name in enumerate(self.names.tolist()) if name in wanted]
        return np.isin(self.codes, np.array(hits, dtype=np.int32)) if hits else np.zeros(len(self.codes), dtype=bool)

    def used(self) -> list[str]:
        """The names some row holds, in code order."""
        seen = np.zeros(len(self.names), dtype=bool)
        seen[self.codes[self.codes >= 0]] = True
        return [str(n) for n in self.names[seen].tolist()]

    def take(self, rows: np.ndarray) -> Texts:
        return Texts(self.codes[rows], self.names)

    def item(self, row: int) -> str | None:
        code = int(self.codes[row])
        return None if code < 0 else str(self.names[code])

    def tolist(self) -> list[str | None]:
        names = self.names.tolist()
        return [None if c < 0 else names[c] for c in self.codes.tolist()]


Column = Ints | Texts


def _names(values: Iterable[str]) -> np.ndarray:
    items = list(values)
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


class Table:
    """Named columns of one length, in a fixed order."""

    __slots__ = ("_columns", "_length")

    def __init__(self, columns: Mapping[str, Column]) -> None:
        lengths = {name: len(column) for name, column in columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns of different lengths: {lengths}")
        self._columns = dict(columns)
        self._length = next(iter(lengths.values()), 0)

    @classmethod
    def empty(cls, ints: Sequence[str], texts: Sequence[str] = (), order: Sequence[str] | None = None) -> Table:
        columns: dict[str, Column] = {name: Ints(np.zeros(0, dtype=np.int64)) for name in ints}
        columns.update({name: Texts(np.zeros(0, dtype=np.int32), _names(())) for name in texts})
        return cls({name: columns[name] for name in (order or columns)})

    def __len__(self) -> int:
        return self._length

    def __repr__(self) -> str:
        return f"Table({self._length} rows: {', '.join(self._columns)})"

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self._columns)

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    def column(self, name: str) -> Column:
        return self._columns[name]

    def ints(self, name: str) -> Ints:
        column = self._columns[name]
        if not isinstance(column, Ints):
            raise TypeError(f"column {name!r} is text, not numbers")
        return column

    def texts(self, name: str) -> Texts:
        column = self._columns[name]
        if not isinstance(column, Texts):
            raise TypeError(f"column {name!r} is numbers, not text")
        return column

    def take(self, rows: np.ndarray) -> Table:
        """The rows at ``rows`` (positions, or a bool mask), in that order."""
        if rows.dtype == bool:
            rows = np.flatnonzero(rows)
        return Table({name: column.take(rows) for name, column in self._columns.items()})

    @property
    def nbytes(self) -> int:
        """Bytes the columns hold: values, masks, codes and the text of each distinct name."""
        total = 0
        for column in self._columns.values():
            if isinstance(column, Ints):
                total += column.values.nbytes + (column.missing.nbytes if column.missing is not None else 0)
            else:
                total += column.codes.nbytes + column.names.nbytes + sum(map(sys.getsizeof, column.names.tolist()))
        return total

    def select(self, names: Sequence[str]) -> Table:
        return Table({name: self._columns[name] for name in names})

    def with_column(self, name: str, column: Column) -> Table:
        columns = dict(self._columns)
        columns[name] = column
        return Table(columns)

    def records(self) -> list[dict[str, Any]]:
        """The rows as dicts (None where missing): for small tables (steps)."""
        lists = {name: column.tolist() for name, column in self._columns.items()}
        return [dict(zip(lists, row)) for row in zip(*lists.values())] if lists else []

    # --- views and conversions -------------------------------------------------------------------

    def to_pandas(self) -> pd.DataFrame:
        """A pandas view for people: ``Int64`` numbers, ``string`` text, a 0..n-1 index."""
        data: dict[str, Any] = {}
        for name, column in self._columns.items():
            if isinstance(column, Ints):
                mask = column.missing if column.missing is not None else np.zeros(len(column), dtype=bool)
                data[name] = pd.arrays.IntegerArray(column.values.copy(), mask.copy())
            else:
                data[name] = pd.array(column.tolist(), dtype="string")
        return pd.DataFrame(data, index=pd.RangeIndex(self._length))

    @classmethod
    def from_pandas(cls, frame: pd.DataFrame, columns: Sequence[str] | None = None) -> Table:
        """The ``columns`` of ``frame`` (all by default): integer columns as :class:`Ints`, text,
        categorical and all-missing object columns as :class:`Texts`."""
        out: dict[str, Column] = {}
        for name in columns if columns is not None else [str(c) for c in frame.columns]:
            out[name] = column_from_pandas(frame[name])
        return cls(out)

    def to_arrow(self) -> pa.Table:
        """An Arrow table: int64 with nulls, and dictionary<int32, string> text (the cache's form)."""
        arrays, names = [], []
        for name, column in self._columns.items():
            if isinstance(column, Ints):
                arrays.append(pa.array(column.values, mask=column.missing))
            else:
                indices = pa.array(column.codes, mask=column.codes < 0)
                arrays.append(pa.DictionaryArray.from_arrays(indices, pa.array(column.names.tolist(), pa.string())))
            names.append(name)
        return pa.table(arrays, names=names)

    @classmethod
    def from_arrow(cls, table: pa.Table) -> Table:
        out: dict[str, Column] = {}
        for name, chunked in zip(table.column_names, table.columns):
            array = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
            out[name] = column_from_arrow(array)
        return cls(out)


def column_from_pandas(series: pd.Series) -> Column:
    dtype = series.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        return Texts.coded(series.cat.codes.to_numpy(), [str(c) for c in series.cat.categories])
    if dtype.kind in "iub" or isinstance(dtype, (pd.Int64Dtype, pd.Int32Dtype, pd.Int16Dtype, pd.Int8Dtype,
                                                pd.UInt32Dtype, pd.UInt16Dtype, pd.UInt8Dtype, pd.BooleanDtype)):
        missing = series.isna().to_numpy(dtype=bool)
        return Ints.of(series.to_numpy(dtype=np.int64, na_value=0), missing)
    if dtype.kind == "f" or isinstance(dtype, pd.Float64Dtype):
        values = series.to_numpy(dtype=np.float64, na_value=np.nan)
        missing = np.isnan(values)
        whole = values[~missing]
        if len(whole) and not (whole == np.floor(whole)).all():
            raise TypeError(f"column {series.name!r} holds fractions, not whole numbers")
        return Ints.of(np.where(missing, 0, values).astype(np.int64), missing)
    if isinstance(dtype, pd.StringDtype) or dtype == object:
        missing = series.isna().to_numpy(dtype=bool)
        if missing.all():
            return Texts.repeat(None, len(series))
        codes, uniques = pd.factorize(series.astype("string") if dtype == object else series)
        return Texts(codes.astype(np.int32), _names(str(u) for u in uniques))
    raise TypeError(f"column {series.name!r} of dtype {dtype} is neither whole numbers nor text")


def column_from_arrow(array: pa.Array) -> Column:
    kind = array.type
    if pa.types.is_dictionary(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return texts_from_arrow(array)
    if pa.types.is_null(kind):
        return Ints.absent(len(array))
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        missing = np.asarray(array.is_null(), dtype=bool) if array.null_count else None
        values = array.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        return Ints.of(values, missing)
    raise TypeError(f"an Arrow column of type {kind} is neither whole numbers nor text")


def texts_from_arrow(column: pa.Array | pa.ChunkedArray) -> Texts:
    """A text or dictionary Arrow column (chunked or not) as :class:`Texts`, coded in C (no Python
    str per cell, one per distinct value)."""
    import pyarrow.compute as pc

    chunked = column if isinstance(column, pa.ChunkedArray) else pa.chunked_array([column], type=column.type)
    encoded = chunked if pa.types.is_dictionary(chunked.type) else pc.dictionary_encode(chunked)
    encoded = encoded.unify_dictionaries()
    if encoded.num_chunks == 0:
        return Texts.repeat(None, 0)
    codes = np.concatenate([chunk.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
                            for chunk in encoded.chunks])
    return Texts.coded(codes, [str(v) for v in encoded.chunk(0).dictionary.to_pylist()])


def coded_chunks(column: pa.ChunkedArray) -> Iterator[tuple[np.ndarray, list[Any]]]:
    """Each chunk of a text or dictionary Arrow column as (int32 codes into its own distinct values,
    -1 where missing; those values), coded in C and never joined into one array."""
    import pyarrow.compute as pc

    for chunk in column.chunks:
        encoded = chunk if pa.types.is_dictionary(chunk.type) else pc.dictionary_encode(chunk)
        codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        yield codes, encoded.dictionary.to_pylist()

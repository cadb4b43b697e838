"""Read a profiler CSV: its header matched to the schema, every row validated, the planned columns kept.

:func:`read_csv` is the one way memgate reads a CSV: the file's size is checked against its cap
before any read and its rows after (:mod:`memgate.readers.limits`), the header against the schema's
header generations, and every cell against its column's property (:mod:`memgate.readers.csvcheck`,
vectorized with pyarrow compute). An error names the file's line, found again here on error paths
only (:func:`line_of`).

A big file is read in byte ranges on a thread pool (:func:`_read_ranges`); each block of a range is
checked and converted at once, the check's parse of a number column serving its conversion
(:class:`memgate.readers.numtext.Parsed`), so only the converted columns stay in memory.
``tests/test_csv_ranges.py`` shows ranges agree with one sequential read, errors included.
"""

from __future__ import annotations

import collections
import csv
import mmap
import os
import re
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from memgate.errors import InputError
from memgate.readers import convert
from memgate.readers.csvcheck import CellError, Checks, Converter, NotUtf8, check_convert, keep_text
from memgate.readers.files import check_readable
from memgate.readers.limits import check_file_size, check_rows

_HEADER_UNIT = re.compile(r"^(?P<base>.*?)\((?P<unit>[^()]*)\)$")
_ARROW_ROW = re.compile(r"Row #([0-9]+)")


@dataclass(frozen=True)
class CsvTable:
    """Validated columns of one CSV file.

    Read without a plan, every column is its raw text (null when empty). Read with a plan
    (``columns={name: converter}``), only the planned columns are kept, as their converters made
    them; the text of other cells is read again from the file when an error message quotes it.
    """

    path: Path
    header: tuple[str, ...]
    variant: str  # which header generation matched (a key of x-memgate-headers)
    columns: dict[str, pa.ChunkedArray]
    num_rows: int
    text_columns: frozenset[str]  # the columns kept as their raw text
    joined: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # read_csv's ``joined``

    def column(self, name: str) -> pa.ChunkedArray:
        return self.columns[name]

    def has(self, name: str) -> bool:
        return name in self.columns or name in self.joined

    def series(self, name: str) -> pd.Series:
        """A kept column as pandas: int64 → ``Int64``, dictionary → ``category``, text → ``string``."""
        return _to_pandas(self.column(name))

    def pop_series(self, name: str) -> pd.Series:
        """:meth:`series`, releasing the Arrow column: building a frame column by column then never
        holds a file's columns twice (later messages read the cell's text from the file)."""
        series = self.series(name)
        del self.columns[name]
        return series

    def pop_ints(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`pop_series` of an int64 column as numpy (values, missing), values 0 where missing."""
        if name in self.joined:
            return self.joined.pop(name)
        parts = convert.int64_parts(self.column(name))
        del self.columns[name]
        return parts

    def pop_int_chunks(self, name: str) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """:meth:`pop_series` of an int64 column as its chunks (:func:`convert.int64_chunks`), not joined."""
        chunks = convert.int64_chunks(self.column(name))
        del self.columns[name]
        return chunks

    @property
    def table(self) -> pa.Table:
        return pa.table(self.columns)

    def cell(self, row: int, name: str) -> str | None:
        """The raw text of one cell (error messages; reads the file again for a converted column)."""
        if name in self.text_columns and self.has(name):
            return self.column(name)[row].as_py()  # type: ignore[no-any-return]
        offset = 0
        for batch in _open_csv(self.path, _column_names(self.path, list(self.header)), [name]):
            if row < offset + batch.num_rows:
                value = batch.column(0)[row - offset].as_py()
                return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
            offset += batch.num_rows
        raise IndexError(row)

    def line_of(self, row: int) -> int:
        return line_of(self.path, row, self.num_rows)

    # A raw text column parsed to int64 pandas; the cell is named when a number does not fit (convert.OutOfRange).
    def parse_bytes(self, name: str, bytes_per_unit: float) -> pd.Series:
        return self._convert(name, lambda col: convert.unit_text_to_bytes(col, bytes_per_unit))

    def parse_ns_from_us(self, name: str) -> pd.Series:
        return self._convert(name, convert.us_text_to_ns)

    def parse_ns(self, name: str) -> pd.Series:
        return self._convert(name, convert.ns_text_to_ns)

    def parse_ints(self, name: str) -> pd.Series:
        return self._convert(name, convert.int_text)

    def _convert(self, name: str, fn: Callable[[pa.ChunkedArray], pd.Series]) -> pd.Series:
        try:
            return fn(self.column(name))
        except convert.OutOfRange as exc:
            raise InputError(exc.message, file=self.path, line=self.line_of(exc.row), column=name,
                             expected=exc.expected, found=exc.found) from None


def _to_pandas(col: pa.ChunkedArray) -> pd.Series:
    if pa.types.is_integer(col.type):
        return convert.int64_series(col)
    if pa.types.is_dictionary(col.type):
        return pd.Series(col.unify_dictionaries().to_pandas(), copy=False)
    return convert.text(col)


def line_of(path: Path, row: int, rows: int | None = None) -> int:
    """1-based file line where a 0-based data row of a file with ``rows`` data rows starts.

    A row is one line unless a quoted cell holds a line break; only then (this runs on error
    paths) is the file read again with the csv module to count the lines earlier rows span.
    """
    if rows is None:  # still streaming the file: count its rows
        try:
            rows = sum(batch.num_rows for batch in _open_csv(path, _column_names(path, read_header(path)), []))
        except InputError:  # a malformed line after this row: the walk below still finds the row's line
            rows = -1
    if _count_lines(path) == rows + 1:
        return row + 2
    for index, (start, _) in enumerate(_csv_rows(path)):
        if index == row + 1:  # row 0 is the header
            return start
    return row + 2


def _count_lines(path: Path, end: int | None = None) -> int:
    """Line breaks in the file, or in its first ``end`` bytes (CRLF, LF or a lone CR, as the csv
    module and Arrow count them)."""
    count, after_cr, left = 0, False, end
    with open(path, "rb") as fh:
        while left != 0 and (chunk := fh.read(1 << 24 if left is None else min(left, 1 << 24))):
            if left is not None:
                left -= len(chunk)
            count += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            if after_cr and chunk.startswith(b"\n"):
                count -= 1
            after_cr = chunk.endswith(b"\r")
    return count


HEADER_BYTES = 1 << 20  # the longest header line read (real headers are well under 4 KiB)


def read_header(path: Path) -> list[str]:
    """The header fields of a CSV file, BOM, CR and a trailing phantom column removed."""
    check_readable(path)
    with open(path, "rb") as fh:
        first = fh.readline(HEADER_BYTES + 1)
    if len(first) > HEADER_BYTES and not first.endswith(b"\n"):
        raise InputError(f"header line longer than {HEADER_BYTES} bytes", file=path, line=1,
                         expected="one line of comma-separated column names", found=repr(first[:40]))
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


def match_header(path: Path, header: list[str], schema: dict[str, Any]) -> tuple[str, list[str]]:
    """Pick the header generation of ``schema`` this file was written with, or explain why none fits."""
    check_unique(path, header)
    variants: dict[str, list[str]] = schema["x-memgate-headers"]
    subset = bool(schema.get("additionalProperties", False))
    for name, columns in variants.items():
        if (set(columns) <= set(header)) if subset else (header == columns):
            return name, columns
    return "", _explain_header(path, header, schema)


def check_unique(path: Path, header: list[str]) -> None:
    """A column named twice is an error: which of the two a loader would read is anyone's guess."""
    seen: dict[str, int] = {}
    for index, column in enumerate(header, start=1):
        if not column:
            continue  # a nameless field (a MindSpore writer's trailing comma): never read by name
        if column in seen:
            raise InputError(f"the header names this column twice (fields {seen[column]} and {index})",
                             file=path, line=1, column=column, expected="each column named once",
                             found=f"{column!r} at fields {seen[column]} and {index}")
        seen[column] = index


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


def read_csv(path: Path, schema: dict[str, Any], columns: Mapping[str, Converter] | None = None,
             joined: Collection[str] = ()) -> CsvTable:
    """Read ``path``, check its header against ``schema`` and validate every row.

    ``joined``: planned int64 columns joined into one numpy array each while the file is read
    (:meth:`CsvTable.pop_ints` hands them over), instead of kept as Arrow chunks.

    The file is read in byte ranges, each parsed, validated and its ``columns`` converted block by
    block on a thread pool (Arrow's parser and kernels release the GIL), so only the converted
    columns stay in memory. Without ``columns``, every known column is kept as text. Its size is
    checked before any read, its rows once all are read (the caps of :mod:`memgate.readers.limits`).
    """
    check_file_size(path)
    header = read_header(path)
    variant, _ = match_header(path, header, schema)
    if variant == "":  # pragma: no cover - match_header raised
        raise AssertionError
    with open(path, "rb") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) != b"\n":
            raise InputError("truncated last line (the file does not end with a line break)", file=path,
                             line=_count_lines(path) + 1, expected="every line, the last too, to end with a line break")
    names = _column_names(path, header)
    # Every column the schema describes, in file order: the first bad cell of a row is the leftmost
    # one, and a known column outside the matched header generation is still validated.
    known = schema["properties"]
    wanted = [c for c in header if c in known] if schema.get("additionalProperties", False) else header
    # a planned column this header generation lacks (torch_npu before 2.1 wrote no Active or
    # Stream Ptr columns) is absent from the table: CsvTable.has() tells the loader
    plan: dict[str, Converter] = ({name: c for name, c in columns.items() if name in wanted} if columns is not None
                                  else {name: keep_text for name in wanted})
    checks = [(name, known[name]) for name in wanted if name in known]
    kept: dict[str, list[pa.Array]] = {name: [] for name in plan if name not in joined}
    joins = {name: _JoinedInts() for name in joined if name in plan}
    rows, size = 0, path.stat().st_size
    for block_rows, block, done in _read_ranges(path, names, wanted, checks, plan):
        rows += block_rows
        for name, arrays in block.items():
            if name in joins:
                joins[name].extend(arrays, expected=rows * size // done if done else None)
            else:
                kept[name].extend(arrays)
    if rows == 0:
        raise InputError("header only: the file has no data rows", file=path, line=2)
    check_rows(path, rows)
    return CsvTable(path=path, header=tuple(header), variant=variant, num_rows=rows,
                    text_columns=frozenset(name for name, converter in plan.items() if converter is keep_text),
                    columns={name: pa.chunked_array(chunks) for name, chunks in kept.items()},
                    joined={name: join.result() for name, join in joins.items()})


class _JoinedInts:
    """An int64 column copied into one numpy array as its chunks arrive (values 0 where missing):
    joined while the rest of the file is read, never held twice (as chunks and as their join)."""

    def __init__(self) -> None:
        self.values = np.empty(0, dtype=np.int64)
        self.missing: np.ndarray | None = None  # made at the first missing value
        self.used = 0

    def extend(self, chunks: list[pa.Array], expected: int | None) -> None:
        """``expected``: the rows the whole file likely holds (from the bytes read so far)."""
        need = self.used + sum(len(chunk) for chunk in chunks)
        if need > len(self.values):
            self._grow(max(need, need + need // 4 if expected is None else expected + expected // 50))
        for values, missing in convert.int64_chunks(pa.chunked_array(chunks, type=pa.int64())):
            at, n = self.used, len(values)
            self.values[at:at + n] = values
            if missing is not None:
                if self.missing is None:
                    self.missing = np.zeros(len(self.values), dtype=bool)
                self.missing[at:at + n] = missing
                self.values[at:at + n][missing] = 0
            self.used += n

    def _grow(self, capacity: int) -> None:
        values = np.empty(capacity, dtype=np.int64)
        values[:self.used] = self.values[:self.used]
        self.values = values
        if self.missing is not None:
            missing = np.zeros(capacity, dtype=bool)
            missing[:self.used] = self.missing[:self.used]
            self.missing = missing

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        missing = self.missing[:self.used] if self.missing is not None else np.zeros(self.used, dtype=bool)
        return self.values[:self.used], missing


def _column_names(path: Path, header: list[str]) -> list[str]:
    """Names for every field of a line: MindSpore's trailing comma adds a nameless phantom field."""
    with open(path, encoding="utf-8-sig", errors="replace") as fh:
        phantom = len(next(csv.reader([fh.readline()]))) > len(header)
    names = header + ([""] if phantom else [])
    return [n if n else f"__phantom_{i}" for i, n in enumerate(names)]


BLOCK_BYTES = 4 << 20


def _open_csv(path: Path, names: list[str], include: list[str], start: int = 0) -> Iterator[pa.RecordBatch]:
    """The file's data rows (from byte ``start``, a line start) as batches of bytes (the check
    makes them text: :func:`memgate.readers.csvcheck.check_convert`), Arrow's parse errors turned into InputError."""
    source = pa.OSFile(str(path))
    try:
        source.seek(start)
        reader = pacsv.open_csv(source, read_options=_read_options(names, start, use_threads=True),
                                parse_options=_PARSE, convert_options=_convert_options(names, include))
        yield from reader
    except pa.ArrowInvalid as exc:
        raise _arrow_error(path, exc, len(names), start) from None
    except UnicodeDecodeError:
        raise _encoding_error(path) from None
    finally:
        source.close()


_PARSE = pacsv.ParseOptions(newlines_in_values=False, ignore_empty_lines=False)


def _read_options(names: list[str], start: int, use_threads: bool) -> pacsv.ReadOptions:
    # the header line is skipped where the file starts; a later byte range starts at a data line
    return pacsv.ReadOptions(column_names=names, skip_rows=1 if start == 0 else 0, use_threads=use_threads,
                             block_size=BLOCK_BYTES)


def _convert_options(names: list[str], include: list[str]) -> pacsv.ConvertOptions:
    # Cells are read as bytes: Arrow's UTF-8 check would read every byte of the number columns, which
    # their proofs read anyway (a proven cell is ASCII); csvcheck checks the other columns.
    return pacsv.ConvertOptions(column_types={n: pa.binary() for n in names}, include_columns=include,
                                strings_can_be_null=True, null_values=[""], quoted_strings_can_be_null=True)


# ---- reading a file in byte ranges, in parallel ------------------------------------------------------
# A big file is cut at line breaks into ranges of about RANGE_BYTES; each range is parsed, checked and
# converted on a worker thread (Arrow's parser and kernels release the GIL), block by block, so only
# the converted columns and a few ranges' text are held at a time. The ranges are consumed in file
# order: the first bad cell of the file is the one reported. A quoted cell may hold a line break, so
# a cut is only known to fall between rows while no quote character came before it: from the first
# range that holds one, the rest of the file is read as one stream (as a small file is).
RANGE_BYTES = 16 << 20
_WORKERS = max(1, min(4, os.cpu_count() or 1))
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="memgate-csv")
    return _POOL


def _forget_pool() -> None:
    """In a forked child (a process pool's worker): the parent's threads are not there, so a pool
    that believes it has them would never run a task."""
    global _POOL
    _POOL = None


os.register_at_fork(after_in_child=_forget_pool)


@dataclass
class _RangeRead:
    rows: int
    columns: dict[str, list[pa.Array]]
    bytes: int


def _cuts(path: Path, size: int) -> list[int]:
    """Byte offsets where the ranges start: 0, then the first line start at or after each multiple of
    RANGE_BYTES (a lone-CR file has none: it is one range)."""
    starts = [0]
    with open(path, "rb") as fh:
        target = RANGE_BYTES
        while target < size:
            fh.seek(target - 1)
            position = target - 1
            while chunk := fh.read(1 << 16):
                found = chunk.find(b"\n")
                if found >= 0:
                    position += found + 1
                    break
                position += len(chunk)
            else:
                break
            if position >= size:
                break
            starts.append(position)
            target = position + RANGE_BYTES
    return starts


def _read_ranges(path: Path, names: list[str], wanted: list[str], checks: Checks,
                 plan: dict[str, Converter]) -> Iterator[tuple[int, dict[str, list[pa.Array]], int | None]]:
    """(rows, converted column chunks, the byte the range ends at) of each range, in file order; the
    byte is None where the file is read as one stream."""
    size = path.stat().st_size
    starts = _cuts(path, size) if size > RANGE_BYTES else [0]
    if len(starts) == 1:
        for rows, block in _blocks(path, names, wanted, checks, plan):
            yield rows, {name: [array] for name, array in block.items()}, None
        return
    ends = starts[1:] + [size]
    pool = _pool()
    pending: collections.deque[tuple[int, Future[_RangeRead | None]]] = collections.deque()
    upcoming = iter(zip(starts, ends))
    rows_before = 0
    buffers = _Buffers()

    def submit() -> None:
        for start, end in upcoming:
            pending.append((start, pool.submit(_read_range, path, names, wanted, checks, plan, start, end, buffers)))
            return

    try:
        for _ in range(_WORKERS + 1):  # a few ranges ahead: their text is what memory holds beyond the result
            submit()
        while pending:
            start, future = pending.popleft()
            try:
                result = future.result()
            except CellError as exc:
                raise exc.error(path, _range_line(path, start, exc.row)) from None
            if result is None:  # a quote character in this range: the rest is one stream
                for _, later in pending:
                    later.cancel()
                pending.clear()
                for rows, block in _blocks(path, names, wanted, checks, plan, start=start, row_offset=rows_before):
                    yield rows, {name: [array] for name, array in block.items()}, None
                return
            submit()
            rows_before += result.rows
            yield result.rows, result.columns, start + result.bytes
    finally:  # an error: drop the ranges not started yet
        for _, future in pending:
            future.cancel()


def _read_range(path: Path, names: list[str], wanted: list[str], checks: Checks,
                plan: dict[str, Converter], start: int, end: int, buffers: _Buffers) -> _RangeRead | None:
    """Parse, check and convert the lines in bytes [start, end) (a worker's task); None when the range
    holds a quote character (a cut after it may fall inside a quoted cell)."""
    size = end - start
    with buffers.get(size) as buffer:
        data = memoryview(buffer)[:size]
        with open(path, "rb", buffering=0) as fh:
            fh.seek(start)
            done = 0
            while done < size and (got := fh.readinto(data[done:])):
                done += got
        if done != size:
            raise InputError("the file changed while it was read", file=path,
                             expected=f"{size} bytes from byte {start}", found=f"{done} bytes")
        if buffer.find(b'"', 0, size) >= 0:
            return None
        try:
            return _parse_range(path, names, wanted, checks, plan, start, data)
        finally:  # Arrow's allocator keeps what a thread freed in that thread's heap until the thread
            pa.default_memory_pool().release_unused()  # asks: an idle worker would hold its text


def _parse_range(path: Path, names: list[str], wanted: list[str], checks: Checks,
                 plan: dict[str, Converter], start: int, data: memoryview) -> _RangeRead:
    kept: dict[str, list[pa.Array]] = {name: [] for name in plan}
    rows = 0
    try:
        reader = pacsv.open_csv(pa.BufferReader(pa.py_buffer(data)),  # Arrow copies cells out of it
                                read_options=_read_options(names, start, use_threads=False),
                                parse_options=_PARSE, convert_options=_convert_options(names, wanted))
        for batch in reader:
            try:
                block = check_convert(batch, checks, plan)
            except CellError as exc:
                exc.row += rows
                raise
            for name, array in block.items():
                kept[name].append(array)
            rows += batch.num_rows
    except pa.ArrowInvalid as exc:
        raise _arrow_error(path, exc, len(names), start) from None
    except (UnicodeDecodeError, NotUtf8):
        raise _encoding_error(path) from None
    return _RangeRead(rows, kept, len(data))


class _Buffers:
    """Read buffers of one file's ranges, reused from range to range (a fresh buffer per range would
    be memory touched for the first time, page faults, again and again), freed with the read.

    Anonymous maps, not bytearrays: freeing a malloc'd block of megabytes raises glibc's mmap
    threshold to its size, after which every later array that size is carved from the heap, and
    the freed memory of the columns is held instead of returned (a higher peak later on)."""

    def __init__(self) -> None:
        self._free: list[mmap.mmap] = []
        self._lock = threading.Lock()

    @contextmanager
    def get(self, size: int) -> Iterator[mmap.mmap]:
        with self._lock:
            buffer = self._free.pop() if self._free else None
        if buffer is None or len(buffer) < size:
            buffer = None  # the old one goes before the new one comes
            buffer = mmap.mmap(-1, max(size, RANGE_BYTES + (RANGE_BYTES >> 3)))
        try:
            yield buffer
        finally:
            with self._lock:
                self._free.append(buffer)


def _range_line(path: Path, start: int, row: int) -> int:
    """1-based line of the 0-based ``row`` of the range that starts at byte ``start`` (error path): a
    range without quote characters holds one row per line."""
    return _count_lines(path, start) + row + (2 if start == 0 else 1)


def _blocks(path: Path, names: list[str], wanted: list[str], checks: Checks,
            plan: dict[str, Converter], start: int = 0,
            row_offset: int = 0) -> Iterator[tuple[int, dict[str, pa.Array]]]:
    """(rows, converted columns) of each block from byte ``start`` in file order; this thread parses,
    a pool checks and converts the blocks."""
    workers = _WORKERS
    pending: collections.deque[tuple[int, Future[dict[str, pa.Array]]]] = collections.deque()
    offset = row_offset
    batches = _open_csv(path, names, wanted, start)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            while True:
                try:
                    batch = next(batches, None)
                except InputError:  # a parse error: an earlier block's validation error comes first
                    while pending:
                        pending.popleft()[1].result()
                    raise
                if batch is None:
                    break
                pending.append((batch.num_rows, pool.submit(_process, path, batch, offset, checks, plan)))
                offset += batch.num_rows
                while len(pending) > 2 * workers:  # bound the text blocks held in memory
                    rows, future = pending.popleft()
                    yield rows, future.result()
            while pending:
                rows, future = pending.popleft()
                yield rows, future.result()
        finally:  # an error: drop the blocks not started yet
            for _, future in pending:
                future.cancel()


def _process(path: Path, batch: pa.RecordBatch, offset: int, checks: Checks,
             plan: dict[str, Converter]) -> dict[str, pa.Array]:
    """Validate one block, then convert its planned columns; errors name the cell's file line."""
    try:
        return check_convert(batch, checks, plan)
    except CellError as exc:
        raise exc.error(path, line_of(path, offset + exc.row)) from None
    except NotUtf8:
        raise _encoding_error(path) from None


def _arrow_error(path: Path, exc: Exception, fields: int, start: int = 0) -> InputError:
    """Turn pyarrow's parse error into one naming the line (pyarrow's message often has no row);
    ``start``: the byte where the failed read began (a line start)."""
    text = str(exc)
    if "UTF8" in text or "utf8" in text.lower():
        return _encoding_error(path)
    if "Expected" in text and "columns" in text:
        line, count = _first_ragged_line(path, fields)
        return InputError("wrong number of fields (truncated or malformed row)", file=path, line=line,
                          expected=f"{fields} columns", found=f"{count} columns" if count is not None else None)
    if "out of sync" in text:  # a quote never closed: the cells after it run on to the end of the file
        line, count = _first_ragged_line(path, fields)
        return InputError("a quoted cell is never closed, or a row has the wrong number of fields", file=path,
                          line=line, expected=f"{fields} columns, each quote closed in its cell",
                          found=f"{count} columns from here" if count is not None else None)
    if "straddl" in text:  # a line longer than the block Arrow parses at a time
        line, length = _straddling_line(path, start=start)
        return InputError(f"a line longer than the {BLOCK_BYTES}-byte block the CSV is parsed in (a cell of megabytes)",
                          file=path, line=line, expected=f"lines shorter than {BLOCK_BYTES} bytes",
                          found=f"a line of {length} bytes" if length is not None else None)
    m = _ARROW_ROW.search(text)  # Arrow counts the rows it read, the header too where it began at the file's start
    line = int(m.group(1)) + (_count_lines(path, start) if start else 0) if m else None
    return InputError(f"cannot parse CSV: {text.splitlines()[0]}", file=path, line=line)


def _straddling_line(path: Path, block: int | None = None, start: int = 0) -> tuple[int | None, int | None]:
    """(1-based line, its length) of the line Arrow's chunker cannot split (error path only).

    Arrow reads the file in blocks of ``block`` bytes and fails on the first block that holds no line
    break while a line is still open from the block before: that line spans it. Found the same way
    here, one block at a time, counting line breaks with bytes.count (a line of gigabytes is never
    held whole, a file of millions of lines is not walked line by line).
    """
    block = block or BLOCK_BYTES
    breaks, line_start, after_cr, offset = _count_lines(path, start) if start else 0, start, False, start
    with open(path, "rb") as fh:
        fh.seek(start)  # where the failed read began: its blocks are counted from there
        while chunk := fh.read(block):
            if offset > start and line_start < offset and b"\n" not in chunk and b"\r" not in chunk:
                return breaks + 1, _line_end(fh, offset + len(chunk)) - line_start
            breaks += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            if after_cr and chunk.startswith(b"\n"):
                breaks -= 1  # the LF of a CRLF the block boundary split: one break, counted at the CR
            last = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
            if last >= 0:
                line_start = offset + last + 1
            after_cr = chunk.endswith(b"\r")
            offset += len(chunk)
    return None, None


def _line_end(fh: BinaryIO, offset: int) -> int:
    """The offset of the first line break at or after ``offset`` (where ``fh`` is), else the end of file."""
    while chunk := fh.read(BLOCK_BYTES):
        ends = [i for i in (chunk.find(b"\n"), chunk.find(b"\r")) if i >= 0]
        if ends:
            return offset + min(ends)
        offset += len(chunk)
    return offset


def _first_ragged_line(path: Path, fields: int) -> tuple[int | None, int | None]:
    """The line where the first row whose field count differs from the header's starts, and that
    count (error path only). A quote never closed makes the rest of the file one row: its line."""
    for start, row in _csv_rows(path):
        if row is None:
            return start, None
        if len(row) != fields and start > 1:
            return start, len(row)
    return None, None


def _csv_rows(path: Path) -> Iterator[tuple[int, list[str] | None]]:
    """(1-based line where it starts, fields) of each row of the file read by the csv module (error
    paths only), the header first; a row the csv module cannot read ends it with its fields None.

    The csv module refuses a field over 128 KiB by default, a process-wide limit; Arrow reads longer
    cells (a long operator name, the rest of a file after a quote never closed), so it is lifted
    while this runs.
    """
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, 2**31 - 1))  # a C long on every platform
    try:
        with open(path, encoding="utf-8-sig", errors="replace", newline="") as fh:
            reader = csv.reader(fh)
            start = 1
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    return
                except csv.Error:
                    yield start, None
                    return
                yield start, row
                start = reader.line_num + 1
    finally:
        csv.field_size_limit(limit)


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


def rows_as_dicts(table: CsvTable) -> list[dict[str, str | None]]:
    """The rows as the JSON objects the schemas describe (used by tests and `memgate validate`)."""
    rows: list[dict[str, str | None]] = table.table.to_pylist()
    return rows

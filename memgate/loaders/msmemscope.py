"""msMemScope dumps: ``memscope_dump_{ts}.csv`` / ``.db`` (and ``leaks_dump_{ts}.csv`` of msleaks).

docs/formats-reference.md §6. Header ``ID,Event,Event Type,Name,Timestamp(ns),Process Id,Thread Id,Device Id,Ptr,Attr``
plus ``Call Stack(Python)`` / ``Call Stack(C)`` when stacks were collected (msleaks wrote
``Timestamp(us)``); the db holds the same columns in table ``memscope_dump``, or in table ``leaks_dump``
(msleaks' db writer of 2025-06 on), or in ``leaks_dump`` under camelCase names (``id, event, eventType, name,
timestamp, processId, threadId, deviceId, ptr, attr``: the msleaks dumps MindStudio Insight reads, its test data
of 2025-05) whose ``timestamp`` names no unit and is read by the magnitude rule below.

How the events become the model:

- **Blocks.** MALLOC/FREE rows of every pool (Event Type PTA, PTA_WORKSPACE, HAL, ATB, MINDSPORE,
  HOST, HOST_PINNED → the block's component; MINDSPORE is named ``MindSpore`` like the MindSpore
  profiler's series). A FREE is matched to the latest earlier MALLOC with the same (process, pool,
  ptr), in (timestamp, ID) order — rows are grouped per allocation in the file, not sorted. The
  device is not part of the key: a ptr is a virtual address of its process, and old files write
  ``Device Id`` N/A on HAL FREE rows; the block takes the MALLOC's device. A FREE without a MALLOC
  is a block allocated before the window (its size from its own ``size``; dropped and counted when
  it has none, as HAL frees of some versions); a MALLOC without a FREE is still live at the end.
  A record that lost an event is noted and kept physical: a MALLOC of a live ptr ends the earlier
  block there, a FREE of a freed ptr is dropped.
  The op of a pool block (not HAL / host: those are the segments under the pools) is the innermost
  ``OP_LAUNCH`` span (ATEN_START/END, ATB_START/END) open on the same thread at the MALLOC, by its
  raw name (``torch._ops.aten.mm.default``); its owner is Attr's ``owner`` (``PTA@…@…``).
- **Series.** ``used`` / ``total`` of a pool's MALLOC/FREE rows (the pool's allocated / reserved
  after the event) → one series per pool. Old writers put a ``total`` below ``used`` (it was not the
  pool's reserved size then): such a series keeps allocated and drops reserved, and says so.
- **Steps.** ``SYSTEM`` / ``STEP`` rows (``msmemscope.step()``, Name = step number) start a step;
  it ends at the next STEP of the same process and device, else at STOP_TRACE, else at the
  process's last event. Steps of several processes are merged by number (earliest start, latest end).
- **Devices.** ``npu:<Device Id>``; host pools and ``Device Id`` ``host`` (old files) or ``cpu`` (what
  msMemScope's ``DevID2String`` writes for host and host-pinned events) → ``cpu``. IDs are unique
  only per process and one file can hold several processes (old fixtures): with more than one
  process the label is ``npu:0/pid<pid>``, one device model per (process, device), since two
  processes' allocators are separate (globs like ``npu:0*`` still select them).
- **Time.** ``Timestamp(ns)`` is ns since the epoch (19 digits). Old fixtures wrote 16-digit µs
  values under that header: when every epoch-looking value has 16 digits (1e15 ≤ t < 1e16) the
  column is read as µs and ``metadata["timestamp_note"]`` says so; a file mixing 16- and 19-digit
  values is rejected. ``Timestamp(us)`` (msleaks) is µs.
- **Attr** is ``{k:v,...}`` with unquoted keys (the db stores it as JSON with quoted keys and string
  values); it is parsed with vectorized regular expressions, never ``json.loads`` per row.

Detection: a ``.csv`` whose first line is an msMemScope header (the tool's default names are
``memscope_dump_*.csv`` / ``leaks_dump_*.csv``, but copies get renamed), or a
``memscope_dump_*.db`` / ``leaks_dump_*.db`` with the sqlite header.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from memgate.errors import InputError, read_errors_named, show
from memgate.loaders import registry
from memgate.loaders.events import Pairs, pair_events, repair_notes, take
from memgate.model import (
    SERIES_COLUMNS,
    STEP_COLUMNS,
    DeviceModel,
    Profile,
    Series,
    empty_steps,
    int_table,
    typed_blocks,
)
from memgate.readers import convert
from memgate.readers.csvcheck import describe
from memgate.readers.csvtable import read_csv
from memgate.readers.limits import check_rows
from memgate.readers.numtext import offsets_and_text
from memgate.readers.sqlitetable import Database, open_db, quote_ident, sqlite_or_unreadable, validate_table
from memgate.schemas import load_schema, re2_pattern
from memgate.table import Table

FORMAT = "msmemscope"
TABLE = "memscope_dump"
LEAKS_TABLE = "leaks_dump"
# The reader's names (the CSV header's) → the camelCase leaks_dump's columns.
CAMEL_COLUMNS = {"ID": "id", "Event": "event", "Event Type": "eventType", "Name": "name", "Timestamp(ns)": "timestamp",
                 "Process Id": "processId", "Thread Id": "threadId", "Device Id": "deviceId", "Ptr": "ptr",
                 "Attr": "attr"}
DB_NAME = re.compile(r"(?:^|_)(?:memscope|leaks)_dump_[0-9]+.*\.db$")
HEADER_PREFIX = "ID,Event,Event Type,Name,Timestamp("
COLUMNS = ("ID", "Event", "Event Type", "Name", "Timestamp", "Process Id", "Thread Id", "Device Id", "Ptr", "Attr")
POOL_COMPONENTS = {"PTA": "PTA", "PTA_WORKSPACE": "PTA_WORKSPACE", "ATB": "ATB", "MINDSPORE": "MindSpore",
                   "HAL": "HAL", "HOST": "HOST", "HOST_PINNED": "HOST_PINNED"}
HOST_POOLS = ("HOST", "HOST_PINNED")
# Device Id of host events: "host" (old files) and "cpu" (msMemScope's DevID2String for DEVICE_ID_CPU:
# host and host-pinned memory, Event Type HOST / HOST_PINNED, and pinned HAL blocks).
HOST_DEVICES = ("host", "cpu")
SPAN_START = ("ATEN_START", "ATB_START")
SPAN_END = ("ATEN_END", "ATB_END")
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
US_LOW, US_HIGH, NS_LOW = 10**15, 10**16, 10**17  # 16-digit µs epoch vs 19-digit ns epoch
I64_MAX = (1 << 63) - 1
CSV_NAME = re.compile(r"(?:^|_)(?:memscope|leaks)_dump_[0-9]+.*\.csv$")  # the tool's default names



# --- detection -----------------------------------------------------------------------------------

def claims(path: Path) -> bool:
    if not path.is_file():
        return False
    name = path.name.lower()
    if name.endswith(".csv"):
        try:
            with open(path, "rb") as fh:
                first = fh.read(256)
        except PermissionError:
            return bool(CSV_NAME.search(name))  # the tool's name: load() says it is unreadable
        except OSError:
            return False
        return first.decode("utf-8-sig", errors="replace").startswith(HEADER_PREFIX)
    return bool(DB_NAME.search(name)) and sqlite_or_unreadable(path)


# --- reading -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rows:
    """The dump's columns as text (null when empty), plus how to name a row in an error."""

    path: Path
    table: pa.Table  # COLUMNS, all string
    time_unit: str  # the header's unit: "ns" or "us"
    rowids: np.ndarray | None  # db rowids; None for a CSV (row i is line i + 2)
    db_table: str = TABLE
    db_columns: dict[str, str] | None = None  # the reader's column names → the db table's, when they differ

    def col(self, name: str) -> pa.ChunkedArray:
        return self.table.column(name)

    def where(self, row: int) -> str:
        """Where a row is: ``line N`` of the CSV, ``rowid N`` of the db table."""
        return f"line {row + 2}" if self.rowids is None else f"rowid {int(self.rowids[row])}"

    def error(self, row: int, message: str, column: str, *, expected: str | None = None,
              found: str | None = None) -> InputError:
        if self.rowids is None:
            return InputError(message, file=self.path, line=row + 2, column=column, expected=expected, found=found)
        column = (self.db_columns or {}).get(column, column)
        return InputError(f"table {self.db_table} rowid {int(self.rowids[row])}: {message}", file=self.path,
                          column=f"{self.db_table}.{column}", expected=expected, found=found)

    @property
    def timestamp_header(self) -> str:
        """The timestamp column's name in the file, for messages."""
        header = f"Timestamp({self.time_unit})"
        return (self.db_columns or {}).get(header, header)


def read_csv_rows(path: Path) -> Rows:
    table = read_csv(path, load_schema("msmemscope.dump"))
    unit = "us" if table.has("Timestamp(us)") else "ns"
    columns = [table.column(f"Timestamp({unit})" if c == "Timestamp" else c) for c in COLUMNS]
    return Rows(path, pa.table(columns, names=list(COLUMNS)), unit, None)


def _db_form(db: Database) -> tuple[dict[str, Any], dict[str, str] | None]:
    """The schema of the dump table this db holds, and its column names when they are not the CSV's.

    ``memscope_dump`` wins; without it, ``leaks_dump`` under the CSV's names (the ``Timestamp(ns)`` column
    tells) or under camelCase names. A db with neither is reported as missing ``memscope_dump``.
    """
    if TABLE in db.tables or TABLE in db.others or (LEAKS_TABLE not in db.tables and LEAKS_TABLE not in db.others):
        return load_schema("msmemscope.memscope_dump"), None
    if LEAKS_TABLE in db.others:  # a view (or trigger) named leaks_dump: said as such, never run nor asked its columns
        return load_schema("msmemscope.leaks_dump"), CAMEL_COLUMNS
    if "Timestamp(ns)" in db.columns(LEAKS_TABLE):
        schema = dict(load_schema("msmemscope.memscope_dump"))
        schema.update({"x-memgate-table": LEAKS_TABLE, "title": "msleaks leaks_dump_{ts}.db: table leaks_dump"})
        return schema, None
    return load_schema("msmemscope.leaks_dump"), CAMEL_COLUMNS


def read_db_rows(path: Path) -> Rows:
    with open_db(path) as db:
        schema, renamed = _db_form(db)
        table = str(schema["x-memgate-table"])
        validate_table(db, schema)
        names = ["ID", "Event", "Event Type", "Name", "Timestamp(ns)", "Process Id", "Thread Id", "Device Id", "Ptr",
                 "Attr"]
        select = ", ".join(f"CAST({quote_ident((renamed or {}).get(n, n))} AS TEXT)" for n in names)
        rows = db.query(f"SELECT rowid, {select} FROM {quote_ident(table)} ORDER BY rowid", table=table)
    if not rows:
        raise InputError(f"table {table} has no rows", file=path, column=table)
    check_rows(path, len(rows), column=table)
    grid = np.array(rows, dtype=object).reshape(len(rows), len(names) + 1)  # cheaper than zip(*rows)
    rowids = grid[:, 0].astype(np.int64)
    arrays = []
    for i in range(1, len(names) + 1):
        arr = pa.array(grid[:, i], type=pa.string(), from_pandas=False)
        arrays.append(pc.if_else(pc.equal(arr, ""), pa.scalar(None, pa.string()), arr))
    # "ns" also for camelCase ``timestamp``, which names no unit: timestamps_ns decides µs vs ns by
    # magnitude (msleaks recorded µs until 2025-05-29, ns after).
    result = Rows(path, pa.table(arrays, names=list(COLUMNS)), "ns", rowids, table, renamed)
    _check_patterns(result)
    return result


def _check_patterns(rows: Rows) -> None:
    """The CSV row schema's cell patterns, applied to the db's values as text."""
    props = load_schema("msmemscope.dump")["properties"]
    first: tuple[int, str] | None = None
    for name in COLUMNS:
        prop = props["Timestamp(ns)" if name == "Timestamp" else name]
        col = rows.col(name)
        bad = pc.is_null(col)
        if "null" in prop["type"]:
            bad = pc.and_(bad, pa.scalar(False))
        if "pattern" in prop:
            ok = pc.fill_null(pc.match_substring_regex(col, re2_pattern(prop["pattern"])), True)
            bad = pc.or_(bad, pc.invert(ok))
        if pc.any(bad).as_py():
            row = int(pc.index(bad, True).as_py())
            if first is None or row < first[0]:
                first = (row, name)
    if first is not None:
        row, name = first
        prop = props["Timestamp(ns)" if name == "Timestamp" else name]
        value = rows.col(name)[row].as_py()
        raise rows.error(row, "malformed value", "Timestamp(ns)" if name == "Timestamp" else name,
                         expected=describe(prop), found=repr(value) if value is not None else "an empty cell")


@read_errors_named
def _rows(path: Path) -> Rows:
    return read_db_rows(path) if path.suffix.lower() == ".db" else read_csv_rows(path)


def load(path: Path) -> Profile:
    return build_profile(_rows(path))


# --- normalization -------------------------------------------------------------------------------

def _np_bool(mask: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), dtype=bool)


def _int64(rows: Rows, name: str, header: str) -> pa.ChunkedArray:
    """Decimal text (already pattern-checked) → int64; a value past int64 is an error naming its cell."""
    try:
        return convert.to_int(convert.na_to_null(rows.col(name)))
    except convert.OutOfRange as exc:  # the pattern allows any number of digits
        raise rows.error(exc.row, "value out of range", header, expected=exc.expected, found=exc.found) from None


def _int_or(rows: Rows, name: str, missing: int) -> np.ndarray:
    """An integer column as int64, ``missing`` where null / N/A."""
    values = pc.fill_null(_int64(rows, name, name), missing)
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.int64)


def _strings(values: pa.ChunkedArray | pa.Array) -> pd.Series:
    return pd.Series(values.to_pandas(), dtype="string").reset_index(drop=True)


def timestamps_ns(rows: Rows) -> tuple[np.ndarray, str | None]:
    """Timestamps as int64 ns and a note when the unit was decided by magnitude."""
    col = rows.col("Timestamp")
    header = rows.timestamp_header
    raw = np.asarray(_int64(rows, "Timestamp", f"Timestamp({rows.time_unit})").to_numpy(zero_copy_only=False),
                     dtype=np.int64)
    us_column = rows.time_unit == "us"
    past = raw > I64_MAX // 1000
    if (us_column or (raw < US_HIGH).all()) and past.any():  # µs that do not fit int64 ns
        row = int(np.flatnonzero(past)[0])
        raise rows.error(row, "timestamp out of range", f"Timestamp({rows.time_unit})",
                         expected="µs that fit int64 ns", found=repr(col[row].as_py()))
    if us_column:
        return raw * 1000, None
    us_like = (raw >= US_LOW) & (raw < US_HIGH)
    ns_like = raw >= NS_LOW
    if us_like.any() and ns_like.any():
        row = int(max(np.flatnonzero(us_like)[0], np.flatnonzero(ns_like)[0]))  # where the second kind starts
        raise rows.error(row, f"{header} mixes 16-digit (µs-looking) and 19-digit (ns) epoch values",
                         "Timestamp(ns)", expected="one unit for the whole file", found=repr(col[row].as_py()))
    if us_like.any():
        return raw * 1000, (f"{header} holds 16-digit values (µs since the epoch, as msleaks until 2025-05 and "
                            "old msMemScope fixtures wrote them): read as µs")
    return raw, None


_HEX_LUT = np.full(256, 255, dtype=np.uint8)
_HEX_LUT[np.frombuffer(b"0123456789", dtype=np.uint8)] = np.arange(10, dtype=np.uint8)
_HEX_LUT[np.frombuffer(b"abcdef", dtype=np.uint8)] = np.arange(10, 16, dtype=np.uint8)


def parse_ptr(text: pa.Array | pa.ChunkedArray | pd.Series) -> np.ndarray:
    """``0x…`` hex or decimal addresses (no nulls) → uint64, vectorized (no per-row int(x, 16))."""
    arr = pa.array(text, type=pa.string()) if isinstance(text, pd.Series) else text
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    lower = pc.utf8_lower(arr)
    is_hex = _np_bool(pc.starts_with(lower, "0x"))
    out = np.zeros(len(arr), dtype=np.uint64)
    if (~is_hex).any():
        out[~is_hex] = pc.cast(pc.filter(lower, pa.array(~is_hex)), pa.uint64()).to_numpy(zero_copy_only=False)
    if is_hex.any():
        digits = pc.utf8_ltrim(pc.utf8_slice_codeunits(pc.filter(lower, pa.array(is_hex)), 2), "0")
        if pc.max(pc.utf8_length(digits)).as_py() > 16:
            raise ValueError("address wider than 64 bits")
        padded = pc.utf8_lpad(digits, 16, "0")
        data = offsets_and_text(padded)[1].reshape(-1, 16)
        nibbles = _HEX_LUT[data]
        if (nibbles == 255).any():
            raise ValueError("not a hex address")
        shifts = (4 * np.arange(15, -1, -1)).astype(np.uint64)
        out[is_hex] = np.bitwise_or.reduce(nibbles.astype(np.uint64) << shifts, axis=1)
    return out


@dataclass(frozen=True)
class Attr:
    """The memory keys of Attr, one entry per memory row (NA where a row lacks the key)."""

    allocation_id: pd.Series  # Int64
    addr: pd.Series  # string
    size: pd.Series  # Int64
    used: pd.Series  # Int64
    total: pd.Series  # Int64
    owner: pd.Series  # string


def parse_attr(rows: Rows, mem_idx: np.ndarray, is_malloc: np.ndarray) -> Attr:
    """Parse ``{k:v,...}`` (keys unquoted; the db's JSON form too) of the memory rows ``mem_idx``.

    Split on ``,`` then on the first ``:`` with Arrow list kernels — linear, no regex scan per key.
    """
    m = len(mem_idx)
    attr = pc.replace_substring(rows.col("Attr").take(pa.array(mem_idx, type=pa.int64())), '"', "")
    attr = pc.utf8_trim_whitespace(attr).combine_chunks() if m else pa.array([], pa.string())

    def fail(i: int, message: str, expected: str) -> InputError:
        row = int(mem_idx[i])
        value = rows.col("Attr")[row].as_py()
        return rows.error(row, message, "Attr", expected=expected,
                          found=show(value) if value is not None else "an empty cell")

    if m and pc.any(pc.is_null(attr)).as_py():
        raise fail(int(pc.index(pc.is_null(attr), True).as_py()), "MALLOC/FREE row without Attr",
                   "{allocation_id:…,addr:…,size:…}")
    braced = pc.and_(pc.starts_with(attr, "{"), pc.ends_with(attr, "}"))
    if m and not pc.all(braced).as_py():
        raise fail(int(pc.index(braced, False).as_py()), "malformed Attr", "{key:value,...} with unquoted keys")
    parts = pc.split_pattern(pc.utf8_slice_codeunits(attr, 1, -1), ",")
    flat = pc.utf8_trim_whitespace(pc.list_flatten(parts))
    parent = np.asarray(pc.list_parent_indices(parts).to_numpy(zero_copy_only=False), dtype=np.int64)
    flat, parent = _json_attrs(rows.col("Attr").take(pa.array(mem_idx, type=pa.int64())), flat, parent, fail)
    nonempty = pc.not_equal(flat, "")
    kv = pc.split_pattern(pc.binary_join_element_wise(flat, ":", ""), ":", max_splits=1)  # always 2 items
    key = pc.utf8_trim_whitespace(pc.list_element(kv, 0))
    value = pc.utf8_trim_whitespace(pc.utf8_slice_codeunits(pc.list_element(kv, 1), 0, -1))
    encoded = pc.dictionary_encode(key)
    names = encoded.dictionary.to_pylist()  # the distinct keys: a handful, checked once each
    codes = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    bad_names = [i for i, k in enumerate(names) if k is None or not _KEY.match(k)]
    no_colon = _np_bool(pc.less(pc.find_substring(flat, ":"), 0))
    bad = _np_bool(nonempty) & (no_colon | np.isin(codes, bad_names))
    if bad.any():
        raise fail(int(parent[np.flatnonzero(bad)[0]]), "malformed Attr", "{key:value,...} with unquoted keys")

    def text(name: str) -> pd.Series:
        hit = np.flatnonzero(codes == names.index(name)) if name in names else np.array([], dtype=np.int64)
        out = pd.Series(pd.NA, index=range(m), dtype="string")
        if len(hit):
            repeated = pd.Index(parent[hit]).duplicated(keep=False)
            if repeated.any():  # a key twice in one Attr: the same value, or no telling which is meant
                seen = pd.DataFrame({"row": parent[hit[repeated]],
                                     "value": _strings(value.take(pa.array(hit[repeated]))).to_numpy()})
                differ = seen.groupby("row", sort=True)["value"].nunique()
                if (differ > 1).any():
                    raise fail(int(differ.index[(differ > 1).to_numpy()][0]), f"Attr repeats {name} with another value",
                               "each key once in Attr (or repeated with the same value)")
            keep = hit[~pd.Index(parent[hit]).duplicated(keep="last")]
            out.iloc[parent[keep]] = _strings(value.take(pa.array(keep))).to_numpy()
        return out.mask(out == "")

    def integer(name: str, required: np.ndarray) -> pd.Series:
        raw = text(name)
        need = required & raw.isna().to_numpy()
        if need.any():
            raise fail(int(np.flatnonzero(need)[0]), f"Attr has no {name}", f"{name}:<integer>")
        arrow = pa.array(raw, type=pa.string())
        well = pc.fill_null(pc.match_substring_regex(arrow, r"^-?[0-9]+$"), True)
        if not pc.all(well).as_py():
            raise fail(int(pc.index(well, False).as_py()), f"malformed {name} in Attr", f"{name}:<integer>")
        try:
            values = convert.to_int(arrow)
        except convert.OutOfRange as exc:
            raise fail(exc.row, f"{name} in Attr out of range", exc.expected or f"{name}:<int64>") from None
        return pd.Series(values.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get), dtype="Int64")

    none = np.zeros(m, dtype=bool)
    return Attr(
        allocation_id=integer("allocation_id", none),
        addr=text("addr"),
        size=integer("size", is_malloc),
        used=integer("used", none),
        total=integer("total", none),
        owner=text("owner"),
    )


# An Attr in the db's JSON form whose quoted strings hold no comma (nor an escape): split on commas like
# the CSV form. Any other JSON Attr (an owner "PTA@a,b@c") is read by json.loads, the form it is.
_PLAIN_JSON = r'^[^"\\]*(?:"[^",\\]*"[^"\\]*)*$'


def _json_attrs(raw: pa.Array, flat: pa.Array, parent: np.ndarray,
                fail: Callable[[int, str, str], InputError]) -> tuple[pa.Array, np.ndarray]:
    """``flat`` (``key:value`` texts) and ``parent`` (their rows) with the JSON-form Attrs that a split on
    commas cuts apart read as JSON instead: a comma inside a quoted value is part of the value."""
    trimmed = pc.utf8_ltrim_whitespace(raw)
    json_form = pc.and_(pc.starts_with(trimmed, '{"'), pc.invert(pc.match_substring_regex(trimmed, _PLAIN_JSON)))
    rows = np.flatnonzero(_np_bool(pc.fill_null(json_form, False)))
    if not len(rows):
        return flat, parent
    texts: list[str] = []
    owners: list[int] = []
    for i in rows.tolist():
        pairs = _json_pairs(str(raw[i].as_py()))
        if pairs is None:
            raise fail(i, "malformed Attr", '{"key":"value",...} (the JSON form) or {key:value,...}')
        texts += [f"{key}:{value}" for key, value in pairs]
        owners += [i] * len(pairs)
    keep = ~np.isin(parent, rows)
    joined = np.concatenate([parent[keep], np.asarray(owners, dtype=np.int64)])
    order = np.argsort(joined, kind="stable")  # each row's keys in its own order (the last of a repeated key wins)
    texts_array = pa.concat_arrays([flat.filter(pa.array(keep)), pa.array(texts, type=pa.string())])
    return pc.utf8_trim_whitespace(texts_array.take(pa.array(order))), joined[order]


def _json_pairs(text: str) -> list[tuple[str, str]] | None:
    """The (key, value) pairs of a JSON-form Attr, values as text; None for what is not an object of
    scalar values."""
    try:
        pairs = json.loads(text, object_pairs_hook=lambda items: items, parse_int=str, parse_float=str,
                           parse_constant=str)
    except (ValueError, RecursionError):
        return None
    if not isinstance(pairs, list) or not all(type(p) is tuple and not isinstance(p[1], list) for p in pairs):
        return None  # a nested object or array
    return [(str(k), v if isinstance(v, str) else json.dumps(v)) for k, v in pairs]  # true / false / null as written


def enclosing_ops(group: np.ndarray, t: np.ndarray, seq: np.ndarray, delta: np.ndarray, names: pd.Series,
                  target: np.ndarray) -> pd.Series:
    """For each ``target`` row, the name of the innermost span (delta +1 start / -1 end) open on its group.

    Depth is a cumulative sum per group (an END without its START lowers the floor instead of going
    negative); the innermost open span at depth d is the latest START that reached depth d — one
    forward-fill per depth level, not a loop over rows.
    """
    n = len(group)
    result = pd.Series(pd.NA, index=range(n), dtype="string")
    if not target.any() or not (delta > 0).any():
        return result
    relevant = np.flatnonzero((delta != 0) | target)
    order = relevant[np.lexsort((seq[relevant], t[relevant], group[relevant]))]
    g = pd.Series(group[order])
    depth = pd.Series(delta[order]).groupby(g, sort=False).cumsum()
    floor = depth.clip(upper=0).groupby(g, sort=False).cummin()
    level = (depth - floor).to_numpy()
    is_start = delta[order] > 0
    is_target = target[order]
    sorted_names = names.iloc[order].reset_index(drop=True)
    out = pd.Series(pd.NA, index=range(len(order)), dtype="string")
    for lv in np.unique(level[is_start]):
        at_level = sorted_names.where(pd.Series(is_start & (level == lv)))
        filled = at_level.groupby(g, sort=False).ffill()
        pick = is_target & (level == lv)
        out[pick] = filled[pick]
    result.iloc[order] = out.to_numpy()
    return result


def _first_bad_ptr(text: pd.Series) -> int:
    """Position of the first address :func:`parse_ptr` rejects (the error path only)."""
    lower = text.str.lower()
    is_hex = lower.str.startswith("0x")
    digits = lower.str.slice(2).str.lstrip("0")
    bad_hex = is_hex & ((digits.str.len() > 16) | ~digits.str.fullmatch(r"[0-9a-f]*"))
    dec = lower.str.lstrip("0")
    too_big = (dec.str.len() > 20) | ((dec.str.len() == 20) & (dec > str((1 << 64) - 1)))
    bad_dec = ~is_hex & (~dec.str.fullmatch(r"[0-9]*") | too_big)
    bad = (bad_hex | bad_dec).fillna(True).to_numpy(dtype=bool)
    return int(np.flatnonzero(bad)[0]) if bad.any() else 0


def build_profile(rows: Rows) -> Profile:
    event = pc.utf8_upper(rows.col("Event"))
    sub = pc.utf8_upper(rows.col("Event Type"))
    t_ns, time_note = timestamps_ns(rows)
    seq = _int_or(rows, "ID", -1)
    pid = _int_or(rows, "Process Id", -1)
    is_malloc = _np_bool(pc.equal(event, "MALLOC"))
    mem = _memory_rows(rows, event, sub, t_ns, seq, pid, is_malloc)
    notes: list[str] = [time_note] if time_note else []
    processes = sorted(int(p) for p in np.unique(mem.pid))
    pairs = pair_events((mem.pid, pd.factorize(mem.component)[0], mem.ptr), mem.t, mem.seq, mem.is_alloc)
    notes += repair_notes(pairs, "MALLOC", "FREE")
    label = _device_labels(rows, mem, pairs, processes, notes)
    # HAL / host blocks are the driver's segments under the pools: naming them after the op that
    # triggered them would count the op's memory twice, so only pool blocks get an op.
    framework = is_malloc.copy()
    framework[mem.index] &= ~mem.pool.isin(["HAL", *HOST_POOLS]).fillna(True).to_numpy(dtype=bool)
    ops = enclosing_ops(*_span_inputs(rows, event, sub, pid, t_ns, seq, framework))
    blocks, block_label = _blocks(mem, pairs, label, ops, notes)
    device_series = _pool_series(rows.path, mem, label, notes)
    steps = read_steps(rows, event, sub, pid, t_ns, seq)
    models = []
    labels = block_label.to_numpy(dtype=object)
    for device in sorted(set(labels.tolist()) | set(device_series)):
        device_blocks = blocks[labels == device].reset_index(drop=True)
        models.append(DeviceModel(
            device=str(device),
            series=device_series.get(str(device), {}),
            blocks=typed_blocks(device_blocks),
            blocks_source=str(rows.path) if len(device_blocks) else None,
        ))
    metadata: dict[str, Any] = {
        "timestamp_unit": "us" if (rows.time_unit == "us" or time_note) else "ns",
        "processes": processes,
        "unmatched_frees": int((pairs.alloc_rows < 0).sum()),
    }
    if notes:
        metadata["notes"] = notes
    return Profile(
        path=str(rows.path),
        format=FORMAT,
        rank=_rank(rows.path),
        devices=tuple(models),
        steps=steps,
        steps_source=str(rows.path) if len(steps) else None,
        metadata=metadata,
    )


@dataclass(frozen=True)
class _MemoryRows:
    """The dump's MALLOC/FREE rows, checked: one entry per such row, in file order."""

    index: np.ndarray  # the row in the dump
    is_alloc: np.ndarray  # a MALLOC (else a FREE)
    attr: Attr
    pool: pd.Series  # Event Type, upper case
    component: pd.Series  # the pool's component name (POOL_COMPONENTS)
    ptr: np.ndarray  # uint64 address
    pid: np.ndarray
    t: np.ndarray  # ns
    seq: np.ndarray  # ID


def _memory_rows(rows: Rows, event: pa.ChunkedArray, sub: pa.ChunkedArray, t_ns: np.ndarray, seq: np.ndarray,
                 pid: np.ndarray, is_malloc: np.ndarray) -> _MemoryRows:
    """The MALLOC/FREE rows; an error names the first without a process id, size or address."""
    memory = is_malloc | _np_bool(pc.equal(event, "FREE"))
    if (memory & (pid < 0)).any():
        row = int(np.flatnonzero(memory & (pid < 0))[0])
        raise rows.error(row, "MALLOC/FREE row without a process id", "Process Id", expected="an integer", found="N/A")
    mem_idx = np.flatnonzero(memory)
    if not len(mem_idx):
        raise InputError("no MALLOC/FREE events in this dump", file=rows.path,
                         expected="a dump recorded with memory events (MALLOC/FREE rows)")
    take_mem = pa.array(mem_idx, type=pa.int64())
    m_alloc = is_malloc[mem_idx]
    attr = parse_attr(rows, mem_idx, m_alloc)
    negative = m_alloc & (attr.size < 0).fillna(False).to_numpy(dtype=bool)
    if negative.any():  # old writers put negative sizes on FREE rows only; a MALLOC of -n bytes is corrupt
        row = int(mem_idx[np.flatnonzero(negative)[0]])
        raise rows.error(row, "MALLOC with a negative size", "Attr", expected="size:<bytes >= 0>",
                         found=repr(rows.col("Attr")[row].as_py()))
    m_pool = _strings(sub.take(take_mem))
    m_comp = m_pool.map(POOL_COMPONENTS).fillna(m_pool).astype("string")
    ptr_text = _strings(convert.na_to_null(rows.col("Ptr")).take(take_mem)).fillna(attr.addr)
    if ptr_text.isna().any():
        row = int(mem_idx[np.flatnonzero(ptr_text.isna().to_numpy())[0]])
        raise rows.error(row, "MALLOC/FREE row without an address", "Ptr", expected="0x-hex or decimal", found="N/A")
    try:
        ptr = parse_ptr(pa.array(ptr_text, type=pa.string()))
    except (ValueError, pa.ArrowInvalid):
        k = _first_bad_ptr(ptr_text)
        raise rows.error(int(mem_idx[k]), "address out of range or not hex/decimal", "Ptr",
                         expected="a 64-bit address", found=repr(ptr_text.iloc[k])) from None
    return _MemoryRows(mem_idx, m_alloc, attr, m_pool, m_comp, ptr, pid[mem_idx], t_ns[mem_idx], seq[mem_idx])


def _device_labels(rows: Rows, mem: _MemoryRows, pairs: Pairs, processes: list[int], notes: list[str]) -> pd.Series:
    """The device of each memory row: its own, else (FREE rows with N/A) its MALLOC's, else the
    process's only one (NA where none: noted); ``/pid<pid>`` added when the dump holds several processes."""
    m_dev = _strings(convert.na_to_null(rows.col("Device Id")).take(pa.array(mem.index, type=pa.int64())))
    a, f = pairs.alloc_rows, pairs.free_rows
    both = (a >= 0) & (f >= 0)
    both[both] = ~mem.is_alloc[f[both]]  # a FREE row; a reused block ends at the next MALLOC, which has its own
    from_malloc = pd.Series(pd.NA, index=range(len(m_dev)), dtype="string")
    from_malloc.iloc[f[both]] = m_dev.iloc[a[both]].to_numpy()
    m_dev = m_dev.fillna(from_malloc)
    if m_dev.isna().any():
        per_pid = pd.DataFrame({"pid": mem.pid, "dev": m_dev}).dropna().drop_duplicates()
        counts = per_pid.groupby("pid")["dev"].transform("size")
        only = per_pid[counts == 1].set_index("pid")["dev"]
        m_dev = m_dev.fillna(pd.Series(mem.pid).map(only).astype("string"))
    unplaced = int(m_dev.isna().sum())
    if unplaced:
        notes.append(f"{unplaced} FREE row(s) with Device Id N/A and no MALLOC to take a device from: dropped")
    host = (mem.component.isin(list(HOST_POOLS)) | m_dev.isin(list(HOST_DEVICES))).fillna(False)
    label = ("npu:" + m_dev).where(~host, "cpu")
    if len(processes) > 1:
        label = label + "/pid" + pd.Series(mem.pid).astype("string")
    return label


def _blocks(mem: _MemoryRows, pairs: Pairs, label: pd.Series, ops: pd.Series,
            notes: list[str]) -> tuple[pd.DataFrame, pd.Series]:
    """The blocks in (start, ID) order, and each one's device label; a FREE without a MALLOC and
    without a size, and a block on no device, are dropped (noted)."""
    a, f = pairs.alloc_rows, pairs.free_rows
    attr = mem.attr
    m_t = pd.Series(pd.array(mem.t, dtype="Int64"))
    first = np.where(a >= 0, a, f)
    blocks = pd.DataFrame({
        "size": take(attr.size, first).abs(),
        "t_alloc": take(m_t, a),
        "t_free": take(m_t, f),
        "op": take(ops.iloc[mem.index].reset_index(drop=True), a),
        "stream": pd.Series(pd.NA, index=range(len(first)), dtype="string"),
        "owner": take(attr.owner, a),
        "component": take(mem.component, first),
        "alloc_total": take(attr.used, a),
    })
    block_label = take(label, first)
    sizeless = (blocks["size"].isna() | (blocks["size"] == 0)).fillna(True).to_numpy(dtype=bool) & (a < 0)
    if sizeless.any():
        notes.append(f"{int(sizeless.sum())} FREE row(s) without a MALLOC and without a size: dropped")
    keep = ~sizeless & block_label.notna().to_numpy(dtype=bool)
    order = np.flatnonzero(keep)
    start = np.where(a >= 0, mem.t[np.maximum(a, 0)], mem.t[np.maximum(f, 0)])
    order = order[np.lexsort((mem.seq[first[order]], start[order]))]
    return blocks.iloc[order].reset_index(drop=True), block_label.iloc[order].reset_index(drop=True)


def _pool_series(path: Path, mem: _MemoryRows, label: pd.Series, notes: list[str]) -> dict[str, dict[str, Series]]:
    """By device and pool: the pool's used/total after each of its events (allocated / reserved)."""
    attr = mem.attr
    sampled = (attr.used.notna() & label.notna()).to_numpy(dtype=bool)
    series_rows = pd.DataFrame({
        "device": label[sampled].to_numpy(), "component": mem.component[sampled].to_numpy(), "t_ns": mem.t[sampled],
        "seq": mem.seq[sampled], "allocated": attr.used[sampled].to_numpy(), "reserved": attr.total[sampled].to_numpy(),
    })
    device_series: dict[str, dict[str, Series]] = {}
    for (device, comp), group in series_rows.groupby(["device", "component"], sort=True):
        group = group.sort_values(["t_ns", "seq"], kind="stable")
        frame = pd.DataFrame({
            "t_ns": pd.array(group["t_ns"].to_numpy(), dtype="Int64"),
            "allocated": pd.array(group["allocated"], dtype="Int64"),
            "reserved": pd.array(group["reserved"], dtype="Int64"),
            "active": pd.array([pd.NA] * len(group), dtype="Int64"),
        })
        if (frame["allocated"] > frame["reserved"]).fillna(False).any():
            notes.append(f"{device} {comp}: Attr 'total' is below 'used' (not the pool's reserved size in this "
                         "writer version): reserved left empty")
            frame["reserved"] = pd.array([pd.NA] * len(frame), dtype="Int64")
        series = Series(str(comp), int_table(frame, SERIES_COLUMNS), str(path))
        device_series.setdefault(str(device), {})[str(comp)] = series
    return device_series


def _span_inputs(rows: Rows, event: pa.ChunkedArray, sub: pa.ChunkedArray, pid: np.ndarray, t_ns: np.ndarray,
                 seq: np.ndarray, target: np.ndarray) -> tuple[Any, ...]:
    is_launch = _np_bool(pc.equal(event, "OP_LAUNCH"))
    starts = is_launch & _np_bool(pc.is_in(sub, pa.array(SPAN_START)))
    ends = is_launch & _np_bool(pc.is_in(sub, pa.array(SPAN_END)))
    delta = starts.astype(np.int64) - ends.astype(np.int64)
    tid = _int_or(rows, "Thread Id", -1)
    group = np.unique(np.stack([pid, tid], axis=1), axis=0, return_inverse=True)[1].reshape(-1)
    names = _strings(convert.na_to_null(rows.col("Name")))
    return group, t_ns, seq, delta, names, target


def read_steps(rows: Rows, event: pa.ChunkedArray, sub: pa.ChunkedArray, pid: np.ndarray, t_ns: np.ndarray,
               seq: np.ndarray) -> Table:
    system = _np_bool(pc.equal(event, "SYSTEM"))
    is_step = system & _np_bool(pc.equal(sub, "STEP"))
    if not is_step.any():
        return empty_steps()
    step_idx = np.flatnonzero(is_step)
    names = _strings(rows.col("Name").take(pa.array(step_idx)))
    number = names.str.strip().str.strip('"')
    bad = ~number.str.fullmatch(r"0*[0-9]{1,18}").fillna(False).to_numpy(dtype=bool)
    if bad.any():
        row = int(step_idx[np.flatnonzero(bad)[0]])
        raise rows.error(row, "STEP row without a step number", "Name", expected="the step number (at most 18 digits)",
                         found=repr(rows.col("Name")[row].as_py()))
    device = _strings(convert.na_to_null(rows.col("Device Id"))).fillna("N/A")
    # Int64 throughout: a float64 detour (NaN from shift) would round ns timestamps.
    frame = pd.DataFrame({"pid": pid, "device": device, "t": pd.array(t_ns, dtype="Int64"), "seq": seq})
    stops = frame[system & _np_bool(pc.equal(sub, "STOP_TRACE"))]
    stop_at = stops.groupby("pid")["t"].max()
    last_at = frame.groupby("pid")["t"].max()
    marks = frame.iloc[step_idx].assign(step=number.astype("int64").to_numpy(), row=step_idx)
    marks = marks.sort_values(["pid", "device", "t", "seq"], kind="stable")
    again = marks.duplicated(["pid", "device", "step"], keep="first")
    if again.any():  # one process marks each step once: a repeat would merge two spans into one
        second = marks[again].iloc[0]
        first = marks[(marks["pid"] == second["pid"]) & (marks["device"] == second["device"])
                      & (marks["step"] == second["step"])].iloc[0]
        raise rows.error(int(second["row"]), f"step {second['step']} appears twice in process {second['pid']}",
                         "Name", expected="each step number once per process and device",
                         found=f"STEP {second['step']} at {rows.where(int(first['row']))} and at "
                               f"{rows.where(int(second['row']))}")
    following = marks.groupby(["pid", "device"], sort=False)["t"].shift(-1)
    stop = pd.Series(marks["pid"].map(stop_at), dtype="Int64")
    stop = stop.where(stop >= marks["t"])
    last = pd.Series(marks["pid"].map(last_at), dtype="Int64")
    marks["t_end"] = following.fillna(stop).fillna(last)
    steps = marks.groupby("step", sort=True).agg(t_start=("t", "min"), t_end=("t_end", "max")).reset_index()
    return int_table(steps, STEP_COLUMNS)


def _rank(path: Path) -> str:
    """msMemScope records no rank: a ``rank_N`` directory names it (the nearest), else "0"."""
    return registry.rank_in_names(*reversed(path.parts[:-1])) or "0"


registry.register(registry.Format(FORMAT, claims, load, rank_hint=_rank,
                                  named=lambda path: path.is_file() and bool(CSV_NAME.search(path.name.lower()))))

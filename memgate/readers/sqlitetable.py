"""Open profiler sqlite databases read-only and validate their tables against JSON Schemas.

A db schema (``memgate/schemas/<writer>.<table>.schema.json``) describes one row of a table as a
JSON object whose values are the sqlite values: ``"type"`` over ``integer`` / ``number`` /
``string`` / ``null``, optional ``enum`` and ``minimum``, ``required`` = the columns the table must
have, and two annotations: ``x-memgate-table`` (the table name) and ``x-references``
(``"STRING_IDS.id"``: the value is an id that must exist in that table; a list names alternatives, of
which the first table the db has is the one referenced, see :func:`referenced`). Every check runs as one
SQL scan per table (``typeof()`` in a ``WHERE``), never a Python loop over rows; the first bad row in
rowid order is reported with its rowid, column, what was expected and what was found.

The file is opened with a ``mode=ro&immutable=1`` URI, so nothing is ever written next to it: no
journal, no ``-shm``, no lock file. A db whose changes still sit in a pending write-ahead log
(``-wal``) or a hot rollback journal (``-journal``) would be read without them that way, and SQLite
cannot apply them read-only without creating ``-shm`` next to the db (or rolling the file back): such
a db is copied with its log into a private temporary folder and read there, never in the profile tree.

Only real tables are read: a VIEW, a trigger or a virtual table named like an expected table is
reported as such, never queried. Every query runs under a time budget (a progress handler,
``$MEMGATE_MAX_QUERY_SECONDS``) and the row cap (``$MEMGATE_MAX_ROWS``, counted while fetching), so a
hostile schema cannot hang the load or fill memory.
"""

from __future__ import annotations

import shutil
import sqlite3
import struct
import tempfile
import time
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from memgate.errors import InputError, cannot_read
from memgate.readers.files import check_readable
from memgate.readers.limits import QUERY_SECONDS_ENV, check_file_size, check_rows, current, max_query_seconds

SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_SIZE = 100
JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")  # the header of a hot rollback journal
PROGRESS_STEPS = 100_000  # sqlite VM instructions between two checks of the query's time budget
FETCH_ROWS = 65_536  # rows fetched at a time (the row cap is checked between two fetches)
# Ascend dbs write this (uint32 -1) where an id is unknown (device, stream, string id).
INVALID_ID = 4294967295

# JSON Schema type → sqlite typeof() values it admits ("integer" also admits a whole REAL, as JSON
# Schema's integer is any number with a zero fractional part; NUMERIC columns can hold one).
_TYPEOF = {"integer": ("integer",), "number": ("integer", "real"), "string": ("text",), "null": ("null",),
           "boolean": ("integer",)}


def is_sqlite(path: Path) -> bool:
    """Whether ``path`` starts with the sqlite header (cheap: reads 16 bytes; False when unreadable)."""
    try:
        with open(path, "rb") as fh:
            return fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def sqlite_or_unreadable(path: Path) -> bool:
    """:func:`is_sqlite`, or a file that is empty or cannot be opened: a loader claims such a file by
    its db name, and the load says what is wrong with it (never a silently skipped rank)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except PermissionError:
        return True
    except OSError:
        return False
    return head in (SQLITE_MAGIC, b"")


@dataclass(frozen=True)
class Database:
    """A read-only connection plus the names of its tables (real tables only: ``others`` maps the
    names of views, triggers and virtual tables to what they are)."""

    path: Path
    conn: sqlite3.Connection
    tables: frozenset[str]
    others: dict[str, str] = field(default_factory=dict)
    read_log: str | None = None  # "-wal" / "-journal": read from a private copy with that log applied

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> list[str]:
        return [str(row[1]) for row in self.query(f"PRAGMA table_info({quote_ident(table)})", table=table)]

    def query(self, sql: str, params: Sequence[Any] = (), *, table: str | None = None) -> list[tuple[Any, ...]]:
        """Run ``sql`` under the time budget and the row cap; a corrupt page or any sqlite failure
        becomes an InputError naming the table."""
        seconds = max_query_seconds()
        deadline = time.monotonic() + seconds
        over: list[bool] = []

        def progress() -> int:
            if time.monotonic() > deadline:
                over.append(True)
                return 1  # sqlite stops the statement: OperationalError "interrupted"
            return 0

        cap = current().max_rows
        self.conn.set_progress_handler(progress, PROGRESS_STEPS)
        try:
            cursor = self.conn.execute(sql, tuple(params))
            rows: list[tuple[Any, ...]] = []
            while chunk := cursor.fetchmany(FETCH_ROWS):
                rows += chunk
                if len(rows) > cap:
                    cursor.close()
                    check_rows(self.path, len(rows), column=table)  # raises, naming the cap
            return rows
        except sqlite3.DatabaseError as exc:
            if over:
                where = f"table {table}: " if table else ""
                raise InputError(f"{where}a query ran past the {seconds:g} s limit (a view or schema that never ends?)",
                                 file=self.path, column=table,
                                 expected=f"queries that finish within the limit (raise it with ${QUERY_SECONDS_ENV})",
                                 found=f"still running after {seconds:g} s") from None
            raise _db_error(self.path, exc, table) from None
        except UnicodeDecodeError as exc:  # a TEXT value that is not UTF-8 (a flipped bit in a string)
            where = f"table {table}: " if table else ""
            raise InputError(f"{where}text that is not UTF-8", file=self.path, column=table, expected="UTF-8 text",
                             found=repr(exc.object[exc.start:exc.start + 8])) from None
        finally:
            self.conn.set_progress_handler(None, 0)

    def frame(self, sql: str, names: Sequence[str], kinds: Sequence[str], *, table: str | None = None) -> pd.DataFrame:
        """Rows of ``sql`` as a DataFrame: kind ``int`` → exact Int64 (never via float64), ``text`` → string."""
        rows = self.query(sql, table=table)
        check_rows(self.path, len(rows), column=table)
        # One 2-D object array, then Arrow per column: far cheaper than zip(*rows) on big tables.
        grid = np.array(rows, dtype=object).reshape(len(rows), len(names))
        data: dict[str, pd.Series] = {}
        for i, (name, kind) in enumerate(zip(names, kinds)):
            column = grid[:, i]
            data[name] = int64_series(column) if kind == "int" else pd.Series(
                pa.array(column, type=pa.string(), from_pandas=False), dtype="string")
        return pd.DataFrame(data)


def int64_series(values: Sequence[Any] | np.ndarray) -> pd.Series:
    """sqlite integers (or whole REALs, already validated) with NULLs → exact nullable Int64.

    Python ints go straight into an Arrow int64 array: a float64 detour would round ns timestamps.
    """
    try:
        arr = pa.array(values, type=pa.int64())
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):  # a NUMERIC column handed back a float
        obj = np.asarray(values, dtype=object)
        mask = np.asarray(pd.isna(obj), dtype=bool)
        return pd.Series(pd.arrays.IntegerArray(np.where(mask, 0, obj).astype(np.int64), mask))
    return pd.Series(arr.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get), dtype="Int64")


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@contextmanager
def open_db(path: Path) -> Iterator[Database]:
    """Open ``path`` read-only after checking it is a complete sqlite file.

    With a pending ``-wal`` or a hot ``-journal`` the db and its log are copied to a private temporary
    folder and read there (see the module docstring); otherwise the file itself is opened immutable.
    """
    check_readable(path)
    check_file_size(path)
    header = _read_header(path)
    log = pending_log(path, header)
    with _private_copy(path, log) as copy:
        if copy is None:
            uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro&immutable=1"
        else:  # our own copy: sqlite may apply the log to it (-shm, a rollback) in the temporary folder
            uri = "file:" + urllib.parse.quote(str(copy)) + "?mode=rw"
        try:
            conn = sqlite3.connect(uri, uri=True)
        except sqlite3.Error as exc:
            raise InputError(f"cannot open the database read-only: {exc}", file=path) from None
        try:
            db = Database(path, conn, frozenset())
            if copy is not None:
                db.query("PRAGMA query_only = 1")
            kinds = db.query("SELECT type, name, upper(ltrim(coalesce(sql, ''))) LIKE 'CREATE VIRTUAL%' "
                             "FROM sqlite_master WHERE type IN ('table', 'view', 'trigger')")
            tables = frozenset(str(name) for kind, name, virtual in kinds if kind == "table" and not virtual)
            others = {str(name): "virtual table" if virtual else str(kind) for kind, name, virtual in kinds
                      if str(name) not in tables}
            yield Database(path, conn, tables, others, log.name[len(path.name):] if log is not None else None)
        finally:
            conn.close()


def pending_log(path: Path, header: bytes | None = None) -> Path | None:
    """The ``-wal`` (WAL mode) or hot ``-journal`` (rollback mode) holding changes not in ``path`` yet."""
    if header is None:
        header = _read_header(path)
    if header[18] == 2:  # WAL mode: frames in a non-empty -wal are committed data the db file lacks
        wal = Path(str(path) + "-wal")
        return wal if wal.is_file() and wal.stat().st_size > 0 else None
    journal = Path(str(path) + "-journal")
    try:
        with open(journal, "rb") as fh:
            hot = fh.read(len(JOURNAL_MAGIC)) == JOURNAL_MAGIC
    except OSError:
        return None
    return journal if hot else None


@contextmanager
def _private_copy(path: Path, log: Path | None) -> Iterator[Path | None]:
    """``path`` and ``log`` copied into a temporary folder (removed afterwards); None without a log."""
    if log is None:
        yield None
        return
    check_readable(log)
    check_file_size(log)
    with tempfile.TemporaryDirectory(prefix="memgate-db-") as tmp:
        copy = Path(tmp) / path.name
        try:
            shutil.copyfile(path, copy)
            shutil.copyfile(log, Path(str(copy) + log.name[len(path.name):]))
        except OSError as exc:
            raise InputError(f"the database has a pending {log.name[len(path.name):]} log: reading it needs a private "
                             f"copy, which failed ({exc.strerror or exc})", file=path,
                             expected=f"room for a copy of the db in {tempfile.gettempdir()} ($TMPDIR), or a "
                             "checkpointed db (open it once with sqlite3 where it was written)",
                             found=f"{log.name} of {log.stat().st_size} bytes") from None
        yield copy


def _read_header(path: Path) -> bytes:
    try:
        with open(path, "rb") as fh:
            header = fh.read(HEADER_SIZE)
    except OSError as exc:  # os.access said yes, but the read failed (ACLs, EIO)
        raise cannot_read(exc, path) from None
    if not header.startswith(SQLITE_MAGIC[: len(header)]) or len(header) < len(SQLITE_MAGIC):
        raise InputError("not a sqlite database", file=path, expected="a file starting with 'SQLite format 3\\0'",
                         found=repr(header[:16]))
    if len(header) < HEADER_SIZE:
        raise InputError("truncated database: shorter than the 100-byte sqlite header", file=path,
                         expected=f"at least {HEADER_SIZE} bytes", found=f"{len(header)} bytes")
    page_size = struct.unpack(">H", header[16:18])[0]
    page_size = 65536 if page_size == 1 else page_size
    change_counter, pages = struct.unpack(">II", header[24:32])
    valid_for = struct.unpack(">I", header[92:96])[0]
    size = path.stat().st_size
    # The in-header page count is trustworthy only when version-valid-for equals the change counter.
    if pages and valid_for == change_counter and size < pages * page_size:
        raise InputError("truncated database: the file is shorter than its header says", file=path,
                         expected=f"{pages * page_size} bytes ({pages} pages of {page_size})",
                         found=f"{size} bytes")
    return header


def _db_error(path: Path, exc: sqlite3.DatabaseError, table: str | None) -> InputError:
    text = str(exc)
    where = f"table {table}: " if table else ""
    if "malformed" in text or "not a database" in text or "disk I/O" in text:
        return InputError(f"{where}corrupt or truncated database ({text})", file=path, column=table)
    return InputError(f"{where}cannot read the database ({text})", file=path, column=table)


def require_table(db: Database, table: str, why: str) -> None:
    if table in db.others:  # a view over anything (an endless recursive query) is never read as data
        raise InputError(f"{table} is a {db.others[table]}, not a table", file=db.path, column=table,
                         expected=f"table {table} ({why})", found=f"a {db.others[table]} named {table}")
    if not db.has(table):
        present = ", ".join(sorted(db.tables)) or "none"
        raise InputError(f"missing table {table}", file=db.path, column=table, expected=f"table {table} ({why})",
                         found=f"tables: {_clip_list(present)}")


def _clip_list(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_table(db: Database, schema: dict[str, Any]) -> None:
    """Check that the table of ``schema`` has its required columns and that every row fits it."""
    table = str(schema["x-memgate-table"])
    require_table(db, table, str(schema.get("title", "")))
    present = db.columns(table)
    for column in schema.get("required", []):
        if column not in present:
            raise InputError(f"table {table} has no column {column!r}", file=db.path, column=f"{table}.{column}",
                             expected=f"columns {', '.join(schema['required'])}",
                             found=f"columns {', '.join(present)}")
    props: dict[str, Any] = schema["properties"]
    checks: list[tuple[str, str, str]] = []  # (column, SQL condition that is true for a bad row, problem)
    for column in present:
        prop = props.get(column)
        if prop is None:
            continue
        for condition, problem in _conditions(quote_ident(column), prop):
            checks.append((column, condition, problem))
    if not checks:
        return
    case = " ".join(f"WHEN {cond} THEN {i}" for i, (_, cond, _) in enumerate(checks))
    where = " OR ".join(f"({cond})" for _, cond, _ in checks)
    sql = f"SELECT rowid, CASE {case} END FROM {quote_ident(table)} WHERE {where} ORDER BY rowid LIMIT 1"
    bad = db.query(sql, table=table)
    if bad:
        rowid, index = bad[0]
        column, _, problem = checks[int(index)]
        raise_bad_value(db, table, int(rowid), column, problem, describe(props[column]))
    for column in present:
        ref = props.get(column, {}).get("x-references")
        if ref:
            check_reference(db, table, column, referenced(db, ref))


def referenced(db: Database, ref: str | list[str]) -> str:
    """The ``TABLE.column`` an ``x-references`` names in this db. A list is the forms writers used, the
    first table the db has wins: a writer that moved a column from an enum table to ``STRING_IDS`` stopped
    writing the enum table, so its presence, never the values, tells the forms apart. None present: the
    last, whose absence check_reference reports."""
    choices = [ref] if isinstance(ref, str) else list(ref)
    return next((c for c in choices if db.has(c.split(".", 1)[0])), choices[-1])


def raise_bad_value(db: Database, table: str, rowid: int, column: str, problem: str, expected: str) -> None:
    found = db.query(f"SELECT typeof({quote_ident(column)}), quote({quote_ident(column)}) FROM {quote_ident(table)} "
                     f"WHERE rowid = ?", (rowid,), table=table)
    kind, value = found[0] if found else ("?", "?")
    raise InputError(f"table {table} rowid {rowid}: {problem}", file=db.path, column=f"{table}.{column}",
                     expected=expected, found=f"{kind} {value}")


def check_reference(db: Database, table: str, column: str, ref: str) -> None:
    """Every id in ``table.column`` (except NULL and the invalid-id marker) exists in ``ref``."""
    ref_table, ref_column = ref.split(".", 1)
    if not db.has(ref_table):
        require_table(db, ref_table, f"{table}.{column} refers to it")
    col, rcol = quote_ident(column), quote_ident(ref_column)
    sql = (f"SELECT t.rowid, t.{col} FROM {quote_ident(table)} t LEFT JOIN {quote_ident(ref_table)} r "
           f"ON r.{rcol} = t.{col} WHERE t.{col} IS NOT NULL AND t.{col} != {INVALID_ID} AND r.{rcol} IS NULL "
           f"ORDER BY t.rowid LIMIT 1")
    bad = db.query(sql, table=table)
    if bad:
        rowid, value = bad[0]
        raise InputError(f"table {table} rowid {rowid}: id not found in {ref_table}", file=db.path,
                         column=f"{table}.{column}", expected=f"an id present in {ref}", found=repr(value))


def _conditions(col: str, prop: dict[str, Any]) -> list[tuple[str, str]]:
    types = prop.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    out: list[tuple[str, str]] = []
    if types:
        allowed = {t for name in types for t in _TYPEOF[name]}
        whole_real = "integer" in types and "number" not in types
        if whole_real:
            allowed.add("real")
        listed = ", ".join(f"'{t}'" for t in sorted(allowed))
        cond = f"typeof({col}) NOT IN ({listed})"
        if whole_real:  # a REAL is fine for an integer column only when it is whole
            cond = f"{cond} OR (typeof({col}) = 'real' AND {col} != CAST({col} AS INTEGER))"
        out.append((cond, "wrong type"))
    if "enum" in prop:
        values = ", ".join(_sql_literal(v) for v in prop["enum"] if v is not None)
        out.append((f"{col} IS NOT NULL AND {col} NOT IN ({values})", "value not allowed"))
    if "minimum" in prop:
        out.append((f"typeof({col}) IN ('integer', 'real') AND {col} < {prop['minimum']!r}", "value below the minimum"))
    return out


def _sql_literal(value: Any) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def describe(prop: dict[str, Any]) -> str:
    types = prop.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    words = {"integer": "an integer", "number": "a number", "string": "text", "null": "NULL"}
    what = " or ".join(words.get(t, t) for t in types) or "a value"
    if "enum" in prop:
        what = "one of " + ", ".join(repr(v) for v in prop["enum"])
    if "minimum" in prop:
        what += f" >= {prop['minimum']}"
    unit = prop.get("x-unit")
    return f"{what} ({unit})" if unit else what

"""memgate.readers.sqlitetable: sqlite files read read-only and checked first (the header, a truncated
file), their tables told from views, triggers and virtual tables, exact int64 columns, a pending -wal
read without writing beside the db, and every query under a time budget and the row cap.

The real torch_npu db and its mutations through the loader: tests/test_ascend_db.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from helpers import ASCEND

from memgate.errors import InputError
from memgate.readers import limits
from memgate.readers.sqlitetable import (
    FETCH_ROWS,
    is_sqlite,
    open_db,
    pending_log,
    quote_ident,
    referenced,
    require_table,
    sqlite_or_unreadable,
    validate_table,
)

DB = ASCEND / "msinsight_pta21_db_level0_rank0" / "ascend_pytorch_profiler_0.db"
NS = 1764246877082702440  # past float64's exact integers


def _raw(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A small db: a table of ints and text, and a view, a trigger and a virtual table beside it."""
    path = tmp_path / "profile.db"
    conn = sqlite3.connect(path)
    conn.execute('CREATE TABLE "MEMORY_RECORD" (id INTEGER, ts INTEGER, name TEXT)')
    conn.executemany("INSERT INTO MEMORY_RECORD VALUES (?, ?, ?)", [(1, NS, "PTA"), (2, None, None)])
    conn.execute("CREATE VIEW V AS SELECT * FROM MEMORY_RECORD")
    conn.execute("CREATE TRIGGER T AFTER INSERT ON MEMORY_RECORD BEGIN SELECT 1; END")
    conn.execute("CREATE VIRTUAL TABLE F USING fts5(x)")
    conn.commit()
    conn.close()
    return path


def test_a_sqlite_file_is_known_by_its_header(db: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    text = tmp_path / "text.db"
    text.write_text("Component,Timestamp(us)\n")
    assert is_sqlite(db) and sqlite_or_unreadable(db)
    assert not is_sqlite(empty) and sqlite_or_unreadable(empty)  # claimed by its name: the load says it is empty
    assert not is_sqlite(text) and not sqlite_or_unreadable(text)
    assert not is_sqlite(tmp_path / "missing.db") and not sqlite_or_unreadable(tmp_path / "missing.db")


def test_tables_views_triggers_and_virtual_tables(db: Path) -> None:
    with open_db(db) as opened:
        assert "MEMORY_RECORD" in opened.tables and "V" not in opened.tables
        assert opened.others == {"V": "view", "T": "trigger", "F": "virtual table"}
        assert opened.read_log is None  # nothing pending: the file itself, opened immutable
        assert opened.columns("MEMORY_RECORD") == ["id", "ts", "name"]
        require_table(opened, "MEMORY_RECORD", "the allocator's totals")
        for name, kind in (("V", "view"), ("F", "virtual table")):
            with pytest.raises(InputError) as info:
                require_table(opened, name, "the allocator's totals")
            assert info.value.one_line() == (f"{db}: column '{name}': {name} is a {kind}, not a table; expected table "
                                             f"{name} (the allocator's totals), found 'a {kind} named {name}'")
        with pytest.raises(InputError) as info:
            require_table(opened, "OP_MEMORY", "the blocks")
        assert (info.value.message, info.value.expected) == ("missing table OP_MEMORY", "table OP_MEMORY (the blocks)")
        assert info.value.found is not None and info.value.found.startswith("tables: F_config, ")


def test_columns_are_exact_int64_and_text(db: Path) -> None:
    with open_db(db) as opened:
        frame = opened.frame("SELECT id, ts, name FROM MEMORY_RECORD", ["id", "ts", "name"], ["int", "int", "text"])
        with pytest.raises(InputError) as info:
            opened.query("SELECT * FROM NO_SUCH_TABLE", table="NO_SUCH_TABLE")
    assert [str(t) for t in frame.dtypes] == ["Int64", "Int64", "string"]
    assert frame["ts"].tolist()[0] == NS and frame["ts"].isna().tolist() == [False, True]
    assert (info.value.column, info.value.message) == (
        "NO_SUCH_TABLE", "table NO_SUCH_TABLE: cannot read the database (no such table: NO_SUCH_TABLE)")
    assert quote_ident('a"b') == '"a""b"'


def test_a_reference_to_alternatives_is_the_first_table_the_db_has(tmp_path: Path) -> None:
    """``x-references`` as a list: the tables present decide (an id may exist in both), the last when none is."""
    path = tmp_path / "profile.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE EVENTS (kind INTEGER)")
    conn.execute("CREATE TABLE STRING_IDS (id INTEGER PRIMARY KEY, value TEXT)")
    conn.executemany("INSERT INTO EVENTS VALUES (?)", [(5,), (9,)])
    conn.executemany("INSERT INTO STRING_IDS VALUES (?, ?)", [(5, "x"), (9, "y")])
    conn.commit()
    conn.close()
    schema = {"x-memgate-table": "EVENTS", "required": ["kind"],
              "properties": {"kind": {"type": "integer", "x-references": ["ENUM_X.id", "STRING_IDS.id"]}}}
    with open_db(path) as opened:
        assert referenced(opened, schema["properties"]["kind"]["x-references"]) == "STRING_IDS.id"
        assert referenced(opened, ["ENUM_X.id", "OTHER.id"]) == "OTHER.id"  # none there: the last is asked for
        validate_table(opened, schema)
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE ENUM_X (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO ENUM_X VALUES (5, 'x')")
    conn.commit()
    conn.close()
    with open_db(path) as opened:
        assert referenced(opened, schema["properties"]["kind"]["x-references"]) == "ENUM_X.id"
        with pytest.raises(InputError) as info:
            validate_table(opened, schema)
    assert (info.value.message, info.value.column, info.value.found) == (
        "table EVENTS rowid 2: id not found in ENUM_X", "EVENTS.kind", "9")


def test_what_is_no_complete_sqlite_file_is_refused_before_it_is_opened(db: Path, tmp_path: Path) -> None:
    cases = {
        "text.db": (b"Component,Timestamp(us)\n1,2\n", ("not a sqlite database; expected a file starting with "
                    "'SQLite format 3\\0', found \"b'Component,Timest'\"")),
        "short.db": (db.read_bytes()[:50], ("truncated database: shorter than the 100-byte sqlite header; expected at "
                     "least 100 bytes, found '50 bytes'")),
        "cut.db": (db.read_bytes()[:4096], ("truncated database: the file is shorter than its header says; expected "
                   f"{db.stat().st_size} bytes ({db.stat().st_size // 4096} pages of 4096), found '4096 bytes'")),
        "empty.db": (b"", "empty file (0 bytes)"),
    }
    for name, (content, says) in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(InputError) as info, open_db(path):
            pass
        assert info.value.one_line() == f"{path}: {says}"


def test_a_pending_write_ahead_log_is_read_and_nothing_is_written_beside_the_db(tmp_path: Path) -> None:
    path = tmp_path / "profile.db"
    writer = sqlite3.connect(path)
    try:
        writer.execute("PRAGMA journal_mode = WAL")
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("CREATE TABLE STEP_TIME (id INTEGER)")
        writer.execute("INSERT INTO STEP_TIME VALUES (7)")
        writer.commit()
        assert pending_log(path) == Path(str(path) + "-wal")
        before = sorted(p.name for p in tmp_path.iterdir())
        with open_db(path) as opened:
            assert opened.read_log == "-wal"
            assert opened.query("SELECT id FROM STEP_TIME") == [(7,)]
        assert sorted(p.name for p in tmp_path.iterdir()) == before  # read from a private copy
    finally:
        writer.close()


# ---- the time budget and the row cap of every query, on the real db --------------------------------------


ENDLESS = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


def test_a_query_past_its_time_budget_stops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(limits.QUERY_SECONDS_ENV, "0.2")
    with open_db(DB) as db, pytest.raises(InputError) as info:
        db.query(ENDLESS, table="MEMORY_RECORD")
    err = info.value
    assert err.file == str(DB) and err.column == "MEMORY_RECORD"
    assert "ran past the 0.2 s limit" in err.message and limits.QUERY_SECONDS_ENV in (err.expected or "")
    with open_db(DB) as db:  # the handler is per query: the next one runs normally
        assert db.query("SELECT count(*) FROM STEP_TIME") == _raw(DB, "SELECT count(*) FROM STEP_TIME")


def test_rows_are_capped_while_fetching(monkeypatch: pytest.MonkeyPatch) -> None:
    endless_rows = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c"
    with open_db(DB) as db, pytest.raises(InputError) as info:
        monkeypatch.setenv(limits.ROWS_ENV, "10")
        db.query(endless_rows, table="X")
    assert info.value.message == f"{FETCH_ROWS} rows, over the limit of 10"

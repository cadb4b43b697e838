"""memgate.loaders.msmemscope on msleaks' sqlite dump (table ``leaks_dump``, camelCase columns).

The sample is a trimmed real dump (PROVENANCE.md). Expected values are computed here from the raw
table with plain sqlite3 — the writer's own ``used`` counter and a running sum of the sizes —, never
copied from memgate's output.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections import defaultdict
from pathlib import Path

import jsonschema
import pytest
from helpers import SAMPLES

from memgate.errors import InputError
from memgate.loaders import msmemscope
from memgate.metrics import device_metrics
from memgate.schemas import load_schema

LEAKS_DB = SAMPLES / "msmemscope" / "leaks_dump_2025.db"


def raw(path: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def test_real_leaks_db_peaks_match_the_raw_table() -> None:
    # Two processes in one file: memgate labels a device npu:<deviceId>/pid<processId>.
    used = {f"npu:{dev}/pid{pid}": peak for pid, dev, peak in raw(
        LEAKS_DB, "SELECT processId, deviceId, max(CAST(json_extract(attr, '$.used') AS INTEGER)) FROM leaks_dump "
                  "WHERE eventType = 'PTA' AND event IN ('MALLOC', 'FREE') GROUP BY 1, 2")}
    level: dict[str, int] = defaultdict(int)
    summed: dict[str, int] = defaultdict(int)
    for pid, dev, event, attr in raw(LEAKS_DB, "SELECT processId, deviceId, event, attr FROM leaks_dump WHERE "
                                               "eventType = 'PTA' AND event IN ('MALLOC', 'FREE') ORDER BY timestamp, id"):
        size = abs(int(json.loads(attr)["size"]))  # FREE rows carry the size negated
        key = f"npu:{dev}/pid{pid}"
        level[key] += size if event == "MALLOC" else -size
        summed[key] = max(summed[key], level[key])
    assert used == dict(summed) and len(used) == 3  # the writer's counter agrees with the events
    profile = msmemscope.load(LEAKS_DB)
    got = {d.device: device_metrics(profile, d).values["peak_allocated_bytes"] for d in profile.devices
           if d.device.startswith("npu:")}
    assert got == used


def test_real_leaks_db_time_is_microseconds() -> None:
    profile = msmemscope.load(LEAKS_DB)
    assert profile.metadata["timestamp_unit"] == "us"
    assert any("16-digit" in note for note in profile.metadata["notes"])
    ((first,),) = raw(LEAKS_DB, "SELECT min(timestamp) FROM leaks_dump WHERE eventType = 'PTA' AND event = 'MALLOC' "
                                "AND deviceId = '0'")
    (device,) = [d for d in profile.devices if d.device == "npu:0/pid1528642"]
    blocks = device.blocks.to_pandas()
    assert int(blocks[blocks["component"] == "PTA"]["t_alloc"].min()) == first * 1000


def test_leaks_db_is_read_in_place(tmp_path: Path) -> None:
    path = shutil.copy(LEAKS_DB, tmp_path / "leaks_dump_2025.db")
    assert msmemscope.claims(Path(path))
    msmemscope.load(Path(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["leaks_dump_2025.db"]


def _dir(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir()
    return tmp_path / name


def _edited(directory: Path, sql: str) -> tuple[Path, int]:
    """A copy of the sample with ``sql`` applied to one PTA FREE row; that row's rowid."""
    path = Path(shutil.copy(LEAKS_DB, directory / "leaks_dump_2025.db"))
    conn = sqlite3.connect(path)
    (rowid,) = conn.execute("SELECT rowid FROM leaks_dump WHERE eventType = 'PTA' AND event = 'FREE' "
                            "ORDER BY rowid LIMIT 1 OFFSET 5").fetchone()
    conn.execute(f"UPDATE leaks_dump SET {sql} WHERE rowid = ?", (rowid,))
    conn.commit()
    conn.close()
    return path, rowid


def test_leaks_db_malformed_rows(tmp_path: Path) -> None:
    path, rowid = _edited(_dir(tmp_path, "a"), "attr = '{size=1}'")
    with pytest.raises(InputError) as info:
        msmemscope.load(path)
    assert info.value.message == f"table leaks_dump rowid {rowid}: malformed Attr"
    assert info.value.column == "leaks_dump.attr" and info.value.file == str(path)
    path, rowid = _edited(_dir(tmp_path, "b"), "timestamp = 'soon'")
    with pytest.raises(InputError) as info:
        msmemscope.load(path)
    assert info.value.message.startswith(f"table leaks_dump rowid {rowid}: wrong type")
    assert info.value.column == "leaks_dump.timestamp" and info.value.found == "text 'soon'"
    path, rowid = _edited(_dir(tmp_path, "c"),
                          "timestamp = timestamp * 1000")  # one 19-digit value among 16-digit ones
    with pytest.raises(InputError, match="timestamp mixes 16-digit") as info:
        msmemscope.load(path)
    assert info.value.column == "leaks_dump.timestamp"


def test_leaks_dump_under_the_csv_names(tmp_path: Path) -> None:
    """msleaks' own db writer (2025-06 on): table leaks_dump, the CSV's column names, ns."""
    path = tmp_path / "leaks_dump_20250610120000.db"
    conn = sqlite3.connect(path)
    conn.execute('CREATE TABLE leaks_dump ("ID" INTEGER, "Event" TEXT, "Event Type" TEXT, "Name" TEXT, '
                 '"Timestamp(ns)" INTEGER, "Process Id" INTEGER, "Thread Id" INTEGER, "Device Id" TEXT, "Ptr" TEXT, '
                 '"Attr" TEXT)')
    conn.executemany("INSERT INTO leaks_dump VALUES (?,?,?,?,?,?,?,?,?,?)", [
        (1, "MALLOC", "PTA", "N/A", 1749528000000000100, 7, 7, "0", "16", '{"addr":"16","size":"512","used":"512"}'),
        (2, "FREE", "PTA", "N/A", 1749528000000000200, 7, 7, "0", "16", '{"addr":"16","size":"-512","used":"0"}'),
    ])
    conn.commit()
    conn.close()
    (device,) = msmemscope.load(path).devices
    frame = device.blocks.to_pandas()
    assert (int(frame["t_alloc"][0]), int(frame["t_free"][0]), int(frame["size"][0])) == (
        1749528000000000100, 1749528000000000200, 512)


def test_leaks_dump_schema_is_valid() -> None:
    schema = load_schema("msmemscope.leaks_dump")
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    names = [r[1] for r in raw(LEAKS_DB, "PRAGMA table_info(leaks_dump)")]
    for row in raw(LEAKS_DB, "SELECT * FROM leaks_dump"):
        validator.validate(dict(zip(names, row)))


# ---- hostile dumps: a view named leaks_dump, JSON owners holding commas ------------------------------

_CAMEL = ("id INTEGER, event TEXT, eventType TEXT, name TEXT, timestamp INTEGER, processId INTEGER, threadId INTEGER, "
          "deviceId TEXT, ptr TEXT, attr TEXT")


def _camel_db(path: Path, attrs: tuple[str, str], table: str = "leaks_dump") -> Path:
    """A camelCase leaks_dump of one PTA block (MALLOC then FREE, ns) with these two Attr texts."""
    conn = sqlite3.connect(path)
    conn.execute(f"CREATE TABLE {table} ({_CAMEL})")
    conn.executemany(f"INSERT INTO {table} VALUES (?,?,?,?,?,?,?,?,?,?)", [
        (1, "MALLOC", "PTA", "N/A", 1749528000000000100, 7, 7, "0", "16", attrs[0]),
        (2, "FREE", "PTA", "N/A", 1749528000000000200, 7, 7, "0", "16", attrs[1])])
    conn.commit()
    conn.close()
    return path


_FREE = '{"addr": "16", "size": "-512", "used": "0"}'


@pytest.mark.parametrize(("attr", "owner"), [
    ('{"addr": "16", "size": "512", "used": "512", "owner": "PTA@model,decoder@weight"}', "PTA@model,decoder@weight"),
    ('{"owner": "a, b ,c", "addr": "16", "size": "512"}', "a, b ,c"),
    ('{"addr": "16", "size": 512, "pinned": true, "owner": "x,\\"y\\"@z"}', 'x,"y"@z'),  # numbers, true, an escape
    ('{"addr": "16", "size": "512", "owner": "PTA@plain@name"}', "PTA@plain@name"),  # the split path, unchanged
    ('{"addr": "16", "size": "512", "owner": "' + "o," * 50_000 + '"}', "o," * 50_000),
])
def test_a_json_attr_owner_holding_a_comma_is_read_whole(tmp_path: Path, attr: str, owner: str) -> None:
    """The db's Attr is JSON: a comma inside a quoted owner is the owner's, not a separator (the CSV form,
    unquoted, is split on commas)."""
    (device,) = msmemscope.load(_camel_db(tmp_path / "leaks_dump_1.db", (attr, _FREE))).devices
    frame = device.blocks.to_pandas()
    assert (int(frame["size"][0]), frame["owner"][0]) == (512, owner)


@pytest.mark.parametrize("attr", ['{"addr": "16", "size": "512", "owner": {"x": "a,b"}}',
                                  '{"addr": "16", "size": "512", "owner": ["a,b"]}',
                                  '{"addr": "16", "size": "512", "owner": "a,b", }'])
def test_a_json_attr_that_is_no_flat_object_is_malformed(tmp_path: Path, attr: str) -> None:
    path = _camel_db(tmp_path / "leaks_dump_1.db", (attr, _FREE))
    with pytest.raises(InputError) as info:
        msmemscope.load(path)
    assert (info.value.message, info.value.column) == ("table leaks_dump rowid 1: malformed Attr", "leaks_dump.attr")
    assert info.value.expected == '{"key":"value",...} (the JSON form) or {key:value,...}'


def test_a_leaks_dump_view_is_said_to_be_a_view(tmp_path: Path) -> None:
    """A view is never run (bad-input.md: only real tables); it was reported as a missing memscope_dump table."""
    path = _camel_db(tmp_path / "leaks_dump_1.db", ('{"addr": "16", "size": "512"}', _FREE), table="base")
    conn = sqlite3.connect(path)
    conn.execute("CREATE VIEW leaks_dump AS SELECT * FROM base")
    conn.commit()
    conn.close()
    with pytest.raises(InputError) as info:
        msmemscope.load(path)
    assert (info.value.message, info.value.column, info.value.found) == (
        "leaks_dump is a view, not a table", "leaks_dump", "a view named leaks_dump")

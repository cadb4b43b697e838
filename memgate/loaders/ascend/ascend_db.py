"""Ascend profiler sqlite exports: ``ascend_pytorch_profiler[_{rank}].db`` and CANN ``msprof_*.db``.

docs/formats-reference.md §1 (db part) and §3: every value is bytes or ns, missing is NULL, and text lives in
``STRING_IDS`` (ids) / ``ENUM_MODULE`` (early msprof db exports: the ``type`` of ``NPU_OP_MEM`` / ``NPU_MEM`` in
``ENUM_MEMORY``, see :func:`_type_names`). Each table read is validated first against its schema
``memgate/schemas/ascend_db.<table>.schema.json`` (one SQL scan per table, see
:mod:`memgate.readers.sqlitetable`); the file is opened read-only and nothing is written next to it.

What is read, per device (``deviceId`` → ``npu:N``):

- torch_npu db: ``MEMORY_RECORD`` → series PTA / GE / PTA+GE / WORKSPACE (no APP rows there);
  ``OP_MEMORY`` → blocks (GE rows are the ones without a stream; their names get the ``cann::``
  prefix the text export writes, so op caps match either export); ``STEP_TIME`` → steps.
- both: ``NPU_MEM`` → ``APP`` (app ddr + hbm, the whole process) and the ``NPU MEM APP/DDR`` …
  ``NPU MEM Device/Memory`` series the trace_view loader also produces; ``NPU_MODULE_MEM`` →
  ``module:<name>`` series.
- msprof db (CANN tables only): ``NPU_OP_MEM`` allocate/release events → GE blocks (a release is
  matched to the latest earlier allocate of the same device, component and address; a release
  without one is a block allocated before the window, an allocate without one is still live) and
  the ``GE`` series (the totals written with each event).

Detection: a ``.db`` file by name (``ascend_pytorch_profiler[_N].db``, ``msprof_*.db``) and the
sqlite header; a ``*_ascend_pt`` or ``ASCEND_PROFILER_OUTPUT`` directory that holds exactly one
``ascend_pytorch_profiler*.db`` and no text export (``memory_record.csv`` /
``operator_memory.csv``). When a run exported both text and db, the text export wins: the directory
is left to the torch_npu text loader (its CSVs carry the same data plus the APP rows).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memgate.errors import InputError
from memgate.loaders import registry
from memgate.loaders.ascend.crossfile import cross_file_facts
from memgate.loaders.events import pair_events, repair_notes, take
from memgate.model import (
    APP_COMPONENT,
    STEP_COLUMNS,
    DeviceModel,
    Profile,
    Series,
    by_device,
    check_bytes,
    check_steps,
    empty_blocks,
    empty_steps,
    int_table,
    key_texts,
    split_series,
    steps_in_order,
    typed_blocks,
)
from memgate.readers.sqlitetable import (
    INVALID_ID,
    Database,
    open_db,
    quote_ident,
    referenced,
    require_table,
    sqlite_or_unreadable,
    validate_table,
)
from memgate.schemas import load_schema
from memgate.table import Table

FORMAT = "ascend_db"
OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
TORCH_DB = re.compile(r"^ascend_pytorch_profiler(?:_([0-9]+))?\.db$")
MSPROF_DB = re.compile(r"^msprof_[0-9_]+\.db$")
TEXT_EXPORT = ("memory_record.csv", "operator_memory.csv")
NPU_MEM_KINDS = {"app": "APP", "device": "Device"}
_ASCII_INT = re.compile(r"-?[0-9]+")


def _schema(table: str) -> dict[str, Any]:
    return load_schema(f"ascend_db.{table.lower()}")


def output_dir(profile_dir: Path) -> Path:
    inner = profile_dir / OUTPUT_DIR
    return inner if inner.is_dir() else profile_dir


def torch_dbs(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if TORCH_DB.match(p.name) and p.is_file())
    except OSError:
        return []


def claims(path: Path) -> bool:
    if path.is_file():
        return bool(TORCH_DB.match(path.name) or MSPROF_DB.match(path.name)) and sqlite_or_unreadable(path)
    if not path.is_dir() or not (path.name.endswith("_ascend_pt") or path.name == OUTPUT_DIR):
        return False
    out = output_dir(path)
    if any((out / name).exists() for name in TEXT_EXPORT):
        return False  # the text export wins (torch_npu loader)
    return len(torch_dbs(out)) == 1


def load(path: Path) -> Profile:
    if path.is_dir():
        found = torch_dbs(output_dir(path))
        if len(found) != 1:
            raise InputError("expected exactly one ascend_pytorch_profiler[_{rank}].db here", file=path,
                             expected=f"one db in {output_dir(path)}", found=f"{len(found)}")
        db_path = found[0]
    else:
        db_path = path
    with open_db(db_path) as db:
        return _load(db, path)


# Every table this loader may read: one of these names on a view, trigger or virtual table is an error
# (sqlitetable.require_table), never data and never silently skipped.
KNOWN_TABLES = ("MEMORY_RECORD", "OP_MEMORY", "NPU_OP_MEM", "NPU_MEM", "NPU_MODULE_MEM", "STEP_TIME", "STRING_IDS",
                "ENUM_MODULE", "ENUM_MEMORY", "META_DATA", "RANK_DEVICE_MAP")
# The text column of each table a type id may be resolved in.
TEXT_COLUMN = {"STRING_IDS": "value", "ENUM_MEMORY": "name"}


def _load(db: Database, profile_path: Path) -> Profile:
    for table in KNOWN_TABLES:
        if table in db.others:
            require_table(db, table, "a table of the profiler's export")
    torch_kind = bool(TORCH_DB.match(db.path.name)) or db.has("MEMORY_RECORD") or db.has("OP_MEMORY")
    memory_tables = ("MEMORY_RECORD", "OP_MEMORY") if torch_kind else ("NPU_OP_MEM", "NPU_MEM", "NPU_MODULE_MEM")
    if not any(db.has(t) for t in memory_tables):
        require_table(db, memory_tables[0],
                      "memory data: record with profile_memory=True" if torch_kind else "CANN memory data")
    if any(db.has(t) for t in ("MEMORY_RECORD", "OP_MEMORY", "NPU_MEM", "NPU_OP_MEM")):
        validate_table(db, _schema("STRING_IDS"))
        _check_ids_once(db, "STRING_IDS")
    devices: dict[str, dict[str, Any]] = {}

    def slot(device: str) -> dict[str, Any]:
        return devices.setdefault(device, {"series": {}, "blocks": empty_blocks(), "blocks_source": None})

    source = str(db.path)
    notes: list[str] = [f"the db's pending {db.read_log} log was applied (read from a private copy)"] \
        if db.read_log is not None else []
    if torch_kind and db.has("MEMORY_RECORD"):
        for device, component, frame in read_memory_record(db):
            slot(device)["series"][component] = Series(component, frame, f"{source}:MEMORY_RECORD")
    if torch_kind and db.has("OP_MEMORY"):
        for device, blocks in read_op_memory(db):  # each device once
            slot(device)["blocks"] = blocks
            slot(device)["blocks_source"] = f"{source}:OP_MEMORY"
    if not torch_kind and db.has("NPU_OP_MEM"):
        blocks_by_device, series, pairing_notes = read_npu_op_mem(db)
        notes += pairing_notes
        for device, blocks in blocks_by_device:  # each device once
            slot(device)["blocks"] = blocks
            slot(device)["blocks_source"] = f"{source}:NPU_OP_MEM"
        for device, component, frame in series:
            slot(device)["series"][component] = Series(component, frame, f"{source}:NPU_OP_MEM")
    if db.has("NPU_MEM"):
        for device, name, frame in read_npu_mem(db):
            slot(device)["series"][name] = Series(name, frame, f"{source}:NPU_MEM")
    if db.has("NPU_MODULE_MEM"):
        for device, name, frame in read_npu_module_mem(db):
            slot(device)["series"][f"module:{name}"] = Series(f"module:{name}", frame, f"{source}:NPU_MODULE_MEM")

    steps, steps_source = empty_steps(), None
    if db.has("STEP_TIME"):
        steps = read_step_time(db)
        steps_source = f"{source}:STEP_TIME" if len(steps) else None
    meta = read_meta_data(db)
    rank_map = read_rank_device_map(db)

    if not devices:
        raise InputError("the memory tables hold no rows", file=db.path,
                         expected=f"rows in {' / '.join(t for t in memory_tables if db.has(t))}")
    models = []
    for device in sorted(devices):
        parts = devices[device]
        series = parts["series"]
        models.append(DeviceModel(
            device=device,
            series=series,
            blocks=parts["blocks"],
            blocks_source=parts["blocks_source"],
            sum_components={"PTA+GE": ("PTA", "GE")} if "PTA+GE" in series else {},
        ))
    metadata: dict[str, Any] = {"export": "db" if torch_kind else "msprof db", "db_file": db.path.name,
                                "cross_file": cross_file_facts(models, db.path, steps, steps_source)}
    if notes:
        metadata["notes"] = notes
    for key in ("SCHEMA_VERSION", "torch_npu_version", "cann_version"):
        if key in meta:
            metadata[key.lower()] = meta[key]
    return Profile(
        path=str(profile_path),
        format=FORMAT,
        rank=rank_of(db.path, profile_path, meta, rank_map),
        devices=tuple(models),
        steps=steps,
        steps_source=steps_source,
        metadata=metadata,
    )


# --- tables ---------------------------------------------------------------------------------------

def _device_labels(ids: pd.Series) -> pd.Series:
    return pd.Series(("npu:" + ids.astype("string")), dtype="string")


def _marker_to_na(values: pd.Series) -> pd.Series:
    """The invalid-id marker 4294967295 means 'unknown'."""
    return values.mask(values == INVALID_ID)


def _check_devices(db: Database, table: str) -> None:
    bad = db.query(f"SELECT rowid FROM {table} WHERE deviceId = {INVALID_ID} ORDER BY rowid LIMIT 1", table=table)
    if bad:
        raise InputError(f"table {table} rowid {bad[0][0]}: memory row without a device (invalid-id marker)",
                         file=db.path, column=f"{table}.deviceId", expected="a device id", found=str(INVALID_ID))


def _check_ids_once(db: Database, table: str) -> None:
    """Each id listed once: a table joined with STRING_IDS (or ENUM_MEMORY) would repeat its row for every
    listing (an event counted twice), and which value an id names would depend on the order rows were read."""
    text = TEXT_COLUMN[table]
    repeated = db.query(f"SELECT id, COUNT(*), COUNT(DISTINCT {text}) FROM {table} GROUP BY id HAVING COUNT(*) > 1 "
                        "ORDER BY id LIMIT 1", table=table)
    if repeated:
        ident, count, values = repeated[0]
        raise InputError(f"table {table} lists id {ident} {count} times", file=db.path, column=f"{table}.id",
                         expected="each id once", found=f"{count} rows with id {ident}, {values} distinct value(s)")


def _type_names(db: Database, table: str) -> tuple[str, str]:
    """The table and text column ``table.type`` is resolved in: ENUM_MEMORY where the db has one (msprof's
    early db exports, 2024, keyed the type into it), else STRING_IDS (msprof since). The schema's
    ``x-references`` lists both; the tables the db holds decide, never the ids, which may exist in both."""
    names = referenced(db, _schema(table)["properties"]["type"]["x-references"]).split(".", 1)[0]
    if names != "STRING_IDS":  # STRING_IDS was checked for every db with these tables
        validate_table(db, _schema(names))
        _check_ids_once(db, names)
    return names, TEXT_COLUMN[names]


def _names(db: Database, ids: pd.Series) -> pd.Series:
    """STRING_IDS ids → text (NA for NULL and the invalid-id marker; validate_table checked the rest)."""
    strings = dict(db.query("SELECT id, value FROM STRING_IDS", table="STRING_IDS"))
    distinct = {int(i): strings.get(int(i)) for i in ids.dropna().unique()}
    return pd.Series(ids.map(distinct), dtype="string")


def _string_ref_missing(db: Database, table: str, column: str, frame: pd.DataFrame, name: str, why: str) -> None:
    """A row whose id is the invalid marker (so it names nothing) where a name is needed."""
    missing = frame[name].isna()
    if missing.any():
        rowid = int(frame.loc[missing.idxmax(), "rowid"])
        raise InputError(f"table {table} rowid {rowid}: {why}", file=db.path, column=f"{table}.{column}",
                         expected="an id present in STRING_IDS", found=str(INVALID_ID))


def read_memory_record(db: Database) -> list[tuple[str, str, Table]]:
    validate_table(db, _schema("MEMORY_RECORD"))
    _check_devices(db, "MEMORY_RECORD")
    # Ids, not a join: mapping the few distinct ids in pandas is cheaper than a string per row from sqlite.
    frame = db.frame(
        "SELECT rowid, component, timestamp, totalAllocated, totalReserved, totalActive, deviceId "
        "FROM MEMORY_RECORD ORDER BY rowid",
        ("rowid", "component", "t_ns", "allocated", "reserved", "active", "device_id"),
        ("int", "int", "int", "int", "int", "int", "int"), table="MEMORY_RECORD")
    frame["component"] = _names(db, frame["component"])
    _string_ref_missing(db, "MEMORY_RECORD", "component", frame, "component", "component id is the invalid-id marker")
    # the components torch_npu writes (its memory_record.csv schema's list): another name is no series of ours
    known = load_schema("torch_npu.memory_record")["properties"]["Component"]["enum"]
    bad = ~frame["component"].isin(known).fillna(True)
    if bad.any():
        row = frame.loc[bad.idxmax()]
        raise InputError(f"table MEMORY_RECORD rowid {int(row['rowid'])}: unknown component", file=db.path,
                         column="MEMORY_RECORD.component", expected="one of " + ", ".join(known),
                         found=repr(row["component"]))
    frame["device"] = _device_labels(frame["device_id"])
    return split_series(frame)


def read_op_memory(db: Database) -> list[tuple[str, Table]]:
    validate_table(db, _schema("OP_MEMORY"))
    _check_devices(db, "OP_MEMORY")
    # The allocated total drops at the earlier of releaseTime and activeReleaseTime (see
    # torch_npu.read_operator_memory): a block another stream still uses is handed back later.
    active = "activeReleaseTime" if "activeReleaseTime" in db.columns("OP_MEMORY") else "NULL"
    frame = db.frame(
        f"SELECT rowid, name, size, allocationTime, releaseTime, {active}, allocationTotalAllocated, streamPtr, "
        "deviceId FROM OP_MEMORY ORDER BY rowid",
        ("rowid", "name", "size", "t_alloc", "t_release", "t_active_release", "alloc_total", "stream", "device_id"),
        ("int", "int", "int", "int", "int", "int", "int", "int", "int"), table="OP_MEMORY")
    release, active_release = frame["t_release"], frame["t_active_release"]
    frame["t_free"] = release.where(active_release.isna() | (release <= active_release).fillna(False), active_release)
    frame["name"] = _names(db, frame["name"])
    release_only = frame["size"] < 0
    bad = (release_only & frame["t_alloc"].notna()) | (~release_only & frame["t_alloc"].isna())
    if bad.any():
        row = frame.loc[bad.idxmax()]
        raise InputError(
            f"table OP_MEMORY rowid {int(row['rowid'])}: a block needs an allocationTime unless its size is "
            "negative (allocated before the window)", file=db.path, column="OP_MEMORY.allocationTime",
            expected="allocationTime NULL exactly when size < 0",
            found=f"size {row['size']}, allocationTime {row['t_alloc']}")
    bad = release_only & frame["t_free"].isna()
    if bad.any():
        rowid = int(frame.loc[bad.idxmax(), "rowid"])
        raise InputError(f"table OP_MEMORY rowid {rowid}: a release-only row (negative size) needs a releaseTime",
                         file=db.path, column="OP_MEMORY.releaseTime", expected="an integer (ns)", found="NULL")
    stream = _marker_to_na(frame["stream"])
    # torch_npu writes GE blocks (from CANN NPU_OP_MEM) without a stream; PTA blocks always have one.
    is_ge = frame["stream"].isna()
    name = frame["name"]
    prefixed = name.where(~is_ge | name.isna() | name.str.startswith("cann::"), "cann::" + name)
    blocks = pd.DataFrame({
        "size": frame["size"].abs(),
        "t_alloc": frame["t_alloc"],
        "t_free": frame["t_free"],
        "op": pd.Series(prefixed, dtype="string"),
        "stream": pd.Series(stream.astype("string"), dtype="string"),
        "owner": pd.Series(pd.NA, index=frame.index, dtype="string"),
        "component": pd.Series(np.where(is_ge.to_numpy(), "GE", "PTA"), dtype="string"),
        "alloc_total": frame["alloc_total"],
    })
    return by_device(typed_blocks(blocks), key_texts(_device_labels(frame["device_id"])))


def read_npu_op_mem(db: Database) -> tuple[list[tuple[str, Table]], list[tuple[str, str, Table]], list[str]]:
    """CANN GE allocate/release events → blocks and the GE totals series (msprof db)."""
    validate_table(db, _schema("NPU_OP_MEM"))
    _check_devices(db, "NPU_OP_MEM")
    names, text = _type_names(db, "NPU_OP_MEM")
    has_component = "component" in db.columns("NPU_OP_MEM")
    component_sql = "c.value" if has_component else "NULL"
    join = "LEFT JOIN STRING_IDS c ON c.id = m.component" if has_component else ""
    frame = db.frame(
        f"SELECT m.rowid, n.value, CAST(m.addr AS TEXT), lower(t.{text}), m.size, m.timestampNs, m.totalAllocate, "
        f"m.totalReserve, {component_sql}, m.deviceId FROM NPU_OP_MEM m LEFT JOIN STRING_IDS n ON n.id = m.operatorName "
        f"LEFT JOIN {names} t ON t.id = m.type {join} ORDER BY m.rowid",
        ("rowid", "name", "addr", "kind", "size", "t_ns", "allocated", "reserved", "component", "device_id"),
        ("int", "text", "text", "text", "int", "int", "int", "int", "text", "int"), table="NPU_OP_MEM")
    bad = ~frame["kind"].isin(["allocate", "release"]).fillna(False)
    if bad.any():
        row = frame.loc[bad.idxmax()]
        raise InputError(f"table NPU_OP_MEM rowid {int(row['rowid'])}: unknown event type", file=db.path,
                         column="NPU_OP_MEM.type", expected=f"{names} {text} 'allocate' or 'release'",
                         found=repr(row["kind"]) if not pd.isna(row["kind"]) else f"an id not in {names}")
    frame["component"] = frame["component"].fillna("GE")
    relabelled = _op_components(frame)
    frame["device"] = _device_labels(frame["device_id"])
    keys = [pd.factorize(frame[c])[0] for c in ("device", "component", "addr")]
    is_alloc = (frame["kind"] == "allocate").to_numpy(dtype=bool)
    pairs = pair_events(keys, frame["t_ns"].to_numpy(dtype=np.int64), frame["rowid"].to_numpy(dtype=np.int64), is_alloc)
    names = frame["name"].astype("string")
    op = names.where(names.isna() | names.str.startswith("cann::"), "cann::" + names)
    a, f = pairs.alloc_rows, pairs.free_rows
    first = np.where(a >= 0, a, f)  # the row a block's size, name and device come from
    blocks = pd.DataFrame({
        "size": take(frame["size"], first),
        "t_alloc": take(frame["t_ns"], a),
        "t_free": take(frame["t_ns"], f),
        "op": take(op, first),
        "stream": pd.Series(pd.NA, index=range(len(first)), dtype="string"),
        "owner": pd.Series(pd.NA, index=range(len(first)), dtype="string"),
        "component": take(frame["component"].astype("string"), first),
        "alloc_total": take(frame["allocated"], a),
    })
    devices = take(frame["device"], first)
    start = blocks["t_alloc"].fillna(blocks["t_free"]).to_numpy(dtype=np.int64, na_value=0)
    order = np.lexsort((first, start))
    blocks_of = by_device(typed_blocks(blocks.iloc[order]), key_texts(devices.iloc[order]))
    series_frame = pd.DataFrame({
        "device": frame["device"], "component": frame["component"], "t_ns": frame["t_ns"],
        "allocated": frame["allocated"], "reserved": frame["reserved"],
        "active": pd.Series(pd.NA, index=frame.index, dtype="Int64"),
    })
    return blocks_of, split_series(series_frame), relabelled + repair_notes(pairs, "allocate", "release")


# Names memgate gives a whole-process or summed series: NPU_OP_MEM's rows are operator memory (msprof
# labels them GE), and a label taking one of these names would pass its totals off as that series.
_NOT_OP_COMPONENTS = (APP_COMPONENT, "PTA+GE", "MindSpore+GE")  # the sums: metrics.SERIES_PARTS


def _op_components(frame: pd.DataFrame) -> list[str]:
    """Rows labelled with one of :data:`_NOT_OP_COMPONENTS` read as GE, what msprof writes for every
    NPU_OP_MEM row (a hand-edited db relabelled them); a note says how many and which labels."""
    bad = frame["component"].isin(_NOT_OP_COMPONENTS)
    if not bad.any():
        return []
    labels = sorted(set(frame.loc[bad, "component"]))
    first = int(frame.loc[bad.idxmax(), "rowid"])
    frame.loc[bad, "component"] = "GE"
    return [(f"NPU_OP_MEM: {int(bad.sum())} row(s) (first rowid {first}) labelled {', '.join(map(repr, labels))} "
             "read as GE: their totals are operator memory, not a whole-process or summed series")]


def read_npu_mem(db: Database) -> list[tuple[str, str, Table]]:
    validate_table(db, _schema("NPU_MEM"))
    _check_devices(db, "NPU_MEM")
    names, text = _type_names(db, "NPU_MEM")
    frame = db.frame(
        f"SELECT n.rowid, lower(s.{text}), n.ddr, n.hbm, n.timestampNs, n.deviceId "
        f"FROM NPU_MEM n LEFT JOIN {names} s ON s.id = n.type ORDER BY n.rowid",
        ("rowid", "kind", "ddr", "hbm", "t_ns", "device_id"), ("int", "text", "int", "int", "int", "int"),
        table="NPU_MEM")
    bad = ~frame["kind"].isin(list(NPU_MEM_KINDS)).fillna(False)
    if bad.any():
        row = frame.loc[bad.idxmax()]
        raise InputError(f"table NPU_MEM rowid {int(row['rowid'])}: unknown memory type", file=db.path,
                         column="NPU_MEM.type", expected=f"{names} {text} 'app' or 'device'",
                         found=repr(row["kind"]) if not pd.isna(row["kind"]) else f"an id not in {names}")
    frame["device"] = _device_labels(frame["device_id"])
    who = frame["kind"].map(NPU_MEM_KINDS)
    parts = []
    for column in ("ddr", "hbm"):  # added up below
        check_bytes(frame[column].fillna(0).to_numpy(dtype=np.int64), db.path, f"NPU_MEM.{column}")
    for suffix, values in (("DDR", frame["ddr"]), ("HBM", frame["hbm"]), ("Memory", frame["ddr"] + frame["hbm"])):
        parts.append(pd.DataFrame({
            "device": frame["device"], "component": "NPU MEM " + who + "/" + suffix, "t_ns": frame["t_ns"],
            "allocated": pd.Series(pd.NA, index=frame.index, dtype="Int64"), "reserved": values,
            "active": pd.Series(pd.NA, index=frame.index, dtype="Int64"),
        }))
    result = split_series(pd.concat(parts, ignore_index=True))
    # APP = the whole process's device memory (ddr + hbm), as memory_record.csv's APP rows.
    result += [(d, "APP", f) for d, c, f in result if c == "NPU MEM APP/Memory"]
    return result


def read_npu_module_mem(db: Database) -> list[tuple[str, str, Table]]:
    validate_table(db, _schema("ENUM_MODULE"))
    validate_table(db, _schema("NPU_MODULE_MEM"))
    _check_devices(db, "NPU_MODULE_MEM")
    frame = db.frame(
        "SELECT m.rowid, e.name, m.timestampNs, m.totalReserved, m.deviceId "
        "FROM NPU_MODULE_MEM m LEFT JOIN ENUM_MODULE e ON e.id = m.moduleId ORDER BY m.rowid",
        ("rowid", "component", "t_ns", "reserved", "device_id"), ("int", "text", "int", "int", "int"),
        table="NPU_MODULE_MEM")
    _string_ref_missing(db, "NPU_MODULE_MEM", "moduleId", frame, "component", "module id is the invalid-id marker")
    frame["device"] = _device_labels(frame["device_id"])
    frame["allocated"] = pd.Series(pd.NA, index=frame.index, dtype="Int64")
    frame["active"] = pd.Series(pd.NA, index=frame.index, dtype="Int64")
    return split_series(frame)


def read_step_time(db: Database) -> Table:
    validate_table(db, _schema("STEP_TIME"))
    frame = db.frame("SELECT rowid, id, startNs, endNs FROM STEP_TIME ORDER BY rowid",
                     ("rowid", "step", "t_start", "t_end"), ("int",) * 4, table="STEP_TIME")
    bad = frame["t_end"] < frame["t_start"]
    if bad.any():
        row = frame.loc[bad.idxmax()]
        raise InputError(f"table STEP_TIME rowid {int(row['rowid'])}: step ends before it starts", file=db.path,
                         column="STEP_TIME.endNs", expected=f">= startNs {row['t_start']}", found=str(row["t_end"]))
    steps = int_table(frame, STEP_COLUMNS)
    check_steps(steps, db.path, column="STEP_TIME", where=[f"rowid {int(r)}" for r in frame["rowid"]])
    return steps_in_order(steps)


def read_meta_data(db: Database) -> dict[str, str]:
    if not db.has("META_DATA"):
        return {}
    validate_table(db, _schema("META_DATA"))
    return {str(name): str(value) for name, value in db.query("SELECT name, value FROM META_DATA", table="META_DATA")
            if value is not None}


def read_rank_device_map(db: Database) -> list[tuple[int, int]]:
    if not db.has("RANK_DEVICE_MAP"):
        return []
    validate_table(db, _schema("RANK_DEVICE_MAP"))
    rows = db.query(f"SELECT rankId, deviceId FROM {quote_ident('RANK_DEVICE_MAP')}", table="RANK_DEVICE_MAP")
    return [(int(r), int(d)) for r, d in rows]


def rank_of(db_path: Path, profile_path: Path, meta: dict[str, str], rank_map: list[tuple[int, int]]) -> str:
    """The file name's ``_{rank}`` suffix, else META_DATA's rank, else RANK_DEVICE_MAP, else a ``rank_N``
    directory name, else "0" (a run without distribution writes no suffix and rank 4294967295)."""
    if (m := TORCH_DB.match(db_path.name)) and m.group(1) is not None:
        return str(int(m.group(1)))
    for key in ("rank_id", "RANK_ID", "rankId"):
        value = meta.get(key, "").strip()
        if not value:
            continue
        if not _ASCII_INT.fullmatch(value):
            raise InputError(f"table META_DATA: {key} is not a whole number", file=db_path, column=f"META_DATA.{key}",
                             expected="an integer in ASCII digits", found=repr(value)[:60])
        if int(value) >= 0 and int(value) != INVALID_ID:
            return str(int(value))
    ranks = {r for r, _ in rank_map if r != INVALID_ID and r >= 0}
    if len(ranks) == 1:
        return str(ranks.pop())
    return registry.rank_in_names(profile_path.name, profile_path.parent.name) or "0"


# Asked before the torch_npu text loader: a directory with a db and only trace_view.json is better
# read from the db; a directory with the text CSVs is not claimed here (see the module docstring).
registry.register(registry.Format(FORMAT, claims, load, named=lambda path: path.is_file() and bool(
    TORCH_DB.match(path.name) or MSPROF_DB.match(path.name))), before="torch_npu")

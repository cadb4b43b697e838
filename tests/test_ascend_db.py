"""memgate.loaders.ascend.ascend_db (reading through memgate.readers.sqlitetable, whose own tests are
tests/test_sqlitetable.py): the real torch_npu db sample, the real early msprof db (types in
ENUM_MEMORY), the writers' round trip, and bad input.

Expected values are derived here from the raw file with sqlite3 (and csv for the text export),
never copied from memgate's output.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sqlite3
from pathlib import Path

import jsonschema
import pytest
from groundtruth import expected_metrics
from helpers import ASCEND, PTA21_L1, db_exec, edited_db, one_stderr_line, run_cli
from hypothesis import given
from strategies import secondary_examples, traces
from writers.ascend_db import app_peak, write_msprof_db, write_torch_db

from memgate import discover
from memgate.errors import InputError
from memgate.loaders.ascend import ascend_db
from memgate.metrics import device_metrics
from memgate.readers.sqlitetable import open_db, referenced, validate_table
from memgate.schemas import load_schema, schema_names

DB_DIR = ASCEND / "msinsight_pta21_db_level0_rank0"
DB = DB_DIR / "ascend_pytorch_profiler_0.db"
MSPROF_DIR = ASCEND / "msinsight_msprof_db_2024_enum_memory"  # PROVENANCE.md §6
MSPROF_DB = MSPROF_DIR / "msprof_0.db"
REAL_DBS = (DB, MSPROF_DB)
METRICS = ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation", "step_growth_bytes", "leaked_bytes",
           "op_max_block_bytes")


def raw(sql: str, path: Path = DB) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def component_max(column: str, component: str) -> int:
    return raw(f"SELECT max(m.{column}) FROM MEMORY_RECORD m JOIN STRING_IDS s ON s.id = m.component "
               f"WHERE s.value = '{component}'")[0][0]


@pytest.fixture(scope="module")
def sample() -> tuple:
    profile = ascend_db.load(DB)
    assert [d.device for d in profile.devices] == ["npu:0"]
    return profile, device_metrics(profile, profile.devices[0])


# --- the real sample -------------------------------------------------------------------------------

def test_sample_peaks_come_from_the_pta_ge_series(sample: tuple) -> None:
    profile, metrics = sample
    peak_alloc, peak_res = component_max("totalAllocated", "PTA+GE"), component_max("totalReserved", "PTA+GE")
    assert (peak_alloc, peak_res) == (1245819904, 1600913408)  # sanity: what sqlite3 says
    assert metrics.component == "PTA+GE"
    assert metrics.values["peak_allocated_bytes"] == peak_alloc
    assert metrics.values["peak_reserved_bytes"] == peak_res
    # Fragmentation is per pool (PTA+GE sums two allocators whose peaks fall apart): the worst pool.
    pools = {c: 1 - component_max("totalAllocated", c) / component_max("totalReserved", c) for c in ("PTA", "GE")}
    assert metrics.pool_of["fragmentation"] == "PTA" == max(pools, key=pools.__getitem__)
    assert metrics.values["fragmentation"] == pools["PTA"]
    assert round(pools["PTA"], 4) == 0.1818
    for component in ("PTA", "GE"):
        frame = profile.devices[0].series[component].frame.to_pandas()
        assert int(frame["allocated"].max()) == component_max("totalAllocated", component)
        assert len(frame) == raw(f"SELECT count(*) FROM MEMORY_RECORD m JOIN STRING_IDS s ON s.id = m.component "
                                 f"WHERE s.value = '{component}'")[0][0]


def test_sample_app_series_is_app_ddr_plus_hbm(sample: tuple) -> None:
    profile, metrics = sample
    (app,) = raw("SELECT max(n.ddr + n.hbm) FROM NPU_MEM n JOIN STRING_IDS s ON s.id = n.type WHERE s.value = 'app'")[0]
    (device,) = raw("SELECT max(n.ddr + n.hbm) FROM NPU_MEM n JOIN STRING_IDS s ON s.id = n.type "
                    "WHERE s.value = 'device'")[0]
    assert metrics.values["peak_app_reserved_bytes"] == app == 2212081664
    series = profile.devices[0].series
    assert int(series["NPU MEM Device/Memory"].frame.to_pandas()["reserved"].max()) == device
    assert len(series["APP"].frame) == raw("SELECT count(*) FROM NPU_MEM n JOIN STRING_IDS s ON s.id = n.type "
                                           "WHERE s.value = 'app'")[0][0]


def test_sample_module_series(sample: tuple) -> None:
    profile, _ = sample
    expected = dict(raw("SELECT e.name, max(m.totalReserved) FROM NPU_MODULE_MEM m JOIN ENUM_MODULE e "
                        "ON e.id = m.moduleId GROUP BY e.name"))
    got = {name.removeprefix("module:"): int(s.frame.to_pandas()["reserved"].max())
           for name, s in profile.devices[0].series.items() if name.startswith("module:")}
    assert got == expected
    assert got["HCCL"] == 423690240


def test_sample_blocks_and_op_max(sample: tuple) -> None:
    profile, metrics = sample
    rows = raw("SELECT s.value, o.size, o.allocationTime, o.releaseTime, o.streamPtr FROM OP_MEMORY o "
               "LEFT JOIN STRING_IDS s ON s.id = o.name")
    expected: dict[str, int] = {}
    for name, size, alloc, _release, stream in rows:
        op = name if stream is not None else f"cann::{name}"  # GE blocks: no stream, no cann:: prefix
        if alloc is not None and name:
            expected[op] = max(expected.get(op, 0), size)
    assert metrics.values["op_max_block_bytes"] == expected
    assert expected["aten::_foreach_add"] == 150995456
    blocks = profile.devices[0].blocks.to_pandas()
    assert len(blocks) == len(rows) == 184
    assert int(blocks["t_free"].isna().sum()) == sum(r[3] is None for r in rows) == 24
    assert int((blocks["component"] == "GE").sum()) == sum(r[4] is None for r in rows) == 57
    assert sorted(blocks["size"].astype(int)) == sorted(r[1] for r in rows)


def test_sample_steps_rank_and_exact_ns(sample: tuple) -> None:
    profile, _ = sample
    assert profile.rank == "0" and profile.format == "ascend_db"
    assert [tuple(map(int, r)) for r in profile.steps.to_pandas().to_numpy()] == raw("SELECT id, startNs, endNs FROM STEP_TIME")
    first = raw("SELECT min(m.timestamp) FROM MEMORY_RECORD m JOIN STRING_IDS s ON s.id = m.component "
                "WHERE s.value = 'PTA'")[0][0]
    assert int(profile.devices[0].series["PTA"].frame.to_pandas()["t_ns"].iloc[0]) == first == 1736407067941451180
    assert profile.metadata["schema_version"] == "1.0.0"


def test_sample_inspect_json_cli() -> None:
    rc, out, err = run_cli(["inspect", DB, "--json"])
    assert rc == 0, err
    (entry,) = json.loads(out)["profiles"]
    assert entry["format"] == "ascend_db" and entry["rank"] == "0"
    (device,) = entry["devices"]
    assert device["metrics"]["peak_allocated_bytes"] == component_max("totalAllocated", "PTA+GE")
    assert device["metrics"]["peak_app_reserved_bytes"] == 2212081664
    assert entry["steps"] == [{"step": 50, "t_start": 1736407067933660740, "t_end": 1736407068072327480}]


def test_sample_is_the_same_workload_as_the_level1_text_export_but_another_run() -> None:
    """The db (level0) and the text export (level1) of the msinsight campaign: same blocks and per-
    component curves, different runs (30 min apart), so only PTA+GE's peak differs."""
    with open(PTA21_L1 / "operator_memory.csv", newline="", encoding="utf-8") as fh:
        text_blocks = list(csv.DictReader(fh))
    with open(PTA21_L1 / "memory_record.csv", newline="", encoding="utf-8") as fh:
        records = list(csv.DictReader(fh))
    text_sizes = sorted(round(float(r["Size(KB)"]) * 1024) for r in text_blocks)
    assert text_sizes == sorted(r[0] for r in raw("SELECT size FROM OP_MEMORY"))
    for component in ("PTA", "GE"):
        text_max = max(round(float(r["Total Allocated(MB)"]) * 1024 * 1024) for r in records
                       if r["Component"] == component)
        assert text_max == component_max("totalAllocated", component)
    text_pta_ge = max(round(float(r["Total Allocated(MB)"]) * 1024 * 1024) for r in records
                      if r["Component"] == "PTA+GE")
    assert text_pta_ge == 1322299392 != component_max("totalAllocated", "PTA+GE")
    text_start = min(int(r["Timestamp(us)"].strip().split(".")[0]) for r in records) * 1000
    db_start = raw("SELECT min(timestamp) FROM MEMORY_RECORD")[0][0]
    assert abs(text_start - db_start) > 60 * 10**9


def test_loading_writes_nothing_next_to_the_db(tmp_path: Path) -> None:
    before = sorted(os.listdir(DB_DIR))
    ascend_db.load(DB)  # the sample directory is read-only
    assert sorted(os.listdir(DB_DIR)) == before
    copy = tmp_path / "ascend_pytorch_profiler_0.db"
    shutil.copyfile(DB, copy)
    stamp = copy.stat().st_mtime_ns
    ascend_db.load(copy)
    assert os.listdir(tmp_path) == [copy.name] and copy.stat().st_mtime_ns == stamp


# --- the real early msprof db: NPU_OP_MEM.type is an ENUM_MEMORY id ----------------------------------

# The framework series memgate takes first (docs/design.md, "The normalized model").
FRAMEWORK_ORDER = ("PTA+GE", "MindSpore+GE", "PTA", "MindSpore", "allocator", "GE")


# The names of memgate's whole-process and summed series: NPU_OP_MEM rows labelled so read as GE,
# the label msprof writes on every such row (this hand-edited file says APP and PTA+GE).
NOT_OP_COMPONENTS = ("APP", "PTA+GE", "MindSpore+GE")


def op_mem_events() -> list[tuple]:
    """(rowid, kind, op, component, addr, size, t, allocated, reserved, device) with sqlite3 alone: the
    type through ENUM_MEMORY, the names through STRING_IDS, a label of NOT_OP_COMPONENTS as GE."""
    rows = raw("SELECT m.rowid, e.name, n.value, c.value, m.addr, m.size, m.timestampNs, m.totalAllocate, "
               "m.totalReserve, m.deviceId FROM NPU_OP_MEM m JOIN ENUM_MEMORY e ON e.id = m.type "
               "LEFT JOIN STRING_IDS n ON n.id = m.operatorName LEFT JOIN STRING_IDS c ON c.id = m.component "
               "ORDER BY m.rowid", MSPROF_DB)
    return [(*r[:3], "GE" if r[3] in NOT_OP_COMPONENTS else r[3], *r[4:]) for r in rows]


def paired_blocks(events: list[tuple]) -> list[tuple]:
    """Each release closes the open allocate of its (device, component, addr), in (time, rowid) order;
    a release with none is a block from before the window, an allocate never closed is still live.
    Blocks as (device, component, op, size, t_alloc, t_free, allocated at the allocate)."""
    open_: dict[tuple, tuple] = {}
    seen: set[tuple] = set()
    blocks = []
    for _rowid, kind, op, component, addr, size, t, allocated, _reserved, device in sorted(
            events, key=lambda e: (e[6], e[0])):
        key = (device, component, addr)
        if kind == "allocate":
            assert key not in open_  # this file: no address allocated twice without its release
            open_[key] = (op, size, t, allocated)
        elif key in open_:
            op, size, t_alloc, at_alloc = open_.pop(key)
            blocks.append((device, component, op, size, t_alloc, t, at_alloc))
        elif key in seen:  # a release of an address already freed, no allocate in between: dropped
            continue  # (this file: the hand-added release at the instant GE's own release of it is written)
        else:
            blocks.append((device, component, op, size, None, t, None))
        seen.add(key)
    blocks += [(device, component, op, size, t, None, at_alloc)
               for (device, component, _addr), (op, size, t, at_alloc) in open_.items()]
    return blocks


@pytest.fixture(scope="module")
def msprof() -> tuple:
    profile = ascend_db.load(MSPROF_DB)
    return profile, {d.device: device_metrics(profile, d) for d in profile.devices}


def test_msprof_sample_types_are_enum_memory_ids() -> None:
    """What the loader must get right: the ids 5 and 6 name allocate/release in ENUM_MEMORY, while
    STRING_IDS holds unrelated text under the same ids (and its own 'allocate'/'release' elsewhere)."""
    assert raw("SELECT id, name FROM ENUM_MEMORY ORDER BY id", MSPROF_DB) == [
        (0, "app"), (1, "device"), (3, "read"), (4, "write"), (5, "allocate"), (6, "release")]
    assert raw("SELECT type, count(*) FROM NPU_OP_MEM GROUP BY type", MSPROF_DB) == [(5, 247), (6, 247)]
    assert raw("SELECT id, value FROM STRING_IDS WHERE id IN (5, 6, 1403, 1404) ORDER BY id", MSPROF_DB) == [
        (5, '"1676480000"'), (6, "aclnnCast_CastAiCore_Cast"), (1403, "allocate"), (1404, "release")]
    assert len(op_mem_events()) == raw("SELECT count(*) FROM NPU_OP_MEM", MSPROF_DB)[0][0] == 494
    assert MSPROF_DB.read_bytes()[18:20] == b"\x02\x02"  # WAL mode: a plain open would create -wal / -shm


def test_msprof_sample_blocks_are_the_paired_events(msprof: tuple) -> None:
    profile, _ = msprof
    events = op_mem_events()
    expected = paired_blocks(events)
    assert len(expected) == 247  # 246 pairs and the hand-added allocate (its hand-added release dropped)
    assert raw("SELECT DISTINCT c.value FROM NPU_OP_MEM m JOIN STRING_IDS c ON c.id = m.component ORDER BY 1",
               MSPROF_DB) == [("APP",), ("PTA+GE",)]  # as the file labels them
    assert [d.device for d in profile.devices] == sorted({f"npu:{e[9]}" for e in events}) == ["npu:0"]
    got = []
    for device in profile.devices:
        frame = device.blocks.to_pandas().astype(object).where(lambda f: f.notna(), None)
        got += [(int(device.device.removeprefix("npu:")), r.component, r.op.removeprefix("cann::"), r.size,
                 r.t_alloc, r.t_free, r.alloc_total) for r in frame.itertuples()]
        assert all(op.startswith("cann::") for op in frame["op"])
    assert sorted(got, key=str) == sorted(expected, key=str)
    assert profile.metadata["export"] == "msprof db"
    assert profile.metadata["notes"] == [
        ("NPU_OP_MEM: 494 row(s) (first rowid 1) labelled 'APP', 'PTA+GE' read as GE: their totals are operator "
         "memory, not a whole-process or summed series"),
        "1 release(s) of an address already freed, with no allocate in between: dropped"]


def test_msprof_sample_series_and_peaks(msprof: tuple) -> None:
    """One GE series (the file's APP and PTA+GE labels read as GE: see PROVENANCE.md §6), the totals
    written with its events; the peaks are those of that series: 604110848 B allocated, not the 131072 B
    of the two rows the file labels PTA+GE."""
    profile, metrics = msprof
    events = op_mem_events()
    components = sorted({e[3] for e in events})
    assert components == ["GE"]
    (device,) = profile.devices
    assert sorted(device.series) == components
    for component in components:
        rows = sorted((e[6], e[7], e[8]) for e in events if e[3] == component)
        frame = device.series[component].frame.to_pandas()
        assert sorted(zip(frame["t_ns"].astype(int), frame["allocated"].astype(int), frame["reserved"].astype(int),
                          strict=True)) == rows
    framework = next(c for c in FRAMEWORK_ORDER if c in components)
    measured = metrics["npu:0"]
    assert measured.component == framework
    assert measured.values["peak_allocated_bytes"] == max(e[7] for e in events if e[3] == framework)
    assert measured.values["peak_reserved_bytes"] == max(e[8] for e in events if e[3] == framework)
    op_max: dict[str, int] = {}
    for _device, _component, op, size, t_alloc, _t_free, _at in paired_blocks(events):
        if t_alloc is not None:
            op_max["cann::" + op] = max(op_max.get("cann::" + op, 0), size)
    assert measured.values["op_max_block_bytes"] == op_max


def test_msprof_sample_inspect_json_writes_nothing_beside_it(tmp_path: Path) -> None:
    before = sorted(os.listdir(MSPROF_DIR))
    copy = tmp_path / MSPROF_DB.name
    shutil.copyfile(MSPROF_DB, copy)
    stamp = copy.stat().st_mtime_ns
    for target in (MSPROF_DIR, copy):  # the folder, as the report found it, and the file
        rc, out, err = run_cli(["inspect", "--json", target])
        assert rc == 0, err
        (entry,) = json.loads(out)["profiles"]
        assert entry["format"] == "ascend_db" and entry["metadata"]["export"] == "msprof db"
    assert os.listdir(tmp_path) == [copy.name] and copy.stat().st_mtime_ns == stamp  # no -wal, no -shm
    assert sorted(os.listdir(MSPROF_DIR)) == before


def test_msprof_sample_in_the_string_ids_form_reads_the_same(tmp_path: Path, msprof: tuple) -> None:
    """The same events with the types re-keyed to STRING_IDS (which lists allocate/release in this file)
    and ENUM_MEMORY dropped, as msprof writes dbs since: the tables present decide, the figures agree."""
    profile, _ = msprof
    path = edited_db(MSPROF_DB, tmp_path / MSPROF_DB.name,
                     "UPDATE NPU_OP_MEM SET type = CASE type WHEN 5 THEN 1403 WHEN 6 THEN 1404 END",
                     "DROP TABLE ENUM_MEMORY")
    (device,) = ascend_db.load(path).devices
    assert device.blocks.to_pandas().equals(profile.devices[0].blocks.to_pandas())
    assert {c: s.frame.to_pandas().to_dict() for c, s in device.series.items()} == \
        {c: s.frame.to_pandas().to_dict() for c, s in profile.devices[0].series.items()}


def test_msprof_writer_enum_memory_form_reads_as_the_string_ids_form(tmp_path: Path) -> None:
    """NPU_OP_MEM and NPU_MEM written both ways (writers/ascend_db.py): the same blocks and series."""
    from corpus import small_trace

    (tmp_path / "strings").mkdir()
    (tmp_path / "enum").mkdir()
    (strings,) = ascend_db.load(write_msprof_db(small_trace(), tmp_path / "strings")).devices
    path = write_msprof_db(small_trace(), tmp_path / "enum", enum_memory=True)
    (enum,) = ascend_db.load(path).devices
    assert raw("SELECT DISTINCT type FROM NPU_MEM ORDER BY type", path) == [(0,), (1,)]
    assert enum.blocks.to_pandas().equals(strings.blocks.to_pandas())
    assert sorted(enum.series) == sorted(strings.series) and "APP" in enum.series
    for name, series in strings.series.items():
        assert enum.series[name].frame.to_pandas().equals(series.frame.to_pandas()), name


BAD_MSPROF = {
    "type id in no ENUM_MEMORY row": (("UPDATE NPU_OP_MEM SET type = 99 WHERE rowid = 7",),
                                      "table NPU_OP_MEM rowid 7: id not found in ENUM_MEMORY", "NPU_OP_MEM.type", "99"),
    # 1403 is 'allocate' in this file's STRING_IDS: with ENUM_MEMORY present it is no type id all the same
    "a STRING_IDS id where ENUM_MEMORY is used": (("UPDATE NPU_OP_MEM SET type = 1403 WHERE rowid = 9",),
                                                   "table NPU_OP_MEM rowid 9: id not found in ENUM_MEMORY",
                                                   "NPU_OP_MEM.type", "1403"),
    "an ENUM_MEMORY name that is no event": (("UPDATE NPU_OP_MEM SET type = 3 WHERE rowid = 11",),
                                              "table NPU_OP_MEM rowid 11: unknown event type", "NPU_OP_MEM.type",
                                              "'read'"),
    "type id in neither table": (("UPDATE NPU_OP_MEM SET type = 123456789 WHERE rowid = 4", "DROP TABLE ENUM_MEMORY"),
                                 "table NPU_OP_MEM rowid 4: id not found in STRING_IDS", "NPU_OP_MEM.type",
                                 "123456789"),
    "ENUM_MEMORY lists an id twice": (("CREATE TABLE E2 AS SELECT * FROM ENUM_MEMORY", "DROP TABLE ENUM_MEMORY",
                                       "ALTER TABLE E2 RENAME TO ENUM_MEMORY",
                                       "INSERT INTO ENUM_MEMORY VALUES (5, 'release')"),
                                      "table ENUM_MEMORY lists id 5 2 times", "ENUM_MEMORY.id", "2 rows with id 5"),
    "ENUM_MEMORY name not text": (("UPDATE ENUM_MEMORY SET name = NULL WHERE id = 6",),
                                  "table ENUM_MEMORY rowid 6: wrong type", "ENUM_MEMORY.name", "null NULL"),
}


@pytest.mark.parametrize("case", list(BAD_MSPROF), ids=list(BAD_MSPROF))
def test_bad_msprof_db_is_an_input_error(tmp_path: Path, case: str) -> None:
    statements, message, column, found = BAD_MSPROF[case]
    path = edited_db(MSPROF_DB, tmp_path / MSPROF_DB.name, *statements)
    with pytest.raises(InputError) as info:
        ascend_db.load(path)
    err = info.value
    assert err.file == str(path)
    assert err.message.startswith(message), err.one_line()
    assert (err.column, err.found is not None and err.found.startswith(found)) == (column, True), err.one_line()
    assert err.expected
    assert sorted(os.listdir(tmp_path)) == [MSPROF_DB.name]


def test_unknown_npu_mem_type_in_enum_memory(tmp_path: Path) -> None:
    from corpus import small_trace

    path = write_msprof_db(small_trace(), tmp_path, enum_memory=True)
    db_exec(path, "UPDATE NPU_MEM SET type = 4 WHERE rowid = 2")  # ENUM_MEMORY 4 = write
    with pytest.raises(InputError) as info:
        ascend_db.load(path)
    err = info.value
    assert (err.message, err.column, err.found) == ("table NPU_MEM rowid 2: unknown memory type", "NPU_MEM.type",
                                                    "'write'")
    assert err.expected == "ENUM_MEMORY name 'app' or 'device'"


# --- detection ---------------------------------------------------------------------------------------

def _rank_dir(tmp_path: Path, rank: int = 3) -> Path:
    out = tmp_path / "node1_1234_20250101_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    shutil.copyfile(DB, out / f"ascend_pytorch_profiler_{rank}.db")
    return out.parent


def test_discover_claims_an_ascend_pt_dir_with_only_the_db(tmp_path: Path) -> None:
    profile_dir = _rank_dir(tmp_path)
    (found,) = discover.discover(tmp_path)
    assert found.path == profile_dir and found.format.name == "ascend_db"
    profile = discover.load(found)
    assert profile.rank == "3" and profile.path == str(profile_dir)


def test_text_export_wins_over_the_db(tmp_path: Path) -> None:
    profile_dir = _rank_dir(tmp_path)
    for name in ("memory_record.csv", "operator_memory.csv"):
        shutil.copyfile(PTA21_L1 / name, profile_dir / "ASCEND_PROFILER_OUTPUT" / name)
    (found,) = discover.discover(tmp_path)
    assert found.path == profile_dir and found.format.name == "torch_npu"


def test_db_beats_a_lone_trace_view(tmp_path: Path) -> None:
    """A db export at level0 also writes trace_view.json: the db has the memory tables, it wins."""
    profile_dir = _rank_dir(tmp_path)
    shutil.copyfile(ASCEND / "msinsight_pta21_level0_rank0" / "trace_view.json",
                    profile_dir / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")
    (found,) = discover.discover(tmp_path)
    assert found.format.name == "ascend_db"
    (inner,) = discover.discover(profile_dir / "ASCEND_PROFILER_OUTPUT")
    assert (inner.path, inner.format.name) == (profile_dir, "ascend_db")


def test_rank_from_rank_device_map_without_a_suffix(tmp_path: Path) -> None:
    path = mutated(tmp_path, "UPDATE RANK_DEVICE_MAP SET rankId = 7")
    plain = path.rename(tmp_path / "ascend_pytorch_profiler.db")
    assert raw("SELECT rankId FROM RANK_DEVICE_MAP", plain) == [(7,)]
    assert ascend_db.load(plain).rank == "7"
    mutated(tmp_path, "UPDATE RANK_DEVICE_MAP SET rankId = 4294967295").rename(plain)
    assert ascend_db.load(plain).rank == "0"  # not distributed


def test_claims_by_name_and_sqlite_header(tmp_path: Path) -> None:
    assert ascend_db.claims(DB)
    other = tmp_path / "profile.db"
    shutil.copyfile(DB, other)
    assert not ascend_db.claims(other)
    fake = tmp_path / "ascend_pytorch_profiler_1.db"
    fake.write_text("not sqlite\n")
    assert not ascend_db.claims(fake)
    msprof = tmp_path / "msprof_20250101123456.db"
    shutil.copyfile(DB, msprof)
    assert ascend_db.claims(msprof)


# --- writers: round trip -------------------------------------------------------------------------------

@secondary_examples()
@given(traces())
def test_torch_db_round_trip(tmp_path_factory: pytest.TempPathFactory, trace) -> None:  # type: ignore[no-untyped-def]
    path = write_torch_db(trace, tmp_path_factory.mktemp("db"), rank=5)
    profile = ascend_db.load(path)
    assert profile.rank == "5"
    (device,) = profile.devices
    assert device.device == f"npu:{trace.device_id}"
    got = device_metrics(profile, device).values
    expected = expected_metrics(trace, separate_allocators=True)  # PTA+GE: two allocators' reserved summed
    assert {k: got[k] for k in METRICS} == {k: expected[k] for k in METRICS}
    assert got["peak_app_reserved_bytes"] == app_peak(trace)
    assert [tuple(map(int, r)) for r in profile.steps.to_pandas().to_numpy()] == sorted(trace.steps)


@secondary_examples()
@given(traces())
def test_msprof_db_round_trip(tmp_path_factory: pytest.TempPathFactory, trace) -> None:  # type: ignore[no-untyped-def]
    """CANN NPU_OP_MEM events of one allocator (every block); ops get the cann:: prefix."""
    path = write_msprof_db(trace, tmp_path_factory.mktemp("msprof"))
    profile = ascend_db.load(path)
    (device,) = profile.devices
    metrics = device_metrics(profile, device)
    expected = expected_metrics(trace)
    assert metrics.component == "GE"
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation"):
        assert metrics.values[key] == expected[key]
    assert metrics.values["op_max_block_bytes"] == {
        "cann::" + op.removeprefix("cann::"): size for op, size in expected["op_max_block_bytes"].items()}
    assert metrics.values["leaked_bytes"] is None  # msprof dbs have no steps
    blocks = device.blocks.to_pandas()
    assert int(blocks["t_alloc"].isna().sum()) == sum(b.t_alloc is None for b in trace.blocks)
    assert int(blocks["t_free"].isna().sum()) == sum(b.t_free is None for b in trace.blocks)
    assert int(device.series["module:APP"].frame.to_pandas()["reserved"].max()) == max(r for _, r in trace.reserved_curve())


# --- bad input -------------------------------------------------------------------------------------------

def mutated(tmp_path: Path, *statements: str) -> Path:
    return edited_db(DB, tmp_path / DB.name, *statements)


BAD = {
    "no memory tables": (("DROP TABLE MEMORY_RECORD", "DROP TABLE OP_MEMORY"),
                         "missing table MEMORY_RECORD", "MEMORY_RECORD", None),
    "no STRING_IDS": (("DROP TABLE STRING_IDS",), "missing table STRING_IDS", "STRING_IDS", None),
    "text in an integer column": (("UPDATE MEMORY_RECORD SET totalAllocated = '12 MB' WHERE rowid = 7",),
                                  "table MEMORY_RECORD rowid 7: wrong type", "MEMORY_RECORD.totalAllocated",
                                  "text '12 MB'"),
    "NULL size": (("UPDATE OP_MEMORY SET size = NULL WHERE rowid = 3",),
                  "table OP_MEMORY rowid 3: wrong type", "OP_MEMORY.size", "null NULL"),
    "fractional bytes": (("UPDATE NPU_MEM SET hbm = 1.5 WHERE rowid = 2",),
                         "table NPU_MEM rowid 2: wrong type", "NPU_MEM.hbm", "real 1.5"),
    "negative total": (("UPDATE MEMORY_RECORD SET totalReserved = -1 WHERE rowid = 9",),
                       "table MEMORY_RECORD rowid 9: value below the minimum", "MEMORY_RECORD.totalReserved", "integer -1"),
    "dangling string id": (("UPDATE MEMORY_RECORD SET component = 123456789 WHERE rowid = 4",),
                           "table MEMORY_RECORD rowid 4: id not found in STRING_IDS", "MEMORY_RECORD.component", "123456789"),
    "missing column": (("CREATE TABLE S2 (id INTEGER, startNs INTEGER)", "DROP TABLE STEP_TIME",
                        "ALTER TABLE S2 RENAME TO STEP_TIME"),
                       "table STEP_TIME has no column 'endNs'", "STEP_TIME.endNs", "columns id, startNs"),
    "positive size without allocationTime": (("UPDATE OP_MEMORY SET allocationTime = NULL WHERE rowid = 1",),
                                             "table OP_MEMORY rowid 1: a block needs an allocationTime",
                                             "OP_MEMORY.allocationTime", "size 19268096, allocationTime <NA>"),
    "unknown component": (("UPDATE STRING_IDS SET value = 'PTA2' WHERE value = 'GE'",),
                          "table MEMORY_RECORD rowid", "MEMORY_RECORD.component", "'PTA2'"),
    "unknown NPU_MEM type": (("UPDATE STRING_IDS SET value = 'sys' WHERE value = 'app'",),
                             "table NPU_MEM rowid 1: unknown memory type", "NPU_MEM.type", "'sys'"),
    "invalid device marker": (("UPDATE MEMORY_RECORD SET deviceId = 4294967295 WHERE rowid = 2",),
                              "table MEMORY_RECORD rowid 2: memory row without a device", "MEMORY_RECORD.deviceId",
                              "4294967295"),
    # the writer's table has id as its key; a table without one can list an id twice
    "string id listed twice": (("CREATE TABLE S2 AS SELECT * FROM STRING_IDS", "DROP TABLE STRING_IDS",
                                "ALTER TABLE S2 RENAME TO STRING_IDS",
                                "INSERT INTO STRING_IDS (id, value) SELECT id, 'PTA' FROM STRING_IDS WHERE value = 'GE'"),
                               "table STRING_IDS lists id", "STRING_IDS.id", "2 rows with id"),
    "step ends before it starts": (("UPDATE STEP_TIME SET endNs = startNs - 1",),
                                   "table STEP_TIME rowid 1: step ends before it starts", "STEP_TIME.endNs", None),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_db_is_an_input_error(tmp_path: Path, case: str) -> None:
    statements, message, column, found = BAD[case]
    path = mutated(tmp_path, *statements)
    with pytest.raises(InputError) as info:
        ascend_db.load(path)
    err = info.value
    assert err.file == str(path)
    assert err.message.startswith(message), err.one_line()
    assert err.column == column
    if found is not None:
        assert err.found is not None and err.found.startswith(found), err.found
    assert err.expected


def test_not_a_sqlite_file_in_a_profile_dir(tmp_path: Path) -> None:
    profile_dir = _rank_dir(tmp_path, rank=0)
    db = profile_dir / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db"
    db.write_text("Component,Timestamp(us)\n")
    with pytest.raises(InputError, match="not a sqlite database") as info:
        ascend_db.load(profile_dir)
    assert info.value.found == repr(b"Component,Timest")
    rc, _out, err = run_cli(["inspect", tmp_path])
    assert rc == 2
    assert "not a sqlite database" in one_stderr_line(err)


def test_truncated_db(tmp_path: Path) -> None:
    path = tmp_path / "ascend_pytorch_profiler_0.db"
    path.write_bytes(DB.read_bytes()[:300_000])
    assert ascend_db.claims(path)  # the header is intact
    with pytest.raises(InputError, match="truncated database") as info:
        ascend_db.load(path)
    assert info.value.expected == "679936 bytes (166 pages of 4096)" and info.value.found == "300000 bytes"
    rc, _out, err = run_cli(["inspect", path, "--json"])
    assert rc == 2
    line = one_stderr_line(err)
    assert line.startswith(f"memgate: error: {path}: truncated database")


def test_corrupt_page_names_the_table(tmp_path: Path) -> None:
    path = tmp_path / "ascend_pytorch_profiler_0.db"
    shutil.copyfile(DB, path)
    (root,) = raw("SELECT rootpage FROM sqlite_master WHERE name = 'MEMORY_RECORD'", path)[0]
    with open(path, "r+b") as fh:
        fh.seek(4096 * (root - 1))
        fh.write(b"\xff" * 100)
    with pytest.raises(InputError, match="corrupt or truncated database") as info:
        ascend_db.load(path)
    assert info.value.column == "MEMORY_RECORD"


def test_empty_db_file(tmp_path: Path) -> None:
    path = tmp_path / "ascend_pytorch_profiler_0.db"
    path.write_bytes(b"")
    with pytest.raises(InputError, match="empty file"):
        ascend_db.load(path)


# --- schemas ---------------------------------------------------------------------------------------------

DB_SCHEMAS = [n for n in schema_names() if n.startswith("ascend_db.")]


def test_every_db_table_has_a_schema() -> None:
    assert {load_schema(n)["x-memgate-table"] for n in DB_SCHEMAS} == {
        "STRING_IDS", "MEMORY_RECORD", "OP_MEMORY", "NPU_MEM", "ENUM_MODULE", "ENUM_MEMORY", "NPU_MODULE_MEM",
        "NPU_OP_MEM", "STEP_TIME", "META_DATA", "RANK_DEVICE_MAP"}


@pytest.mark.parametrize("name", DB_SCHEMAS)
def test_db_schema_is_valid_and_accepts_the_sample_rows(name: str) -> None:
    """The SQL checks and jsonschema agree on the real rows of every real db holding the table (and
    jsonschema rejects a bad one)."""
    schema = load_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    rows = []
    for path in REAL_DBS:
        conn = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            table = schema["x-memgate-table"]
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone():
                rows += [dict(r) for r in conn.execute(f'SELECT * FROM "{table}"')]
        finally:
            conn.close()
    assert rows
    for row in rows:
        validator.validate(row)
    assert not validator.is_valid({**rows[0], schema["required"][0]: [1]})


@pytest.mark.parametrize(("path", "types_in"), [(DB, "STRING_IDS"), (MSPROF_DB, "ENUM_MEMORY")],
                         ids=["torch_npu db", "early msprof db"])
def test_the_type_schemas_validate_both_forms(path: Path, types_in: str) -> None:
    """NPU_OP_MEM.type / NPU_MEM.type list both tables; the one the db holds is checked."""
    with open_db(path) as db:
        for table in ("NPU_OP_MEM", "NPU_MEM"):
            schema = load_schema(f"ascend_db.{table.lower()}")
            assert referenced(db, schema["properties"]["type"]["x-references"]) == f"{types_in}.id"
            if db.has(table):
                validate_table(db, schema)


def test_pending_write_ahead_log_is_read_not_ignored(tmp_path: Path) -> None:
    """immutable=1 would skip a -wal file's committed rows: such a db is opened plain read-only."""
    path = tmp_path / "ascend_pytorch_profiler_0.db"
    shutil.copyfile(DB, path)
    writer = sqlite3.connect(path)
    try:
        writer.execute("PRAGMA journal_mode = WAL")
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute("UPDATE MEMORY_RECORD SET totalAllocated = 9999999999 WHERE rowid = 1")
        writer.commit()
        assert (tmp_path / (path.name + "-wal")).stat().st_size > 0
        profile = ascend_db.load(path)
    finally:
        writer.close()
    assert int(profile.devices[0].series["PTA"].frame.to_pandas()["allocated"].max()) == 9999999999


def test_empty_memory_tables(tmp_path: Path) -> None:
    path = mutated(tmp_path, "DELETE FROM MEMORY_RECORD", "DELETE FROM OP_MEMORY", "DROP TABLE NPU_MEM",
                   "DROP TABLE NPU_MODULE_MEM")
    with pytest.raises(InputError, match="the memory tables hold no rows") as info:
        ascend_db.load(path)
    assert info.value.expected == "rows in MEMORY_RECORD / OP_MEMORY"


# --- issue 11: what is a table, how long a query may run, logs not yet in the db file -------------------

def _snapshot(directory: Path) -> dict[str, tuple[int, int, bytes]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(directory.iterdir())}


def _with_pending_wal(tmp_path: Path, *statements: str) -> Path:
    """The sample turned WAL-mode, ``statements`` committed into its -wal and never checkpointed, then the
    db and the -wal (no -shm) copied into a fresh profile folder, as an artifact copied mid-run looks."""
    work = tmp_path / "writer"
    work.mkdir()
    src = work / "ascend_pytorch_profiler_0.db"
    shutil.copyfile(DB, src)
    writer = sqlite3.connect(src)
    try:
        writer.execute("PRAGMA journal_mode = WAL")
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        for sql in statements:
            writer.execute(sql)
        writer.commit()
        profile_dir = tmp_path / "profile"
        profile_dir.mkdir()
        shutil.copyfile(src, profile_dir / src.name)
        shutil.copyfile(str(src) + "-wal", str(profile_dir / src.name) + "-wal")
    finally:
        writer.close()
    return profile_dir / src.name


def test_a_copied_pending_wal_is_read_and_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    path = _with_pending_wal(tmp_path, "UPDATE MEMORY_RECORD SET totalAllocated = 9999999999 WHERE rowid = 1",
                             "UPDATE MEMORY_RECORD SET totalReserved = 8888888888 WHERE rowid = 1")
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + "-wal"]
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    before = _snapshot(path.parent)
    profile = ascend_db.load(path)
    assert _snapshot(path.parent) == before  # no -shm, no checkpoint, no change
    assert list(private.iterdir()) == []  # the private copy is gone
    pta = profile.devices[0].series["PTA"].frame.to_pandas()
    assert int(pta["allocated"].max()) == 9999999999
    assert int(pta["reserved"].max()) == 8888888888
    # immutable=1 alone would have read the db file without the log
    assert raw("SELECT max(totalAllocated) FROM MEMORY_RECORD", path)[0][0] != 9999999999


def test_a_hot_rollback_journal_is_applied_to_a_copy(tmp_path: Path) -> None:
    """A db copied mid-transaction: its file holds half-written pages, the -journal the old ones."""
    work = tmp_path / "writer"
    work.mkdir()
    src = work / "ascend_pytorch_profiler_0.db"
    shutil.copyfile(DB, src)
    committed = raw("SELECT count(*), sum(size) FROM OP_MEMORY")[0]
    writer = sqlite3.connect(src, isolation_level=None)
    try:
        writer.execute("PRAGMA cache_size = 1")  # spill the uncommitted change into the db file
        writer.execute("BEGIN")
        writer.execute("UPDATE OP_MEMORY SET size = size * 1000")
        writer.execute("INSERT INTO OP_MEMORY SELECT * FROM OP_MEMORY")
        profile_dir = tmp_path / "profile"
        profile_dir.mkdir()
        for suffix in ("", "-journal"):
            shutil.copyfile(str(src) + suffix, str(profile_dir / src.name) + suffix)
    finally:
        writer.close()
    path = profile_dir / src.name
    assert raw("SELECT count(*) FROM OP_MEMORY", path)[0][0] != committed[0]  # immutable reads the torn state
    before = _snapshot(profile_dir)
    profile = ascend_db.load(path)
    assert _snapshot(profile_dir) == before
    blocks = profile.devices[0].blocks.to_pandas()
    assert (len(blocks), int(blocks["size"].abs().sum())) == (committed[0], abs(committed[1]))


@pytest.mark.parametrize(("statements", "kind"), [
    (("DROP TABLE MEMORY_RECORD", "CREATE VIEW MEMORY_RECORD AS SELECT * FROM OP_MEMORY"), "view"),
    # a view over an endless recursive query: refused before any read, no hang
    (("DROP TABLE NPU_MEM", ("CREATE VIEW NPU_MEM AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
      "SELECT x AS type, x AS ddr, x AS hbm, x AS timestampNs, 0 AS deviceId FROM c")), "view"),
    (("DROP TABLE STEP_TIME", "CREATE TRIGGER STEP_TIME AFTER INSERT ON OP_MEMORY BEGIN SELECT 1; END"), "trigger"),
    (("DROP TABLE NPU_MODULE_MEM", "CREATE VIRTUAL TABLE NPU_MODULE_MEM USING fts5(moduleId)"), "virtual table"),
])
def test_a_table_name_on_something_else_is_refused(tmp_path: Path, statements: tuple[str, ...], kind: str) -> None:
    path = mutated(tmp_path, *statements)
    table = statements[0].split()[-1]
    with pytest.raises(InputError) as info:
        ascend_db.load(path)
    err = info.value
    assert (err.file, err.column, err.message) == (str(path), table, f"{table} is a {kind}, not a table")
    assert err.found == f"a {kind} named {table}"


@pytest.mark.parametrize("value", ["²", "٣", "3.0", "three"])
def test_a_meta_data_rank_that_is_not_ascii_digits(tmp_path: Path, value: str) -> None:
    path = mutated(tmp_path, f"INSERT INTO META_DATA VALUES ('rank_id', '{value}')")
    path = path.rename(tmp_path / "ascend_pytorch_profiler.db")  # no file-name suffix: META_DATA is read
    with pytest.raises(InputError) as info:
        ascend_db.load(path)
    assert (info.value.column, info.value.found) == ("META_DATA.rank_id", repr(value))


def test_the_cache_key_of_a_db_covers_its_pending_wal(tmp_path: Path) -> None:
    """A -wal appearing next to a cached db changes what the db reads: the cache must not serve the old load."""
    from memgate.cache import ProfileCache

    path = _with_pending_wal(tmp_path, "UPDATE MEMORY_RECORD SET totalAllocated = 9999999999 WHERE rowid = 1")
    (found,) = discover.discover(path)
    cache = ProfileCache(tmp_path / "cache")
    with_wal = cache.key(found)
    wal = Path(str(path) + "-wal")
    data = wal.read_bytes()
    wal.unlink()
    assert cache.key(found) != with_wal
    wal.write_bytes(data)
    assert cache.key(found) == with_wal


def test_npu_op_mem_repeated_release_is_dropped_and_noted(tmp_path: Path) -> None:
    """CANN's NPU_OP_MEM pairs leniently like msMemScope: a release of a released address is dropped
    (not a block from before the window, which would raise every level) and the profile says so."""
    from corpus import small_trace

    path = write_msprof_db(small_trace(ge=False), tmp_path)
    before = ascend_db.load(path)
    with sqlite3.connect(path) as conn:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(NPU_OP_MEM)")]
        release = conn.execute("SELECT id FROM STRING_IDS WHERE value = 'release'").fetchone()[0]
        rowid = conn.execute("SELECT max(rowid) FROM NPU_OP_MEM WHERE type = ?", (release,)).fetchone()[0]
        kept = ", ".join(f'"{c}"' for c in columns)
        conn.execute(f"INSERT INTO NPU_OP_MEM ({kept}) SELECT {kept} FROM NPU_OP_MEM WHERE rowid = ?", (rowid,))
    after = ascend_db.load(path)
    assert after.devices[0].blocks.to_pandas().equals(before.devices[0].blocks.to_pandas())
    assert any("release(s) of an address already freed" in note for note in after.metadata["notes"])


def test_a_block_frees_at_the_earlier_of_release_and_active_release() -> None:
    """As the text export (test_torch_npu): the allocated total drops at the earlier of releaseTime and
    activeReleaseTime; this real file has two blocks another stream used, released actively later."""
    rows = raw("SELECT allocationTime, releaseTime, activeReleaseTime FROM OP_MEMORY WHERE allocationTime IS NOT NULL")
    assert sum(1 for _, rel, act in rows if rel is not None and act is not None and act > rel) == 2
    expected = sorted(((a, min(t for t in (rel, act) if t is not None) if (rel, act) != (None, None) else None)
                       for a, rel, act in rows), key=str)
    [found] = discover.discover(DB_DIR)
    [device] = discover.load(found).devices
    t_free = device.blocks.ints("t_free")
    got = list(zip(device.blocks.ints("t_alloc").values.tolist(),
                   [None if na else t for t, na in zip(t_free.values.tolist(), t_free.isna().tolist())]))
    assert sorted(got, key=str) == expected

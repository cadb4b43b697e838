"""memgate.loaders.msmemscope: the real msMemScope dumps, the writers' round trip, bad input.

Expected values are derived here from the raw files with the csv module (pairing by
allocation_id, a plain stack for ops, dict-based pairing for the old file), never copied from
memgate's output.
"""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pytest
from groundtruth import Trace, expected_metrics
from helpers import SAMPLES, one_stderr_line, read_lines, run_cli, write_lines
from hypothesis import assume, given
from strategies import secondary_examples, traces
from writers.msmemscope import as_written, write_csv, write_db

from memgate.errors import InputError
from memgate.loaders import msmemscope
from memgate.metrics import device_metrics
from memgate.readers.csvtable import read_csv, rows_as_dicts
from memgate.schemas import load_schema
from memgate.table import Table

MS = SAMPLES / "msmemscope"
BASELINE = MS / "example_compare_baseline.csv"
LEAKS = MS / "example_compare_leaks.csv"
SMOKE = MS / "smoke_memscope_dump_20250428113810.csv"
NEW_FORMAT = (BASELINE, LEAKS)
METRICS = ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation", "step_growth_bytes", "leaked_bytes",
           "op_max_block_bytes")


def raw_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def attr_of(text: str) -> dict[str, str]:
    body = text.strip()[1:-1]
    return dict(part.split(":", 1) for part in body.split(",")) if body else {}


def memory_rows(path: Path) -> list[dict[str, str]]:
    return [r for r in raw_rows(path) if r["Event"] in ("MALLOC", "FREE")]


def blocks_as_tuples(blocks: Table) -> list[tuple]:
    frame = blocks.to_pandas()
    return sorted((None if pd.isna(r.t_alloc) else int(r.t_alloc), None if pd.isna(r.t_free) else int(r.t_free),
                   int(r.size), str(r.component)) for r in frame.itertuples())


# --- the real samples: current format -------------------------------------------------------------------

@pytest.mark.parametrize("path", NEW_FORMAT, ids=lambda p: p.stem)
def test_new_format_series_peaks(path: Path) -> None:
    pta = [attr_of(r["Attr"]) for r in memory_rows(path) if r["Event Type"] == "PTA"]
    profile = msmemscope.load(path)
    (device,) = profile.devices
    assert device.device == "npu:0"
    metrics = device_metrics(profile, device)
    assert metrics.component == "PTA"
    assert metrics.values["peak_allocated_bytes"] == max(int(a["used"]) for a in pta)
    assert metrics.values["peak_reserved_bytes"] == max(int(a["total"]) for a in pta)
    assert len(device.series["PTA"].frame) == len(pta)
    assert profile.metadata["timestamp_unit"] == "ns" and profile.metadata["unmatched_frees"] == 0
    assert len(profile.steps) == 0  # these runs called no msmemscope.step()


@pytest.mark.parametrize("path", NEW_FORMAT, ids=lambda p: p.stem)
def test_new_format_blocks_match_allocation_id_pairing(path: Path) -> None:
    """Address pairing in time order agrees with the writer's own allocation_id on every block."""
    mallocs, frees = {}, {}
    for r in memory_rows(path):
        a = attr_of(r["Attr"])
        (mallocs if r["Event"] == "MALLOC" else frees)[(r["Event Type"], a["allocation_id"])] = (
            int(r["Timestamp(ns)"]), int(a["size"]))
    expected = sorted((t, frees[k][0] if k in frees else None, size, k[0]) for k, (t, size) in mallocs.items())
    profile = msmemscope.load(path)
    assert blocks_as_tuples(profile.devices[0].blocks) == expected


def _with_a_row_repeated(path: Path, tmp_path: Path, event: str) -> tuple[Path, dict[str, str]]:
    """A copy of the dump with its first PTA ``event`` row written again 1 ns later (a new ID)."""
    lines = read_lines(path)
    rows = raw_rows(path)
    at = next(i for i, r in enumerate(rows) if r["Event"] == event and r["Event Type"] == "PTA")
    cells = lines[at + 1].split(b",", 5)
    again = [str(max(int(r["ID"]) for r in rows) + 1).encode(), *cells[1:4],
             str(int(rows[at]["Timestamp(ns)"]) + 1).encode(), cells[5]]
    out = tmp_path / path.name
    write_lines(out, [*lines, b",".join(again)])
    return out, rows[at]


def test_a_free_repeated_is_dropped_not_taken_for_memory_from_before_the_window(tmp_path: Path) -> None:
    copy, _ = _with_a_row_repeated(BASELINE, tmp_path, "FREE")
    original, repeated = msmemscope.load(BASELINE), msmemscope.load(copy)
    assert blocks_as_tuples(repeated.devices[0].blocks) == blocks_as_tuples(original.devices[0].blocks)
    assert repeated.metadata["unmatched_frees"] == 0
    assert any("FREE(s) of an address already freed" in note for note in repeated.metadata["notes"])


def test_a_malloc_of_a_live_address_ends_the_block_there(tmp_path: Path) -> None:
    copy, row = _with_a_row_repeated(BASELINE, tmp_path, "MALLOC")
    blocks = msmemscope.load(copy).devices[0].blocks.to_pandas()
    again = int(row["Timestamp(ns)"]) + 1
    first = blocks[blocks["t_alloc"] == int(row["Timestamp(ns)"])]
    assert first["t_free"].tolist() == [again]  # not live on beside the block that took its address
    assert len(blocks[blocks["t_alloc"] == again]) == 1


def test_leak_example_open_blocks() -> None:
    def open_pta(path: Path) -> list[int]:
        rows = memory_rows(path)
        freed = {attr_of(r["Attr"])["allocation_id"] for r in rows if r["Event"] == "FREE"}
        return sorted(int(attr_of(r["Attr"])["size"]) for r in rows
                      if r["Event"] == "MALLOC" and r["Event Type"] == "PTA" and attr_of(r["Attr"])["allocation_id"] not in freed)

    for path in NEW_FORMAT:
        blocks = msmemscope.load(path).devices[0].blocks.to_pandas()
        still = blocks[(blocks["component"] == "PTA") & blocks["t_free"].isna()]
        assert sorted(still["size"].astype(int)) == open_pta(path)
    # the leak run keeps two more blocks: aten._to_copy's 4000256-byte tensors, never freed
    leaked = sum(open_pta(LEAKS)) - sum(open_pta(BASELINE))
    assert (len(open_pta(BASELINE)), len(open_pta(LEAKS)), leaked) == (4, 6, 2 * 4000256)


@pytest.mark.parametrize("path", NEW_FORMAT, ids=lambda p: p.stem)
def test_ops_are_the_innermost_aten_span_on_the_thread(path: Path) -> None:
    rows = sorted(raw_rows(path), key=lambda r: (r["Process Id"], r["Thread Id"], int(r["Timestamp(ns)"]), int(r["ID"])))
    stacks: dict[tuple[str, str], list[str]] = {}
    expected: dict[str, int] = {}
    for r in rows:
        stack = stacks.setdefault((r["Process Id"], r["Thread Id"]), [])
        if r["Event Type"] == "ATEN_START":
            stack.append(r["Name"])
        elif r["Event Type"] == "ATEN_END":
            stack.pop()
        elif r["Event"] == "MALLOC" and r["Event Type"] == "PTA" and stack:
            expected[stack[-1]] = max(expected.get(stack[-1], 0), int(attr_of(r["Attr"])["size"]))
    profile = msmemscope.load(path)
    assert device_metrics(profile, profile.devices[0]).values["op_max_block_bytes"] == expected
    assert expected["torch._ops.aten.mse_loss.default"] == 16778240


# --- the real samples: the old fixture ----------------------------------------------------------------

def test_old_fixture_reads_microseconds_and_splits_processes() -> None:
    rows = memory_rows(SMOKE)
    profile = msmemscope.load(SMOKE)
    assert profile.metadata["timestamp_unit"] == "us"
    assert any("16-digit" in note for note in profile.metadata["notes"])
    assert profile.metadata["processes"] == sorted({int(r["Process Id"]) for r in rows})
    expected_labels = {("cpu" if r["Device Id"] == "host" else f"npu:{r['Device Id']}") + f"/pid{r['Process Id']}"
                       for r in rows if r["Device Id"] != "N/A"}
    assert {d.device for d in profile.devices} == expected_labels
    for device in profile.devices:
        if "PTA" not in device.series:
            continue
        pid, dev = device.device.split("/pid")[1], device.device.split(":")[1].split("/")[0]
        stream = [r for r in rows if r["Event Type"] == "PTA" and r["Process Id"] == pid and r["Device Id"] == dev]
        frame = device.series["PTA"].frame.to_pandas()
        assert int(frame["allocated"].max()) == max(int(attr_of(r["Attr"])["used"]) for r in stream)
        assert int(frame["t_ns"].min()) == min(int(r["Timestamp(ns)"]) for r in stream) * 1000
        # this writer's 'total' is below 'used': reserved is left empty rather than wrong
        assert frame["reserved"].isna().all()
        assert device_metrics(profile, device).values["peak_reserved_bytes"] is None


def test_old_fixture_pairing_matches_a_plain_dict_walk() -> None:
    rows = sorted(memory_rows(SMOKE), key=lambda r: (int(r["Timestamp(ns)"]), r["Process Id"], int(r["ID"])))
    live: dict[tuple[str, str, int], dict[str, str]] = {}
    pairs, lone = [], []
    for r in rows:
        key = (r["Process Id"], r["Event Type"], int(r["Ptr"]))
        if r["Event"] == "MALLOC":
            live[key] = r
        elif key in live:
            pairs.append((live.pop(key), r))
        else:
            lone.append(r)
    profile = msmemscope.load(SMOKE)
    assert profile.metadata["unmatched_frees"] == len(lone) == 7
    blocks = pd.concat([d.blocks.to_pandas() for d in profile.devices])
    closed = blocks.dropna(subset=["t_alloc", "t_free"])
    assert sorted(zip(closed["t_alloc"].astype(int), closed["t_free"].astype(int))) == sorted(
        (int(m["Timestamp(ns)"]) * 1000, int(f["Timestamp(ns)"]) * 1000) for m, f in pairs)
    assert int(blocks["t_free"].isna().sum()) == len(live)
    # FREE rows of old files give a negative size; the block takes its MALLOC's size.
    assert (blocks["size"] > 0).all()


@pytest.mark.parametrize("path", [BASELINE, LEAKS, SMOKE], ids=lambda p: p.stem)
def test_inspect_json_cli(path: Path) -> None:
    rc, out, err = run_cli(["inspect", path, "--json"])
    assert rc == 0, err
    (entry,) = json.loads(out)["profiles"]
    assert entry["format"] == "msmemscope"
    if path != SMOKE:
        peak = max(int(attr_of(r["Attr"])["used"]) for r in memory_rows(path) if r["Event Type"] == "PTA")
        assert entry["devices"][0]["metrics"]["peak_allocated_bytes"] == peak


# --- writers: round trip --------------------------------------------------------------------------------

def check_round_trip(path: Path, trace: Trace) -> None:
    profile = msmemscope.load(path)
    (device,) = profile.devices
    assert device.device == f"npu:{trace.device_id}"
    got = device_metrics(profile, device).values
    expected = expected_metrics(as_written(trace))
    assert {k: got[k] for k in METRICS} == {k: expected[k] for k in METRICS}
    assert [tuple(map(int, r)) for r in profile.steps.to_pandas().to_numpy()] == sorted(as_written(trace).steps)


@secondary_examples()
@given(traces(ge=False))
def test_csv_round_trip(tmp_path_factory: pytest.TempPathFactory, trace: Trace) -> None:
    path = write_csv(trace, tmp_path_factory.mktemp("ms") / "memscope_dump_20251203120000.csv")
    check_round_trip(path, trace)


@secondary_examples()
@given(traces(ge=False))
def test_db_round_trip(tmp_path_factory: pytest.TempPathFactory, trace: Trace) -> None:
    path = write_db(trace, tmp_path_factory.mktemp("ms") / "memscope_dump_20251203120000.db")
    assert msmemscope.claims(path)
    check_round_trip(path, trace)


def shifted(trace: Trace, delta: int) -> Trace:
    def s(t: int | None) -> int | None:
        return None if t is None else t + delta
    return replace(trace, blocks=tuple(replace(b, t_alloc=s(b.t_alloc), t_free=s(b.t_free)) for b in trace.blocks),
                   steps=tuple((n, a + delta, b + delta) for n, a, b in trace.steps),
                   t_start=trace.t_start + delta, t_end=trace.t_end + delta)


@secondary_examples()
@given(traces(ge=False))
def test_old_layout_round_trip(tmp_path_factory: pytest.TempPathFactory, trace: Trace) -> None:
    """16-digit µs under Timestamp(ns), decimal Ptr, negative FREE sizes: exact on a whole-µs clock."""
    trace = shifted(trace, -(trace.t_start % 1000))
    times = [trace.t_end, *(t for b in trace.blocks for t in (b.t_alloc, b.t_free) if t is not None),
             *(t for s in trace.steps for t in s[1:])]
    assume(all(t % 1000 == 0 for t in times))
    path = write_csv(trace, tmp_path_factory.mktemp("ms") / "leaks_dump_20250428113810.csv", old=True)
    check_round_trip(path, trace)
    assert msmemscope.load(path).metadata["timestamp_unit"] == "us"


# --- vectorized helpers ---------------------------------------------------------------------------------

def test_enclosing_ops_nested_and_unbalanced() -> None:
    # thread 0: A( B( m1 ) m2 ) m3 ; thread 1: END(unmatched) C( m4 )
    group = np.array([0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    delta = np.array([1, 1, 0, -1, 0, -1, 0, -1, 1, 0, -1])
    names = pd.Series(["A", "B", None, "B", None, "A", None, "X", "C", None, "C"], dtype="string")
    target = delta == 0
    t = np.arange(11)
    ops = msmemscope.enclosing_ops(group, t, np.zeros(11, dtype=np.int64), delta, names, target)
    assert [None if pd.isna(v) else v for v in ops[target]] == ["B", "A", None, "C"]


def test_parse_ptr_hex_and_decimal() -> None:
    values = ["0x000012c041400000", "0xFFFFFFFFFFFFFFFF", "0x0", "20616939214848", "0", "18446744073709551615"]
    got = msmemscope.parse_ptr(pd.Series(values, dtype="string"))
    assert got.tolist() == [int(v, 16) if v.lower().startswith("0x") else int(v) for v in values]


# --- detection --------------------------------------------------------------------------------------------

def test_claims_by_header_and_db_name(tmp_path: Path) -> None:
    assert all(msmemscope.claims(p) for p in (BASELINE, LEAKS, SMOKE))
    other = tmp_path / "memscope_dump_1.csv"
    other.write_text("Component,Timestamp(us)\nPTA,1\n")
    assert not msmemscope.claims(other)
    db = tmp_path / "memscope_dump_20251203120000.db"
    sqlite3.connect(db).close()
    db.write_bytes(b"SQLite format 3\x00" + bytes(100))
    assert msmemscope.claims(db)
    renamed = tmp_path / "trace.db"
    shutil.copyfile(db, renamed)
    assert not msmemscope.claims(renamed)


# --- bad input --------------------------------------------------------------------------------------------

def first_line(lines: list[bytes], needle: bytes) -> int:
    return next(i for i, line in enumerate(lines) if needle in line)


def mutate(tmp_path: Path, needle: bytes, old: bytes, new: bytes) -> tuple[Path, int]:
    lines = read_lines(BASELINE)
    i = first_line(lines, needle)
    assert old in lines[i]
    lines[i] = lines[i].replace(old, new, 1)
    path = tmp_path / "memscope_dump_20251203120000.csv"
    write_lines(path, lines)
    return path, i + 1


CSV_BAD = {
    "Attr not k:v": (b",MALLOC,PTA,", b"{allocation_id:4,addr", b"{allocation_id=4,addr", "malformed Attr", "Attr"),
    "size not an integer": (b",MALLOC,PTA,", b"size:16778240", b"size:16MB", "malformed size in Attr", "Attr"),
    "MALLOC without size": (b",MALLOC,PTA,", b"size:16778240,", b"", "Attr has no size", "Attr"),
    "used not an integer": (b",FREE,PTA,", b"used:2048", b"used:2k", "malformed used in Attr", "Attr"),
    "bad Ptr": (b",MALLOC,HAL,", b",0x000012c041400000,", b",0xZZ,", "malformed value", "Ptr"),
    "MALLOC without a process": (b",MALLOC,PTA,", b",3101864,3101864,", b",N/A,3101864,",
                                 "MALLOC/FREE row without a process id", "Process Id"),
    "16-digit time among 19-digit ones": (b"10,MALLOC,PTA,", b"1764753084425691000", b"1764753084425691",
                                          "Timestamp(ns) mixes 16-digit", "Timestamp(ns)"),
    "ID past int64": (b"10,MALLOC,PTA,", b"10,MALLOC", b"9" * 40 + b",MALLOC", "value out of range", "ID"),
    "thread id past int64": (b",MALLOC,PTA,", b",3101864,3101864,0,", b",3101864,9223372036854775808,0,",
                             "value out of range", "Thread Id"),
    "size past int64": (b",MALLOC,PTA,", b"size:16778240", b"size:" + b"9" * 30, "size in Attr out of range", "Attr"),
    "timestamp past int64": (b"10,MALLOC,PTA,", b"1764753084425691000", b"09223372036854775808",
                             "value out of range", "Timestamp(ns)"),
}


@pytest.mark.parametrize("case", list(CSV_BAD), ids=list(CSV_BAD))
def test_bad_csv_is_an_input_error(tmp_path: Path, case: str) -> None:
    needle, old, new, message, column = CSV_BAD[case]
    path, line = mutate(tmp_path, needle, old, new)
    with pytest.raises(InputError) as info:
        msmemscope.load(path)
    err = info.value
    assert (err.file, err.line, err.column) == (str(path), line, column)
    assert err.message.startswith(message), err.one_line()
    assert err.expected


@pytest.mark.parametrize("name", ["first", "9" * 40])
def test_step_without_a_number(tmp_path: Path, name: str) -> None:
    lines = read_lines(BASELINE)
    lines.insert(3, f"200,SYSTEM,STEP,{name},1764753083997498271,3101864,3101864,0,N/A,,,\n".encode())
    path = tmp_path / "memscope_dump_1.csv"
    write_lines(path, lines)
    with pytest.raises(InputError, match="STEP row without a step number") as info:
        msmemscope.load(path)
    assert (info.value.line, info.value.column, info.value.found) == (4, "Name", repr(name))


def test_steps_end_at_the_next_step_or_stop_trace(tmp_path: Path) -> None:
    lines = read_lines(BASELINE)
    lines[1:1] = [b"300,SYSTEM,STEP,1,1764753083997498270,3101864,3101864,0,N/A,,,\n",
                  b"301,SYSTEM,STEP,2,1764753084427763120,3101864,3101864,0,N/A,,,\n"]
    path = tmp_path / "memscope_dump_1.csv"
    write_lines(path, lines)
    stop = next(int(r["Timestamp(ns)"]) for r in raw_rows(BASELINE) if r["Event Type"] == "STOP_TRACE")
    steps = msmemscope.load(path).steps
    assert [tuple(map(int, r)) for r in steps.to_pandas().to_numpy()] == [
        (1, 1764753083997498270, 1764753084427763120), (2, 1764753084427763120, stop)]


def test_truncated_csv(tmp_path: Path) -> None:
    data = BASELINE.read_bytes()
    path = tmp_path / "memscope_dump_1.csv"
    path.write_bytes(data[: len(data) - 30])
    with pytest.raises(InputError, match="truncated last line"):
        msmemscope.load(path)
    lines = read_lines(BASELINE)
    lines[5] = b",".join(lines[5].split(b",")[:6]) + b"\n"
    write_lines(path, lines)
    with pytest.raises(InputError, match="wrong number of fields") as info:
        msmemscope.load(path)
    assert info.value.file == str(path) and (info.value.line, info.value.expected, info.value.found) == (6, "12 columns", "6 columns")


def test_cli_bad_attr_exits_2_with_one_line(tmp_path: Path) -> None:
    path, line = mutate(tmp_path, b",MALLOC,PTA,", b"size:16778240", b"size:lots")
    rc, _out, err = run_cli(["inspect", path, "--json"])
    assert rc == 2
    assert one_stderr_line(err).startswith(f"memgate: error: {path}:{line}: column 'Attr': malformed size in Attr")


def _db(directory: Path, trace_rows: list[tuple]) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / "memscope_dump_20251203120000.db"
    conn = sqlite3.connect(path)
    conn.execute('CREATE TABLE memscope_dump ("ID" INTEGER, "Event" TEXT, "Event Type" TEXT, "Name" TEXT, '
                 '"Timestamp(ns)" INTEGER, "Process Id" INTEGER, "Thread Id" INTEGER, "Device Id" TEXT, "Ptr" TEXT, '
                 '"Attr" TEXT)')
    conn.executemany("INSERT INTO memscope_dump VALUES (?,?,?,?,?,?,?,?,?,?)", trace_rows)
    conn.commit()
    conn.close()
    return path


GOOD_DB_ROWS = [
    (1, "SYSTEM", "START_TRACE", "N/A", 1764753083996495030, 7, 7, "N/A", "N/A", ""),
    (2, "MALLOC", "PTA", "N/A", 1764753083996495040, 7, 7, "0", "0x10",
     '{"allocation_id":"1","addr":"0x10","size":"512","total":"2097152","used":"512"}'),
    (3, "FREE", "PTA", "N/A", 1764753083996495050, 7, 7, "0", "0x10",
     '{"allocation_id":"1","addr":"0x10","size":"512","total":"2097152","used":"0"}'),
]


def test_db_reads_json_attr(tmp_path: Path) -> None:
    profile = msmemscope.load(_db(tmp_path, GOOD_DB_ROWS))
    (device,) = profile.devices
    assert blocks_as_tuples(device.blocks) == [(1764753083996495040, 1764753083996495050, 512, "PTA")]
    assert device_metrics(profile, device).values["peak_reserved_bytes"] == 2097152


def test_db_bad_inputs(tmp_path: Path) -> None:
    bad_type = [*GOOD_DB_ROWS[:2], (3, "FREE", "PTA", "N/A", "soon", 7, 7, "0", "0x10", "{}")]
    with pytest.raises(InputError) as info:
        msmemscope.load(_db(tmp_path / "a", bad_type))
    assert info.value.message.startswith("table memscope_dump rowid 3: wrong type")
    assert info.value.column == "memscope_dump.Timestamp(ns)" and info.value.found == "text 'soon'"
    bad_attr = [*GOOD_DB_ROWS[:2], (3, "FREE", "PTA", "N/A", 1764753083996495050, 7, 7, "0", "0x10", "{size=1}")]
    with pytest.raises(InputError) as info:
        msmemscope.load(_db(tmp_path / "b", bad_attr))
    assert info.value.message == "table memscope_dump rowid 3: malformed Attr"
    assert info.value.column == "memscope_dump.Attr"
    (tmp_path / "c").mkdir()
    path = tmp_path / "c" / "memscope_dump_1.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE python_trace_7 (FuncInfo TEXT)")
    conn.close()
    with pytest.raises(InputError, match="missing table memscope_dump") as info:
        msmemscope.load(path)
    assert info.value.column == "memscope_dump" and "python_trace_7" in (info.value.found or "")


# --- schemas ----------------------------------------------------------------------------------------------

def test_schemas_are_valid_and_accept_the_samples() -> None:
    schema = load_schema("msmemscope.dump")
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator.check_schema(load_schema("msmemscope.memscope_dump"))
    validator = jsonschema.Draft202012Validator(schema)
    for path in (BASELINE, LEAKS, SMOKE):
        rows = rows_as_dicts(read_csv(path, schema))
        assert len(rows) == len(raw_rows(path))
        for row in rows:
            validator.validate(row)
    assert not validator.is_valid({**rows[0], "Ptr": "0xZZ"})


def test_dump_without_memory_events(tmp_path: Path) -> None:
    lines = [line for line in read_lines(BASELINE) if b",MALLOC," not in line and b",FREE," not in line]
    path = tmp_path / "memscope_dump_1.csv"
    write_lines(path, lines)
    with pytest.raises(InputError, match="no MALLOC/FREE events in this dump"):
        msmemscope.load(path)


# --- Device Id "cpu" (msMemScope's DevID2String for host and host-pinned events) -----------------------

PINNED_PID = "3101864"
# Host-pinned blocks as the current writer dumps them (Event Type HOST, Device Id cpu, Attr pinned:true
# with the host pool's running used), inside the sample's trace window.
PINNED_ROWS = [
    (b'9001,MALLOC,HOST,N/A,1764753084000000000,3101864,3101864,cpu,0x00007f0000001000,'
    b'"{allocation_id:9001,addr:0x00007f0000001000,size:4096,pinned:true,used:4096,process_used:1000000}",,\n'),
    (b'9002,MALLOC,HOST,N/A,1764753084100000000,3101864,3101864,cpu,0x00007f0000003000,'
    b'"{allocation_id:9002,addr:0x00007f0000003000,size:8192,pinned:true,used:12288,process_used:1000000}",,\n'),
    (b'9003,FREE,HOST,N/A,1764753084200000000,3101864,3101864,cpu,0x00007f0000001000,'
    b'"{allocation_id:9001,addr:0x00007f0000001000,size:4096,pinned:true,used:8192,process_used:1000000}",,\n'),
    (b'9004,MALLOC,HOST_PINNED,N/A,1764753084300000000,3101864,3101864,cpu,0x00007f0000009000,'
    b'"{allocation_id:9004,addr:0x00007f0000009000,size:512,used:512}",,\n'),
]


def _with_pinned_rows(tmp_path: Path) -> Path:
    lines = read_lines(BASELINE)
    lines[60:60] = PINNED_ROWS  # grouped per allocation in the middle of the file, as the writer does
    path = tmp_path / "memscope_dump_20251203120000.csv"
    write_lines(path, lines)
    return path


def test_device_id_cpu_is_the_cpu_device(tmp_path: Path) -> None:
    path = _with_pinned_rows(tmp_path)
    original, profile = msmemscope.load(BASELINE), msmemscope.load(path)
    assert [d.device for d in profile.devices] == ["cpu", "npu:0"]
    cpu, npu = profile.devices
    assert blocks_as_tuples(cpu.blocks) == [
        (1764753084000000000, 1764753084200000000, 4096, "HOST"),
        (1764753084100000000, None, 8192, "HOST"),
        (1764753084300000000, None, 512, "HOST_PINNED"),
    ]
    assert cpu.blocks.to_pandas()["op"].isna().all()  # host blocks are segments, never an op's
    assert cpu.series["HOST"].frame.to_pandas()["allocated"].tolist() == [4096, 12288, 8192]
    assert cpu.series["HOST"].frame.to_pandas()["reserved"].isna().all()  # pinned rows carry no pool total
    assert cpu.series["HOST_PINNED"].frame.to_pandas()["allocated"].tolist() == [512]
    # the blocks are the cpu device's whole memory: 4096 + 8192 live at once, then 512 more after a free
    cpu_metrics = device_metrics(profile, cpu)
    assert (cpu_metrics.component, cpu_metrics.values["peak_allocated_bytes"]) == ("blocks", 12288)
    # the npu device is the original file's, number for number
    before = device_metrics(original, original.devices[0]).values
    after = device_metrics(profile, npu).values
    assert {k: after[k] for k in METRICS} == {k: before[k] for k in METRICS}
    assert blocks_as_tuples(npu.blocks) == blocks_as_tuples(original.devices[0].blocks)


def test_device_id_cpu_passes_the_row_schema(tmp_path: Path) -> None:
    path = _with_pinned_rows(tmp_path)
    validator = jsonschema.Draft202012Validator(load_schema("msmemscope.dump"))
    rows = rows_as_dicts(read_csv(path, load_schema("msmemscope.dump")))
    for row in rows:
        validator.validate(row)
    assert sum(r["Device Id"] == "cpu" for r in rows) == len(PINNED_ROWS)
    for bad in ("CPU", "cpu0", "gpu"):
        assert not validator.is_valid({**rows[0], "Device Id": bad})


def test_device_id_cpu_in_a_db(tmp_path: Path) -> None:
    rows = [*GOOD_DB_ROWS,
            (4, "MALLOC", "HOST", "N/A", 1764753083996495060, 7, 7, "cpu", "0x20",
             '{"allocation_id":"2","addr":"0x20","size":"4096","pinned":"true","used":"4096"}')]
    profile = msmemscope.load(_db(tmp_path, rows))
    assert [d.device for d in profile.devices] == ["cpu", "npu:0"]
    assert blocks_as_tuples(profile.devices[0].blocks) == [(1764753083996495060, None, 4096, "HOST")]

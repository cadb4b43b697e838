"""CANN msprof loader (docs/formats-reference.md §3): ground-truth traces written by tests/writers/cann.py read back.

Exactness: CANN writes KB = bytes / 1024 as float text, an exact binary fraction for integer bytes
below 2**53, and µs with 3 decimals (exact ns); the loader multiplies back and rounds to the byte,
so every comparison is ``==``. CANN sees one allocator (GE): the whole trace is its curve.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import jsonschema
import pytest
from groundtruth import Block, Trace, expected_metrics
from helpers import join_row, one_stderr_line, read_lines, run_cli, split_row, write_lines
from hypothesis import given
from hypothesis import strategies as st
from strategies import secondary_examples, traces
from writers.cann import STATIC_GRAPH, STATIC_TOTAL, CannOptions, app_samples, raw_name, write_prof

from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.metrics import profile_metrics
from memgate.model import Profile
from memgate.readers.csvtable import read_csv, rows_as_dicts
from memgate.schemas import load_schema, schema_names

KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation")

cann_options = st.builds(
    CannOptions,
    layout=st.sampled_from(("mindstudio", "device")),
    slices=st.integers(1, 3),
    unfreed=st.sampled_from(("empty", "zero")),
    crlf=st.booleans(),
)


def _expected_ops(trace: Trace) -> dict[str, int]:
    ops = expected_metrics(trace)["op_max_block_bytes"]
    assert isinstance(ops, dict)
    return {"cann::" + raw_name(op): size for op, size in ops.items()}


def _read(prof: Path) -> Profile:
    found = discover(prof)
    assert [(f.path, f.format.name) for f in found] == [(prof, "cann")]
    return load(found[0])


@secondary_examples()
@given(trace=traces(), opts=cann_options)
def test_metrics_equal_ground_truth(trace: Trace, opts: CannOptions) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        profile = _read(write_prof([trace], Path(tmp), opts))
    (m,) = profile_metrics(profile)
    assert (profile.rank, m.device, m.component) == (str(trace.device_id), f"npu:{trace.device_id}", "GE")
    expected = expected_metrics(trace)
    for key in KEYS:
        assert m.values[key] == expected[key], key
        assert type(m.values[key]) is type(expected[key]), key
    assert m.values["op_max_block_bytes"] == _expected_ops(trace)
    assert m.values["peak_app_reserved_bytes"] == max(v for _, v in app_samples(trace, opts))
    assert m.values["step_growth_bytes"] is None and m.values["leaked_bytes"] is None  # no steps in CANN CSVs
    # The blocks themselves: sizes, times, open ends.
    blocks = profile.devices[0].blocks.to_pandas()
    got = sorted(zip(blocks["size"].astype(int), blocks["t_alloc"].fillna(-1).astype(int),
                     blocks["t_free"].fillna(-1).astype(int)))
    shown = [b for b in trace.blocks if b.t_alloc is not None or (opts.unfreed == "empty" and b.t_free is not None)]
    assert got == sorted((b.size, -1 if b.t_alloc is None else b.t_alloc, -1 if b.t_free is None else b.t_free)
                         for b in shown)
    marks = profile.metadata.get("unfreed_marked_by", [])
    assert marks == ([opts.unfreed] if any(b.t_free is None and b.t_alloc is not None for b in trace.blocks) else [])
    ge = m.facts.components["GE"]
    if opts.unfreed == "empty" or all(b.t_alloc is not None for b in trace.blocks):
        # With release-only rows (or none needed), every block's total gives the hidden baseline.
        assert (ge.baseline_bytes, ge.consistency) == (trace.hidden_baseline, 1.0)
    assert profile.metadata["static_op_mem"] == [{
        "device": f"npu:{trace.device_id}", "model_name": "0", "graph_id": "1", "total_bytes": STATIC_TOTAL,
        "ops": len(STATIC_GRAPH), "largest_op": "MatMulV2", "largest_op_bytes": 7 << 20}]


@secondary_examples()
@given(a=traces(), b=traces(), opts=cann_options)
def test_one_profile_with_a_device_per_device_id(a: Trace, b: Trace, opts: CannOptions) -> None:
    a, b = replace(a, device_id=0), replace(b, device_id=5)
    with tempfile.TemporaryDirectory() as tmp:
        profile = _read(write_prof([a, b], Path(tmp), opts))
    metrics = profile_metrics(profile)
    assert [m.device for m in metrics] == ["npu:0", "npu:5"]
    assert profile.rank == "0+5"
    for trace, m in zip((a, b), metrics):
        expected = expected_metrics(trace)
        assert [m.values[k] for k in KEYS] == [expected[k] for k in KEYS]
        assert m.values["op_max_block_bytes"] == _expected_ops(trace)


@secondary_examples()
@given(trace=traces(max_blocks=10), slices=st.integers(2, 3))
def test_slices_read_as_one_file(trace: Trace, slices: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        whole = _read(write_prof([trace], Path(tmp) / "a", CannOptions()))
        pieces = _read(write_prof([trace], Path(tmp) / "b", CannOptions(slices=slices)))
    for name, series in whole.devices[0].series.items():
        assert series.frame.to_pandas().equals(pieces.devices[0].series[name].frame.to_pandas()), name
    assert whole.devices[0].blocks.to_pandas().equals(pieces.devices[0].blocks.to_pandas())


def _trace(device_id: int = 3) -> Trace:
    t0 = 1_736_408_883_573_957_920
    return Trace(device_id=device_id, hidden_baseline=64 << 10, t_start=t0, t_end=t0 + 100_000,
                 blocks=(Block(192 << 10, t0, t0 + 92_600, "cann::Graph_21", component="GE"),
                         Block(1 << 20, t0 + 10, None, "cann::MatMulV2", component="GE"),
                         Block(2 << 20, None, t0 + 50_000, "", component="GE")),
                 steps=())


def test_small_profile_values(tmp_path: Path) -> None:
    profile = _read(write_prof([_trace()], tmp_path, CannOptions(stale_export=True)))
    (m,) = profile_metrics(profile)
    assert m.values["peak_allocated_bytes"] == (64 << 10) + (2 << 20) + (192 << 10) + (1 << 20)
    assert m.values["peak_reserved_bytes"] == 4 << 20
    assert m.values["op_max_block_bytes"] == {"cann::Graph_21": 192 << 10, "cann::MatMulV2": 1 << 20}
    # The older export next to the latest is ignored and named, never mixed in.
    assert [Path(p).name for p in profile.metadata["older_exports_ignored"]] == ["memory_record_20000101000000.csv"]
    assert profile.devices[0].series["module:SLOG"].frame.to_pandas()["reserved"].isna().all()  # -1: no level
    assert set(profile.devices[0].series) >= {"GE", "APP", "NPU MEM Device/Memory", "module:HCCL"}


def test_rank_from_a_rank_dir_and_output_folder_given_directly(tmp_path: Path) -> None:
    prof = write_prof([_trace(device_id=1)], tmp_path / "rank_6", CannOptions())
    assert load(discover(prof)[0]).rank == "6"
    out = prof / "mindstudio_profiler_output"
    found = discover(out)
    assert [(f.path, f.format.name) for f in found] == [(out, "cann")]
    assert load(found[0]).rank == "6"
    root = discover(tmp_path)  # walking a root: the PROF dir, not its inner folder
    assert [f.path for f in root] == [prof]


def test_zero_duration_with_a_reserved_total_is_a_real_release(tmp_path: Path) -> None:
    """Newer CANN's unfreed mark is 0 in Duration *and* both Release totals; a freed block keeps a reserved total."""
    t0 = 1_736_408_883_573_957_920
    trace = Trace(device_id=0, hidden_baseline=0, t_start=t0, t_end=t0 + 1000,
                  blocks=(Block(4096, t0, None, "A", component="GE"), Block(8192, t0 + 1000, None, "B", component="GE")),
                  steps=())
    prof = write_prof([trace], tmp_path, CannOptions(unfreed="zero", static_graph=False))
    path = prof / "mindstudio_profiler_output" / "operator_memory_20250114093025.csv"
    lines = read_lines(path)
    fields, eol = split_row(lines[2])  # B: freed at the instant it was allocated, pool still reserved
    fields[7], fields[8] = "4.0", "2048.0"
    lines[2] = join_row(fields, eol)
    write_lines(path, lines)
    blocks = _read(prof).devices[0].blocks.to_pandas()
    assert blocks["t_free"].isna().tolist() == [True, False]
    assert int(blocks["t_free"][1]) == t0 + 1000


# ---- schemas ---------------------------------------------------------------------------------------------


CANN_SCHEMAS = [n for n in schema_names() if n.startswith("cann.")]


def test_schemas_valid_and_agree_with_jsonschema(tmp_path: Path) -> None:
    assert len(CANN_SCHEMAS) == 5
    prof = write_prof([_trace()], tmp_path, CannOptions())
    out = prof / "mindstudio_profiler_output"
    for name in CANN_SCHEMAS:
        schema = load_schema(name)
        jsonschema.Draft202012Validator.check_schema(schema)
        (path,) = out.glob(name.split(".")[1] + "_2*.csv")
        rows = rows_as_dicts(read_csv(path, schema))
        validator = jsonschema.Draft202012Validator(schema)
        assert rows and all(not list(validator.iter_errors(r)) for r in rows), name


# ---- bad input -------------------------------------------------------------------------------------------


def _file(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    prof = write_prof([_trace()], tmp_path, CannOptions())
    return prof, prof / "mindstudio_profiler_output" / f"{kind}_20250114093025.csv"


def _set(path: Path, line: int, column: str, value: str) -> None:
    lines = read_lines(path)
    header, _ = split_row(lines[0])
    fields, eol = split_row(lines[line - 1])
    fields[header.index(column)] = value
    lines[line - 1] = join_row(fields, eol)
    write_lines(path, lines)


@pytest.mark.parametrize(("kind", "column", "value", "message"), [
    ("operator_memory", "Size(KB)", "N/A", "malformed value"),
    ("operator_memory", "Allocation Time(us)", "", "needs an Allocation Time"),
    ("operator_memory", "Duration(us)", "-3.0", "malformed value"),
    ("memory_record", "Component", "APP", "value not allowed"),
    ("memory_record", "Total Allocated(KB)", "", "empty cell"),
    ("npu_mem", "event", "Host", "value not allowed"),
    ("npu_mem", "Device_id", "host", "malformed value"),
    ("npu_module_mem", "Timestamp(us)", "N/A", "malformed value"),
])
def test_bad_cell(tmp_path: Path, kind: str, column: str, value: str, message: str) -> None:
    prof, path = _file(tmp_path, kind)
    _set(path, 3, column, value)
    with pytest.raises(InputError) as err:
        load(discover(prof)[0])
    e = err.value
    assert (e.file, e.line, e.column) == (str(path), 3, column)
    assert message in e.message and e.expected


@pytest.mark.parametrize(("kind", "old", "new"), [
    ("operator_memory", "Size(KB)", "Size(MB)"),
    ("memory_record", "Total Reserved(KB)", "Total Reserved(MB)"),
    ("npu_mem", "memory(KB)", "memory(MB)"),
])
def test_wrong_unit_in_header(tmp_path: Path, kind: str, old: str, new: str) -> None:
    prof, path = _file(tmp_path, kind)
    path.write_bytes(path.read_bytes().replace(old.encode(), new.encode(), 1))
    with pytest.raises(InputError) as err:
        load(discover(prof)[0])
    assert (err.value.line, err.value.column, err.value.expected) == (1, new, repr(old))


def test_missing_device_id_column(tmp_path: Path) -> None:
    prof, path = _file(tmp_path, "memory_record")
    lines = [b",".join(line.split(b",")[1:]) for line in read_lines(path)]
    write_lines(path, lines)
    with pytest.raises(InputError) as err:
        load(discover(prof)[0])
    assert (err.value.line, err.value.column) == (1, "Device_id")


def test_prof_dir_without_memory_data(tmp_path: Path) -> None:
    prof = tmp_path / "PROF_000001_20250114093025123_ABC"
    (prof / "host").mkdir(parents=True)
    with pytest.raises(InputError) as err:
        load(discover(prof)[0])
    assert err.value.file == str(prof) and "no CANN memory data" in err.value.message
    rc, _, stderr = run_cli(["inspect", str(tmp_path)])
    assert rc == 2
    assert "no CANN memory data" in one_stderr_line(stderr)


def test_cli_exit_2_names_file_line_column(tmp_path: Path) -> None:
    prof, path = _file(tmp_path / "root", "operator_memory")
    _set(path, 2, "Size(KB)", "N/A")
    rc, _, stderr = run_cli(["inspect", str(prof)])
    assert rc == 2
    line = one_stderr_line(stderr)
    assert line.startswith(f"memgate: error: {path}:2: column 'Size(KB)': malformed value")


# ---- files of one PROF directory that cannot belong together (issue 11) ------------------------------------


def _edit_all(path: Path, column: str, edit: Callable[[str], str]) -> None:
    lines = read_lines(path)
    header, _ = split_row(lines[0])
    for i in range(1, len(lines)):
        fields, eol = split_row(lines[i])
        fields[header.index(column)] = edit(fields[header.index(column)])
        lines[i] = join_row(fields, eol)
    write_lines(path, lines)


def test_operator_memory_of_another_device_is_refused(tmp_path: Path) -> None:
    prof, ops = _file(tmp_path, "operator_memory")
    _edit_all(ops, "Device_id", lambda _: "4")
    with pytest.raises(InputError) as info:
        _read(prof)
    err = info.value
    assert (err.file, err.found) == (str(ops), "blocks on npu:4")
    assert err.message.startswith("the files of this profile name different devices: the blocks on npu:4 have no "
                                  "allocator totals, memory_record_20250114093025.csv records them for npu:3 only")


def test_operator_memory_of_another_window_is_refused(tmp_path: Path) -> None:
    prof, ops = _file(tmp_path, "operator_memory")
    hour_us = 3600 * 10**6
    _edit_all(ops, "Allocation Time(us)", lambda v: f"{int(v.split('.')[0]) + hour_us}.{v.split('.')[1]}")
    with pytest.raises(InputError) as info:
        _read(prof)
    t0 = _trace().t_start
    record = prof / "mindstudio_profiler_output" / "memory_record_20250114093025.csv"
    err = info.value
    assert err.file == str(ops)
    assert err.message.startswith("npu:3: the blocks and the allocator totals of memory_record_20250114093025.csv do "
                                  "not overlap in time")
    # the GE series spans the trace's events; the blocks moved by an hour (92.6 µs the longest)
    assert err.expected == f"blocks inside the window of {record} ({t0}..{t0 + 92_600} ns)"
    assert err.found == f"blocks from {t0 + hour_us * 1000}..{t0 + hour_us * 1000 + 92_600} ns"


def test_cross_file_figures(tmp_path: Path) -> None:
    prof, _ = _file(tmp_path, "operator_memory")
    profile = _read(prof)
    t0 = _trace().t_start
    names = {f"mindstudio_profiler_output/{k}_20250114093025.csv": ["npu:3"]
             for k in ("memory_record", "npu_mem", "npu_module_mem", "operator_memory")}
    assert profile.metadata["cross_file"]["devices_by_file"] == names
    assert profile.metadata["cross_file"]["window_ns_by_file"][
        "mindstudio_profiler_output/operator_memory_20250114093025.csv"] == [t0, t0 + 92_600]
    (m,) = profile_metrics(profile)
    ge = m.facts.consistency["GE"]
    assert (ge.window_overlap, ge.checked_blocks, ge.agreeing_blocks) == (1.0, 2, 2)

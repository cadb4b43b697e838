"""MindSpore loader (docs/formats-reference.md §2): ground-truth traces written by tests/writers/mindspore.py read back.

Exactness: memory_record.csv's MindSpore MB (= bytes / 1024 / 1000 as Python float text) is parsed
and multiplied back by 1 024 000; for integer bytes below 2**51 the float error (2**-53 per step)
stays under half a byte, so every series value is exact and the metrics compare with ``==``.
operator_memory.csv times are exact decimals (or, as MindSpore writes them, float ``ns / 1000`` —
exact for whole µs, which the float-times test uses). The memory tracker prints float32 KB with one
decimal: exact for multiples of 512 B below 8 GiB, else within the bound stated in
``test_tracker_dump_within_rounding``.
"""

from __future__ import annotations

import csv
import json
import pickle
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

import jsonschema
import pandas as pd
import pytest
from groundtruth import Block, Trace, expected_metrics, live_blocks_at, peak_moment
from helpers import (
    PTA21_L1,
    SAMPLES,
    copy_sample,
    join_row,
    one_stderr_line,
    read_lines,
    run_cli,
    split_row,
    write_lines,
)
from hypothesis import given
from hypothesis import strategies as st
from strategies import secondary_examples, traces
from writers.mindspore import MsOptions, app_samples, write_memory_block, write_profile, write_tracker_dump

from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.loaders.ascend import mindspore
from memgate.metrics import TOP_HOLDERS, profile_metrics
from memgate.model import Profile
from memgate.readers.csvtable import read_csv, rows_as_dicts
from memgate.schemas import load_schema, schema_names

SERIES_KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation")


def _only_ms(trace: Trace) -> Trace:
    """The blocks MindSpore's operator_memory.csv shows: its own allocator's, none of GE's."""
    return replace(trace, blocks=tuple(b for b in trace.blocks if b.component == "PTA"))


def _whole_us(trace: Trace) -> Trace:
    """The same trace on a µs clock (×100 after the start, so ticks of 10 ns become whole µs)."""
    base = trace.t_start // 1000 * 1000

    def t(v: int | None) -> int | None:
        return None if v is None else base + (v - trace.t_start) * 100

    return replace(
        trace,
        blocks=tuple(replace(b, t_alloc=t(b.t_alloc), t_free=t(b.t_free)) for b in trace.blocks),
        steps=tuple((n, base + (s - trace.t_start) * 100, base + (e - trace.t_start) * 100) for n, s, e in trace.steps),
        t_start=base,
        t_end=base + (trace.t_end - trace.t_start) * 100,
    )


def _one(root: Path) -> tuple[Profile, object]:
    found = discover(root)
    assert [f.format.name for f in found] == ["mindspore"]
    profile = load(found[0])
    metrics = profile_metrics(profile)
    assert len(metrics) == 1
    return profile, metrics[0]


def _assert_equal(values: dict, expected: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        assert values[key] == expected[key], key
        assert type(values[key]) is type(expected[key]), key


ms_options = st.builds(
    MsOptions,
    rank=st.integers(0, 63),
    steps=st.sampled_from(("kernel_details", "step_trace_time", "none")),
    crlf=st.booleans(),
)


@secondary_examples()
@given(trace=traces(), opts=ms_options)
def test_metrics_equal_ground_truth(trace: Trace, opts: MsOptions) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        prof = write_profile(trace, Path(tmp), opts)
        profile, m = _one(Path(tmp))
    assert profile.path == str(prof) and profile.format == "mindspore"
    assert profile.rank == str(opts.rank)
    assert m.device == f"npu:{trace.device_id}"  # the physical id, not the NPU:{rank} of MindSpore rows
    assert m.component == "MindSpore+GE"
    expected = expected_metrics(trace, separate_allocators=True)
    _assert_equal(m.values, expected, SERIES_KEYS)
    assert m.values["peak_app_reserved_bytes"] == max(v for _, v in app_samples(trace, opts))
    blocks_expected = expected_metrics(_only_ms(trace))
    assert m.values["op_max_block_bytes"] == blocks_expected["op_max_block_bytes"]
    if opts.steps == "kernel_details":
        assert [tuple(map(int, r)) for r in profile.steps.to_pandas().to_numpy()] == sorted(trace.steps)
        _assert_equal(m.values, expected, ("step_growth_bytes",))
        _assert_equal(m.values, blocks_expected, ("leaked_bytes",))
    else:
        assert m.values["step_growth_bytes"] is None and m.values["leaked_bytes"] is None
        assert "step" in m.missing["leaked_bytes"]
        assert list(profile.steps.to_pandas()["step"]) == ([n for n, _, _ in sorted(trace.steps)]
                                               if opts.steps == "step_trace_time" else [])
    # Who holds the peak: the largest MindSpore blocks live then (GE and pre-window blocks have no row).
    t = peak_moment(trace)
    live = sorted((b.size for b in live_blocks_at(_only_ms(trace), t) if b.t_alloc is not None), reverse=True)
    assert [e["size"] for e in m.values["top_at_peak"]] == live[:TOP_HOLDERS]
    # The sum rows agree with their parts (MindSpore+GE = MindSpore + GE); the blocks' totals give the
    # pre-window baseline (pre-window blocks have no row in MindSpore's file: only without them is it exact).
    times = [t for b in trace.blocks for t in (b.t_alloc, b.t_free) if t is not None]
    if len(times) == len(set(times)):  # reconcile's sum check matches rows by timestamp
        assert m.facts.sum_checks["MindSpore+GE"] == 1.0
    if all(b.t_alloc is not None for b in trace.blocks):
        ms = m.facts.components["MindSpore"]
        assert (ms.baseline_bytes, ms.consistency) == (trace.hidden_baseline, 1.0)


@secondary_examples()
@given(trace=traces(), rank=st.integers(0, 7))
def test_float_times_as_mindspore_writes_them(trace: Trace, rank: int) -> None:
    """operator_memory times as ``ns / 1000`` float text: exact on a whole-µs clock."""
    trace = _whole_us(trace)
    with tempfile.TemporaryDirectory() as tmp:
        write_profile(trace, Path(tmp), MsOptions(rank=rank, float_times=True))
        profile, m = _one(Path(tmp))
    blocks_expected = expected_metrics(_only_ms(trace))
    _assert_equal(m.values, blocks_expected, ("op_max_block_bytes", "leaked_bytes"))
    blocks = profile.devices[0].blocks.to_pandas()
    got = sorted(zip(blocks["t_alloc"], blocks["t_free"].fillna(-1)))
    want = sorted((b.t_alloc, -1 if b.t_free is None else b.t_free) for b in _only_ms(trace).blocks
                  if b.t_alloc is not None)
    assert got == want


@secondary_examples()
@given(trace=traces(ge=False))
def test_cpu_memory_record_is_the_mindspore_series_when_memory_record_is_absent(trace: Trace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_profile(trace, Path(tmp), MsOptions(rank=3, memory_record=False))
        profile, m = _one(Path(tmp))
    assert m.component == "MindSpore"
    assert m.device == f"npu:{trace.device_id}"  # the same NPU, not a second ('cpu') device
    assert m.source.endswith("FRAMEWORK/cpu_ms_memory_record_3.txt")
    assert m.values["peak_allocated_bytes"] == max(v for _, v in trace.allocated_curve("PTA"))
    assert m.values["peak_reserved_bytes"] == max(v for _, v in trace.reserved_curve("PTA"))
    assert profile.rank == "3"


def test_device_label_falls_back_to_the_rank_label(tmp_path: Path) -> None:
    trace = Trace(device_id=6, hidden_baseline=0, t_start=1_700_000_000_000_000_000, t_end=1_700_000_000_000_100_000,
                  blocks=(Block(4096, 1_700_000_000_000_000_000, 1_700_000_000_000_050_000, "MatMul"),), steps=())
    prof = write_profile(trace, tmp_path, MsOptions(rank=9, operator_memory=False))
    (prof / "ASCEND_PROFILER_OUTPUT" / "npu_module_mem.csv").unlink()
    profile, m = _one(tmp_path)
    assert (profile.rank, m.device) == ("9", "npu:9")  # only MindSpore's NPU:{rank} rows name a device
    assert m.values["peak_allocated_bytes"] == 4096


def test_profile_naming_two_devices_is_an_input_error(tmp_path: Path) -> None:
    trace = Trace(device_id=1, hidden_baseline=0, t_start=1_700_000_000_000_000_000, t_end=1_700_000_000_000_100_000,
                  blocks=(Block(4096, 1_700_000_000_000_000_000, None, "MatMul"),
                          Block(512, 1_700_000_000_000_001_000, None, "Add")), steps=())
    prof = write_profile(trace, tmp_path, MsOptions(rank=1))
    path = prof / "ASCEND_PROFILER_OUTPUT" / "operator_memory.csv"
    lines = read_lines(path)
    fields, eol = split_row(lines[2])
    fields[-1] = "NPU:4"
    lines[2] = join_row(fields, eol)
    write_lines(path, lines)
    with pytest.raises(InputError) as err:
        load(discover(tmp_path)[0])
    assert (err.value.file, err.value.line, err.value.column) == (str(path), 3, "Device Type")
    assert (err.value.expected, err.value.found) == ("NPU:1", "NPU:4")


# ---- the memory tracker files -----------------------------------------------------------------------


def _aligned(trace: Trace) -> Trace:
    """Sizes in whole 512 B and totals below 8 GiB: what float32 KB with one decimal holds exactly."""
    blocks = tuple(replace(b, size=((b.size % (1 << 24)) // 512 + 1) * 512) for b in trace.blocks)
    return replace(trace, blocks=blocks, hidden_baseline=trace.hidden_baseline % (1 << 32) // 512 * 512)


@secondary_examples()
@given(trace=traces(pre_window=False), rank=st.integers(0, 15))
def test_tracker_dump_exact_for_aligned_sizes(trace: Trace, rank: int) -> None:
    trace = _aligned(_whole_us(trace))
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tracker_dump(trace, Path(tmp), rank)
        found = discover(Path(tmp))
        assert [(f.path, f.format.name) for f in found] == [(path, "mindspore")]
        profile = load(found[0])
    (m,) = profile_metrics(profile)
    assert (profile.rank, m.device, m.component) == (str(rank), f"npu:{rank}", "blocks")
    expected = expected_metrics(trace)
    _assert_equal(m.values, expected, ("peak_allocated_bytes", "op_max_block_bytes"))
    assert m.facts.components["MindSpore"].baseline_bytes == trace.hidden_baseline
    assert m.facts.components["MindSpore"].consistency == 1.0
    assert m.values["peak_reserved_bytes"] is None  # no reserved series in this file


def _tracker_error(size: int) -> float:
    """One value's worst error: 0.05 KB printed, float32 rounding, the loader's rounding to a byte."""
    return 0.05 * 1024 + size * 2.0**-23 + 1


@pytest.mark.parametrize("unit", ["KB", "MB"])
@secondary_examples()
@given(trace=traces(pre_window=False, max_blocks=12))
def test_tracker_dump_within_rounding(unit: str, trace: Trace) -> None:
    """Any sizes: each block within 51.2 B + 2**-23 relative; the peak within the sum of those errors
    plus one total's error (0.05 MB = 52 428.8 B when the totals are in MB)."""
    trace = _whole_us(trace)
    with tempfile.TemporaryDirectory() as tmp:
        write_tracker_dump(trace, Path(tmp), 2, unit=unit)
        profile = load(discover(Path(tmp))[0])
    (m,) = profile_metrics(profile)
    expected = expected_metrics(trace)
    got_ops = m.values["op_max_block_bytes"]
    assert set(got_ops) == set(expected["op_max_block_bytes"])
    for op, size in expected["op_max_block_bytes"].items():
        assert abs(got_ops[op] - size) <= _tracker_error(size)
    peak = expected["peak_allocated_bytes"]
    total_error = (0.05 * (1024 if unit == "KB" else 1 << 20) + peak * 2.0**-23 + 1
                   + 2 * sum(_tracker_error(b.size) for b in trace.blocks))
    assert abs(m.values["peak_allocated_bytes"] - peak) <= total_error


@secondary_examples()
@given(trace=traces(pre_window=False), rank=st.integers(0, 7), last_user_task=st.booleans())
def test_memory_block_on_the_logical_clock(trace: Trace, rank: int, last_user_task: bool) -> None:
    trace = replace(trace, hidden_baseline=0)  # the tracker sees every block since the process started
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / f"rank_{rank}"
        folder.mkdir()
        path = write_memory_block(trace, folder, last_user_task=last_user_task)
        found = discover(Path(tmp))
        assert [(f.path, f.format.name) for f in found] == [(path, "mindspore")]
        profile = load(found[0])
    (m,) = profile_metrics(profile)
    assert (profile.rank, m.device) == (str(rank), f"npu:{rank}")
    assert "logical" in profile.metadata["clock"]
    allocated = [b for b in trace.blocks if b.t_alloc is not None]
    assert len(profile.devices[0].blocks) == len(allocated)  # InSideSomas rows dropped
    assert profile.metadata["in_side_somas_rows_dropped"] == 2 * (len(allocated) // 3)
    expected = expected_metrics(trace)
    _assert_equal(m.values, expected, ("peak_allocated_bytes", "op_max_block_bytes"))
    assert profile.metadata["tracker_actual_peak_bytes"] == expected["peak_allocated_bytes"]
    assert m.values["step_growth_bytes"] is None and m.values["leaked_bytes"] is None


# ---- discovery ----------------------------------------------------------------------------------------


def _small_trace(device_id: int = 0) -> Trace:
    t0 = 1_736_408_883_573_957_920
    return Trace(device_id=device_id, hidden_baseline=1 << 30, t_start=t0, t_end=t0 + 50_000_000,
                 blocks=(Block(3 << 20, t0, t0 + 20_000_000, "MatMul-op1"),
                         Block(5 << 20, t0 + 1_000, None, "Add-op2"),
                         Block(1 << 20, t0 + 2_000, t0 + 30_000_000, "cann::Conv", component="GE")),
                 steps=((7, t0, t0 + 25_000_000), (8, t0 + 25_000_000, t0 + 40_000_000),
                        (9, t0 + 40_000_000, t0 + 50_000_000)))


def test_mindspore_dir_is_not_taken_for_torch_npu(tmp_path: Path) -> None:
    prof = write_profile(_small_trace(), tmp_path / "root", MsOptions(rank=0))
    plain = tmp_path / "plain_name"  # no _ascend_ms suffix: the memory_record header decides
    shutil.copytree(prof, plain)
    assert [f.format.name for f in discover(prof)] == ["mindspore"]
    assert [f.format.name for f in discover(plain)] == ["mindspore"]
    out = discover(prof / "ASCEND_PROFILER_OUTPUT")  # the output folder given directly
    assert [(f.path, f.format.name) for f in out] == [(prof, "mindspore")]
    sample = copy_sample(PTA21_L1, tmp_path / "pt" / "host_1_2_ascend_pt")
    assert [f.format.name for f in discover(sample)] == ["torch_npu"]
    assert not mindspore.claims(sample)


def test_small_profile_values(tmp_path: Path) -> None:
    """A hand-sized profile: the numbers a reader can check by eye."""
    trace = _small_trace(device_id=2)
    write_profile(trace, tmp_path, MsOptions(rank=4))
    profile, m = _one(tmp_path)
    assert m.values["peak_allocated_bytes"] == (1 << 30) + (9 << 20)
    assert m.values["peak_reserved_bytes"] == (1 << 30) + (8 << 20) + (2 << 20)
    assert m.values["op_max_block_bytes"] == {"MatMul-op1": 3 << 20, "Add-op2": 5 << 20}
    assert m.values["leaked_bytes"] == 0  # Add-op2 was allocated in step 7, the warmup step
    assert m.values["leak_undetermined_bytes"] == 0  # nothing allocated in step 9 stays
    assert (profile.rank, m.device, m.peak_step) == ("4", "npu:2", 7)
    dvpp = profile.devices[0].series["module:DVPP"].frame.to_pandas()
    assert dvpp["reserved"].isna().all()  # -1: no level


# ---- schemas -------------------------------------------------------------------------------------------


MS_SCHEMAS = [n for n in schema_names() if n.startswith("mindspore.")]


def test_schemas_are_valid_json_schemas() -> None:
    assert len(MS_SCHEMAS) == 8
    for name in MS_SCHEMAS:
        schema = load_schema(name)
        jsonschema.Draft202012Validator.check_schema(schema)
        for generation in schema["x-memgate-headers"].values():
            assert set(generation) <= set(schema["properties"])


def test_every_written_row_is_valid_per_jsonschema(tmp_path: Path) -> None:
    """The vectorized check and jsonschema agree on the writer's files (row by row)."""
    trace = _small_trace()
    prof = write_profile(trace, tmp_path / "a", MsOptions(rank=1, steps="kernel_details"))
    files = {
        "mindspore.memory_record": prof / "ASCEND_PROFILER_OUTPUT/memory_record.csv",
        "mindspore.operator_memory": prof / "ASCEND_PROFILER_OUTPUT/operator_memory.csv",
        "mindspore.npu_module_mem": prof / "ASCEND_PROFILER_OUTPUT/npu_module_mem.csv",
        "mindspore.step_trace_time": prof / "ASCEND_PROFILER_OUTPUT/step_trace_time.csv",
        "mindspore.kernel_details": prof / "ASCEND_PROFILER_OUTPUT/kernel_details.csv",
        "mindspore.cpu_ms_memory_record": prof / "FRAMEWORK/cpu_ms_memory_record_1.txt",
        "mindspore.tracker_operator_memory": write_tracker_dump(trace, tmp_path, 1, unit="MB"),
        "mindspore.memory_block": write_memory_block(trace, tmp_path),
    }
    assert sorted(files) == sorted(MS_SCHEMAS)
    for name, path in files.items():
        schema = load_schema(name)
        rows = rows_as_dicts(read_csv(path, schema))
        validator = jsonschema.Draft202012Validator(schema)
        for row in rows:
            assert not list(validator.iter_errors(row)), (name, row)
        assert rows


# ---- bad input -------------------------------------------------------------------------------------------


def _edit_cell(path: Path, line: int, column: str, value: str) -> None:
    lines = read_lines(path)
    header, _ = split_row(lines[0])
    fields, eol = split_row(lines[line - 1])
    fields[header.index(column)] = value
    lines[line - 1] = join_row(fields, eol)
    write_lines(path, lines)


def _written(tmp_path: Path) -> Path:
    return write_profile(_small_trace(), tmp_path, MsOptions(rank=0))


@pytest.mark.parametrize(
    ("file", "column", "value", "message", "expected"),
    [
        ("operator_memory.csv", "Size(KB)", "N/A", "malformed value", "a decimal number in KB"),
        ("operator_memory.csv", "Allocation Time(us)", "N/A", "needs an Allocation Time", "a timestamp"),
        ("operator_memory.csv", "Allocation Total Allocated(MB)", "1.5 MB", "malformed value",
         "a decimal number in MB"),
        ("memory_record.csv", "Total Reserved(MB)", "N/A", "malformed value", "a decimal number in MB"),
        ("memory_record.csv", "Component", "PTA", "value not allowed", "one of 'MindSpore', 'GE'"),
        ("memory_record.csv", "Timestamp(us)", "12:00:01", "malformed value", "a timestamp in us"),
        ("npu_module_mem.csv", "Device_id", "host", "malformed value", "an integer"),
    ],
)
def test_bad_cell(tmp_path: Path, file: str, column: str, value: str, message: str, expected: str) -> None:
    prof = _written(tmp_path)
    path = prof / "ASCEND_PROFILER_OUTPUT" / file
    _edit_cell(path, 3, column, value)
    with pytest.raises(InputError) as err:
        load(discover(tmp_path)[0])
    e = err.value
    assert (e.file, e.line, e.column) == (str(path), 3, column)
    assert message in e.message
    assert e.expected is not None and e.expected.startswith(expected)
    if "malformed" in message or "not allowed" in message:
        assert e.found == repr(value)


@pytest.mark.parametrize(("file", "old", "new"), [
    ("memory_record.csv", "Total Allocated(MB)", "Total Allocated(KB)"),
    ("npu_module_mem.csv", "Total Reserved(KB)", "Total Reserved(MB)"),
    ("operator_memory.csv", "Size(KB)", "Size(MB)"),
])
def test_wrong_unit_in_header(tmp_path: Path, file: str, old: str, new: str) -> None:
    prof = _written(tmp_path)
    path = prof / "ASCEND_PROFILER_OUTPUT" / file
    path.write_bytes(path.read_bytes().replace(old.encode(), new.encode(), 1))
    with pytest.raises(InputError) as err:
        load(discover(tmp_path)[0])
    e = err.value
    assert (e.file, e.line, e.column) == (str(path), 1, new)
    assert "not allowed" in e.message and e.expected == repr(old)


def _drop_trailing_comma(tmp_path: Path) -> Path:
    path = write_tracker_dump(_small_trace(), tmp_path, 0)
    lines = read_lines(path)
    lines[2] = lines[2].replace(b",\n", b"\n")  # the C++ writer ends every line with a comma
    write_lines(path, lines)
    return path


def test_trailing_comma_mismatch_in_tracker_file(tmp_path: Path) -> None:
    path = _drop_trailing_comma(tmp_path)
    with pytest.raises(InputError) as err:
        load(discover(tmp_path)[0])
    assert err.value.file == str(path)
    assert "number of fields" in err.value.message
    assert (err.value.expected, err.value.found) == ("10 columns", "9 columns")


def test_trailing_comma_mismatch_names_the_line(tmp_path: Path) -> None:
    _drop_trailing_comma(tmp_path)
    with pytest.raises(InputError) as err:
        load(discover(tmp_path)[0])
    assert err.value.line == 3


def test_memory_block_ending_before_it_starts(tmp_path: Path) -> None:
    path = write_memory_block(_small_trace(), tmp_path)
    _edit_cell(path, 2, "end_time_stamp", "0")
    with pytest.raises(InputError) as err:
        load(discover(tmp_path)[0])
    assert (err.value.line, err.value.column, err.value.found) == (2, "end_time_stamp", "0")


def test_empty_ascend_ms_dir_names_what_is_missing(tmp_path: Path) -> None:
    prof = tmp_path / "w_1_ascend_ms"
    (prof / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (prof / "profiler_info_0.json").write_text(json.dumps({"rank_id": 0}))
    with pytest.raises(InputError) as err:
        load(discover(tmp_path)[0])
    assert err.value.file == str(prof) and "memory_record.csv" in err.value.message


def test_cli_exit_2_with_one_error_line(tmp_path: Path) -> None:
    prof = _written(tmp_path / "root")
    path = prof / "ASCEND_PROFILER_OUTPUT" / "operator_memory.csv"
    _edit_cell(path, 3, "Size(KB)", "N/A")
    rc, out, err = run_cli(["inspect", str(tmp_path / "root")])
    assert rc == 2
    line = one_stderr_line(err)
    assert f"{path}:3:" in line and "'Size(KB)'" in line and "'N/A'" in line
    rc, out, err = run_cli(["validate", str(tmp_path / "root")])
    assert rc == 2 and "INVALID" in out and "[mindspore]" in out
    one_stderr_line(err)


# ---- files of one profile from different windows (issue 11) ---------------------------------------------


def _shift_column(path: Path, column: str, by: int) -> list[int]:
    """Add ``by`` to every integer cell of ``column``; the new values."""
    lines = read_lines(path)
    header, _ = split_row(lines[0])
    values = []
    for i in range(1, len(lines)):
        fields, eol = split_row(lines[i])
        value = int(fields[header.index(column)]) + by
        fields[header.index(column)] = str(value)
        values.append(value)
        lines[i] = join_row(fields, eol)
    write_lines(path, lines)
    return values


def test_an_allocator_record_of_another_window_is_refused(tmp_path: Path) -> None:
    trace = _small_trace()
    prof = write_profile(trace, tmp_path, MsOptions(rank=0, memory_record=False))
    record = prof / "FRAMEWORK" / "cpu_ms_memory_record_0.txt"
    hour = 3600 * 10**9
    shifted = _shift_column(record, "Timestamp(ns)", hour)
    with pytest.raises(InputError) as info:
        load(discover(prof)[0])
    err = info.value
    ops = prof / "ASCEND_PROFILER_OUTPUT" / "operator_memory.csv"
    assert err.file == str(ops)
    assert err.message == ("npu:0: the blocks and the allocator totals of cpu_ms_memory_record_0.txt do not overlap "
                           "in time: they come from different runs or profiling windows")
    assert err.expected == f"blocks inside the window of {record} ({min(shifted)}..{max(shifted)} ns)"
    ms_blocks = [b for b in trace.blocks if b.component == "PTA"]
    times = [t for b in ms_blocks for t in (b.t_alloc, b.t_free) if t is not None]
    assert err.found == f"blocks from {min(times)}..{max(times)} ns"
    # the same record in its own window: loaded, and the figures name both files on one device
    _shift_column(record, "Timestamp(ns)", -hour)
    profile = load(discover(prof)[0])
    cross = profile.metadata["cross_file"]
    assert cross["devices_by_file"] == {"ASCEND_PROFILER_OUTPUT/npu_module_mem.csv": ["npu:0"],
                                        "ASCEND_PROFILER_OUTPUT/operator_memory.csv": ["npu:0"],
                                        "FRAMEWORK/cpu_ms_memory_record_0.txt": ["npu:0"]}
    assert cross["window_ns_by_file"]["ASCEND_PROFILER_OUTPUT/operator_memory.csv"] == [min(times), max(times)]


def test_a_tracker_dump_of_two_windows_is_refused(tmp_path: Path) -> None:
    trace = _aligned(_small_trace())
    path = write_tracker_dump(trace, tmp_path, rank=3, cpu_record=True)
    _shift_column(tmp_path / "cpu_ms_memory_record_3.txt", "Timestamp(ns)", -(3600 * 10**9))
    with pytest.raises(InputError, match="do not overlap in time") as info:
        load(discover(path)[0])
    assert info.value.file == str(path)


# ---- MindSpore 2.10 as it writes (tests/data/samples/mindspore, PROVENANCE.md) ------------------------

MS210 = SAMPLES / "mindspore"
MS210_PROFILE = next((MS210 / "ms210_cpu_graph_old").glob("*_ascend_ms"))
MS210_CPU_RECORD = MS210_PROFILE / "FRAMEWORK" / "cpu_ms_memory_record_0.txt"
MS210_TRACKER = MS210 / "ms210_memtracker_cpu_graph" / "memory_block.csv"


def _raw_columns(path: Path) -> dict[str, list[str]]:
    """The file's cells by column, read with the csv module (the trailing comma's nameless column dropped)."""
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    header = rows[0]
    return {name: [r[i] for r in rows[1:]] for i, name in enumerate(header) if name}


def test_ms210_cpu_target_profile_is_cpu_with_the_record_peaks() -> None:
    raw = _raw_columns(MS210_CPU_RECORD)
    allocated = [int(v) for v in raw["Total Allocated(Byte)"]]
    reserved = [int(v) for v in raw["Total Reserved(Byte)"]]
    assert (max(allocated), max(reserved), len(allocated)) == (680448, 1073741824, 183)  # PROVENANCE.md
    profile, m = _one(MS210 / "ms210_cpu_graph_old")
    assert m.device == "cpu"  # the CPU pool, though the folder is named *_ascend_ms
    assert m.values["peak_allocated_bytes"] == max(allocated)
    assert m.values["peak_reserved_bytes"] == max(reserved)
    assert m.peak_t_ns == int(raw["Timestamp(ns)"][allocated.index(max(allocated))]) == 1795846802590065666
    assert profile.metadata["target"] == "CPU"
    assert "KB/1000" not in profile.metadata["units"]  # no memory_record.csv was read: no note of its units
    why = m.missing["step_growth_bytes"]
    assert "no step marker on the CPU target" in why and "Ascend or GPU" in why
    assert "prof.step() once per training step" not in why and "lower warmup_steps" not in why


def test_ms210_cpu_record_alone_is_cpu_whatever_its_folder_is_called(tmp_path: Path) -> None:
    root = copy_sample(MS210_PROFILE, tmp_path / "renamed")  # not *_ascend_ms
    record = root / "FRAMEWORK" / MS210_CPU_RECORD.name
    found = discover(root)
    assert [(f.path, f.format.name) for f in found] == [(root, "mindspore")]  # not torch_npu's trace_view.json
    for profile in (load(found[0]), mindspore.load(record)):  # the folder, and the file given alone
        (m,) = profile_metrics(profile)
        assert (m.device, m.values["peak_allocated_bytes"], m.values["peak_reserved_bytes"]) == (
            "cpu", 680448, 1073741824)
        assert "no step marker on the CPU target" in m.missing["step_growth_bytes"]


def test_an_ascend_profile_with_a_cpu_record_stays_npu(tmp_path: Path) -> None:
    """profiler_info and the NPU files name the device: the cpu_ms_memory_record is the NPU's allocator."""
    prof = write_profile(_small_trace(device_id=2), tmp_path, MsOptions(rank=4, memory_record=False))
    (prof / "ASCEND_PROFILER_OUTPUT" / "operator_memory.csv").unlink()
    (prof / "ASCEND_PROFILER_OUTPUT" / "npu_module_mem.csv").unlink()
    profile, m = _one(tmp_path)
    assert m.device == "npu:4" and "target" not in profile.metadata  # profiler_info: not the CPU target


@pytest.mark.parametrize("given", ["file", "folder"])
def test_ms210_tracker_header_alone_is_a_cpu_profile_that_measures_nothing(given: str) -> None:
    data = MS210_TRACKER.read_bytes()
    assert data.count(b"\n") == 1 and data.endswith(b",\n")  # the real file: its header, a trailing comma
    root = MS210_TRACKER if given == "file" else MS210_TRACKER.parent
    found = discover(root)
    assert [(f.path, f.format.name) for f in found] == [(MS210_TRACKER, "mindspore")]
    profile = load(found[0])
    assert profile.metadata["header"] == "2.10" and len(profile.devices[0].blocks) == 0
    (m,) = profile_metrics(profile)
    assert m.device == "cpu"
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "step_growth_bytes", "leaked_bytes"):
        assert m.values[key] is None, key  # never a silent 0
        assert "skips every block of its CPU pool" in m.missing[key], key


def test_ms210_tracker_inspect_cli() -> None:
    results = [run_cli(["inspect", path]) for path in (MS210 / "ms210_cpu_graph_old", MS210_TRACKER.parent)]
    assert [r.rc for r in results] == [0, 0], [r.stderr for r in results]
    assert "  cpu  " in results[0].stdout and "(680448 B)" in results[0].stdout
    assert "(1073741824 B)" in results[0].stdout
    assert "  cpu  " in results[1].stdout and "CPU pool" in results[1].stdout


def _ms210_rows(tmp_path: Path) -> Path:
    import corpus  # the rows as mem_tracker.cc writes them, under the sample's header

    return corpus.ms210_memory_block(tmp_path / "rank_5")


def test_ms210_tracker_rows_as_the_writer_streams_them(tmp_path: Path) -> None:
    path = _ms210_rows(tmp_path)
    raw = _raw_columns(path)
    found = discover(tmp_path)
    assert [(f.path, f.format.name) for f in found] == [(path, "mindspore")]
    profile = load(found[0])
    (m,) = profile_metrics(profile)
    assert (profile.rank, m.device, profile.metadata["header"]) == ("5", "npu:5", "2.10")
    blocks = profile.devices[0].blocks.to_pandas()
    never = str((1 << 63) - 1)
    assert blocks["size"].tolist() == [int(v) for v in raw["size"]]
    assert blocks["t_alloc"].tolist() == [int(v) for v in raw["start_time_stamp"]]
    assert [None if v is pd.NA else int(v) for v in blocks["t_free"]] == [
        None if v == never else int(v) for v in raw["end_time_stamp"]]
    assert [None if v is pd.NA else v for v in blocks["op"]] == [v or None for v in raw["node_name"]]
    assert [None if v is pd.NA else v for v in blocks["owner"]] == [
        s or (f"{f}:{n}" if f else None) for s, f, n in zip(raw["python_stack"], raw["file_name"], raw["line_num"])]
    assert blocks["component"].tolist() == raw["pool_type"]
    assert blocks["stream"].tolist() == raw["stream_id"]
    # the running sum of the block sizes on the tracker's counter, computed here from the raw cells
    events = sorted([(int(s), 1, int(z)) for s, z in zip(raw["start_time_stamp"], raw["size"])]
                    + [(int(e), -1, int(z)) for e, z in zip(raw["end_time_stamp"], raw["size"]) if e != never])
    level, peak = 0, 0
    for _, sign, size in events:
        level += sign * size
        peak = max(peak, level)
    assert m.values["peak_allocated_bytes"] == peak
    assert profile.metadata["tracker_actual_peak_bytes"] == max(int(v) for v in raw["actual_peak_memory"])
    assert profile.metadata["tracker_used_peak_bytes"] == max(int(v) for v in raw["actual_used_memory"])
    assert profile.metadata["persistent_blocks"] == raw["is_persistent"].count("1")
    assert m.values["step_growth_bytes"] is None and "event counter" in m.missing["step_growth_bytes"]
    validator = jsonschema.Draft202012Validator(load_schema("mindspore.memory_block"))
    for row in rows_as_dicts(read_csv(path, load_schema("mindspore.memory_block"))):
        assert not list(validator.iter_errors(row)), row


def test_ms210_tracker_row_with_a_bad_cell_names_it(tmp_path: Path) -> None:
    path = _ms210_rows(tmp_path)
    lines = read_lines(path)
    fields, eol = split_row(lines[3])
    fields[19] = "true"  # is_small: std::ostream prints a bool as 0 or 1
    lines[3] = join_row(fields, eol)
    write_lines(path, lines)
    with pytest.raises(InputError) as err:
        load(discover(tmp_path)[0])
    assert (err.value.file, err.value.line, err.value.column, err.value.found) == (str(path), 4, "is_small", "'true'")


# ---- torch_npu snapshots: the npu label (snapshot_stacks.is_npu; kept here, beside the other Ascend labels) ----


def _npu_snapshot(tmp_path: Path, entries: int, npu_at: int, shared: bool) -> Path:
    """A torch_npu snapshot whose only torch_npu frame is in entry ``npu_at`` of a long trace."""
    user = [{"name": "step", "filename": "/work/train.py", "line": 3},
            {"name": "forward", "filename": "/usr/lib/python3/site-packages/torch/nn/modules/module.py", "line": 9}]
    npu = {"name": "empty", "filename": "/usr/local/lib/python3.9/site-packages/torch_npu/npu/memory.py", "line": 1}
    trace = []
    for i in range(entries):
        frames = [f if shared else dict(f) for f in user] + ([npu] if i == npu_at else [])
        trace.append({"action": "alloc", "addr": (1 << 20) + 512 * i, "size": 512, "stream": 0, "frames": frames})
    blocks = [{"address": (1 << 20) + 512 * i, "size": 512, "requested_size": 512, "state": "active_allocated"}
              for i in range(entries)]
    data = {"segments": [{"device": 0, "address": 1 << 20, "total_size": 512 * entries, "stream": 0,
                          "segment_type": "large", "blocks": blocks}], "device_traces": [trace]}
    path = tmp_path / "npu_snapshot.pickle"
    path.write_bytes(pickle.dumps(data))
    return path


@pytest.mark.parametrize("shared", [True, False])
def test_torch_npu_frames_past_the_first_thousand_entries_label_npu(tmp_path: Path, shared: bool) -> None:
    from memgate.loaders.snapshot import snapshot

    path = _npu_snapshot(tmp_path, 3000, 2500, shared)
    assert [d.device for d in snapshot.load(path).devices] == ["npu:0"]
    path = _npu_snapshot(tmp_path, 3000, -1, shared)  # no torch_npu frame at all: torch.cuda's
    assert [d.device for d in snapshot.load(path).devices] == ["cuda:0"]

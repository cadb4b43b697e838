"""torch_npu profiler text export: ``*_ascend_pt/ASCEND_PROFILER_OUTPUT/*.csv`` and friends.

Both header generations (≤2.5 and 2.6+) of every file; see docs/formats-reference.md §1.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from memgate.errors import InputError, read_errors_named, show
from memgate.loaders import registry
from memgate.loaders.ascend.crossfile import cross_file_facts
from memgate.loaders.ascend.trace_view import read_trace_view
from memgate.model import (
    MAX_RANK,
    STEP_COLUMNS,
    ChunkColumn,
    DeviceModel,
    Profile,
    Series,
    by_device,
    check_steps,
    empty_blocks,
    empty_steps,
    int_table,
    split_chunks,
    split_series,
    untimed_steps,
)
from memgate.readers import convert
from memgate.readers.csvcheck import Converter
from memgate.readers.csvtable import CsvTable, read_csv
from memgate.readers.files import check_readable
from memgate.readers.jsonstream import loads_unique
from memgate.readers.limits import check_file_size
from memgate.readers.memory import release_free_memory
from memgate.schemas import load_schema
from memgate.table import Ints, Table, Texts, coded_chunks, texts_from_arrow

FORMAT = "torch_npu"
OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
# A directory is a torch_npu text profile when it holds one of these.
MARKER_FILES = ("memory_record.csv", "operator_memory.csv", "trace_view.json")
MIB = 1 << 20
KIB = 1 << 10
# Files of the export this loader reads (a broken symlink to one must not pass as "absent").
EXPORT_FILES = ("memory_record.csv", "operator_memory.csv", "npu_module_mem.csv", "trace_view.json",
                "kernel_details.csv", "step_trace_time.csv")
SMALL_JSON_BYTES = 16 << 20  # profiler_info / profiler_metadata are a few KB
COLLECT_MEMORY = "re-run torch_npu.profiler.profile(..., profile_memory=True)"


def output_dir(profile_dir: Path) -> Path:
    """Where the CSVs are: ``ASCEND_PROFILER_OUTPUT/`` or the directory itself."""
    inner = profile_dir / OUTPUT_DIR
    return inner if inner.is_dir() else profile_dir


def is_profile_dir(path: Path) -> bool:
    out = output_dir(path)
    if any((out / name).is_file() for name in MARKER_FILES):
        return True
    # A *_ascend_pt run without memory data (profile_memory=False, or never exported): load() says so.
    return path.name.endswith("_ascend_pt") and ((path / OUTPUT_DIR).is_dir() or any(path.glob("profiler_info*.json")))


@read_errors_named
def load(profile_dir: Path) -> Profile:
    profile = _load(profile_dir)
    release_free_memory()  # what reading and checking the files left behind
    return profile


def _load(profile_dir: Path) -> Profile:
    out = output_dir(profile_dir)
    _check_links(out)
    info = read_profiler_info(profile_dir)
    if not any((out / name).exists() for name in MARKER_FILES):
        raise _no_memory_data(profile_dir, out, info)
    devices: dict[str, _Parts] = {}
    _read_memory_files(out, devices)
    steps, steps_source = _read_trace_view(out, devices, info)
    if steps_source is None:
        steps, steps_source = _untraced_steps(out)
    if not devices:
        raise _no_memory_data(profile_dir, out, info)
    models = _device_models(devices)
    metadata = _metadata(info, profile_dir)
    metadata["cross_file"] = cross_file_facts(models, profile_dir, steps, steps_source)
    return Profile(
        path=str(profile_dir),
        format=FORMAT,
        rank=rank_of(profile_dir, info),
        devices=tuple(models),
        steps=steps,
        steps_source=steps_source,
        metadata=metadata,
    )


_Parts = dict[str, Any]  # what the files give one device: its "series", "blocks" and "blocks_source"


def _slot(devices: dict[str, _Parts], device: str) -> _Parts:
    if device not in devices:
        devices[device] = {"series": {}, "blocks": empty_blocks(), "blocks_source": None}
    return devices[device]


def _read_memory_files(out: Path, devices: dict[str, _Parts]) -> None:
    """The series of memory_record.csv and npu_module_mem.csv and the blocks of operator_memory.csv,
    by device."""
    ops_path = out / "operator_memory.csv"
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="memgate-ops") as side:
        ops: Future[list[tuple[str, Table]] | None] | None = None
        if (out / "memory_record.csv").exists():
            path = out / "memory_record.csv"
            # operator_memory.csv is parsed while this file's series are split (they would hold a
            # core each way), not before: both files' columns at once would raise the peak memory
            record_parsed, failed = threading.Event(), threading.Event()
            if ops_path.exists():
                ops = side.submit(_read_operator_memory_after, ops_path, record_parsed, failed)
            try:
                for device, component, frame in read_memory_record(path, record_parsed.set):
                    _slot(devices, device)["series"][component] = Series(component, frame, str(path))
                _require_operator_memory(out, devices)
            except BaseException:  # this file's error comes first; the other read stops or is not begun
                failed.set()
                record_parsed.set()
                raise
        if ops is not None or ops_path.exists():
            blocks_list = ops.result() if ops is not None else read_operator_memory(ops_path)
            for device, blocks in blocks_list or []:
                _slot(devices, device)["blocks"] = blocks
                _slot(devices, device)["blocks_source"] = str(ops_path)
    if (out / "npu_module_mem.csv").exists():
        path = out / "npu_module_mem.csv"
        for device, component, frame in read_npu_module_mem(path):
            _slot(devices, device)["series"][f"module:{component}"] = Series(f"module:{component}", frame, str(path))


def _read_trace_view(out: Path, devices: dict[str, _Parts], info: dict[str, Any]) -> tuple[Table, str | None]:
    """The steps of trace_view.json (and its path; None where it has none), its NPU MEM counters added
    to ``devices``."""
    steps, steps_source = empty_steps(), None
    if not (out / "trace_view.json").exists():
        return steps, steps_source
    path = out / "trace_view.json"
    trace = read_trace_view(path)
    if len(trace.steps):
        check_steps(trace.steps, path, column="ProfilerStep")
        steps, steps_source = trace.steps, str(path)
    # NPU MEM counters: the device their process id names (trace_view.device_of_pid), each its
    # own device; a pid that names none belongs to this rank's only device, if it has one.
    targets = list(devices) or [_device_from_info(info)]
    for device_id, counters in trace.counters.items():
        if device_id is None and len(targets) != 1:
            continue
        device = targets[0] if device_id is None else f"npu:{device_id}"
        for name, counter in counters.items():
            _slot(devices, device)["series"][f"NPU MEM {name}"] = Series(f"NPU MEM {name}", _counter_series(counter),
                                                                          str(path))
    return steps, steps_source


def _untraced_steps(out: Path) -> tuple[Table, str | None]:
    """Steps where trace_view.json has none: kernel_details.csv's step ranges, else step_trace_time.csv's
    step numbers (and the file's path; None where neither has steps)."""
    if (out / "kernel_details.csv").exists():
        path = out / "kernel_details.csv"
        kernel_steps = read_kernel_steps(path)
        if len(kernel_steps):
            return kernel_steps, str(path)
    if (out / "step_trace_time.csv").exists():
        path = out / "step_trace_time.csv"
        numbered = read_step_numbers(path)
        if len(numbered):
            return numbered, str(path)
    return empty_steps(), None


def _device_models(devices: dict[str, _Parts]) -> list[DeviceModel]:
    models = []
    for device in sorted(devices):
        parts = devices[device]
        series = dict(parts["series"])
        if "APP" not in series and "NPU MEM APP/Memory" in series:
            series["APP"] = Series("APP", series["NPU MEM APP/Memory"].frame, series["NPU MEM APP/Memory"].source)
        models.append(
            DeviceModel(
                device=device,
                series=series,
                blocks=parts["blocks"],
                blocks_source=parts["blocks_source"],
                sum_components={"PTA+GE": ("PTA", "GE")} if "PTA+GE" in series else {},
            )
        )
    return models


def _counter_series(counter: Table) -> Table:
    """An NPU MEM counter (``t_ns``, ``reserved``) as a series: allocated and active unknown."""
    n = len(counter)
    return Table({"t_ns": counter.ints("t_ns"), "allocated": Ints.absent(n), "reserved": counter.ints("reserved"),
                  "active": Ints.absent(n)})


def _take_texts(table: CsvTable, name: str) -> Texts:
    """A text column as :class:`Texts`, releasing the Arrow column (as :meth:`CsvTable.pop_series`)."""
    texts = texts_from_arrow(table.column(name))
    del table.columns[name]
    return texts


def _read_operator_memory_after(path: Path, start: threading.Event,
                                failed: threading.Event) -> list[tuple[str, Table]] | None:
    start.wait()
    return None if failed.is_set() else read_operator_memory(path)


def _check_links(out: Path) -> None:
    """A symlink loop or a dangling link where an export file belongs is an error, not a missing file."""
    for name in EXPORT_FILES:
        path = out / name
        if path.is_symlink() and not path.exists():
            raise InputError("a broken symlink or a symlink loop where an export file belongs", file=path,
                             expected="a file (or a symlink to one)", found=f"a link to {str(path.readlink())!r}")


def _require_operator_memory(out: Path, devices: dict[str, _Parts]) -> None:
    """memory_record.csv with allocator rows but no operator_memory.csv: the export stopped half-way.

    torch_npu writes both from the same memory data (an allocator row needs an allocation, which is
    an operator_memory row); one without the other is a rank killed while writing its output.
    """
    allocator = any(c in ("PTA", "GE") for d in devices.values() for c in d["series"])
    ops = out / "operator_memory.csv"
    if allocator and not ops.exists():
        raise InputError(
            "operator_memory.csv is missing next to memory_record.csv: the export did not finish (was the "
            "rank killed while torch_npu wrote ASCEND_PROFILER_OUTPUT?)", file=ops,
            expected="both memory files; re-export the raw data with torch_npu.profiler.profiler.analyse() "
                     "or re-run the profile",
            found="memory_record.csv only")


def _no_memory_data(profile_dir: Path, out: Path, info: dict[str, Any]) -> InputError:
    """What to say about a profile without any memory data, and how to collect it."""
    config = info.get("config")
    common = config.get("common_config") if isinstance(config, dict) else None
    info_file = profile_dir / str(info.get("_info_file", "profiler_info.json"))
    if isinstance(common, dict) and common.get("profile_memory") is False:
        return InputError(f"recorded without profile_memory=True; {COLLECT_MEMORY}", file=info_file,
                          column="config.common_config.profile_memory", expected="true", found="false")
    if out == profile_dir and profile_dir.name.endswith("_ascend_pt"):
        return InputError(f"no {OUTPUT_DIR} here: the raw data was never exported (did the rank stop before "
                          "torch_npu analysed it?)", file=profile_dir,
                          expected="export it with torch_npu.profiler.profiler.analyse() or re-run the profile",
                          found=", ".join(sorted(p.name for p in profile_dir.iterdir())) or "an empty folder")
    return InputError(
        "no memory data: no memory_record.csv or operator_memory.csv, and no NPU MEM counters in "
        f"trace_view.json; {COLLECT_MEMORY}", file=out, expected="memory_record.csv / operator_memory.csv",
        found=", ".join(sorted(p.name for p in out.iterdir())) or "an empty folder")


_R = TypeVar("_R")
_P = ParamSpec("_P")


def _file_errors(read: Callable[Concatenate[Path, _P], _R]) -> Callable[Concatenate[Path, _P], _R]:
    """A value the schema admits but int64 cannot hold (a 25-digit timestamp) is bad input, not a crash.

    The conversion does not say which row failed, so the error names the file only.
    """

    @functools.wraps(read)
    def wrapper(path: Path, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return read(path, *args, **kwargs)
        except (pa.ArrowInvalid, OverflowError) as exc:
            raise InputError(f"a value is out of range: {str(exc).splitlines()[0]}", file=path,
                             expected="bytes and ns that fit in int64") from None

    return wrapper


# What the loaders keep of the two big files (streamed; nothing else stays in memory). The
# converters reuse what each column's check computed: each number cell is read once.
_LABELS = convert.ToCategories(labels=True)
_US = convert.ToNs(3)
MEMORY_RECORD_COLUMNS: dict[str, Converter] = {
    "Device Type": _LABELS,
    "Component": convert.ToCategories(),
    "Timestamp(us)": _US,
    "Total Allocated(MB)": convert.ToBytes(MIB),
    "Total Reserved(MB)": convert.ToBytes(MIB),
    "Total Active(MB)": convert.ToBytes(MIB),
}
OPERATOR_MEMORY_COLUMNS: dict[str, Converter] = {
    "Device Type": _LABELS,
    # dictionary-encoded while parsed, on the parse threads: a few hundred op names and streams over
    # millions of rows (as text, the two columns were the largest part of the file's peak memory)
    "Name": convert.ToCategories(),
    "Stream Ptr": convert.ToCategories(),
    "Size(KB)": convert.ToBytes(KIB),
    "Allocation Time(us)": _US,
    "Release Time(us)": _US,
    "Active Release Time(us)": _US,
    "Allocation Total Allocated(MB)": convert.ToBytes(MIB),
}
# joined into whole columns while the file is read (the blocks table holds them whole)
OPERATOR_MEMORY_INTS = ("Size(KB)", "Allocation Time(us)", "Release Time(us)", "Active Release Time(us)",
                        "Allocation Total Allocated(MB)")


@_file_errors
def read_memory_record(path: Path, parsed: Callable[[], None] | None = None) -> list[tuple[str, str, Table]]:
    """``parsed``: called once the file is parsed and checked, before the series are split."""
    table = read_csv(path, load_schema("torch_npu.memory_record"), MEMORY_RECORD_COLUMNS)
    if parsed is not None:
        parsed()
    _require_when(table, "Component", lambda c: pc.not_equal(c, "APP"), ("Total Allocated(MB)", "Total Reserved(MB)"))
    _require_when(table, "Component", lambda c: pc.equal(c, "APP"), ("Total Reserved(MB)",))
    columns = {"t_ns": "Timestamp(us)", "allocated": "Total Allocated(MB)", "reserved": "Total Reserved(MB)",
               "active": "Total Active(MB)"}
    pairs, names = _pair_codes(table.column("Device Type"), table.column("Component"))
    del table.columns["Device Type"], table.columns["Component"]

    def take(key: str) -> list[ChunkColumn]:
        if not table.has(columns[key]):  # torch_npu before 2.1 wrote no Total Active column
            return [(absent.values, absent.isna()) for absent in map(Ints.absent, map(len, pairs))]
        chunks = table.pop_int_chunks(columns[key])
        offset = 0
        for values, missing in chunks if key != "t_ns" else ():
            below = values < 0 if missing is None else (values < 0) & ~missing
            if below.any():  # allocator totals are never below 0 (an operator_memory Size is)
                row = offset + int(np.flatnonzero(below)[0])
                raise InputError("a memory total below 0", file=table.path, line=table.line_of(row),
                                 column=columns[key], expected="a size >= 0", found=repr(table.cell(row, columns[key])))
            offset += len(values)
        return chunks

    series = split_chunks(pairs, names, take)
    release_free_memory()  # the parse buffers, before the next file
    return series


def _pair_codes(device: pa.ChunkedArray, component: pa.ChunkedArray) -> tuple[list[np.ndarray], list[tuple[str, str]]]:
    """Each chunk's (device, component) pair codes, -1 where either is missing, and the pairs they
    name (some pairs of a chunk's device and component values may name no row)."""
    names: dict[tuple[str, str], int] = {}
    pairs = []
    for (devices, device_names), (components, component_names) in zip(coded_chunks(device), coded_chunks(component),
                                                                      strict=True):
        lookup = np.array([[names.setdefault((str(d), str(c)), len(names)) for c in component_names]
                           for d in device_names], dtype=np.int32).reshape(len(device_names), len(component_names))
        codes = lookup[devices, components] if lookup.size else np.full(len(devices), -1, dtype=np.int32)
        codes[(devices < 0) | (components < 0)] = -1  # (-1 indexed the last value above)
        pairs.append(codes)
    return pairs, list(names)


def _require_when(table: CsvTable, key: str, condition: Any, columns: tuple[str, ...]) -> None:
    """Cells a row must fill given its ``key`` column (e.g. a PTA row needs Total Allocated)."""
    applies = _rows_where(table.column(key), condition)
    for column in columns:
        missing = pc.and_(applies, pc.is_null(table.column(column)))
        if pc.any(missing).as_py():
            row = int(pc.index(missing, True).as_py())
            raise InputError(
                f"empty cell in a {table.column(key)[row].as_py()} row",
                file=table.path, line=table.line_of(row), column=column, expected="a number",
                found="an empty cell",
            )


def _rows_where(col: pa.ChunkedArray, condition: Any) -> pa.ChunkedArray:
    """``condition`` of each row; of a dictionary column, computed on its distinct values only."""
    if not pa.types.is_dictionary(col.type):
        return condition(col)
    return pa.chunked_array([pc.take(condition(chunk.dictionary), chunk.indices) for chunk in col.chunks],
                            type=pa.bool_())


@_file_errors
def read_operator_memory(path: Path) -> list[tuple[str, Table]]:
    table = read_csv(path, load_schema("torch_npu.operator_memory"), OPERATOR_MEMORY_COLUMNS,
                     joined=OPERATOR_MEMORY_INTS)
    # numpy (values, missing) pairs: the checks below run on 5M-row columns without pandas' masked ops
    size, no_size = table.pop_ints("Size(KB)")
    alloc, no_alloc = table.pop_ints("Allocation Time(us)")
    # torch_npu's allocator takes a block out of its allocated total when the block is freed, then
    # writes two records: MEMORY_BLOCK_FREE (Active Release Time) when the block stops being active,
    # and MEMORY_FREE (Release Time) at the end of free(). Without pending stream uses the first
    # comes a few us before the second; a block still used by another stream is handed back later
    # (Active Release Time after Release Time). Either way the allocated total has dropped at the
    # earlier of the two. GE rows and files before 2.1 have only Release Time.
    released, no_released = table.pop_ints("Release Time(us)")
    before_2_1 = not table.has("Stream Ptr")  # no Active columns and no Stream Ptr were written then
    if before_2_1:
        absent = Ints.absent(len(size))
        active_released, no_active_released = absent.values, absent.isna()
        del absent  # its arrays go with the names below, before the blocks are built
    else:
        active_released, no_active_released = table.pop_ints("Active Release Time(us)")
    release_free_memory()  # the number columns' text and the parse buffers, before the checks and the blocks
    release = np.where(no_active_released, released,
                       np.where(no_released, active_released, np.minimum(released, active_released)))
    no_release = no_active_released & no_released
    release_only = size < 0  # a missing Size fails the schema: every row has one
    bad = release_only != no_alloc
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        has_alloc = not no_alloc[row]
        raise InputError(
            "a block needs an allocation time unless its Size is negative (allocated before the window)",
            file=path, line=table.line_of(row), column="Allocation Time(us)",
            expected="an empty cell for a negative Size" if has_alloc else "a time in us for a positive Size",
            found=f"Size(KB) {table.cell(row, 'Size(KB)')} with " + ("an allocation time" if has_alloc else "an empty cell"),
        )
    if (release_only & no_release).any():
        row = int(np.flatnonzero(release_only & no_release)[0])
        raise InputError("a release-only row (negative Size) needs a Release Time", file=path,
                         line=table.line_of(row), column="Release Time(us)", expected="a time in us",
                         found=f"an empty cell (Size(KB) {table.cell(row, 'Size(KB)')})")
    for column, times, no_times in (("Active Release Time(us)", active_released, no_active_released),
                                    ("Release Time(us)", released, no_released)):
        early = (times < alloc) & ~no_times & ~no_alloc
        if early.any():
            row = int(np.flatnonzero(early)[0])
            raise InputError("a block is released before it is allocated", file=path, line=table.line_of(row),
                             column=column, expected=f"a time at or after Allocation Time(us) "
                             f"{str(table.cell(row, 'Allocation Time(us)')).strip()}",
                             found=repr(table.cell(row, column)))
    del released, no_released, active_released, no_active_released
    name = table.column("Name")
    is_ge = pc.fill_null(_rows_where(name, lambda c: pc.starts_with(c, "cann::")), False)
    if not before_2_1:  # a GE row has no stream; before 2.1 no row has one, and GE rows are cann:: named
        is_ge = pc.or_(is_ge, pc.and_(pc.is_null(name), pc.is_null(table.column("Stream Ptr"))))
    component = Texts.coded(np.logical_not(np.asarray(is_ge, dtype=bool)).view(np.int8).astype(np.int32), ("GE", "PTA"))
    del name, is_ge
    np.abs(size, out=size)
    total, no_total = table.pop_ints("Allocation Total Allocated(MB)")
    blocks = Table(
        {
            "size": Ints.of(size, no_size),
            "t_alloc": Ints.of(alloc, no_alloc),
            "t_free": Ints.of(release, no_release),
            "op": _take_texts(table, "Name"),
            "stream": Texts.repeat(None, len(size)) if before_2_1 else _take_texts(table, "Stream Ptr"),
            "owner": Texts.repeat(None, len(size)),
            "component": component,
            "alloc_total": Ints.of(total, no_total),
        }
    )
    del size, no_size, alloc, no_alloc, release, no_release, total, no_total
    devices = _take_texts(table, "Device Type")
    release_free_memory()  # the parse buffers, before the next file
    return by_device(blocks, devices)


@_file_errors
def read_npu_module_mem(path: Path) -> list[tuple[str, str, Table]]:
    table = read_csv(path, load_schema("torch_npu.npu_module_mem"))
    frame = pd.DataFrame(
        {
            "device": convert.device_labels(table.column("Device")),
            "component": convert.text(table.column("Component")),
            "t_ns": table.parse_ns_from_us("Timestamp(us)"),
            "allocated": pd.Series(pd.NA, index=range(table.num_rows), dtype="Int64"),
            "reserved": table.parse_bytes("Total Reserved(MB)", MIB),
            "active": pd.Series(pd.NA, index=range(table.num_rows), dtype="Int64"),
        }
    )
    return split_series(frame)


@_file_errors
def read_kernel_steps(path: Path) -> Table:
    """Step time ranges from kernel start/duration grouped by ``Step Id`` (empty if no steps)."""
    table = read_csv(path, load_schema("torch_npu.kernel_details"))
    step_column = "Step Id" if table.has("Step Id") else None
    if step_column is None:
        return empty_steps()
    start = table.parse_ns_from_us("Start Time(us)")
    end = start + table.parse_ns_from_us("Duration(us)")
    frame = pd.DataFrame({"step": table.parse_ints(step_column), "t_start": start, "t_end": end})
    frame = frame.dropna(subset=["step"])
    grouped = frame.groupby("step", sort=True).agg(t_start=("t_start", "min"), t_end=("t_end", "max"))
    return int_table(grouped.reset_index(), STEP_COLUMNS)


@_file_errors
def read_step_numbers(path: Path) -> Table:
    """Step numbers without times (step_trace_time.csv holds durations only)."""
    table = read_csv(path, load_schema("torch_npu.step_trace_time"))
    return untimed_steps(table.parse_ints("Step").dropna().drop_duplicates().sort_values().to_numpy(dtype=np.int64))


_INFO_NAME = re.compile(r"^profiler_info(?:_([0-9]+))?\.json$")
_ASCII_INT = re.compile(r"-?[0-9]+")


def read_profiler_info(profile_dir: Path) -> dict[str, Any]:
    """``profiler_info[_{rank}].json`` merged with ``profiler_metadata.json`` (both optional).

    One profile directory is one rank: two profiler_info files in it (``profiler_info_0.json`` beside
    ``profiler_info_1.json``) are two ranks' outputs mixed, an error rather than a pick.
    """
    info: dict[str, Any] = {}
    found = [p for p in sorted(profile_dir.glob("profiler_info*.json")) if _INFO_NAME.match(p.name)]
    if len(found) > 1:
        raise InputError("two profiler_info files in one profile directory (the outputs of two ranks or runs mixed)",
                         file=found[1], expected=f"one profiler_info[_{{rank}}].json per profile, as {found[0].name}",
                         found=", ".join(p.name for p in found))
    for candidate in found:
        info.update(_read_small_json(candidate))
        info["_info_file"] = candidate.name
    meta = profile_dir / "profiler_metadata.json"
    if meta.exists():
        info["_metadata"] = _read_small_json(meta)
    return info


def _read_small_json(path: Path) -> dict[str, Any]:
    check_readable(path)
    check_file_size(path, limit=SMALL_JSON_BYTES, why="profiler_info / profiler_metadata JSON is a few KB")
    try:
        value = loads_unique(path.read_bytes(), path)  # a key repeated with another value: InputError
    except RecursionError:
        raise InputError("JSON nested too deeply", file=path, expected="a small JSON object (a few levels)") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON at char {exc.colno}: {exc.msg}", file=path, line=exc.lineno,
                         expected="valid JSON", found=repr(exc.doc[exc.pos:exc.pos + 20]) if exc.doc[exc.pos:] else "end of file",
                         ) from None
    except UnicodeDecodeError as exc:
        raise InputError("file is not UTF-8 text", file=path, expected="UTF-8 JSON",
                         found=f"byte {exc.object[exc.start:exc.start + 1]!r} at offset {exc.start}") from None
    if not isinstance(value, dict):
        raise InputError("expected a JSON object", file=path, line=1, found=type(value).__name__)
    return value


def info_rank(profile_dir: Path, info: dict[str, Any]) -> int | None:
    """The rank profiler_info states: its ``rank_id`` (an int, or ASCII digits as text; -1 = not
    distributed), else the ``_{rank}`` of its file name; None when it states none.

    A ``rank_id`` that is not a whole number is an error. One that contradicts the file name
    (``profiler_info_3.json`` holding ``rank_id`` 5: a renamed or copied file) is resolved, and the
    resolution stated by :func:`rank_notes`: the content wins (torch_npu names the file after it).
    """
    name = str(info.get("_info_file", ""))
    info_file = profile_dir / (name or "profiler_info.json")
    m = _INFO_NAME.match(name)
    from_name = int(m.group(1)) if m and m.group(1) is not None else None
    raw = info.get("rank_id")
    rank: int | None = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        rank = raw
    elif isinstance(raw, str) and _ASCII_INT.fullmatch(raw.strip()):
        rank = int(raw.strip())
    elif not (raw is None or (isinstance(raw, str) and not raw.strip())):
        raise InputError("rank_id is not a whole number", file=info_file, column="rank_id",
                         expected="an integer in ASCII digits (-1 when not distributed)", found=repr(raw)[:60])
    if rank is not None and rank > MAX_RANK:
        raise InputError("rank_id out of range", file=info_file, column="rank_id",
                         expected=f"a rank from 0 to {MAX_RANK} (-1 when not distributed)", found=show(raw, 60))
    if rank is not None and rank < 0:
        rank = None  # -1: not distributed
    if rank is None and from_name is not None and from_name > MAX_RANK:
        raise InputError("the rank in the file name is out of range", file=info_file,
                         expected=f"profiler_info_{{rank}}.json with a rank from 0 to {MAX_RANK}", found=name[:80])
    return rank if rank is not None else from_name


def rank_notes(profile_dir: Path, info: dict[str, Any]) -> list[str]:
    """What a reader must know about the rank: profiler_info's file name and its rank_id disagreeing."""
    name = str(info.get("_info_file", ""))
    m = _INFO_NAME.match(name)
    rank = info_rank(profile_dir, info)
    if m and m.group(1) is not None and rank is not None and int(m.group(1)) != rank:
        note = (f"{name} holds rank_id {rank}: the rank is {rank} (the content; the file name's suffix "
                f"{int(m.group(1))} disagrees: a renamed or copied file?)")
        return [note]
    return []


def rank_of(profile_dir: Path, info: dict[str, Any]) -> str:
    """Rank from profiler_info (:func:`info_rank`), or the directory name."""
    rank = info_rank(profile_dir, info)
    if rank is not None:
        return str(rank)
    # a number past MAX_RANK in a name is no rank
    return registry.rank_in_names(profile_dir.name, profile_dir.parent.name, at_most=MAX_RANK) or "0"


def rank_hint(profile_dir: Path) -> str:
    """The rank :func:`load` reports, from profiler_info and names only."""
    return rank_of(profile_dir, read_profiler_info(profile_dir))


def _whole(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _ASCII_INT.fullmatch(value.strip()):
        return int(value.strip())
    return None


def run_window(profile_dir: Path) -> tuple[int, int] | None:
    """When the profiler recorded, in ns since the epoch, from profiler_info: it ends at
    ``end_info.collectionTimeEnd`` and lasted ``MonotonicTimeEnd - start_info.start_monotonic``.
    None when profiler_info does not say."""
    info = read_profiler_info(profile_dir)
    start, end = info.get("start_info"), info.get("end_info")
    if not isinstance(start, dict) or not isinstance(end, dict):
        return None
    t_end, mono_end, mono_start = (_whole(end.get("collectionTimeEnd")), _whole(end.get("MonotonicTimeEnd")),
                                   _whole(start.get("start_monotonic")))
    if t_end is None or mono_end is None or mono_start is None or not 0 <= mono_start <= mono_end <= t_end:
        return None
    return t_end - (mono_end - mono_start), t_end


def _device_from_info(info: dict[str, Any]) -> str:
    return "npu"


def _metadata(info: dict[str, Any], profile_dir: Path) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for key in ("torch_npu_version", "cann_version"):
        if key in info:
            meta[key] = info[key]
    config = info.get("config", {})
    if isinstance(config, dict):
        common = config.get("common_config", {})
        if isinstance(common, dict) and "profile_memory" in common:
            meta["profile_memory"] = common["profile_memory"]
    dist = info.get("_metadata", {}).get("distributed_args") if isinstance(info.get("_metadata"), dict) else None
    if isinstance(dist, dict) and "world_size" in dist:
        meta["world_size"] = dist["world_size"]
    env = info.get("_metadata", {}).get("ENV_VARIABLES") if isinstance(info.get("_metadata"), dict) else None
    if isinstance(env, dict) and (conf := {k: v for k, v in env.items() if k.endswith("ALLOC_CONF") and isinstance(v, str)}):
        meta["alloc_conf"] = conf  # the allocator's settings of the platform (memgate.platforms)
    if notes := rank_notes(profile_dir, info):
        meta["notes"] = notes
    return meta


def claims(path: Path) -> bool:
    return path.is_dir() and is_profile_dir(path)


def profile_root(path: Path) -> Path | None:
    """The profile an ``ASCEND_PROFILER_OUTPUT`` folder given directly belongs to: its parent (which
    holds profiler_info, and so the rank)."""
    return path.parent if path.name == OUTPUT_DIR and path.is_dir() and is_profile_dir(path) else None


registry.register(registry.Format(FORMAT, claims, load, rank_hint, run_window, profile_root=profile_root))

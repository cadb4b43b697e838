"""MindSpore profiler output (docs/formats-reference.md §2): ``*_ascend_ms`` directories and the memory tracker files.

What is read, and how it maps onto the model:

- ``{worker}_{ts}_ascend_ms/ASCEND_PROFILER_OUTPUT/memory_record.csv`` (6 columns): components
  ``MindSpore``, ``GE``, ``MindSpore+GE`` (the framework series, docs/design.md) and ``APP``. Here
  **MB = KB / 1000** with KB = bytes / 1024, so bytes = MB × 1 024 000. MindSpore writes
  ``float(bytes) / 1024 / 1000`` as Python float text (shortest repr); parsing it back and
  multiplying by 1 024 000 recovers the integer bytes exactly below 2**51 bytes (the float's relative
  error is 2**-53 per operation), so the loader rounds to the nearest byte and is exact. If a writer
  printed fewer decimals, the error is at most half a unit of the last printed decimal × 1 024 000
  bytes (e.g. 2 decimals → ±5 120 B). APP rows carry ``0.0`` placeholders in Allocated/Active and GE
  rows in Active: those become null, never a measured 0.
- ``operator_memory.csv`` (the 15 torch_npu headers, missing = ``N/A``) → blocks of component
  ``MindSpore``; ``Allocation Total Allocated(MB)`` here is binary MB (bytes / 1024²).
- ``npu_module_mem.csv`` (CANN's copy, Total Reserved in **KB**; ``-1`` = no value) → ``module:*`` series.
- ``kernel_details.csv`` (``Step ID``) → step time ranges; else ``step_trace_time.csv`` → step numbers.
- ``FRAMEWORK/cpu_ms_memory_record_{rank}.txt`` (bytes, ns). Despite the ``cpu_`` prefix (the CPU
  *activity* collects it) it is MindSpore's device allocator: MindSpore builds the ``MindSpore``
  rows of memory_record.csv from it with ``Device Type NPU:{rank}``. It is used as the ``MindSpore``
  series when memory_record.csv has none (analysis not run), never as a second device.
- Older memory tracker output (≈2.3/2.4): ``operator_memory_{rank}.csv`` (trailing comma on every
  line; Duration empty if never freed; ``Device`` is a pool name; sizes are ``float32 / 1024``
  printed with one decimal, so each value is within ±51.2 B plus float32 rounding (2**-24 relative),
  exact for multiples of 512 B below 8 GiB; totals in KB or, later, binary MB — pinned per header).
- ``rank_N/memory_block.csv`` (memory tracker, ``MS_ALLOC_CONF="memory_tracker:True"``; writer
  ``mem_tracker.cc``, ``MemoryTrackerEnabled::DumpMemoryBlock``). Three headers: without and with
  ``last_user_task``, and 2.10's, which adds ``actual_used_memory``, ``is_persistent`` and ``is_small``.
  Every cell is streamed as is and followed by a comma (no quoting, a trailing comma on every line).
  start/end are the tracker's *logical* event counter (int64, one tick per task, allocation and free),
  not time. They are kept as ``t_alloc``/``t_free`` (order preserved, so peaks and holders at the
  peak are right; no steps, so growth/leak budgets are not measurable); ``end == INT64_MAX`` = never
  freed; ``InSideSomas`` rows (start −1, older trackers) are parts of a Somas block already counted and
  are dropped. ``size`` is bytes; ``pool_type`` (the pool's name: DefaultAscendMemoryPool, Ascend for GE
  feature memory, ...) is the block's component; op = node_name (else task_name) of the producing
  task; owner = its python_stack, else the C++ ``file_name:line_num`` that asked for the memory.
  Series: ``actual_used_memory`` / ``actual_peak_memory`` are the pool's in-use bytes and peak read
  at each *allocation* only (nothing at frees), so they are kept as cross-checks
  (``tracker_used_peak_bytes``, ``tracker_actual_peak_bytes``); the allocated series is the blocks'
  running sum on the logical clock; there is no reserved series. The writer skips every block of
  the ``CPU`` pool: a CPU-target run writes the header alone, which loads as a ``cpu`` device with no
  blocks whose metrics are not measurable, saying why.
- CPU target (``ms.set_device("CPU")``): the profiler writes only ``FRAMEWORK/cpu_ms_memory_record_*.txt``
  (MindSpore's CPU pool), no NPU file, no ``PROF_*`` folder and no profiler_info: the device is
  ``cpu`` whatever the folder is called (``*_ascend_ms``), and it has no step marker.

One ``*_ascend_ms`` directory is one rank and one NPU. The writer labels MindSpore and APP rows
``NPU:{rank_id}`` but GE rows, operator_memory and npu_module_mem with the physical device id, so all
of a profile's data goes to one device: the physical id when a file names one, else the rank label.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from memgate import hints
from memgate.errors import InputError, MemgateError, read_errors_named
from memgate.loaders import registry
from memgate.loaders.ascend.crossfile import cross_file_facts
from memgate.loaders.ascend.torch_npu import info_rank, rank_notes, read_profiler_info
from memgate.loaders.ascend.torch_npu import run_window as torch_npu_run_window
from memgate.metric_specs import Fact, not_measurable
from memgate.model import (
    SERIES_COLUMNS,
    STEP_COLUMNS,
    DeviceModel,
    Profile,
    Series,
    empty_blocks,
    empty_steps,
    int_table,
    typed_blocks,
    untimed_steps,
)
from memgate.readers import convert
from memgate.readers.csvtable import CsvTable, match_header, read_csv, read_header
from memgate.schemas import load_schema
from memgate.table import Table

FORMAT = "mindspore"
OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
FRAMEWORK_DIR = "FRAMEWORK"
DIR_SUFFIX = "_ascend_ms"
FRAMEWORK_SERIES = "MindSpore+GE"
MS_COMPONENT = "MindSpore"
MS_MB = 1000 * 1024  # memory_record.csv: MB = KB / 1000, KB = bytes / 1024
MIB = 1 << 20
KIB = 1 << 10
NEVER_FREED = (1 << 63) - 1  # memory tracker's end_time_stamp of a live block
MEMORY_RECORD_HEADER = ["Component", "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)",
                        "Total Active(MB)", "Device Type"]

_TRACKER_OP = re.compile(r"^operator_memory_([0-9]+)\.csv$")
_CPU_RECORD = re.compile(r"^cpu_ms_memory_record_([0-9]+)\.txt$")
_NPU = re.compile(r"^NPU:([0-9]+)$")
CPU_DEVICE = "cpu"
TRACKER_LAYOUT = "memory tracker memory_block.csv"


# ---- detection ---------------------------------------------------------------------------------


def _header_is(path: Path, schema: str) -> bool:
    """Does ``path`` start with one of ``schema``'s header generations? (False when unreadable.)"""
    try:
        header = read_header(path)
    except (MemgateError, OSError):
        return False
    return any(header == cols for cols in load_schema(schema)["x-memgate-headers"].values())


def _header_starts(path: Path, first: list[str]) -> bool:
    try:
        return read_header(path)[:len(first)] == first
    except (MemgateError, OSError):
        return False


def output_dir(profile_dir: Path) -> Path:
    inner = profile_dir / OUTPUT_DIR
    return inner if inner.is_dir() else profile_dir


def claims(path: Path) -> bool:
    """A ``*_ascend_ms`` dir, a dir whose memory_record.csv has the MindSpore header or whose FRAMEWORK/ holds a
    cpu_ms_memory_record (a renamed one), or a tracker file."""
    try:
        if path.is_dir():
            if path.name.endswith(DIR_SUFFIX):
                return True
            framework = path / FRAMEWORK_DIR
            if framework.is_dir() and any(
                    _CPU_RECORD.match(f.name) and _header_is(f, "mindspore.cpu_ms_memory_record")
                    for f in framework.iterdir()):
                return True  # a renamed *_ascend_ms folder: only MindSpore writes cpu_ms_memory_record
            record = output_dir(path) / "memory_record.csv"
            return record.is_file() and _header_is(record, "mindspore.memory_record")
        if not path.is_file():
            return False
        if _TRACKER_OP.match(path.name):
            return _header_is(path, "mindspore.tracker_operator_memory")
        if path.name == "memory_block.csv":
            # the tracker's first two columns: a header that then lacks or adds one is named column by column
            return _header_starts(path, ["start_time_stamp", "end_time_stamp"])
        if m := _CPU_RECORD.match(path.name):
            # Standalone only: next to operator_memory_{rank}.csv it belongs to that profile.
            return not (path.parent / f"operator_memory_{m.group(1)}.csv").exists() and _header_is(
                path, "mindspore.cpu_ms_memory_record")
    except OSError:
        return False
    return False


# ---- entry point ---------------------------------------------------------------------------------


@read_errors_named
def load(path: Path) -> Profile:
    if path.is_dir():
        return _load_dir(path)
    if _TRACKER_OP.match(path.name) or _CPU_RECORD.match(path.name):
        return _load_tracker_dump(path)
    if path.name == "memory_block.csv":
        return _load_memory_block(path)
    raise InputError("not a MindSpore profile", file=path,
                     expected="a *_ascend_ms directory, operator_memory_{rank}.csv, cpu_ms_memory_record_{rank}.txt "
                              "or rank_N/memory_block.csv")


class _Parts:
    """What one profile's files contribute to its single NPU device."""

    def __init__(self) -> None:
        self.series: dict[str, Series] = {}
        self.blocks = empty_blocks()
        self.blocks_source: str | None = None
        self.physical: dict[str, str] = {}  # device label -> file that names it
        self.rank_label: str | None = None  # NPU:{rank} of memory_record's MindSpore rows

    def note_labels(self, labels: pd.Series, path: Path, column: str, table: CsvTable) -> None:
        distinct = labels.dropna().unique()
        if len(distinct) > 1:
            row = int(np.flatnonzero((labels != labels.iloc[0]).to_numpy(dtype=bool))[0])
            raise InputError("one MindSpore profile holds one device, this file names several", file=path,
                             line=table.line_of(row), column=column, expected=str(labels.iloc[0]),
                             found=str(labels.iloc[row]))
        if len(distinct):
            self.physical.setdefault(str(distinct[0]), str(path))

    def device(self, rank: str) -> str:
        if len(set(self.physical)) > 1:
            names = ", ".join(f"{d} ({f})" for d, f in sorted(self.physical.items()))
            raise InputError("the files of one MindSpore profile name different devices", file=next(iter(
                self.physical.values())), expected="one device per rank", found=names)
        if self.physical:
            return next(iter(self.physical)).lower()
        if self.rank_label is not None:
            return self.rank_label.lower()
        return f"npu:{rank}"


def _load_dir(profile_dir: Path) -> Profile:
    out = output_dir(profile_dir)
    info = read_profiler_info(profile_dir)
    parts = _Parts()
    cpu_record = _find_cpu_record(profile_dir)

    record = out / "memory_record.csv"
    if record.exists():
        for component, frame in read_memory_record(record, parts):
            parts.series[component] = Series(component, frame, str(record))
    ops = out / "operator_memory.csv"
    if ops.exists():
        parts.blocks, parts.blocks_source = read_operator_memory(ops, parts), str(ops)
    else:
        tracker = _find_tracker_ops(profile_dir)
        if tracker is not None:
            parts.blocks, parts.blocks_source = read_tracker_operator_memory(tracker), str(tracker)
    modules = out / "npu_module_mem.csv"
    if modules.exists():
        for component, frame in read_npu_module_mem(modules, parts):
            name = f"module:{component}"
            parts.series[name] = Series(name, frame, str(modules))
    if MS_COMPONENT not in parts.series and cpu_record is not None:
        parts.series[MS_COMPONENT] = Series(MS_COMPONENT, read_cpu_memory_record(cpu_record), str(cpu_record))

    if not parts.series and parts.blocks_source is None:
        raise InputError(
            "no MindSpore memory data here (ASCEND_PROFILER_OUTPUT/memory_record.csv, operator_memory.csv, "
            "npu_module_mem.csv or FRAMEWORK/cpu_ms_memory_record_{rank}.txt)",
            file=profile_dir, expected="a profile recorded with mindspore.Profiler(profile_memory=True)",
        )
    steps, steps_source = empty_steps(), None
    kernels = out / "kernel_details.csv"
    if kernels.exists():
        kernel_steps = read_kernel_steps(kernels)
        if len(kernel_steps):
            steps, steps_source = kernel_steps, str(kernels)
    trace_time = out / "step_trace_time.csv"
    if steps_source is None and trace_time.exists():
        numbered = read_step_numbers(trace_time)
        if len(numbered):
            steps, steps_source = numbered, str(trace_time)

    rank = rank_of(profile_dir, info, cpu_record)
    cpu = cpu_target(profile_dir, info) and not parts.physical and parts.rank_label is None
    device = DeviceModel(
        device=CPU_DEVICE if cpu else parts.device(rank),
        series=parts.series,
        blocks=parts.blocks,
        blocks_source=parts.blocks_source,
        sum_components={FRAMEWORK_SERIES: (MS_COMPONENT, "GE")} if FRAMEWORK_SERIES in parts.series else {},
    )
    metadata = _metadata(info, profile_dir, parts, cpu)
    metadata["cross_file"] = cross_file_facts([device], profile_dir, steps, steps_source)
    return Profile(path=str(profile_dir), format=FORMAT, rank=rank, devices=(device,), steps=steps,
                   steps_source=steps_source, metadata=metadata)


# Files only an Ascend (or GPU) run leaves in a profile: MindSpore on the CPU target writes none of them.
_DEVICE_FILES = ("memory_record.csv", "operator_memory.csv", "npu_module_mem.csv", "static_op_mem.csv",
                 "kernel_details.csv", "step_trace_time.csv")


def cpu_target(profile_dir: Path, info: dict[str, Any]) -> bool:
    """Was this profile recorded on MindSpore's CPU target (``ms.set_device("CPU")``)?

    There the profiler writes FRAMEWORK/ (``cpu_ms_memory_record_{rank}.txt`` holds the CPU pool) and a
    trace_view.json without memory counters, in a folder still named ``*_ascend_ms``; it writes no
    profiler_info, no ``PROF_*`` (CANN) folder, no .db and none of :data:`_DEVICE_FILES`.
    """
    if info:
        return False
    out = output_dir(profile_dir)
    for folder in {profile_dir, out}:
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            name = entry.name
            if (name.startswith("PROF_") and entry.is_dir()) or name.endswith(".db") or name in _DEVICE_FILES \
                    or name.startswith("profiler_info") or _TRACKER_OP.match(name):
                return False
    return True


def _find_cpu_record(profile_dir: Path) -> Path | None:
    for folder in (profile_dir / FRAMEWORK_DIR, profile_dir):
        if folder.is_dir():
            for candidate in sorted(folder.iterdir()):
                if _CPU_RECORD.match(candidate.name):
                    return candidate
    return None


def _find_tracker_ops(profile_dir: Path) -> Path | None:
    for folder in (profile_dir, profile_dir / FRAMEWORK_DIR, output_dir(profile_dir)):
        if folder.is_dir():
            for candidate in sorted(folder.iterdir()):
                if _TRACKER_OP.match(candidate.name):
                    return candidate
    return None


# ---- the files -----------------------------------------------------------------------------------


def _split(frame: pd.DataFrame, key: str) -> list[tuple[str, Table]]:
    out = []
    for name, group in frame.groupby(key, sort=True):
        series = group[list(SERIES_COLUMNS)].sort_values("t_ns", kind="stable")
        out.append((str(name), int_table(series, SERIES_COLUMNS)))
    return out


def read_memory_record(path: Path, parts: _Parts | None = None) -> list[tuple[str, Table]]:
    """(component, series frame) of the 6-column MindSpore memory_record.csv."""
    table = read_csv(path, load_schema("mindspore.memory_record"))
    component = convert.text(table.column("Component"))
    labels = convert.text(table.column("Device Type"))
    frame = pd.DataFrame(
        {
            "component": component,
            "t_ns": table.parse_ns_from_us("Timestamp(us)"),
            "allocated": table.parse_bytes("Total Allocated(MB)", MS_MB),
            "reserved": table.parse_bytes("Total Reserved(MB)", MS_MB),
            "active": table.parse_bytes("Total Active(MB)", MS_MB),
        }
    )
    # Placeholders the writer fills with 0.0: APP has only a reserved value, GE no active one.
    frame.loc[component == "APP", ["allocated", "active"]] = pd.NA
    frame.loc[component == "GE", "active"] = pd.NA
    if parts is not None:
        ge = component == "GE"
        if ge.any():
            parts.note_labels(labels[ge].reset_index(drop=True), path, "Device Type", table)
        own = labels[component == MS_COMPONENT]
        if len(own):
            parts.rank_label = str(own.iloc[0])
    return _split(frame, "component")


def read_operator_memory(path: Path, parts: _Parts | None = None) -> Table:
    """Blocks of MindSpore's allocator; ``N/A`` = missing (not freed, no active columns)."""
    table = read_csv(path, load_schema("mindspore.operator_memory"))
    size = table.parse_bytes("Size(KB)", KIB)
    alloc = convert.us_text_to_ns(convert.na_to_null(table.column("Allocation Time(us)")))
    release = convert.us_text_to_ns(convert.na_to_null(table.column("Release Time(us)")))
    release_only = (size < 0).to_numpy(dtype=bool)
    missing_alloc = alloc.isna().to_numpy(dtype=bool)
    bad = np.flatnonzero(release_only == ~missing_alloc)
    if len(bad):
        row = int(bad[0])
        raise InputError(
            "a block needs an Allocation Time unless its Size is negative (allocated before the window)",
            file=path, line=table.line_of(row), column="Allocation Time(us)",
            expected="a timestamp" if not release_only[row] else "N/A in a release-only row",
            found=repr(table.column("Allocation Time(us)")[row].as_py()),
        )
    unplaced = np.flatnonzero(release_only & release.isna().to_numpy(dtype=bool))
    if len(unplaced):
        raise InputError("a release-only row (negative Size) needs a Release Time", file=path,
                         line=table.line_of(int(unplaced[0])), column="Release Time(us)", expected="a timestamp",
                         found="N/A")
    _check_order(path, table, alloc, release, "Release Time(us)")
    labels = convert.text(table.column("Device Type"))
    if parts is not None:
        parts.note_labels(labels, path, "Device Type", table)
    blocks = pd.DataFrame(
        {
            "size": size.abs(),
            "t_alloc": alloc,
            "t_free": release,
            "op": convert.text(table.column("Name")),
            "stream": convert.text(convert.na_to_null(table.column("Stream Ptr"))),
            "owner": pd.Series(pd.NA, index=range(table.num_rows), dtype="string"),
            "component": pd.Series(MS_COMPONENT, index=range(table.num_rows), dtype="string"),
            "alloc_total": convert.unit_text_to_bytes(convert.na_to_null(table.column("Allocation Total Allocated(MB)")), MIB),
        }
    )
    return typed_blocks(blocks)


def _check_order(path: Path, table: CsvTable, alloc: pd.Series, release: pd.Series, column: str) -> None:
    wrong = (release < alloc).fillna(False).to_numpy(dtype=bool)
    if wrong.any():
        row = int(np.flatnonzero(wrong)[0])
        raise InputError("a block is released before it is allocated", file=path, line=table.line_of(row),
                         column=column, expected="a time at or after the allocation",
                         found=f"{release.iloc[row]} ns < {alloc.iloc[row]} ns")


def read_npu_module_mem(path: Path, parts: _Parts | None = None) -> list[tuple[str, Table]]:
    table = read_csv(path, load_schema("mindspore.npu_module_mem"))
    reserved = table.parse_bytes("Total Reserved(KB)", KIB)
    reserved[reserved < 0] = pd.NA  # -1: the module only showed releases, no level
    if parts is not None:
        parts.note_labels(convert.text(table.column("Device")), path, "Device", table)
    n = table.num_rows
    frame = pd.DataFrame(
        {
            "component": convert.text(table.column("Component")),
            "t_ns": table.parse_ns_from_us("Timestamp(us)"),
            "allocated": pd.Series(pd.NA, index=range(n), dtype="Int64"),
            "reserved": reserved,
            "active": pd.Series(pd.NA, index=range(n), dtype="Int64"),
        }
    )
    return _split(frame, "component")


def read_kernel_steps(path: Path) -> Table:
    """Step time ranges: first kernel start to last kernel end per ``Step ID``."""
    table = read_csv(path, load_schema("mindspore.kernel_details"))
    if not table.has("Step ID"):
        return empty_steps()
    start = table.parse_ns_from_us("Start Time(us)")
    end = start + table.parse_ns_from_us("Duration(us)")
    frame = pd.DataFrame({"step": table.parse_ints("Step ID"), "t_start": start, "t_end": end})
    frame = frame.dropna(subset=["step"])
    grouped = frame.groupby("step", sort=True).agg(t_start=("t_start", "min"), t_end=("t_end", "max"))
    return int_table(grouped.reset_index(), STEP_COLUMNS)


def read_step_numbers(path: Path) -> Table:
    table = read_csv(path, load_schema("mindspore.step_trace_time"))
    return untimed_steps(table.parse_ints("Step").dropna().drop_duplicates().sort_values().to_numpy(dtype=np.int64))


def read_cpu_memory_record(path: Path) -> Table:
    """``cpu_ms_memory_record_{rank}.txt``: MindSpore's allocator totals, exact bytes and ns."""
    table = read_csv(path, load_schema("mindspore.cpu_ms_memory_record"))
    frame = pd.DataFrame(
        {
            "t_ns": table.parse_ns("Timestamp(ns)"),
            "allocated": table.parse_ints("Total Allocated(Byte)"),
            "reserved": table.parse_ints("Total Reserved(Byte)"),
            "active": table.parse_ints("Total Active(Byte)"),
        }
    )
    return int_table(frame.sort_values("t_ns", kind="stable"), SERIES_COLUMNS)


def read_tracker_operator_memory(path: Path) -> Table:
    """Memory tracker ``operator_memory_{rank}.csv``: one block per row, release = allocation + duration."""
    table = read_csv(path, load_schema("mindspore.tracker_operator_memory"))
    totals_per_unit = KIB if table.variant == "KB" else MIB
    unit = table.variant
    size = table.parse_bytes("Size(KB)", KIB)
    negative = np.flatnonzero((size < 0).to_numpy(dtype=bool))
    if len(negative):
        row = int(negative[0])
        raise InputError("negative block size", file=path, line=table.line_of(row), column="Size(KB)",
                         expected="a size >= 0 (the tracker writes every block it saw allocated)",
                         found=repr(table.column("Size(KB)")[row].as_py()))
    alloc = table.parse_ns_from_us("Allocation Time(us)")
    release = alloc + table.parse_ns_from_us("Duration(us)")
    n = table.num_rows
    blocks = pd.DataFrame(
        {
            "size": size,
            "t_alloc": alloc,
            "t_free": release,
            "op": convert.text(table.column("Name")),
            "stream": pd.Series(pd.NA, index=range(n), dtype="string"),
            "owner": pd.Series(pd.NA, index=range(n), dtype="string"),
            "component": pd.Series(MS_COMPONENT, index=range(n), dtype="string"),
            "alloc_total": convert.unit_text_to_bytes(table.column(f"Allocation Total Allocated({unit})"),
                                                      totals_per_unit),
        }
    )
    return typed_blocks(blocks)


def _load_tracker_dump(path: Path) -> Profile:
    """An older ``profiler/`` folder: ``operator_memory_{rank}.csv`` (+ ``cpu_ms_memory_record_{rank}.txt``)."""
    m = _TRACKER_OP.match(path.name) or _CPU_RECORD.match(path.name)
    assert m is not None
    rank = str(int(m.group(1)))
    series: dict[str, Series] = {}
    blocks, blocks_source = empty_blocks(), None
    ops = path.parent / f"operator_memory_{m.group(1)}.csv"
    if ops.exists():
        blocks, blocks_source = read_tracker_operator_memory(ops), str(ops)
    record = path.parent / f"cpu_ms_memory_record_{m.group(1)}.txt"
    if record.exists():
        series[MS_COMPONENT] = Series(MS_COMPONENT, read_cpu_memory_record(record), str(record))
    # A FRAMEWORK/cpu_ms_memory_record_{rank}.txt alone (its profile folder renamed, so not claimed as
    # one): the folder around FRAMEWORK says whether it is the CPU target's pool.
    cpu = (blocks_source is None and path.parent.name == FRAMEWORK_DIR
           and cpu_target(path.parent.parent, read_profiler_info(path.parent.parent)))
    device = DeviceModel(device=CPU_DEVICE if cpu else f"npu:{rank}", series=series, blocks=blocks,
                         blocks_source=blocks_source)
    metadata: dict[str, Any] = {
        "layout": ("MindSpore profiler FRAMEWORK/cpu_ms_memory_record_{rank}.txt (CPU target)" if cpu
                   else "memory tracker profiling dump (operator_memory_{rank}.csv)"),
        "cross_file": cross_file_facts([device], path)}
    if cpu:
        metadata.update(_cpu_facts())
    return Profile(path=str(path), format=FORMAT, rank=rank, devices=(device,), metadata=metadata)


def read_memory_block(path: Path) -> tuple[Table, dict[str, Any]]:
    """Blocks of ``memory_block.csv`` on the tracker's logical clock, and facts about the file."""
    schema = load_schema("mindspore.memory_block")
    if _header_alone(path):
        variant, _ = match_header(path, read_header(path), schema)
        return empty_blocks(), {"clock": "logical: the memory tracker's event counter, not time (no steps)",
                                "in_side_somas_rows_dropped": 0, "tracker_actual_peak_bytes": None,
                                "header": variant, "header_only": True}
    table = read_csv(path, schema)
    start = table.parse_ints("start_time_stamp")
    end = table.parse_ints("end_time_stamp")
    inside = (start < 0).to_numpy(dtype=bool)  # InSideSomas: a slice of a Somas block, counted there
    live = (end == NEVER_FREED).to_numpy(dtype=bool)
    bad = np.flatnonzero(~inside & ~live & (end < start).to_numpy(dtype=bool))
    if len(bad):
        row = int(bad[0])
        raise InputError("a block ends before it starts", file=path, line=table.line_of(row), column="end_time_stamp",
                         expected=f"a counter >= start_time_stamp {start.iloc[row]} (or {NEVER_FREED} if never freed)",
                         found=str(end.iloc[row]))
    pool = convert.text(table.column("pool_type"))
    node = convert.text(table.column("node_name"))
    task = convert.text(table.column("task_name"))
    stack = convert.text(table.column("python_stack"))
    file_name = convert.text(table.column("file_name"))
    line_num = convert.text(table.column("line_num"))
    where = (file_name + ":" + line_num.fillna("?")).where(file_name.notna())
    blocks = pd.DataFrame(
        {
            "size": table.parse_ints("size"),
            "t_alloc": start,
            "t_free": end.mask(pd.Series(live)),
            "op": node.fillna(task),
            "stream": convert.text(table.column("stream_id")),
            "owner": stack.fillna(where),
            "component": pool.fillna(MS_COMPONENT),
            "alloc_total": pd.Series(pd.NA, index=range(table.num_rows), dtype="Int64"),
        }
    )
    peaks = table.parse_ints("actual_peak_memory")[~inside].dropna()
    facts: dict[str, Any] = {
        "clock": "logical: the memory tracker's event counter, not time (no steps)",
        "in_side_somas_rows_dropped": int(inside.sum()),
        "tracker_actual_peak_bytes": int(peaks.max()) if len(peaks) else None,
        "header": table.variant,
    }
    if table.has("actual_used_memory"):
        used = table.parse_ints("actual_used_memory")[~inside].dropna()
        facts["tracker_used_peak_bytes"] = int(used.max()) if len(used) else None
    if table.has("is_persistent"):
        persistent = table.parse_ints("is_persistent")[~inside].fillna(0).to_numpy(dtype=np.int64) == 1
        facts["persistent_blocks"] = int(persistent.sum())
    pools = sorted(str(p) for p in pool[~inside].dropna().unique())
    if pools:
        facts["pools"] = pools
    return typed_blocks(blocks).take(~inside), facts


def _header_alone(path: Path) -> bool:
    """Does the file hold its header line (ended by a line break) and nothing else?"""
    with open(path, "rb") as fh:
        first = fh.readline(1 << 16)
        return first.endswith(b"\n") and fh.read(1) == b""


def _load_memory_block(path: Path) -> Profile:
    blocks, facts = read_memory_block(path)
    rank = registry.rank_in_names(path.parent.name, path.parent.parent.name) or "0"
    metadata: dict[str, Any] = {"layout": TRACKER_LAYOUT, **facts}
    if len(blocks) or facts["in_side_somas_rows_dropped"]:
        pools = " ".join(facts.get("pools", ())).lower()
        device = f"cuda:{rank}" if "gpu" in pools and "ascend" not in pools else f"npu:{rank}"
    else:
        # The header alone: the tracker writes every block except the CPU pool's, so the run's memory was
        # all in MindSpore's CPU pool (a CPU-target run), which this file cannot show.
        device = CPU_DEVICE
        metadata.update(_cpu_facts())
        metadata["not_measurable"] = not_measurable({Fact.MEMORY: hints.mindspore_tracker_cpu_pool()})
    model = DeviceModel(device=device, blocks=blocks, blocks_source=str(path))
    return Profile(path=str(path), format=FORMAT, rank=rank, devices=(model,), metadata=metadata)


# ---- rank and metadata -----------------------------------------------------------------------------


def rank_of(profile_dir: Path, info: dict[str, Any], cpu_record: Path | None) -> str:
    """profiler_info's ``rank_id``, its file suffix, the cpu_ms_memory_record suffix, a rank_N dir name."""
    rank = info_rank(profile_dir, info)
    if rank is not None:
        return str(rank)
    if cpu_record is not None and (m := _CPU_RECORD.match(cpu_record.name)):
        return str(int(m.group(1)))
    return registry.rank_in_names(profile_dir.name, profile_dir.parent.name) or "0"


def _cpu_facts() -> dict[str, Any]:
    """What a CPU-target profile is: its ``target`` (read by the hints) and a note for the reader."""
    return {"target": "CPU",
            "notes": [("MindSpore CPU target: the memory is MindSpore's CPU memory pool (host memory), labelled cpu; "
                       "MindSpore writes no step marker on this target")]}


def _metadata(info: dict[str, Any], profile_dir: Path, parts: _Parts, cpu: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    sources = {Path(s.source).name for s in parts.series.values()}
    units = []
    if "memory_record.csv" in sources:
        units.append("memory_record MB = KB/1000 (bytes = MB x 1024000)")
    if "npu_module_mem.csv" in sources:
        units.append("npu_module_mem KB (bytes = KB x 1024)")
    if parts.blocks_source is not None and Path(parts.blocks_source).name == "operator_memory.csv":
        units.append("operator_memory Size KB = bytes/1024, totals MB = bytes/1024^2")
    if any(_CPU_RECORD.match(name) for name in sources):
        units.append("cpu_ms_memory_record bytes and ns")
    if units:
        meta["units"] = "; ".join(units)
    if cpu:
        meta.update(_cpu_facts())
    for key in ("ms_version", "mindspore_version", "cann_version", "rank_id"):
        if key in info and isinstance(info[key], (str, int, float)):
            meta[key] = info[key]
    if notes := rank_notes(profile_dir, info):
        meta["notes"] = [*meta.get("notes", []), *notes]
    return meta


def rank_hint(path: Path) -> str | None:
    """The rank :func:`load` reports, from names and profiler_info only (None for memory_block.csv)."""
    if path.is_dir():
        return rank_of(path, read_profiler_info(path), _find_cpu_record(path))
    m = _TRACKER_OP.match(path.name) or _CPU_RECORD.match(path.name)
    return str(int(m.group(1))) if m else None


# MindSpore directories also look like torch_npu ones by file names: MindSpore claims first.
def run_window(path: Path) -> tuple[int, int] | None:
    """When the profiler recorded (profiler_info, as torch_npu writes it), or None."""
    return torch_npu_run_window(path) if path.is_dir() else None


registry.register(registry.Format(FORMAT, claims, load, rank_hint=rank_hint, run_window=run_window), before="torch_npu")

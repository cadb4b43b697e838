"""The normalized memory model every loader produces and everything after reads.

Bytes are int64, times are int64 ns since the epoch, devices are ``npu:0`` / ``cuda:0`` / ``cpu``.
Series, blocks and steps are :class:`memgate.table.Table` s of numpy columns; a number may be
missing (a block allocated before the profiling window has no ``t_alloc``; an APP sample has no
``allocated``). ``table.to_pandas()`` shows one as a DataFrame (``Int64`` and ``string`` columns).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memgate.errors import InputError
from memgate.lazy import lazy_module
from memgate.table import Ints, Table, Texts, column_from_pandas

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
else:  # imported on first use: pytest loads the plugin, and so this module, on every run
    np = lazy_module("numpy", globals(), "np")
    pd = lazy_module("pandas", globals(), "pd")

SERIES_COLUMNS = ("t_ns", "allocated", "reserved", "active")
BLOCK_COLUMNS = ("size", "t_alloc", "t_free", "op", "stream", "owner", "component", "alloc_total")
BLOCK_TEXT_COLUMNS = ("op", "stream", "owner", "component")
BLOCK_INT_COLUMNS = ("size", "t_alloc", "t_free", "alloc_total")
STEP_COLUMNS = ("step", "t_start", "t_end")

# Component names of the framework allocator, by preference, and of the whole process.
FRAMEWORK_COMPONENTS = ("PTA+GE", "MindSpore+GE", "PTA", "MindSpore", "allocator", "GE")
APP_COMPONENT = "APP"


def empty_series() -> Table:
    return Table.empty(SERIES_COLUMNS)


def empty_blocks() -> Table:
    return Table.empty(BLOCK_INT_COLUMNS, BLOCK_TEXT_COLUMNS, order=BLOCK_COLUMNS)


def typed_blocks(frame: pd.DataFrame) -> Table:
    """``frame``'s BLOCK_COLUMNS as the model's blocks (numbers and text, whatever their dtypes)."""
    columns: dict[str, Ints | Texts] = {}
    for column in BLOCK_COLUMNS:
        dtype = "string" if column in BLOCK_TEXT_COLUMNS else "Int64"
        values = frame[column]
        if not (dtype == "string" and isinstance(values.dtype, pd.CategoricalDtype)):
            values = pd.Series(pd.array(values, dtype=dtype), copy=False)
        columns[column] = column_from_pandas(values)
    return Table(columns)


def int_table(frame: pd.DataFrame, columns: Sequence[str]) -> Table:
    """The ``columns`` of ``frame`` (whole numbers of any dtype, missing or not) as a table:
    ``int_table(frame, SERIES_COLUMNS)`` for a series, ``STEP_COLUMNS`` for steps."""
    return Table({c: column_from_pandas(pd.Series(pd.array(frame[c], dtype="Int64"), copy=False)) for c in columns})


def split_series(frame: pd.DataFrame) -> list[tuple[str, str, Table]]:
    """(device, component, SERIES_COLUMNS table in time order) for each pair in a long frame,
    in order of device then component name.

    Rows keep their file order within a pair unless its times go backwards; then they are sorted
    stably by time. The long frame's columns are dropped from it as they are split, so a 10M-row
    file is not held twice.
    """
    return split_columns(key_texts(frame["device"]), key_texts(frame["component"]),
                         lambda name: _data_and_mask(frame.pop(name)))


def split_columns(device: Texts, component: Texts,
                  take: Callable[[str], tuple[np.ndarray, np.ndarray]]) -> list[tuple[str, str, Table]]:
    """:func:`split_series` of columns given one at a time: ``take(name)`` returns a SERIES_COLUMNS
    column as numpy (values, missing) and lets go of it (:func:`split_chunks` of one chunk)."""
    width = max(len(component.names), 1)
    pair = device.codes.astype(np.int32) * np.int32(width) + component.codes  # int32: 40 MB per 10M rows
    pair[(device.codes < 0) | (component.codes < 0)] = -1  # a missing key: no series (as groupby drops it)
    devices, components = device.names.tolist(), component.names.tolist()
    names = [(str(devices[code // width]), str(components[code % width])) for code in range(len(devices) * width)]
    return split_chunks([pair], names, lambda name: [take(name)])


# A column of one chunk: int64 values (any value where missing) and the missing mask (None: none is).
ChunkColumn = tuple["np.ndarray", "np.ndarray | None"]
_FEW_PAIRS = 16  # up to this many series in a chunk, each one's rows are found by a comparison pass


def split_chunks(pairs: Sequence[np.ndarray], names: Sequence[tuple[str, str]],
                 take: Callable[[str], Sequence[ChunkColumn]]) -> list[tuple[str, str, Table]]:
    """(device, component, SERIES_COLUMNS table in time order) for each (device, component) pair of
    a file read in chunks, in order of device then component name.

    ``pairs[k]``: the pair code (an index into ``names``) of each row of chunk k, -1 for a row of no
    series (a key is missing). ``take(name)`` returns a column's chunks and lets go of them. Each
    column is copied once, chunk by chunk, straight into its series: the file's column is never
    joined into one array first. Rows keep their file order within a pair unless its times go
    backwards; then they are sorted stably by time (missing times last).
    """
    index = np.int32 if sum(len(codes) for codes in pairs) < 2**31 else np.int64
    chunk_rows: list[list[tuple[int, np.ndarray]]] = []  # per chunk: (pair, its rows there)
    sizes = np.zeros(len(names), dtype=np.int64)
    for codes in pairs:
        counts = np.bincount(codes[codes >= 0] if (codes < 0).any() else codes, minlength=len(names))
        sizes += counts
        present = np.flatnonzero(counts).tolist()
        if len(present) == 1 and counts[present[0]] == len(codes):
            chunk_rows.append([(present[0], np.arange(len(codes), dtype=index))])
        elif len(present) <= _FEW_PAIRS:
            chunk_rows.append([(p, np.flatnonzero(codes == p).astype(index, copy=False)) for p in present])
        else:  # many series: one stable sort of the chunk's codes, cut where the code changes
            order = np.argsort(codes, kind="stable").astype(index, copy=False)
            bounds = np.cumsum(np.bincount(codes + 1, minlength=len(names) + 1))  # code -1 first
            chunk_rows.append([(p, order[bounds[p]:bounds[p + 1]]) for p in present])
    kept = sorted(np.flatnonzero(sizes).tolist(), key=lambda p: names[p])
    orders: dict[int, np.ndarray] = {}  # a pair whose times go backwards: its stable time order
    parts: dict[int, dict[str, Ints | Texts]] = {p: {} for p in kept}
    for column in SERIES_COLUMNS:
        chunks = take(column)
        values = {p: np.empty(int(sizes[p]), dtype=np.int64) for p in kept}
        some_missing = any(absent is not None for _, absent in chunks)
        missing = {p: np.zeros(int(sizes[p]) if some_missing else 0, dtype=bool) for p in kept}
        filled = dict.fromkeys(kept, 0)
        for (data, absent), rows_of in zip(chunks, chunk_rows, strict=True):
            for p, rows in rows_of:
                at, n = filled[p], len(rows)
                # mode="clip": the rows are in range, and the default ("raise") would copy via a buffer
                np.take(data, rows, out=values[p][at:at + n], mode="clip")
                if absent is not None:
                    np.take(absent, rows, out=missing[p][at:at + n], mode="clip")
                filled[p] = at + n
        del chunks
        for p in kept:
            data, absent = values.pop(p), (missing.pop(p) if some_missing else None)
            if column == "t_ns":
                times = data if absent is None else np.where(absent, np.iinfo(np.int64).max, data)
                if (times[1:] < times[:-1]).any():
                    orders[p] = np.argsort(times, kind="stable")
            if p in orders:
                data, absent = data[orders[p]], (None if absent is None else absent[orders[p]])
            parts[p][column] = Ints.of(data, absent)
    return [(*names[p], Table(parts[p])) for p in kept]


def key_texts(keys: pd.Series) -> Texts:
    """A key column (device, component) as codes into the text of its distinct values."""
    if isinstance(keys.dtype, pd.CategoricalDtype):
        return Texts.coded(keys.cat.codes.to_numpy(), [str(c) for c in keys.cat.categories])
    codes, uniques = pd.factorize(keys)
    return Texts.coded(codes, [str(u) for u in uniques])


def _data_and_mask(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    array = pd.array(column, dtype="Int64")
    return array.to_numpy(dtype=np.int64, na_value=0), np.asarray(array.isna())


def empty_steps() -> Table:
    return Table.empty(STEP_COLUMNS)


def untimed_steps(numbers: np.ndarray) -> Table:
    """Steps known by number only (a file of step durations): no start or end time."""
    n = len(numbers)
    return Table({"step": Ints.of(numbers), "t_start": Ints.absent(n), "t_end": Ints.absent(n)})


def steps_in_order(steps: Table) -> Table:
    """``steps`` by step number, stably, steps without a number last."""
    number = steps.ints("step")
    return steps.take(np.lexsort((number.values, number.isna())))


def by_device(blocks: Table, devices: Texts) -> list[tuple[str, Table]]:
    """The rows of ``blocks`` of each device (``devices``: one label per row; a row without one is
    dropped), in order of device name. One device, as most files hold: the table itself, no copy."""
    names = devices.names.tolist()
    used = sorted(devices.used())
    if len(used) == 1 and not devices.isna().any():
        return [(used[0], blocks)]
    return [(name, blocks.take(devices.codes == names.index(name))) for name in used]


def step_number(digits: str, file: str | Path, column: str) -> int:
    """The step number a writer's step name carries (``ProfilerStep#<digits>``); InputError past int64."""
    number = int(digits) if len(digits) <= 19 else None  # (no int of thousands of digits)
    if number is None or number > _INT64_MAX:
        raise InputError("step number out of range", file=file, column=column,
                         expected=f"a step number up to {_INT64_MAX}", found=f"{digits[:30]}{'...' if len(digits) > 30 else ''}")
    return number


_INT64_MAX = 2**63 - 1


def check_steps(steps: Table, file: str | Path, *, column: str | None = None,
                where: Sequence[str] | None = None) -> None:
    """Steps a writer recorded are distinct numbers whose spans do not overlap; InputError naming the
    file and both steps otherwise.

    A step number twice, or a step starting before the one before it ended, would put the same
    memory in two steps and move step growth and leaked bytes. Steps may touch (one ends at the ns
    the next starts). ``where``: for each row of ``steps``, where it is in the file (``line 12``,
    ``rowid 3``), named in the error.
    """
    if len(steps) < 2:
        return
    numbers = steps.ints("step").filled(-1)
    place = list(where) if where is not None else None

    def at(i: int) -> str:
        return f" ({place[i]})" if place is not None else ""

    known = np.flatnonzero(numbers >= 0)
    distinct, first_of = np.unique(numbers[known], return_index=True)
    if len(distinct) < len(known):
        seen_first = np.zeros(len(numbers), dtype=bool)
        seen_first[known[first_of]] = True
        second = int(known[~seen_first[known]][0])
        first = int(np.flatnonzero(numbers == numbers[second])[0])
        raise InputError(f"step {numbers[second]} appears twice", file=file, column=column,
                         expected="each step once", found=f"step {numbers[first]}{at(first)} and again{at(second)}")
    t_start, t_end = steps.ints("t_start"), steps.ints("t_end")
    timed = np.flatnonzero(t_start.present() & t_end.present())
    if len(timed) < 2:
        return
    start = t_start.values[timed]
    end = t_end.values[timed]
    order = np.lexsort((end, start))
    start, end, rows = start[order], end[order], timed[order]
    overlap = np.flatnonzero(start[1:] < end[:-1])
    if len(overlap):
        k = int(overlap[0])
        a, b = int(rows[k]), int(rows[k + 1])
        raise InputError(f"steps {numbers[a]} and {numbers[b]} overlap", file=file, column=column,
                         expected="steps one after another (each starts at or after the end of the one before)",
                         found=f"step {numbers[a]}{at(a)} {start[k]}..{end[k]} ns, step {numbers[b]}{at(b)} "
                               f"{start[k + 1]}..{end[k + 1]} ns")


@dataclass(frozen=True)
class Series:
    """Time-ordered samples of one component on one device."""

    component: str
    frame: Table  # SERIES_COLUMNS
    source: str  # file (and table) it came from

    def __post_init__(self) -> None:
        _check_table(self.frame, "a series")


@dataclass(frozen=True)
class PoolState:
    """A caching allocator's pool as a snapshot's final ``segments`` record it at the dump."""

    allocated: int  # bytes of active blocks, on ``size_basis`` (as the allocated series)
    reserved: int  # bytes of all segments
    largest_free_block: int  # the largest inactive (free, reusable) block
    free_bytes: int  # all inactive blocks
    size_basis: str  # "requested" (what the program asked for) or "rounded" (the allocator's block sizes)
    source: str


@dataclass(frozen=True)
class OutOfMemory:
    """One out-of-memory error on a device: a request the allocator could not serve (a snapshot's ``oom``
    trace entry, or what a recording noted when the error reached it)."""

    t_ns: int
    requested: int | None  # bytes of the request that did not fit (the allocator's rounded size)
    device_free: int | None  # bytes the device reported free at that moment
    allocated: int | None = None  # the allocator's allocated and reserved bytes then (None: from the series)
    reserved: int | None = None
    capacity: int | None = None  # the device's memory, or what set_per_process_memory_fraction allows
    stream: int | None = None
    op: str | None = None  # the operator and owner of the failed request, from its frames
    owner: str | None = None
    source: str = "snapshot"  # "snapshot" (an oom entry), "observer" (torch's OOM observer), "exception"
    message: str | None = None  # the error's first line, where the recording caught it
    step: int | None = None  # the step the recording was in (None: the steps' times say)


@dataclass(frozen=True)
class DeviceModel:
    device: str
    series: dict[str, Series] = field(default_factory=dict)
    blocks: Table = field(default_factory=empty_blocks)  # BLOCK_COLUMNS
    blocks_source: str | None = None
    # Series whose sum is written as another series (torch_npu PTA+GE = PTA + GE).
    sum_components: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # The pool at the end of the window, where the writer records it (snapshot segments).
    dump_state: PoolState | None = None
    # The writer's totals leave out memory allocated before profiling and may carry bytes counted
    # by an earlier profiling session (torch's CPU allocator reporter): peaks are window-relative.
    window_relative: bool = False
    # The allocated peak in the bytes the program requested, where the writer records both (snapshots:
    # the series and blocks are in the allocator's block sizes; the difference is its rounding).
    requested_peak: int | None = None
    # The steps in this device's own clock, where its file keeps one of its own (a recording's snapshot:
    # its ProfilerStep annotations, the steps the trace also has); None: the profile's steps.
    steps: Table | None = None
    # The out-of-memory errors of the window, in time order; None: the writer records none (only a snapshot's
    # history and a memgate recording do), so their absence says nothing.
    ooms: tuple[OutOfMemory, ...] | None = None

    def __post_init__(self) -> None:
        _check_table(self.blocks, "blocks")
        if self.steps is not None:
            _check_table(self.steps, "steps")


# metadata: device → {metric: why} (Profile.not_measurable); a loader fills it, and "not_measurable", with
# metric_specs.not_measurable from the facts the profile lacks, never from a list of metrics of its own.
NOT_MEASURABLE_BY_DEVICE = "not_measurable_by_device"


@dataclass(frozen=True)
class Profile:
    """One rank's output, normalized."""

    path: str
    format: str
    rank: str
    devices: tuple[DeviceModel, ...]
    steps: Table = field(default_factory=empty_steps)  # STEP_COLUMNS
    steps_source: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_table(self.steps, "steps")

    def not_measurable(self, device: str) -> dict[str, str]:
        """What the loader says cannot be measured on ``device``: metric → why. ``metadata["not_measurable"]``
        holds what no device of the file measures, ``metadata[NOT_MEASURABLE_BY_DEVICE][device]`` what
        only this one does not (one device's history ring buffer filled, another's did not)."""
        by_device = self.metadata.get(NOT_MEASURABLE_BY_DEVICE) or {}
        return {**(self.metadata.get("not_measurable") or {}), **(by_device.get(device) or {})}


def _check_table(table: object, what: str) -> None:
    if not isinstance(table, Table):  # a loader handing over a DataFrame is a bug, caught at the source
        raise TypeError(f"{what} must be a memgate.table.Table, not {type(table).__name__}")


# No device holds 2**56 bytes (64 PiB): a byte count past it is garbage from the writer. Byte counts
# that are added up (block sizes into levels and curves) must also sum below 2**62, or int64 sums
# would wrap silently into a plausible peak.
MAX_BYTES = 1 << 56
MAX_SUMMED_BYTES = 1 << 62
MAX_RANK = 2**31 - 1  # torch.distributed ranks are C ints (profiler_info rank_id, Kineto distributedInfo.rank)


def check_bytes(values: np.ndarray, file: str | Path, column: str, *, summed: bool = False) -> None:
    """InputError where an int64 byte count is past ±MAX_BYTES or, ``summed``, where the counts'
    magnitudes add up past MAX_SUMMED_BYTES."""
    if not len(values):
        return
    out = (values > MAX_BYTES) | (values < -MAX_BYTES)
    if out.any():
        raise InputError("byte count out of range", file=file, column=column,
                         expected="a byte count within 2**56 (64 PiB) of 0",
                         found=str(int(values[int(np.flatnonzero(out)[0])])))
    if summed and float(np.abs(values).sum(dtype=np.float64)) > MAX_SUMMED_BYTES:
        raise InputError("byte counts out of range: they add up past int64", file=file, column=column,
                         expected="byte counts summing to under 2**62",
                         found=f"{len(values)} counts summing to {float(np.abs(values).sum(dtype=np.float64)):.3g} bytes")


def check_byte_ranges(profile: Profile) -> None:
    """:func:`check_bytes` of every byte count a loaded profile holds, before anything adds them up:
    series levels, block sizes (summed into curves) and recorded totals, the pool at the dump."""
    for device in profile.devices:
        for name, series in device.series.items():
            for column in ("allocated", "reserved", "active"):
                check_bytes(series.frame.ints(column).filled(0), profile.path, f"{device.device} {name} {column}")
        blocks = device.blocks
        check_bytes(blocks.ints("size").filled(0), profile.path, f"{device.device} block sizes", summed=True)
        check_bytes(blocks.ints("alloc_total").filled(0), profile.path, f"{device.device} blocks' recorded totals")
        if device.dump_state is not None:  # Python ints, clipped into int64 to be judged
            state = device.dump_state
            pool = (state.allocated, state.reserved, state.largest_free_block, state.free_bytes)
            check_bytes(np.array([min(max(v, -MAX_SUMMED_BYTES), MAX_SUMMED_BYTES) for v in pool], dtype=np.int64),
                        profile.path, f"{device.device} pool at the dump")


@dataclass(frozen=True)
class ProfileInfo:
    """What a report says of a profile besides its metrics; the cache keeps it next to them, so a
    warm run reports without loading the profile's frames."""

    path: str
    format: str
    rank: str
    metadata: dict[str, Any]
    steps: tuple[dict[str, int | None], ...]  # STEP_COLUMNS per step

    @classmethod
    def of(cls, profile: Profile) -> ProfileInfo:
        steps = tuple(profile.steps.select(STEP_COLUMNS).records())
        return cls(profile.path, profile.format, profile.rank, dict(profile.metadata), steps)

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "format": self.format, "rank": self.rank, "metadata": self.metadata,
                "steps": list(self.steps)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ProfileInfo:
        return cls(str(doc["path"]), str(doc["format"]), str(doc["rank"]), dict(doc["metadata"]),
                   tuple(dict(step) for step in doc["steps"]))

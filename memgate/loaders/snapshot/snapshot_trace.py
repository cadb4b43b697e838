"""One device trace of a snapshot (``device_traces[N]``), checked and put in time order.

Each entry's action (a code into :data:`ACTIONS`), address, requested size and stream become numpy
columns in time order, with the clock they are read on (``time_us`` in ns, or the position in the
trace). The frames lists stay as the file holds them (in its order), grouped by content once
(:attr:`Trace.first_equal`) for the torch_npu scan and the attribution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memgate.errors import InputError
from memgate.loaders.events import repeated_action
from memgate.loaders.snapshot.stack_groups import first_equal, first_equal_of_stacks
from memgate.readers.pyrecords import check_records, int_column
from memgate.readers.snapshot_columns import StackRefs, TraceColumns

ACTIONS = ("alloc", "free_requested", "free_completed", "free", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom", "annotate", "user_defined", "workspace_snapshot")
CODE = {name: i for i, name in enumerate(ACTIONS)}
# Actions that move a counter; only these need an address, a size and (in the time_us era) a time.
MEMORY_ACTIONS = ("alloc", "free_requested", "free_completed", "free", "segment_alloc", "segment_free",
                   "segment_map", "segment_unmap")


def action_table(*names: str) -> np.ndarray:
    """A lookup table over action codes: ``action_table(...)[code]`` is whether each entry's action is one of ``names``."""
    return np.isin(np.arange(len(ACTIONS)), [CODE[a] for a in names])


_MOVES = action_table(*MEMORY_ACTIONS)


@dataclass(frozen=True)
class Trace:
    """One device's trace in time order."""

    device: int
    n: int
    time_base: str  # "time_us", "trace_index" or "none" (no entries that move memory)
    code: np.ndarray  # action code per sorted entry
    addr: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    t_ns: np.ndarray  # per sorted entry
    order: np.ndarray | None  # sorted position -> index in the file's list; None: the file's order (no copy of it)
    frames: Sequence[Any]  # per entry in the file's order, its frames list (None without one)
    device_free: np.ndarray | None = None  # per sorted entry: an oom entry's device_free (-1: none recorded)

    def file_rows(self, at: np.ndarray) -> np.ndarray:
        """The indices in the file's list of the entries at sorted positions ``at``."""
        return at if self.order is None else self.order[at]

    def file_row(self, k: int) -> int:
        """The index in the file's list of the entry at sorted position ``k``."""
        return int(k if self.order is None else self.order[k])

    @cached_property
    def first_equal(self) -> np.ndarray:
        """Per entry in the file's order, the first entry whose frames list equals its own
        (:func:`~memgate.loaders.snapshot.stack_groups.first_equal`): the distinct stacks, found once for the
        torch_npu scan and the attribution."""
        if isinstance(self.frames, StackRefs):  # the compiled reader's: grouped over its distinct stacks
            return first_equal_of_stacks(self.frames.stacks, self.frames.sid)
        return first_equal(self.frames)

    @property
    def grouped(self) -> bool:
        """Whether :attr:`first_equal` is known (a file labelled npu by its settings never groups them all)."""
        return "first_equal" in self.__dict__


def empty_trace(dev: int) -> Trace:
    """The trace of a device without entries."""
    empty = np.zeros(0, dtype=np.int64)
    return Trace(dev, 0, "none", empty.astype(np.int8), empty, empty, empty, empty, None, [])


def parse_trace(path: Path, dev: int, entries: Sequence[Any], schema: dict[str, Any]) -> Trace:
    """Check ``device_traces[dev]`` against the schema and read it into columns in time order (a
    :class:`~memgate.readers.snapshot_columns.TraceColumns`, which the compiled reader checked, as it is)."""
    n = len(entries)
    if n == 0:
        return empty_trace(dev)
    if isinstance(entries, TraceColumns):  # the compiled reader's: checked against the schema as it was read
        code = entries.code  # int8: the action codes need no more
        timed = entries.present(4)
        addr, size, stream = entries.addr, entries.size, entries.stream
        frames: Sequence[Any] = entries.frames
        device_free = np.where(entries.present(5), entries.device_free, -1)
        time_raw = entries.time_us
    else:
        kept: dict[str, list[Any]] = {"frames": []}  # the frames lists as the check gathered them (read once)
        cols = check_records(entries, schema["$defs"]["trace_entry"], file=path,
                             where=lambda i: f"device_traces[{dev}][{i}]", root=schema, objects=kept)
        code = np.asarray(pc.index_in(cols["action"], value_set=pa.array(ACTIONS)).to_numpy(zero_copy_only=False),
                          dtype=np.int8)
        time_col = cols.get("time_us")
        timed = np.asarray(time_col.is_valid(), dtype=bool) if time_col is not None and not pa.types.is_null(
            time_col.type) else np.zeros(n, dtype=bool)
        addr, size = int_column(cols.get("addr"), n, fill=0), int_column(cols.get("size"), n, fill=0)
        stream, frames = int_column(cols.get("stream"), n, fill=0), kept["frames"]
        device_free = int_column(cols.get("device_free"), n, fill=-1)
        time_raw = int_column(time_col, n, fill=0)
    base = _time_base(path, dev, _MOVES[code], timed)
    if base == "time_us":
        raw = time_raw
        # Entries without a time (markers) keep their neighbour's place: carry the last time forward.
        if not timed.all():
            idx = np.where(timed, np.arange(n), 0)
            np.maximum.accumulate(idx, out=idx)
            raw = np.where(timed, raw, raw[idx])
        in_order = not (raw[1:] < raw[:-1]).any()  # torch's own traces; torch_npu inserts some at the front
        order = None if in_order else np.argsort(raw, kind="stable")
        t_ns = (raw if order is None else raw[order]) * 1000
    else:
        order = None
        t_ns = np.arange(1, n + 1, dtype=np.int64)

    def sort(values: np.ndarray) -> np.ndarray:
        return values if order is None else values[order]

    return Trace(
        device=dev, n=n, time_base=base, code=sort(code), addr=sort(addr), size=sort(size), stream=sort(stream),
        t_ns=t_ns, order=order, frames=frames,
        device_free=sort(device_free) if (code == CODE["oom"]).any() else None,
    )


def _time_base(path: Path, dev: int, moves: np.ndarray, timed: np.ndarray) -> str:
    """The clock of a trace: "time_us" when every entry that moves memory has one, "trace_index" when
    none has, "none" when no entry moves memory; a trace where only some have one is an error."""
    if not moves.any():
        return "none"
    if timed[moves].all():
        return "time_us"
    if not timed[moves].any():
        return "trace_index"
    i = int(np.flatnonzero(moves & ~timed)[0])
    raise InputError("entry without time_us in a trace whose other entries have it", file=path,
                     column=f"device_traces[{dev}][{i}]", expected="time_us on every alloc/free/segment entry",
                     found="no time_us")


def lost_free_requests(trace: Trace) -> int:
    """Addresses whose first free entry is a ``free_completed``: its ``free_requested`` (always recorded
    first) was dropped from the front of a ring buffer that filled (``max_entries``)."""
    code = trace.code
    frees = np.flatnonzero((code == CODE["free_requested"]) | (code == CODE["free_completed"]))
    if not len(frees):
        return 0
    _, first = np.unique(trace.addr[frees], return_index=True)
    return int((code[frees[first]] == CODE["free_completed"]).sum())


def repeated_error(path: Path, trace: Trace, k: int) -> InputError:
    """The error for the entry at sorted position ``k`` that repeats its address's last action."""
    action = ACTIONS[int(trace.code[k])]
    return repeated_action(path, f"device_traces[{trace.device}][{trace.file_row(k)}]", action == "alloc",
                           found=f"{action} of {hex(int(trace.addr[k]))} ({int(trace.size[k])} bytes)",
                           expected="allocs and frees of one address in turn (torch's caching allocator)")

"""What holds the memory of a tracked recording: each block as parameters, buffers, gradients,
optimizer state, activations or other, by address and lifetime.

A recording made with ``Recorder.track(model, optimizer)`` (:mod:`memgate.tracking`) lists in its
manifest the storages of the tracked models and optimizers as the recorder noted them, each noting
moment ``k`` marked in the trace by a ``memgate::note#k`` span (and in a snapshot's
``external_annotations``). A block is

- the category of a tracked storage when the block's address range ``[addr, addr + size)`` holds the
  storage's ``data_ptr`` and the block is live at a moment the storage was noted (allocated at or
  before the span's start, not freed by then); where storages of several categories qualify, the
  first of :data:`TRACKED` wins (parameters, buffers, gradients, optimizer_state);
- else ``activations`` when it was allocated inside a step (the device's steps);
- else ``other`` (allocated before the window, or between steps).

Nothing is guessed from sizes or names: a block either held a noted storage while it was noted or it
did not. What an untracked model or optimizer holds is therefore activations (allocated in a step)
or other, never one of the tracked categories.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from memgate.lazy import lazy_module
from memgate.model import DeviceModel
from memgate.table import Table, Texts

if TYPE_CHECKING:
    import numpy as np
else:  # imported on first use: the recorder imports this module's names, not numpy
    np = lazy_module("numpy", globals(), "np")

NOTE_PREFIX = "memgate::note#"  # the span of noting moment k: memgate::note#<k> (memgate.tracking writes it)
TRACKED = ("parameters", "buffers", "gradients", "optimizer_state")  # by priority
ACTIVATIONS = "activations"
OTHER = "other"
CATEGORIES = (*TRACKED, ACTIVATIONS, OTHER)  # the order reports list them in
COLUMN = "category"  # the block column this module adds
ADDRESS = "addr"  # the block column the loaders give a tracked recording's blocks
_NOTE = re.compile(re.escape(NOTE_PREFIX) + r"([0-9]{1,18})\Z")


@dataclass(frozen=True)
class Tracked:
    """The manifest's ``tracked`` record as columns: one row per storage run (noted at the
    consecutive moments ``first`` to ``last``)."""

    moments: int
    category: np.ndarray  # int64 index into TRACKED
    device: list[str]
    data_ptr: np.ndarray  # int64 (addresses past 2**63 cannot be a block's: such rows are dropped)
    nbytes: np.ndarray
    first: np.ndarray
    last: np.ndarray

    @classmethod
    def of(cls, record: dict[str, Any]) -> Tracked:
        """From the manifest's ``tracked`` (validated against schemas/recording.schema.json)."""
        rows = [r for r in record.get("storages") or [] if r[2] < 1 << 63]
        ints = np.array([[TRACKED.index(r[0]), r[2], r[3], r[4], r[5]] for r in rows], dtype=np.int64).reshape(-1, 5)
        return cls(moments=len(record.get("moments") or []), category=ints[:, 0], device=[str(r[1]) for r in rows],
                   data_ptr=ints[:, 1], nbytes=ints[:, 2], first=ints[:, 3], last=ints[:, 4])


def moment_of(name: str) -> int | None:
    """``memgate::note#12`` → 12; None for any other name."""
    match = _NOTE.match(name)
    return int(match.group(1)) if match else None


def note_starts(names: list[Any], stages: list[Any], times: list[int]) -> dict[int, int]:
    """The START time of each ``memgate::note#k`` annotation by k (a snapshot's ``external_annotations``:
    name, stage, time), the earliest were one written twice."""
    out: dict[int, int] = {}
    for name, stage, t in zip(names, stages, times):
        k = moment_of(name) if isinstance(name, str) and stage == "START" else None
        if k is not None:
            out[k] = min(t, out.get(k, t))
    return out


def attribute(device: DeviceModel, tracked: Tracked, moment_ns: dict[int, int],
              steps: Table) -> tuple[DeviceModel, dict[str, Any]]:
    """``device`` with its blocks' :data:`COLUMN` (module docstring), and what the attribution found:
    the storages of this device, the bytes of those no block of the window holds (allocated before
    the recording started: a trace sees only what was allocated while it ran)."""
    blocks = device.blocks
    if ADDRESS not in blocks:
        return device, {"not attributed": "its blocks carry no addresses (allocation events without Addr)"}
    mine = np.array([d == device.device for d in tracked.device], dtype=bool)
    codes = np.full(len(blocks), len(TRACKED), dtype=np.int64)  # len(TRACKED): no tracked storage
    addr, size = blocks.ints(ADDRESS).values, blocks.ints("size").values
    t_alloc, t_free = blocks.ints("t_alloc"), blocks.ints("t_free")
    born = np.where(t_alloc.isna(), np.iinfo(np.int64).min, t_alloc.values)
    gone = np.where(t_free.isna(), np.iinfo(np.int64).max, t_free.values)
    order = np.argsort(addr, kind="stable")
    sorted_addr = addr[order]
    widest = int(size.max()) if len(size) else 0
    moments = np.array([moment_ns.get(k, -1) for k in range(tracked.moments)], dtype=np.int64)
    unplaced, unplaced_bytes = 0, 0
    for row in np.flatnonzero(mine).tolist():
        ptr, code = int(tracked.data_ptr[row]), int(tracked.category[row])
        times = moments[int(tracked.first[row]):int(tracked.last[row]) + 1]
        times = np.sort(times[times >= 0])
        if not len(times):
            continue  # noted only at moments the trace does not hold (a warm-up step)
        lo, hi = np.searchsorted(sorted_addr, [ptr - widest, ptr], side="right")
        candidates = order[lo:hi]
        candidates = candidates[addr[candidates] + size[candidates] > ptr]
        # live at some noting moment: the first moment at or after the block's allocation is before its free
        at = np.searchsorted(times, born[candidates], side="left")
        live = (at < len(times)) & (times[np.minimum(at, len(times) - 1)] < gone[candidates])
        hits = candidates[live]
        if len(hits):
            codes[hits] = np.minimum(codes[hits], code)
        else:
            unplaced += 1
            unplaced_bytes += int(tracked.nbytes[row])
    untracked = codes == len(TRACKED)
    in_step = _in_a_step(born, t_alloc.present(), steps)
    codes[untracked & in_step] = CATEGORIES.index(ACTIVATIONS)
    codes[untracked & ~in_step] = CATEGORIES.index(OTHER)
    facts: dict[str, Any] = {"storage_runs": int(mine.sum())}
    if unplaced:
        facts["storages_without_block"] = unplaced
        facts["bytes_without_block"] = unplaced_bytes
    column = Texts.coded(codes.astype(np.int32), list(CATEGORIES))
    return replace(device, blocks=blocks.with_column(COLUMN, column)), facts


def _in_a_step(t: np.ndarray, known: np.ndarray, steps: Table) -> np.ndarray:
    """Where a known time lies in some step's [t_start, t_end]."""
    timed = steps.take(steps.ints("t_start").present() & steps.ints("t_end").present())
    if not len(timed) or not len(t):
        return np.zeros(len(t), dtype=bool)
    start, end = timed.ints("t_start").values, timed.ints("t_end").values
    by_start = np.argsort(start, kind="stable")
    at = np.searchsorted(start[by_start], t, side="right") - 1
    step = by_start[np.maximum(at, 0)]
    return known & (at >= 0) & (t <= end[step])


def bytes_by_category(blocks: Table, rows: np.ndarray) -> dict[str, int]:
    """Bytes of the blocks at ``rows`` per category, every category listed (0 where none), in
    :data:`CATEGORIES` order."""
    text = blocks.texts(COLUMN)
    names = [str(n) for n in text.names.tolist()]
    codes, sizes = text.codes[rows], blocks.ints("size").values[rows]
    totals = np.zeros(max(len(names), 1), dtype=np.int64)
    named = codes >= 0
    np.add.at(totals, codes[named], sizes[named])
    return {name: int(totals[names.index(name)]) if name in names else 0 for name in CATEGORIES}

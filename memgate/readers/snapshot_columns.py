"""A snapshot pickle read with its device traces as columns: the compiled reader, the pure-Python fallback.

The compiled reader (:mod:`memgate.readers._snapshot_core`, Cython) walks the pickle's opcodes from the
file and builds the same plain data :func:`memgate.readers.safepickle.load` builds, except that each
device trace (``data["device_traces"][d]``) is a :class:`TraceColumns`: its entries' values in typed
columns and each frames list as a stack id (lists that hold the same frame objects are one stack). No
per-entry dict is built, so a 1M-entry snapshot takes a fraction of its file size in memory.

Whatever it does not take (a class reference, an opcode plain data does not use, a value the snapshot
schema refuses, a memo index past the file, a container count near the cap, an unreadable file) it
hands to the pure-Python reader, which builds the dicts and gives the result or the one-line error: the
compiled path only ever accepts what the reference accepts, with the same values. ``MEMGATE_PURE_PYTHON=1``
forces the pure-Python reader; so does an install where the extension could not be built.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, overload

import numpy as np

from memgate.readers import limits, safepickle
from memgate.readers.compiled import PURE_ENV, pure_forced, reader_name
from memgate.readers.memory import address_space_capped, collector_paused

__all__ = ["PURE_ENV", "StackRefs", "TraceColumns", "compiled_available", "load", "pure_forced", "reader_name"]

try:
    from memgate.readers import _snapshot_core as _core  # type: ignore[attr-defined]
except ImportError:  # not built (no compiler at install): the pure-Python reader
    _core = None

# The columns' fields, in the order a materialized entry dict lists them, with the bit each sets in ``has``.
_INT_FIELDS = (("addr", 1), ("size", 2), ("stream", 3), ("time_us", 4), ("device_free", 5))
FRAMES_BIT = 6


def compiled_available() -> bool:
    """Is the compiled reader built and importable?"""
    return _core is not None


class StackRefs(Sequence[Any]):
    """Per entry, its frames list (None without one), looked up when asked: ``stacks`` (the distinct
    stacks) and ``sid`` (each entry's index among them, -1: no frames) are all it keeps, so the grouping by
    content runs over the distinct stacks only and no per-entry list is built (a 1M-entry trace's would
    be 8 MB, and 36 MB more while made)."""

    def __init__(self, stacks: list[list[Any]], sid: np.ndarray) -> None:
        self._table: list[Any] = [*stacks, None]  # sid -1: the last one, None
        self.stacks = stacks
        self.sid = sid

    def __len__(self) -> int:
        return len(self.sid)

    @overload
    def __getitem__(self, i: int) -> Any: ...

    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return list(map(self._table.__getitem__, self.sid[i].tolist()))
        return self._table[self.sid[i]]

    def __iter__(self) -> Iterator[Any]:
        return map(self._table.__getitem__, self.sid.tolist())


@dataclass(frozen=True, eq=False)
class TraceColumns(Sequence[dict[str, Any]]):
    """One device trace as the compiled reader read it. Indexing it builds the entry's dict (as the
    pure-Python reader would have held it), for the few readers that look at single entries."""

    actions: tuple[str, ...]
    code: np.ndarray  # int8, index into actions
    addr: np.ndarray  # int64 each; 0 where the entry has no such key (``has`` tells)
    size: np.ndarray
    stream: np.ndarray
    time_us: np.ndarray
    device_free: np.ndarray
    has: np.ndarray  # uint16 bits: 1 << 1 addr, 2 size, 3 stream, 4 time_us, 5 device_free, 6 frames
    frames: StackRefs
    xid: np.ndarray  # int32 per entry: its keys outside the columns (compile_context, ...) in extra_sets, -1 none
    extra_sets: list[dict[str, Any]]  # the distinct sets of those keys and values (entries share them)

    def __len__(self) -> int:
        return len(self.code)

    def present(self, bit: int) -> np.ndarray:
        return np.asarray((self.has & (1 << bit)) != 0, dtype=bool)

    def entry(self, i: int) -> dict[str, Any]:
        has = int(self.has[i])
        out: dict[str, Any] = {"action": self.actions[int(self.code[i])]}
        for name, bit in _INT_FIELDS:
            if has >> bit & 1:
                out[name] = int(getattr(self, name)[i])
        if has >> FRAMES_BIT & 1:
            out["frames"] = self.frames[i]
        xid = int(self.xid[i])
        if xid >= 0:
            out.update(self.extra_sets[xid])
        return out

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            return [self.entry(k) for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.entry(i)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return (self.entry(i) for i in range(len(self)))


def load(path: Path, *, max_bytes: int, actions: tuple[str, ...], moves: tuple[str, ...]) -> Any:
    """The snapshot's plain data, its device traces as :class:`TraceColumns` where the compiled reader
    read it; else (``$MEMGATE_PURE_PYTHON``, no extension, a file it does not take) what
    :func:`safepickle.load` gives, or its error."""
    if _core is None or pure_forced():
        return safepickle.load(path, max_bytes=max_bytes)
    data = _compiled(path, max_bytes, actions, moves)
    return safepickle.load(path, max_bytes=max_bytes) if data is None else data


def _compiled(path: Path, max_bytes: int, actions: tuple[str, ...], moves: tuple[str, ...]) -> Any:
    """The compiled reader's value, or None where the pure-Python reader must decide."""
    assert _core is not None
    try:
        size = path.stat().st_size
        if not path.is_file() or size == 0 or size > max_bytes:
            return None
        with open(path, "rb") as fh, collector_paused(), address_space_capped(limits.max_pickle_memory(size)):
            value, stacks, extra_sets, traces, placed = _core.read(fh, size, limits.max_pickle_objects(size), actions, moves)
    except Exception:  # noqa: BLE001 - Unsupported, an OS error, MemoryError: the reference decides and says
        return None
    for k, cols in placed:
        traces[k] = TraceColumns(actions=actions, code=cols["code"], addr=cols["addr"], size=cols["size"],
                                 stream=cols["stream"], time_us=cols["time_us"], device_free=cols["device_free"],
                                 has=cols["has"], frames=StackRefs(stacks, cols["sid"]), xid=cols["xid"],
                                 extra_sets=extra_sets)
    return value

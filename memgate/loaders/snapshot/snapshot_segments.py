"""A snapshot's final ``segments``: checked, flattened to one row per block, and the pool they hold.

The segments are the allocator's state at the dump: with a trace, they are where its levels are
rebuilt backwards from (the reserve, the blocks live through the window); with or without one, the
pool at the dump (:func:`pool_state`: allocated, reserved, free blocks). A legacy block (torch ≤ 2.0)
carries no ``address`` (derived here from its segment's address and the sizes before it) and keeps
its requested size and frames in its ``history``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memgate.errors import InputError
from memgate.loaders.snapshot import block_sizes
from memgate.model import PoolState, check_bytes
from memgate.readers.pyrecords import check_records, int_column

_ACTIVE_STATES = ("active_allocated", "active_pending_free")


@dataclass(frozen=True)
class Segments:
    """The final segments' blocks, flattened: one row per block."""

    device: np.ndarray  # int64, the block's segment device
    stream: np.ndarray  # int64, the segment's stream
    address: np.ndarray  # int64
    size: np.ndarray  # int64, the allocator's (rounded) block size
    requested: np.ndarray  # int64, requested size (history real_size for legacy blocks)
    requested_stated: np.ndarray  # bool, the block states its requested size (else ``requested`` is its size)
    active: np.ndarray  # bool, state active_allocated or active_pending_free
    allocated: np.ndarray  # bool, state active_allocated
    inactive: np.ndarray  # bool, state inactive (free, reusable by the pool)
    frames: list[Any]  # per block, the frames of its allocation ([] when unknown)
    seg_device: np.ndarray  # per segment
    seg_total: np.ndarray  # per segment
    seg_address: np.ndarray  # per segment
    seg_replayable: np.ndarray  # per segment: a large-pool segment that is not expandable (block_sizes)
    where: list[str]  # per block, its JSON path


def iter_blocks(segments: Sequence[Any]) -> Any:
    """The blocks of every segment, lazily (the segments not checked yet: what is no dict is skipped)."""
    return chain.from_iterable(s.get("blocks") or () for s in segments if isinstance(s, dict))


def read_segments(path: Path, segments: Sequence[Any], schema: dict[str, Any]) -> Segments:
    """Check the final segments and their blocks against the schema, and flatten them."""
    defs = schema["$defs"]
    cols = check_records(segments, defs["segment"], file=path, where=lambda i: f"segments[{i}]", root=schema)
    counts = np.fromiter((len(s["blocks"]) for s in segments), dtype=np.int64, count=len(segments))
    blocks = list(chain.from_iterable(s["blocks"] for s in segments))
    seg_of = np.repeat(np.arange(len(segments), dtype=np.int64), counts)
    offsets = np.cumsum(counts) - counts  # each segment's first block
    index_in_seg = np.arange(len(blocks), dtype=np.int64) - np.repeat(offsets, counts)
    where = [f"segments[{s}].blocks[{b}]" for s, b in zip(seg_of.tolist(), index_in_seg.tolist())]
    bcols = check_records(blocks, defs["block"], file=path, where=lambda i: where[i], root=schema)

    seg_device = int_column(cols["device"], len(segments))
    seg_address = int_column(cols["address"], len(segments))
    seg_total = int_column(cols["total_size"], len(segments))
    seg_stream = int_column(cols.get("stream"), len(segments), fill=0)
    size = int_column(bcols["size"], len(blocks))
    check_bytes(seg_total, path, "segments[].total_size", summed=True)
    check_bytes(size, path, "segments[].blocks[].size", summed=True)
    given = bcols.get("address")
    has_address = np.asarray(given.is_valid()) if given is not None else np.zeros(len(blocks), dtype=bool)
    address = _addresses(path, size, counts, offsets, seg_of, seg_address, seg_total, given, has_address)
    state = bcols["state"]
    active = np.asarray(pc.is_in(state, value_set=pa.array(_ACTIVE_STATES)), dtype=bool) if len(blocks) \
        else np.zeros(0, dtype=bool)
    allocated = np.asarray(pc.equal(state, "active_allocated"), dtype=bool) if len(blocks) \
        else np.zeros(0, dtype=bool)
    inactive = np.asarray(pc.equal(state, "inactive"), dtype=bool) if len(blocks) else np.zeros(0, dtype=bool)
    requested_col = bcols.get("requested_size")
    requested = np.where(np.asarray(requested_col.is_valid()), int_column(requested_col, len(blocks), fill=0), size) \
        if requested_col is not None and len(blocks) else size.copy()
    stated = np.asarray(requested_col.is_valid(), dtype=bool) if requested_col is not None and len(blocks) \
        else np.zeros(len(blocks), dtype=bool)
    frames = _legacy_history(path, blocks, requested, requested_col, where, schema, stated)
    return Segments(
        device=np.repeat(seg_device, counts), stream=np.repeat(seg_stream, counts), address=address, size=size,
        requested=requested, requested_stated=stated, active=active, allocated=allocated, inactive=inactive,
        frames=frames,
        seg_device=seg_device, seg_total=seg_total, seg_address=seg_address,
        seg_replayable=_replayable(segments, seg_total), where=where,
    )


def _addresses(path: Path, size: np.ndarray, counts: np.ndarray, offsets: np.ndarray, seg_of: np.ndarray,
               seg_address: np.ndarray, seg_total: np.ndarray, given: pa.Array | None,
               has_address: np.ndarray) -> np.ndarray:
    """Each block's address: the one it states, else its segment's address + the sizes before it (legacy
    blocks carry none). A segment whose blocks do not add up to its total is an error."""
    before = np.cumsum(size) - size  # bytes of all blocks listed before this one
    first_before = np.concatenate([before, [0]])[offsets]  # ... before each segment's first block
    derived = np.repeat(seg_address, counts) + before - np.repeat(first_before, counts)
    address = np.where(has_address, int_column(given, len(size), fill=0), derived) if len(size) else derived
    # A segment's blocks tile it (torch lists its free blocks too; every real sample agrees, expandable
    # segments included): a total they do not add up to is a broken dump, whatever the addresses say.
    sums = np.zeros(len(seg_total), dtype=np.int64)
    np.add.at(sums, seg_of, size)
    bad = np.flatnonzero((sums != seg_total) & ((counts > 0) | (not has_address.all())))
    if len(bad):
        i = int(bad[0])
        addressed = "" if has_address[offsets[i]:offsets[i] + counts[i]].all() else " without block addresses"
        raise InputError(f"the blocks of a segment{addressed} do not add up to its total_size",
                         file=path, column=f"segments[{i}].total_size",
                         expected=f"the sum of its block sizes ({int(sums[i])})", found=str(int(seg_total[i])))
    return address


def _legacy_history(path: Path, blocks: list[Any], requested: np.ndarray, requested_col: pa.Array | None,
                    where: list[str], schema: dict[str, Any], stated: np.ndarray) -> list[Any]:
    """Each block's frames ([] when unknown); a legacy block's requested size (where it states none)
    and frames come from the first entry of its ``history`` (``requested`` and ``stated`` are updated
    in place)."""
    frames: list[Any] = [b.get("frames") for b in blocks]
    legacy = [i for i, b in enumerate(blocks) if b.get("history")]
    if legacy:
        first = [blocks[i]["history"][0] for i in legacy]
        hcols = check_records(first, schema["$defs"]["history_entry"], file=path,
                              where=lambda k: f"{where[legacy[k]]}.history[0]", root=schema)
        real = int_column(hcols["real_size"], len(first))
        idx = np.asarray(legacy, dtype=np.int64)
        no_requested = ~np.asarray(requested_col.is_valid())[idx] if requested_col is not None \
            else np.ones(len(idx), dtype=bool)
        requested[idx[no_requested]] = real[no_requested]
        stated[idx] = True
        for k, i in enumerate(legacy):
            if frames[i] is None:
                frames[i] = first[k].get("frames")
    return [f if f is not None else [] for f in frames]


def _replayable(segments: Sequence[Any], totals: np.ndarray) -> np.ndarray:
    """Per segment, whether its layout is replayed for block sizes: the large pool (``segment_type``, or a
    size above the small pool's 2 MiB where older files omit it), not an expandable segment."""
    kinds = [s.get("segment_type") for s in segments]
    large = np.fromiter((k == "large" if isinstance(k, str) else t > block_sizes.SMALL_SEGMENT
                         for k, t in zip(kinds, totals.tolist())), dtype=bool, count=len(segments))
    expandable = np.fromiter((s.get("is_expandable") is True for s in segments), dtype=bool, count=len(segments))
    replayable: np.ndarray = large & ~expandable
    return replayable


def pool_state(segs: Segments, dev: int, path: Path, size_basis: str) -> PoolState:
    """The device's pool at the dump, from the final segments alone (so with or without history).

    ``allocated`` sums the ``active_allocated`` blocks' sizes, as ``torch.cuda.memory_allocated()`` does:
    an ``active_pending_free`` block was freed by the program (``free_requested``, where that counter
    drops) and only waits for its stream's events before reuse. Free blocks count by their size too:
    theirs is what the pool can hand out (their ``requested_size`` is stale).
    """
    mine = segs.device == dev
    free = segs.size[mine & segs.inactive]
    return PoolState(
        allocated=int(segs.size[mine & segs.allocated].sum()),
        reserved=int(segs.seg_total[segs.seg_device == dev].sum()),
        largest_free_block=int(free.max()) if len(free) else 0,
        free_bytes=int(free.sum()),
        size_basis=size_basis,
        source=str(path),
    )

"""A model of torch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``), replaying the storages
an estimate saw into what the allocator would do on the GPU: the trace entries and segments of a memory
snapshot, the same file a CUDA recording writes, so every figure memgate reads from a snapshot comes out.

The rules modelled (one stream, no CUDA graphs):

- a request is rounded (:func:`memgate.loaders.snapshot.block_sizes.rounded`: 512 B, ``roundup_power2_divisions``);
- up to 1 MiB it is served by the small pool, whose segments are 2 MiB; larger by the large pool, whose
  segments are 20 MiB for requests under 10 MiB, else the request rounded up to 2 MiB;
- the block is the smallest free block of the pool that fits (lowest address on a tie), refused where
  ``max_split_size`` says an oversize block may not serve it; a new segment is reserved where none fits;
- the rest of the block is split off as a free block in the small pool when at least 512 B remain, in the
  large pool when more than 1 MiB remains and the block is under ``max_split_size`` (else the block keeps
  it, as the real allocator does);
- a freed block merges with free neighbours of its segment; segments stay reserved (no ``empty_cache``);
- ``expandable_segments``: one segment per pool that grows by whole pages (2 MiB small, 20 MiB large) at its
  end, every rest of 512 B or more split off.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from memgate.loaders.snapshot.block_sizes import MIN_BLOCK, SMALL_SEGMENT, SMALL_SIZE, Settings, rounded

LARGE_SEGMENT = 20 << 20  # kLargeBuffer
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc
ROUND_LARGE = 2 << 20  # kRoundLarge
_BASE = 0x7F0000000000  # the first segment's address: any address works, segments never touch
_GAP = 1 << 34  # between segments (a real device's segments are apart too: no merging across them)


@dataclass(frozen=True)
class Event:
    """One storage birth (``alloc``: ``size`` bytes requested), death (``free``) or a step mark (``mark``)."""

    kind: str  # alloc, free, mark
    ident: int  # the storage's number (alloc and free), -1 for a mark
    size: int
    frames: list[dict[str, Any]]
    what: str  # the operator that created it, or the mark's name


@dataclass
class _Block:
    addr: int
    size: int
    segment: int  # its segment's address
    small: bool
    free: bool = True
    requested: int = 0
    frames: list[dict[str, Any]] = field(default_factory=list)


def segment_size(size: int) -> int:
    """The segment the allocator reserves for a rounded request that no cached block serves."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class Allocator:
    """The caching allocator of one device; :meth:`malloc` and :meth:`free` write snapshot trace entries."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.blocks: dict[int, _Block] = {}  # by address, free and allocated
        self._ends: dict[int, int] = {}  # a block's end address -> its start (its neighbour before a free)
        self.pools: dict[bool, list[tuple[int, int]]] = {True: [], False: []}  # small? -> sorted (size, addr) free
        self.segments: dict[int, tuple[int, bool]] = {}  # address -> (size, small)
        self.trace: list[dict[str, Any]] = []
        self._next_segment = _BASE
        self._expandable: dict[bool, int] = {}  # small? -> its growing segment's address

    # -- the pools --------------------------------------------------------------------------------

    def _add(self, block: _Block) -> None:
        self.blocks[block.addr] = block
        self._ends[block.addr + block.size] = block.addr

    def _resize(self, block: _Block, size: int) -> None:
        del self._ends[block.addr + block.size]
        block.size = size
        self._ends[block.addr + size] = block.addr

    def _insert(self, block: _Block) -> None:
        bisect.insort(self.pools[block.small], (block.size, block.addr))

    def _remove(self, block: _Block) -> None:
        pool = self.pools[block.small]
        pool.pop(bisect.bisect_left(pool, (block.size, block.addr)))

    def _entry(self, action: str, addr: int, size: int, frames: list[dict[str, Any]], t_us: int) -> None:
        self.trace.append({"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t_us,
                           "frames": frames})

    def _best_fit(self, size: int, small: bool) -> _Block | None:
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i == len(pool):
            return None
        block = self.blocks[pool[i][1]]
        limit = self.settings.max_split_size
        if not small and not self.settings.expandable:
            if size < limit <= block.size:  # an oversize block serves only oversize requests
                return None
            if size >= limit and block.size >= size + LARGE_SEGMENT:
                return None
        return block

    def _new_segment(self, size: int, small: bool, frames: list[dict[str, Any]], t_us: int) -> _Block:
        total = segment_size(size)
        addr = self._next_segment
        self._next_segment += -(-total // _GAP) * _GAP + _GAP
        self.segments[addr] = (total, small)
        self._entry("segment_alloc", addr, total, frames, t_us)
        block = _Block(addr, total, addr, small)
        self._add(block)
        return block

    def _grow(self, size: int, small: bool, frames: list[dict[str, Any]], t_us: int) -> _Block:
        """Expandable segments: map pages at the pool's segment's end until a free block there fits."""
        page = SMALL_SEGMENT if small else LARGE_SEGMENT
        addr = self._expandable.get(small)
        if addr is None:
            addr = self._expandable[small] = self._next_segment
            self._next_segment += _GAP * 64
            self.segments[addr] = (0, small)
        total = self.segments[addr][0]
        last = self._last_block(addr, total)
        have = last.size if last is not None and last.free else 0
        pages = -(-(size - have) // page)
        self.segments[addr] = (total + pages * page, small)
        self._entry("segment_map", addr + total, pages * page, frames, t_us)
        if last is not None and last.free:
            self._remove(last)
            self._resize(last, last.size + pages * page)
            return last
        block = _Block(addr + total, pages * page, addr, small)
        self._add(block)
        return block

    def _last_block(self, segment: int, total: int) -> _Block | None:
        start = self._ends.get(segment + total) if total else None
        return self.blocks[start] if start is not None else None

    # -- requests ---------------------------------------------------------------------------------

    def malloc(self, requested: int, frames: list[dict[str, Any]], t_us: int) -> int:
        """Serve a request of ``requested`` bytes; the block's address."""
        size = int(rounded(np.asarray([requested], dtype=np.int64), self.settings)[0])
        small = size <= SMALL_SIZE
        block = self._best_fit(size, small)
        if block is not None:
            self._remove(block)
        elif self.settings.expandable:
            block = self._grow(size, small, frames, t_us)
        else:
            block = self._new_segment(size, small, frames, t_us)
        rest = block.size - size
        if small or self.settings.expandable:
            split = rest >= MIN_BLOCK
        else:
            split = size < self.settings.max_split_size and rest > SMALL_SIZE
        if split:
            self._resize(block, size)
            tail = _Block(block.addr + size, rest, block.segment, block.small)
            self._add(tail)
            self._insert(tail)
        block.free, block.requested, block.frames = False, requested, frames
        self._entry("alloc", block.addr, requested, frames, t_us)
        return block.addr

    def free(self, addr: int, t_us: int) -> None:
        block = self.blocks[addr]
        self._entry("free_requested", addr, block.requested, block.frames, t_us)
        self._entry("free_completed", addr, block.requested, block.frames, t_us)
        block.free, block.requested, block.frames = True, 0, []
        for neighbour in (self._after(block), self._before(block)):
            if neighbour is None or not neighbour.free:
                continue
            self._remove(neighbour)
            first, second = (block, neighbour) if block.addr < neighbour.addr else (neighbour, block)
            del self.blocks[second.addr], self._ends[second.addr + second.size]
            self._resize(first, first.size + second.size)
            block = first
        self._insert(block)

    def _after(self, block: _Block) -> _Block | None:
        nxt = self.blocks.get(block.addr + block.size)
        return nxt if nxt is not None and nxt.segment == block.segment else None

    def _before(self, block: _Block) -> _Block | None:
        start = self._ends.get(block.addr)
        prev = self.blocks.get(start) if start is not None else None
        return prev if prev is not None and prev.segment == block.segment else None

    # -- the snapshot -----------------------------------------------------------------------------

    def snapshot_segments(self) -> list[dict[str, Any]]:
        """The segments as ``torch.cuda.memory._snapshot()`` lists them, with their blocks."""
        out = []
        for addr, (total, small) in sorted(self.segments.items()):
            if not total:
                continue
            blocks = sorted((b for b in self.blocks.values() if b.segment == addr), key=lambda b: b.addr)
            out.append({
                "device": 0, "address": addr, "total_size": total, "stream": 0,
                "segment_type": "small" if small else "large", "segment_pool_id": (0, 0),
                "is_expandable": self.settings.expandable,
                "allocated_size": sum(b.size for b in blocks if not b.free),
                "active_size": sum(b.size for b in blocks if not b.free),
                "requested_size": sum(b.requested for b in blocks if not b.free),
                "blocks": [{"address": b.addr, "size": b.size, "requested_size": b.requested,
                            "state": "inactive" if b.free else "active_allocated",
                            **({} if b.free else {"frames": b.frames})} for b in blocks],
            })
        return out

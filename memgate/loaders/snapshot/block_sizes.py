"""The caching allocator's block sizes behind a snapshot's trace (torch's CUDA allocator; torch_npu's copy).

A snapshot's trace entries carry the size the program *requested*; ``torch.cuda.memory_allocated()``,
``max_memory_allocated()`` and Kineto's ``Total Allocated`` count the *block* the allocator handed out:

- every request is rounded: below 512 B to 512 B, else up to a multiple of 512 B, or with
  ``roundup_power2_divisions`` to the next of N equal divisions of its power-of-two interval;
  torch_npu's copy first adds 32 B to every request (``AddPadSize``; 0 only on Ascend 950 with
  CANN 9.1 or later), so a 1024 B request holds 1536 B there;
- a block is carved from the start of a free block; the rest is split off as a new free block only
  when it is worth it: in the small pool (requests of at most 1 MiB, 2 MiB segments) and in
  expandable segments when at least 512 B remain, in the large pool when more than 1 MiB remains and
  the rounded size is below ``max_split_size``. Otherwise the block keeps the whole free block
  (a 3149824 B request in a fresh 20 MiB segment's last 4177920 B gets all of it).

The first rule is arithmetic (:func:`rounded`). The second needs the layout of each large segment at
the moment of the request: :func:`block_sizes` replays the large-pool entries over the segments
(free blocks coalesce with free neighbours at ``free_completed``, as the allocator merges them), starting
from the layout at the window's start: the final segments, less the segments the trace allocates, plus
the ones it frees, holding the blocks live through the window (their sizes are in the final segments)
and those freed in the window but allocated before it (their extent follows the same rule from the
room the start layout leaves them).

Where the replay cannot place an allocation (an address that is no free block's start in the replayed
layout: a trace that lost entries), that block is counted at its rounded size and the number of such
blocks is reported, never hidden.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from memgate.errors import InputError, show

MIN_BLOCK = 512  # kMinBlockSize: every block is a multiple of it
SMALL_SIZE = 1 << 20  # kSmallSize: requests up to it are served by the small pool; larger rests are split off
SMALL_SEGMENT = 2 << 20  # kSmallBuffer: the small pool's segment size (large-pool segments are larger)
_INTERVALS = 16  # roundup_power2_divisions intervals: [1 MiB, 2 MiB), [2, 4), ... up to 32 GiB and above
NPU_PAD = 32  # bytes torch_npu's round_size adds to a request before rounding it
_NO_LIMIT = (1 << 63) - 1


@dataclass(frozen=True)
class Settings:
    """The allocator settings a snapshot records (``allocator_settings``); defaults are torch's."""

    divisions: tuple[int, ...] = (0,) * _INTERVALS
    max_split_size: int = _NO_LIMIT
    expandable: bool = False
    # False for a snapshot no caching allocator wrote (torch's _profile_to_snapshot of a CPU profile:
    # blocks of 4 B and 40 B): its sizes are the blocks, nothing is rounded or replayed
    caching: bool = True
    pad: int = 0  # bytes added to each request before it is rounded (torch_npu's NPU_PAD)

    @classmethod
    def of(cls, raw: Any, *, file: str | Path | None = None) -> Settings:
        """From a snapshot's ``allocator_settings`` (absent or partial in older files: torch's defaults).

        A value the block sizes would follow that torch never writes is an InputError naming it: a
        division count that is no integer from 0 to 2**54 - 1, an interval start that is no power of
        two, a split size that is no integer, an expandable flag that is no boolean. Ignored, it would
        size every block by torch's defaults without a word."""
        if not isinstance(raw, dict):
            return cls()

        def bad(key: str, expected: str, found: Any) -> InputError:
            return InputError("malformed allocator setting", file=file, column=f"allocator_settings.{key}",
                              expected=expected, found=found)

        divisions = [0] * _INTERVALS
        given = raw.get("roundup_power2_divisions")
        count = "a number of divisions: an integer from 0 to 2**54 - 1"
        if isinstance(given, dict):  # {"1": d, "2": d, ..., "32768": d}: each interval's start in MiB
            for key, value in given.items():
                where = f"roundup_power2_divisions.{key if isinstance(key, str) and len(key) <= 40 else show(key, 40)}"
                # at most 19 digits: past int64 no power of two is an interval, and int() of 4301 digits raises
                mib = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 19 else 0
                if not mib or mib & (mib - 1):
                    raise bad(where, "interval starts in MiB: powers of two as text ('1', '2', '4', ... '32768')",
                              key if isinstance(key, str) else f"{type(key).__name__} {show(key)}")
                if not _is_count(value):
                    raise bad(where, count, value)
                divisions[min(mib.bit_length() - 1, _INTERVALS - 1)] = value
        elif isinstance(given, (list, tuple)):
            for i, value in enumerate(given[:_INTERVALS]):
                if not _is_count(value):
                    raise bad(f"roundup_power2_divisions[{i}]", count, value)
                divisions[i] = value
        elif given is not None:
            raise bad("roundup_power2_divisions", "an object of divisions per interval", given)
        split = raw.get("max_split_size")
        if split is not None and type(split) is not int:
            raise bad("max_split_size", "an integer (bytes; -1: no limit)", split)
        expandable = raw.get("expandable_segments")
        if expandable is not None and type(expandable) is not bool:
            raise bad("expandable_segments", "true or false", expandable)
        max_split = split if split is not None and split > 0 else _NO_LIMIT
        return cls(tuple(divisions), max_split, expandable is True)


def _is_count(value: Any) -> bool:
    """A division count the rounding can use: an int (not a bool), not negative, and small enough that
    512 B times it fits int64 (:func:`rounded` compares a request with that product)."""
    return type(value) is int and 0 <= value <= _NO_LIMIT // MIN_BLOCK


def rounded(requested: np.ndarray, settings: Settings) -> np.ndarray:
    """The allocator's ``round_size`` of each requested size (int64 in, int64 out)."""
    req = requested.astype(np.int64, copy=False) + settings.pad
    out = np.maximum(-(-req // MIN_BLOCK) * MIN_BLOCK, MIN_BLOCK)
    table = np.asarray(settings.divisions, dtype=np.int64)
    if not (table > 1).any():
        return out
    log2 = np.zeros(len(req), dtype=np.int64)
    positive = req > 0
    log2[positive] = np.floor(np.log2(req[positive].astype(np.float64))).astype(np.int64)
    # float log2 can be one off near powers of two: correct it exactly
    log2 -= (np.left_shift(1, log2) > req) & positive
    log2 += (np.left_shift(1, log2 + 1) <= req) & positive
    divisions = table[np.clip(log2 - 20, 0, _INTERVALS - 1)]
    use = (divisions > 1) & (req > MIN_BLOCK * divisions) & positive & ((req & (req - 1)) != 0)
    if not use.any():
        return out
    floor2 = np.left_shift(1, log2[use])
    step = np.right_shift(floor2, np.floor(np.log2(divisions[use].astype(np.float64))).astype(np.int64))
    r = req[use]
    safe = np.maximum(step, 1)
    up = np.where(step == 0, floor2 << 1, np.where(r % safe == 0, r, (r // safe) * safe + safe))
    out[use] = up
    return out


def pad_shown(size: np.ndarray, requested: np.ndarray, settings: Settings) -> int | None:
    """The pad the allocated blocks of the final segments show: ``NPU_PAD`` where the small-pool
    blocks (at most 1 MiB: a request there gets exactly its rounded size) are their requests rounded
    with it and not without, 0 where the reverse holds, None where no block tells the two apart
    (``size`` and ``requested`` of the blocks that state their requested size)."""
    small = (size <= SMALL_SIZE) & (requested >= 0)
    size, requested = size[small], requested[small]
    plain, padded = rounded(requested, settings), rounded(requested, replace(settings, pad=NPU_PAD))
    tells = plain != padded
    votes_padded = int((size[tells] == padded[tells]).sum())
    votes_plain = int((size[tells] == plain[tells]).sum())
    if votes_padded == votes_plain:
        return None
    return NPU_PAD if votes_padded > votes_plain else 0


@dataclass
class _Segment:
    start: int
    end: int
    starts: list[int] = field(default_factory=list)  # block starts, sorted
    size: dict[int, int] = field(default_factory=dict)
    free: dict[int, bool] = field(default_factory=dict)

    def put(self, start: int, size: int, free: bool) -> None:
        if start not in self.size:
            bisect.insort(self.starts, start)
        self.size[start], self.free[start] = size, free

    def drop(self, start: int) -> None:
        self.starts.pop(bisect.bisect_left(self.starts, start))
        del self.size[start], self.free[start]

    def release(self, start: int) -> None:
        """The block at ``start`` becomes free and merges with free neighbours (the allocator's free_block)."""
        self.free[start] = True
        i = bisect.bisect_left(self.starts, start)
        if i + 1 < len(self.starts) and self.free[self.starts[i + 1]]:
            nxt = self.starts[i + 1]
            self.size[start] += self.size[nxt]
            self.drop(nxt)
        if i > 0 and self.free[self.starts[i - 1]]:
            prev = self.starts[i - 1]
            self.size[prev] += self.size[start]
            self.drop(start)


def _kept(free_size: int, size: int, settings: Settings) -> int:
    """The block a large-pool request of rounded ``size`` gets from a free block of ``free_size``."""
    rest = free_size - size
    return size if size < settings.max_split_size and rest > SMALL_SIZE else free_size


@dataclass(frozen=True)
class Replayed:
    """Per trace entry, the allocator block it allocates or frees (0 for segment and marker entries)."""

    block: np.ndarray  # int64
    unplaced: int  # allocations the replay could not place (counted at their rounded size)


@dataclass(frozen=True)
class Codes:
    """The action codes of a trace's entries that the replay tells apart."""

    alloc: int
    frees: tuple[int, ...]  # free_requested, and the single free of torch 2.0
    completes: tuple[int, ...]  # free_completed, and the single free
    seg_alloc: int
    seg_free: int


def block_sizes(code: np.ndarray, addr: np.ndarray, requested: np.ndarray, *, alloc: int, frees: tuple[int, ...],
                completes: tuple[int, ...], seg_alloc: int, seg_free: int, early: np.ndarray,
                final_segments: list[tuple[int, int, bool]], live_blocks: list[tuple[int, int]],
                settings: Settings) -> Replayed:
    """The block size behind every alloc/free entry of one device's trace (in time order).

    ``early``: the free entries of blocks allocated before the window; ``final_segments``: (address,
    total size, replayable) of the device's final segments (replayable: a large-pool segment that is not
    expandable); ``live_blocks``: (address, size) of the final allocated blocks live through the window.
    """
    codes = Codes(alloc, frees, completes, seg_alloc, seg_free)
    moves = np.isin(code, (alloc, *frees, *completes))
    if not settings.caching:
        return Replayed(np.where(moves, requested, 0).astype(np.int64), 0)
    block = rounded(requested, settings)
    block[~moves] = 0
    if settings.expandable:  # every rest of at least 512 B is split off: the rounded size is the block
        return Replayed(block, 0)
    large_seg = (np.isin(code, (seg_alloc, seg_free))) & (requested > SMALL_SEGMENT)
    large = (moves & (block > SMALL_SIZE)) | large_seg
    if not large.any():
        return Replayed(block, 0)
    early_large = early[large[early]] if len(early) else early
    layout = _start_layout(code, addr, requested, block, codes, large_seg, early_large, final_segments,
                           live_blocks, settings)
    live: dict[int, int] = {int(addr[k]): int(block[k]) for k in early_large.tolist()}
    at_large = np.flatnonzero(large)
    out = block[at_large].tolist()  # Python ints: the replay reads and writes each entry once
    unplaced = _replay(layout, live, code[at_large].tolist(), addr[at_large].tolist(), out,
                       requested[at_large].tolist(), codes, settings)
    block[at_large] = out
    return Replayed(block, unplaced)


class _Layout:
    """The large segments by address, and their sorted addresses (to find the one holding an address)."""

    def __init__(self, segments: dict[int, _Segment]) -> None:
        self.segments = segments
        self.order = sorted(segments)

    def find(self, address: int) -> _Segment | None:
        i = bisect.bisect_right(self.order, address) - 1
        seg = self.segments[self.order[i]] if i >= 0 else None
        return seg if seg is not None and address < seg.end else None


def _start_layout(code: np.ndarray, addr: np.ndarray, requested: np.ndarray, block: np.ndarray, codes: Codes,
                  large_seg: np.ndarray, early_large: np.ndarray, final_segments: list[tuple[int, int, bool]],
                  live_blocks: list[tuple[int, int]], settings: Settings) -> _Layout:
    """The large segments at the window's start (the final ones, undone through the trace backwards),
    holding the blocks live through the window and those freed in it but allocated before it (their
    extent, set in ``block``, from the room up to the next block); the gaps are free blocks."""
    segments: dict[int, tuple[int, bool]] = {a: (s, ok) for a, s, ok in final_segments if s > SMALL_SEGMENT}
    at = np.flatnonzero(large_seg)
    for k in at[::-1].tolist():
        if code[k] == codes.seg_alloc:
            segments.pop(int(addr[k]), None)
        else:
            segments[int(addr[k])] = (int(requested[k]), True)
    layout = _Layout({a: _Segment(a, a + s) for a, (s, ok) in segments.items() if ok})
    # Occupied at the start: the blocks live through the window, and those freed in it (allocated before).
    taken: list[tuple[int, int, int]] = []  # (address, rounded size, early entry or -1)
    taken.extend((a, s, -1) for a, s in live_blocks)
    taken.extend((int(addr[k]), int(block[k]), int(k)) for k in early_large.tolist())
    taken.sort()
    for n, (a, s, k) in enumerate(taken):
        seg = layout.find(a)
        if seg is None:
            continue
        room = (taken[n + 1][0] if n + 1 < len(taken) and taken[n + 1][0] < seg.end else seg.end) - a
        size = s if k < 0 else _kept(max(room, s), s, settings)
        if k >= 0:
            block[k] = size
        seg.put(a, size, False)
    for seg in layout.segments.values():  # the gaps are free blocks
        cursor = seg.start
        for start in list(seg.starts):
            if start > cursor:
                seg.put(cursor, start - cursor, True)
            cursor = max(cursor, start + seg.size[start])
        if cursor < seg.end:
            seg.put(cursor, seg.end - cursor, True)
    return layout


def _replay(layout: _Layout, live: dict[int, int], codes_at: list[int], addrs: list[int], out: list[int],
            requested: list[int], codes: Codes, settings: Settings) -> int:
    """Replay the large-pool entries in order over the layout, setting each one's block in ``out``
    (``live``: the block at each address allocated and not yet completed). Returns how many allocations
    could not be placed."""
    unplaced = 0
    alloc, seg_alloc, seg_free = codes.alloc, codes.seg_alloc, codes.seg_free
    completes = set(codes.completes)
    segments, order = layout.segments, layout.order
    bisect_right = bisect.bisect_right  # the loop runs once per large entry (~84k for 1M entries): find() inlined
    for j, (c, a, size, req) in enumerate(zip(codes_at, addrs, out, requested)):
        if c == alloc:
            i = bisect_right(order, a) - 1
            seg = segments[order[i]] if i >= 0 else None
            if seg is not None and a < seg.end and seg.free.get(a) and seg.size[a] >= size:
                whole = seg.size[a]
                size = _kept(whole, size, settings)
                if whole > size:
                    seg.put(a + size, whole - size, True)
                seg.put(a, size, False)
            else:
                unplaced += 1
            out[j] = size
            live[a] = size
        elif c == seg_alloc:
            seg = _Segment(a, a + req)
            seg.put(a, req, True)
            segments[a] = seg
            bisect.insort(order, a)
        elif c == seg_free:
            if segments.pop(a, None) is not None:
                order.remove(a)
        else:
            out[j] = live.get(a, size)
            if c in completes:
                live.pop(a, None)
                i = bisect_right(order, a) - 1
                seg = segments[order[i]] if i >= 0 else None
                if seg is not None and a < seg.end and a in seg.size and not seg.free[a]:
                    seg.release(a)
    return unplaced

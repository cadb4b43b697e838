"""All alloc/free pairing, for every loader of an allocator's events: by address in time order
(snapshot traces, Kineto ``[memory]`` events: :func:`pair_allocs`), by key where a record may have
lost events (msMemScope dumps, the Ascend ``.db``'s memory rows: :func:`pair_events`); and telling
torch's own source files from the user's.

Its own module so that loading one format does not import the other's loader.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from memgate.errors import InputError
from memgate.lazy import lazy_module

if TYPE_CHECKING:
    import pandas as pd
else:  # imported on first use: the snapshot and Kineto loaders pair without pandas
    pd = lazy_module("pandas", globals(), "pd")


@dataclass(frozen=True)
class Pairing:
    """Each alloc's free and each free's alloc at the same address (-1: none in the window)."""

    partner: np.ndarray
    # The first event (in the given order) that repeats its address's previous action: an alloc of an
    # address allocated and not freed since, or a free of one freed and not allocated since. An
    # allocator never does either; a record that shows one lost an event or is corrupt. None: none.
    repeated: int | None


def pair_allocs(addr: np.ndarray, is_alloc: np.ndarray, t: np.ndarray | None = None) -> Pairing:
    """For events in time order: the index of each alloc's next free at the same address, and of each
    free's alloc; -1 where there is none (a free of memory allocated before the window, a block still
    live at its end). Vectorized: a stable sort by address keeps time order within an address.

    ``t``: the events' times, where the events of one instant may be listed in another order than
    they happened (µs timestamps, events reported by several threads): an alloc and a free of one
    address at one instant are then taken in the order the address allows (its free first while it
    is live). Without ``t`` the given order is the truth (a snapshot's trace is in record order).
    """
    n = len(addr)
    partner = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return Pairing(partner, None)
    by_addr = np.argsort(addr, kind="stable")  # stable: time order within an address
    a = addr[by_addr]  # as _order_ties leaves it: it reorders events of one address only
    same = a[1:] == a[:-1]
    alloc = is_alloc[by_addr]
    repeats = np.flatnonzero(same & (alloc[1:] == alloc[:-1])) + 1  # positions repeating the action before
    if len(repeats) and t is not None:
        _order_ties(by_addr, a, is_alloc, t[by_addr], repeats)
        alloc = is_alloc[by_addr]
        repeats = np.flatnonzero(same & (alloc[1:] == alloc[:-1])) + 1
    matched = np.flatnonzero(same & alloc[:-1] & ~alloc[1:])
    partner[by_addr[matched]] = by_addr[matched + 1]
    partner[by_addr[matched + 1]] = by_addr[matched]
    return Pairing(partner, int(by_addr[repeats].min()) if len(repeats) else None)


def _order_ties(by_addr: np.ndarray, a: np.ndarray, is_alloc: np.ndarray, tt: np.ndarray,
                repeats: np.ndarray) -> None:
    """Reorder, in place, the allocs and frees of one address at one instant: alternating, the free
    first where the address is live just before (its previous event, as reordered, is an alloc),
    else the alloc. Only the addresses with a repeat are visited, each instant in turn (a Python
    loop: they are rare); an address's first instant keeps its order (nothing says which came first).
    ``a`` and ``tt``: the addresses and times in ``by_addr`` order."""
    tie = (a[1:] == a[:-1]) & (tt[1:] == tt[:-1])  # tie[k]: positions k and k + 1 are one instant of one address
    mixed = tie & (is_alloc[by_addr[1:]] != is_alloc[by_addr[:-1]])
    starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])  # where each address's events begin
    stops = np.r_[starts[1:], len(a)]
    for j in np.unique(np.searchsorted(starts, repeats, side="right") - 1).tolist():
        begin, end = int(starts[j]), int(stops[j])
        k = begin
        while k < end - 1:
            if not mixed[k]:
                k += 1
                continue
            first, last = k, k + 1
            while first > begin and tie[first - 1]:
                first -= 1
            while last < end - 1 and tie[last]:
                last += 1
            k = last + 1
            if first == begin:
                continue
            group = by_addr[first:last + 1]
            kinds = is_alloc[group]
            allocs, frees = group[kinds].tolist(), group[~kinds].tolist()
            lead, follow = (frees, allocs) if is_alloc[by_addr[first - 1]] else (allocs, frees)
            merged = [x for pair in zip(lead, follow) for x in pair] + lead[len(follow):] + follow[len(lead):]
            by_addr[first:last + 1] = merged


def repeated_action(path: Path, column: str, allocated: bool, found: str, expected: str,
                    context: str = "") -> InputError:
    """The error for an event that repeats its address's last action (:attr:`Pairing.repeated`);
    ``context`` follows the message (the device of a trace that holds several)."""
    twice, between = ("allocated", "free") if allocated else ("freed", "alloc")
    return InputError(f"an address {twice} twice with no {between} between{context}", file=path, column=column,
                      expected=expected, found=found)


# ---- keyed events whose record may have lost some (msMemScope dumps, the Ascend .db's memory rows) -----

@dataclass(frozen=True)
class Pairs:
    """Blocks made of alloc/free events: row indices into the event arrays, -1 where absent."""

    alloc_rows: np.ndarray  # -1 = allocated before the window (a free without an alloc)
    free_rows: np.ndarray  # -1 = still live at the window's end; a reused block: the next alloc's row
    reused: int  # allocs followed by another alloc of the same key (a free the file does not show)
    repeated_frees: int  # frees right after a free of the same key (no alloc between): dropped


def pair_events(keys: Sequence[np.ndarray], t: np.ndarray, seq: np.ndarray, is_alloc: np.ndarray) -> Pairs:
    """Match every free to the latest earlier alloc with the same ``keys`` in (t, seq) order, vectorized.

    ``keys`` are parallel arrays (e.g. process, pool, address). Events of one key alternate alloc,
    free, alloc, … in a complete record; a free right after an alloc closes it, the first event of
    its key being a free is a block from before the window, an alloc not followed by anything is
    still live. A record that breaks the turn lost an event: an alloc followed by another alloc
    ends where the next one begins (one address holds one live block: counting it live on would
    put memory in the curve that was not there), and a free after a free is dropped (the memory was
    counted free already; taken as a block from before the window, it would raise every level).
    """
    n = len(t)
    if n == 0:
        empty = np.array([], dtype=np.int64)
        return Pairs(empty, empty, 0, 0)
    order = np.lexsort((seq, t, *reversed([np.asarray(k) for k in keys])))
    al = np.asarray(is_alloc, dtype=bool)[order]
    same_next = np.zeros(n, dtype=bool)
    same_next[:-1] = True
    for key in keys:
        k = np.asarray(key)[order]
        same_next[:-1] &= k[1:] == k[:-1]
    next_is_free = np.zeros(n, dtype=bool)
    next_is_free[:-1] = ~al[1:]
    ends = al & same_next  # closed by the next event of its key: its free, or (reused) the next alloc
    same_prev = np.zeros(n, dtype=bool)
    same_prev[1:] = same_next[:-1]
    prev_is_alloc = np.zeros(n, dtype=bool)
    prev_is_alloc[1:] = al[:-1]
    repeated_free = ~al & same_prev & ~prev_is_alloc
    alloc_pos = np.flatnonzero(al)
    lone_free_pos = np.flatnonzero(~al & ~same_prev)
    end_pos = np.where(ends[alloc_pos], alloc_pos + 1, 0)
    alloc_rows = np.concatenate([order[alloc_pos], np.full(len(lone_free_pos), -1)]).astype(np.int64)
    free_rows = np.concatenate([np.where(ends[alloc_pos], order[end_pos], -1), order[lone_free_pos]]).astype(np.int64)
    reused = int((al & same_next & ~next_is_free).sum())
    return Pairs(alloc_rows, free_rows, reused, int(repeated_free.sum()))


def repair_notes(pairs: Pairs, alloc: str, free: str) -> list[str]:
    """What :func:`pair_events` did with a record that lost events, for ``metadata.notes``
    (``alloc`` / ``free``: the record's names of the two events)."""
    notes = []
    if pairs.reused:
        notes.append(f"{pairs.reused} {alloc}(s) reuse a live address without a {free} in between: the earlier "
                     "block is counted as freed when the address is allocated again")
    if pairs.repeated_frees:
        notes.append(f"{pairs.repeated_frees} {free}(s) of an address already freed, with no {alloc} in between: "
                     "dropped")
    return notes


def take(values: pd.Series, rows: np.ndarray) -> pd.Series:
    """``values`` at ``rows`` (positional), NA where a row is -1; keeps the dtype."""
    picked = values.iloc[np.maximum(rows, 0)].reset_index(drop=True)
    return picked.where(pd.Series(rows >= 0))


# ---- torch's own files ----------------------------------------------------------------------------

_TORCH_DIR = re.compile(r"(^|/)(torch|torch_npu)/")


def is_torch_file(filename: str) -> bool:
    """Does ``filename`` lie under a ``torch`` / ``torch_npu`` package directory (torch's own code), or is
    it the torch function mode a memgate recording runs the user's torch calls through (never their owner)?"""
    posix = filename.replace("\\", "/")
    return _TORCH_DIR.search(posix) is not None or posix.endswith(_RECORDER_MODE)


_RECORDER_MODE = "memgate/allocation_lines.py"  # memgate.allocation_lines: its frame wraps every torch call

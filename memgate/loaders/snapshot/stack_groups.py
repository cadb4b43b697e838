"""Frames lists grouped by their content: for each list, the first list that holds the same frames.

A snapshot gives every trace entry a frames list of its own (1M of them in the benchmark's trace)
over frame dicts it shares (a few hundred distinct ones): the stacks an entry can carry are few, the
lists many. Whatever reads a stack (the op and owner of an allocation, the torch_npu scan) reads each
distinct one once, through :func:`first_equal`.

Grouping by the identities of the frames would cost a Python int per frame (20M for the benchmark).
Here whole lists are compared instead, in C (numpy's elementwise ``==`` over object arrays; a frame
shared by both lists is one pointer comparison), each against a candidate likely to be equal. Each
pass over a million lists costs ~50 ms, most of it reaching lists scattered in memory; candidates
that are few and hot in cache cost little, which is why a list is compared with the first of its
kind rather than with a neighbour.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_ROUNDS = 8  # rounds of candidates before what is left is grouped by the identities of its frames
_MIX = np.uint64(0x9E3779B97F4A7C15)
_NONE, _OTHER = -1, -2  # the length given to None (no frames) and to a value that is no list or tuple


def first_equal(lists: Sequence[Any]) -> np.ndarray:
    """For each frames list, the index of the first list equal to it (``==``: the same frames).

    None and empty lists (no frames) are one group; a tuple groups as the list of its frames; a
    value that is no list or tuple is a group of its own (:func:`~memgate.loaders.snapshot.snapshot_stacks.op_owner`
    reports the first such value). A list is compared with a candidate: the first list not yet placed
    with its length and its innermost frame (the same object). A list equal to its candidate is placed;
    the others meet the next candidate of their kind in the next round. What eight rounds leave (a
    crafted pickle: a list that holds itself, or many stacks that differ past their innermost frame)
    is grouped by the identities of its frames.

    Lists equal by ``==`` hold the same frames or equal frame dicts (the same name and filename
    strings), so whatever reads the first list gives the same answer for the others; only a ``line``
    of another type than int (1.0 or True for 1) would print as the first list's.
    """
    m = len(lists)
    rows, lens = _rows(lists)
    first = np.arange(m, dtype=np.int64)
    blank = (lens == 0) | (lens == _NONE)
    if blank.any():
        first[blank] = np.flatnonzero(blank)[0]
    todo = np.flatnonzero(lens > 0)  # blanks are placed; a value that is no list stays alone
    heads = np.fromiter(map(operator.itemgetter(0), lists if len(todo) == m else rows[todo]), dtype=object,
                        count=len(todo))
    key = lens[todo].astype(np.uint64) * _MIX + _identities(heads)
    for _ in range(_ROUNDS):  # a key only proposes (it wraps around), == decides
        if not len(todo):
            break
        candidate = todo[first_of_label(key)]  # the first of its kind still to place (itself for that one)
        try:
            same = (rows if len(todo) == m else rows[todo]) == rows[candidate]
        except RecursionError:  # a list that holds itself (only a crafted pickle): what is left goes by identity
            break
        first[todo[same]] = candidate[same]
        todo, key = todo[~same], key[~same]
    seen: dict[tuple[int, ...], int] = {}
    for i in todo.tolist():
        first[i] = seen.setdefault(tuple(map(id, rows[i])), i)
    return first


def first_equal_of_stacks(stacks: Sequence[Any], sid: np.ndarray) -> np.ndarray:
    """:func:`first_equal` of the lists ``stacks[sid[i]]`` (None where ``sid[i] < 0``), as the compiled
    snapshot reader gives a trace's frames: computed over the distinct stacks only, in the order of
    their first entry, and spread to the entries (the same answer as over the lists themselves)."""
    n = len(sid)
    if not n:
        return np.zeros(0, dtype=np.int64)
    none = len(stacks)  # no frames: one more "stack"
    keyed = np.where(sid < 0, none, sid).astype(np.intp)
    # each stack's first entry, without sorting the entries (stack ids are small: a table, not a sort)
    first_entry = np.full(none + 1, n, dtype=np.int64)
    np.minimum.at(first_entry, keyed, np.arange(n, dtype=np.int64))
    used = np.flatnonzero(first_entry < n)
    order = used[np.argsort(first_entry[used], kind="stable")]  # the stacks used, in the order of their first entry
    groups = first_equal([None if label == none else stacks[label] for label in order.tolist()])
    entry_of = np.empty(none + 1, dtype=np.int64)  # per stack: the first entry of the first stack equal to it
    entry_of[order] = first_entry[order][groups]
    return entry_of[keyed]


def _identities(objects: np.ndarray) -> np.ndarray:
    """``id()`` of each item of an object array, as uint64: CPython's ids are the addresses an object
    array holds, copied out at once (~40 % less time than an ``id()`` call and an int per item)."""
    return np.frombuffer(objects.tobytes(), dtype=np.uintp).astype(np.uint64, copy=False)


def _rows(lists: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The lists as an object array (tuples made lists: a list never equals a tuple) and their lengths
    (``_NONE`` for None, ``_OTHER`` for a value that is no list or tuple)."""
    m = len(lists)
    rows = np.fromiter(lists, dtype=object, count=m)
    try:  # torch's case, all lists: their lengths, in the one pass that proves them lists
        return rows, np.fromiter(map(list.__len__, lists), dtype=np.int64, count=m)
    except TypeError:  # None (no frames), tuples, or what op_owner will report: a value of another type
        pass
    is_seq = np.fromiter(map(isinstance, lists, repeat((list, tuple))), dtype=bool, count=m)
    lens = np.full(m, _OTHER, dtype=np.int64)
    lens[np.fromiter(map(operator.is_, lists, repeat(None)), dtype=bool, count=m)] = _NONE
    at = np.flatnonzero(is_seq)
    lens[at] = np.fromiter(map(len, rows[at]), dtype=np.int64, count=len(at))
    for i in np.flatnonzero(np.fromiter(map(isinstance, lists, repeat(tuple)), dtype=bool, count=m)).tolist():
        rows[i] = list(rows[i])
    return rows, lens


def first_of_label(labels: np.ndarray) -> np.ndarray:
    """For each position, the first position with the same label (integer labels).

    Arrow's hash table numbers the labels in order of first appearance, so a position is the first
    of its label where its number exceeds every number before it: no sort (~6x faster than one)."""
    if not len(labels):
        return np.zeros(0, dtype=np.int64)
    number = pc.dictionary_encode(pa.array(labels)).indices.to_numpy(zero_copy_only=False)
    starts = np.empty(len(number), dtype=bool)
    starts[0] = True
    np.greater(number[1:], np.maximum.accumulate(number)[:-1], out=starts[1:])
    out: np.ndarray = np.flatnonzero(starts)[number]
    return out

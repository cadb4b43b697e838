"""Pairing allocs with frees at one address (snapshot traces, Kineto [memory] events): a record that
repeats an address's last action is named, and events of one instant listed in another order
than they happened (Kineto writes an instant's events by thread) are paired as they happened.
Pairing by key (msMemScope dumps, the Ascend .db): a record that lost events is mended as stated."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memgate.loaders.events import pair_allocs, pair_events


def pairs(addr: list[int], alloc: list[bool], t: list[int] | None = None) -> tuple[list[int], int | None]:
    got = pair_allocs(np.array(addr, dtype=np.int64), np.array(alloc), None if t is None else np.array(t))
    return got.partner.tolist(), got.repeated


def test_allocs_and_frees_in_turn() -> None:
    # address 7: a free of memory from before the window, then alloc/free/alloc (live at the end)
    assert pairs([7, 7, 9, 7, 9, 7], [False, True, True, False, False, True]) == ([-1, 3, 4, 1, 2, -1], None)


def test_an_address_allocated_twice_is_named_at_the_second_alloc() -> None:
    assert pairs([7, 9, 7, 7], [True, True, True, False])[1] == 2


def test_an_address_freed_twice_is_named_at_the_second_free() -> None:
    assert pairs([7, 7, 7, 7], [True, False, False, True])[1] == 2
    assert pairs([7, 7], [False, False])[1] == 1  # two frees of memory from before the window


def test_an_instants_events_are_taken_in_the_order_the_address_allows() -> None:
    # alloc at 0; at 5 the file lists the address's next alloc before the free that made room for it
    addr, alloc, t = [7, 7, 7], [True, True, False], [0, 5, 5]
    assert pairs(addr, alloc)[1] == 1  # in file order: allocated twice
    assert pairs(addr, alloc, t) == ([2, -1, 0], None)
    # freed at 0; at 5 the free of the next alloc is listed first
    assert pairs([7, 7, 7], [True, False, True], [0, 0, 0])[1] is None
    assert pairs([7, 7, 7, 7], [True, False, False, True], [0, 2, 5, 5]) == ([1, 0, 3, 2], None)


def test_an_addresss_first_instant_keeps_its_order() -> None:
    # a free of earlier memory then an alloc, or an alloc and its free: both are consistent
    assert pairs([7, 7], [False, True], [5, 5]) == ([-1, -1], None)
    assert pairs([7, 7], [True, False], [5, 5]) == ([1, 0], None)


def test_what_cannot_be_put_in_turn_is_still_named() -> None:
    assert pairs([7, 7, 7], [True, True, True], [0, 5, 5])[1] == 1


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[int], list[bool], list[int], list[tuple[int, int]], int, int]:
    """Events of a few addresses, each alternating from an alloc, at times that often coincide; listed
    by time with each instant's events of an address shuffled (but an address's first instant)."""
    events: list[tuple[int, int, bool, int]] = []  # (t, addr, is_alloc, rank in the true order)
    truth: list[tuple[int, int]] = []
    open_allocs = 0
    for a in range(draw(st.integers(1, 4))):
        n = draw(st.integers(1, 12))
        steps = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
        times = np.cumsum(steps).tolist()
        times = [times[0] + 1] + [x + 1 for x in times[1:]]  # t >= 1
        for k, when in enumerate(times):
            events.append((when, a, k % 2 == 0, k))
        truth += [(times[k], times[k + 1]) for k in range(0, n - 1, 2)]
        open_allocs += n % 2
    events.sort(key=lambda e: (e[0], e[1], e[3]))
    first_t = {a: min(e[0] for e in events if e[1] == a) for a in {e[1] for e in events}}
    groups: dict[tuple[int, int], list[tuple[int, int, bool, int]]] = {}
    for e in events:
        groups.setdefault((e[0], e[1]), []).append(e)
    listed = []
    for (when, a), group in sorted(groups.items()):
        if when != first_t[a]:
            group = draw(st.permutations(group))
        listed += group
    return ([e[1] for e in listed], [e[2] for e in listed], [e[0] for e in listed], sorted(truth), open_allocs, 0)


@settings(max_examples=300, deadline=None)
@given(histories())
def test_shuffled_instants_pair_as_they_happened(history: tuple[list[int], list[bool], list[int],
                                                                list[tuple[int, int]], int, int]) -> None:
    addr, alloc, t, truth, open_allocs, _ = history
    partner, repeated = pairs(addr, alloc, t)
    assert repeated is None
    got = sorted((t[i], t[j]) for i, j in enumerate(partner) if alloc[i] and j >= 0)
    assert got == truth
    assert sum(1 for i, j in enumerate(partner) if alloc[i] and j < 0) == open_allocs
    assert all(j >= 0 for i, j in enumerate(partner) if not alloc[i])  # every free has its alloc


def test_pair_events_in_time_order_with_reuse_and_window_edges() -> None:
    # one address: a free from before the window, then alloc/free, alloc/free reusing it, an open alloc;
    # rows shuffled as in the file
    t = np.array([50, 10, 40, 30, 20, 5, 60])
    is_alloc = np.array([True, True, False, True, False, False, True])
    key = np.array([0, 0, 0, 0, 0, 0, 1])
    pairs = pair_events([key], t, np.arange(7), is_alloc)
    got = sorted(zip(pairs.alloc_rows.tolist(), pairs.free_rows.tolist()))
    assert got == [(-1, 5), (0, -1), (1, 4), (3, 2), (6, -1)]
    assert pairs.reused == 0
    # an alloc of a live address: the earlier block ends where the next begins (never two live at once)
    twice = pair_events([np.array([0, 0])], np.array([1, 2]), np.array([0, 1]), np.array([True, True]))
    assert twice.reused == 1 and sorted(zip(twice.alloc_rows.tolist(), twice.free_rows.tolist())) == [(0, 1), (1, -1)]
    # a free of a freed address is dropped, not taken for a block from before the window
    freed = pair_events([np.zeros(4, dtype=np.int64)], np.array([1, 2, 3, 4]), np.arange(4),
                        np.array([False, False, True, False]))
    assert freed.repeated_frees == 1 and sorted(zip(freed.alloc_rows.tolist(), freed.free_rows.tolist())) == [
        (-1, 0), (2, 3)]

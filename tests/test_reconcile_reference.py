"""Reconciliation's vectorized paths against plain-Python statements of their definitions.

The sum check (a total series against the sum of its parts at each instant) and the block curve
with its baseline estimates are computed with sorted searches, suffixes and an inverted sort order;
the references below walk the rows one by one, as docs/design.md states the definitions. Random series
carry null values, repeated timestamps, parts that start late or hold only nulls; random blocks carry
missing totals, pre-window and open blocks and time ties between frees and allocations.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memgate import reconcile as rc
from memgate.model import DeviceModel, Series
from memgate.table import Ints, Table, Texts

_TIMES = st.integers(0, 12)
_VALUES = st.one_of(st.none(), st.integers(0, 6))


@st.composite
def _series_rows(draw: st.DrawFn, min_size: int = 0) -> list[tuple[int | None, int | None]]:
    rows = draw(st.lists(st.tuples(st.one_of(_TIMES, st.none()), _VALUES), min_size=min_size, max_size=14))
    return sorted(rows, key=lambda r: (r[0] is None, r[0] if r[0] is not None else 0))  # a series is time-ordered


def _series(name: str, rows: list[tuple[int | None, int | None]]) -> Series:
    n = len(rows)
    times = Ints.of(np.array([t or 0 for t, _ in rows], dtype=np.int64), np.array([t is None for t, _ in rows]))
    allocated = Ints.of(np.array([v or 0 for _, v in rows], dtype=np.int64), np.array([v is None for _, v in rows]))
    frame = Table({"t_ns": times, "allocated": allocated, "reserved": Ints.absent(n), "active": Ints.absent(n)})
    return Series(name, frame, "test")


def _sum_check_reference(total: list[tuple[int | None, int | None]],
                         parts: list[list[tuple[int | None, int | None]]]) -> float | None:
    timed = [(t, v) for t, v in total if t is not None]
    if not timed:
        return None
    instants = sorted({t for t, _ in timed})
    agree = 0
    for instant in instants:
        values = [v for t, v in timed if t == instant and v is not None]
        total_value = values[-1] if values else math.nan
        expected, seen = 0.0, False
        for rows in parts:
            before = [(t, v) for t, v in rows if t is not None and t <= instant]
            if before:
                seen = True
            known = [v for _, v in before if v is not None]
            if known:
                expected += known[-1]
        agree += (expected if seen else math.nan) == total_value
    return agree / len(instants)


@settings(max_examples=300, deadline=None)
@given(total=_series_rows(), pta=st.one_of(st.none(), _series_rows()), ge=st.one_of(st.none(), _series_rows()))
def test_sum_check_matches_its_definition(total, pta, ge) -> None:
    series = {"PTA+GE": _series("PTA+GE", total)}
    parts = []
    for name, rows in (("PTA", pta), ("GE", ge)):
        if rows is not None:
            series[name] = _series(name, rows)
            parts.append(rows)
    device = DeviceModel(device="npu:0", series=series, blocks=Table.empty(("size",)), blocks_source=None,
                         sum_components={"PTA+GE": ("PTA", "GE")})
    got = rc._sum_check(device, "PTA+GE", ("PTA", "GE"))
    expected = _sum_check_reference(total, parts) if parts else None
    assert got == expected


_BLOCK = st.tuples(st.integers(1, 5),  # size
                   st.one_of(st.none(), st.integers(0, 9)),  # t_alloc (None: allocated before the window)
                   st.one_of(st.none(), st.integers(0, 9)),  # t_free (None: still live)
                   st.one_of(st.none(), st.integers(0, 30)))  # recorded total at allocation


def _blocks_reference(blocks: list[tuple[int, int | None, int | None, int | None]]):
    start_live = sum(size for size, t_alloc, _, _ in blocks if t_alloc is None)
    events = []  # (time, kind: frees first, file row, signed size)
    for row, (size, t_alloc, t_free, _) in enumerate(blocks):
        if t_free is not None:
            events.append((t_free, 0, row, -size))
        if t_alloc is not None:
            events.append((t_alloc, 1, row, size))
    events.sort()
    running, curve, estimates = start_live, [], []
    for time, kind, row, delta in events:
        running += delta
        curve.append((time, running))
        recorded = blocks[row][3]
        if kind == 1 and recorded is not None:
            estimates.append(recorded - running)
    baseline, agreeing = 0, 0
    if estimates:
        counts = Counter(estimates)
        agreeing = max(counts.values())
        baseline = min(v for v, c in counts.items() if c == agreeing)
    return start_live, curve, estimates, baseline, agreeing


@settings(max_examples=300, deadline=None)
@given(blocks=st.lists(_BLOCK, max_size=16).map(
    lambda rows: [(s, a, f if f is None or a is None else max(f, a), r) for s, a, f, r in rows]))
def test_block_curve_and_baseline_match_their_definition(blocks) -> None:
    def ints(values: list[int | None]) -> Ints:
        return Ints.of(np.array([v or 0 for v in values], dtype=np.int64), np.array([v is None for v in values]))

    table = Table({"size": ints([b[0] for b in blocks]), "t_alloc": ints([b[1] for b in blocks]),
                   "t_free": ints([b[2] for b in blocks]), "alloc_total": ints([b[3] for b in blocks]),
                   "component": Texts.repeat("PTA", len(blocks))})
    facts, curve = rc._reconcile_blocks("PTA", rc._BlockArrays.of(table))
    start_live, events, estimates, baseline, agreeing = _blocks_reference(blocks)
    assert facts.checked_blocks == len(estimates)
    assert facts.baseline_bytes == baseline
    assert facts.consistency == (agreeing / len(estimates) if estimates else None)
    assert curve.start == start_live + baseline
    assert curve.t_ns.tolist() == [t for t, _ in events]
    assert curve.allocated.tolist() == [v + baseline for _, v in events]

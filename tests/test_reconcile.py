"""memgate.reconcile: a device's blocks against the allocator totals written beside them.

Its vectorized paths are checked against plain-Python statements of their definitions. The sum check
(a total series against the sum of its parts at each instant) and the block curve with its baseline
estimates are computed with sorted searches, suffixes and an inverted sort order; the references below
walk the rows one by one, as docs/design.md states the definitions. Random series carry null values,
repeated timestamps, parts that start late or hold only nulls; random blocks carry missing totals,
pre-window and open blocks and time ties between frees and allocations. The event order, a component
read through a mask and the baseline's mode are checked against lexsort, a copy and np.unique.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from memgate import reconcile as rc
from memgate.model import BLOCK_COLUMNS, DeviceModel, Series, typed_blocks
from memgate.reconcile import DeviceFacts, _BlockArrays, _mode, _reconcile_blocks, reconcile
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


# ---- reconcile(): a device's components, their curves and the series beside them ---------------------


def _device(series_source: str) -> DeviceModel:
    rows = [  # size, t_alloc (None: before the window), t_free (None: still live), component, recorded total
        (100, None, 30, "PTA", None),
        (10, 10, 20, "PTA", 1110),  # 1000 B the blocks do not account for: the baseline
        (20, 15, None, "PTA", 1130),
        (5, 12, None, "GE", 7),
    ]
    frame = pd.DataFrame({"size": [r[0] for r in rows], "t_alloc": pd.array([r[1] for r in rows], dtype="Int64"),
                          "t_free": pd.array([r[2] for r in rows], dtype="Int64"), "op": None, "stream": None,
                          "owner": None, "component": [r[3] for r in rows],
                          "alloc_total": pd.array([r[4] for r in rows], dtype="Int64")})
    series = Table.from_pandas(pd.DataFrame({"t_ns": [5, 10, 15, 40], "allocated": [1100, 1110, 1130, 1030],
                                             "reserved": [2000] * 4, "active": [None] * 4}).astype("Int64"))
    return DeviceModel("npu:0", series={"PTA": Series("PTA", series, series_source)},
                       blocks=typed_blocks(frame[list(BLOCK_COLUMNS)]), blocks_source="operator_memory.csv")


def test_reconcile_gives_each_component_its_baseline_curve_and_consistency() -> None:
    facts = reconcile(_device("memory_record.csv"))
    pta, ge = facts.components["PTA"], facts.components["GE"]
    assert (pta.blocks, pta.pre_window_blocks, pta.open_blocks, pta.baseline_bytes, pta.checked_blocks,
            pta.consistency) == (3, 1, 1, 1000, 2, 1.0)
    assert (ge.blocks, ge.baseline_bytes, ge.checked_blocks) == (1, 2, 1)
    curve = facts.curves["PTA"]
    assert curve.start == 1100  # the baseline and the block live before the window
    assert (curve.t_ns.tolist(), curve.allocated.tolist()) == ([10, 15, 20, 30], [1110, 1130, 1120, 1020])
    # the blocks against the PTA series of another file: inside its window, every recorded total a sample of it
    consistency = facts.consistency["PTA"]
    assert (consistency.window_overlap, consistency.checked_blocks, consistency.agreeing_blocks,
            consistency.agreement) == (1.0, 2, 2, 1.0)
    assert "GE" not in facts.consistency  # no GE series to compare with
    again = DeviceFacts.from_json(facts.as_json())
    assert again.as_json() == facts.as_json() and again.curves == {}  # the curves are not kept


def test_a_series_read_from_the_blocks_own_file_is_not_compared_with_them() -> None:
    assert reconcile(_device("operator_memory.csv")).consistency == {}  # it agrees by construction


# ---- the event order, a component's mask and the baseline's mode --------------------------------------


BLOCKS = st.lists(st.tuples(st.integers(1, 50), st.one_of(st.none(), st.integers(0, 12)), st.integers(0, 12),
                            st.booleans(), st.one_of(st.none(), st.integers(0, 200))), max_size=50)


def block_arrays(blocks: list[tuple]) -> _BlockArrays:
    """BLOCKS as reconcile's columns: (size, t_alloc or None, t_free, freed, recorded total or None)."""
    size = np.array([b[0] for b in blocks], dtype=np.int64)
    pre = np.array([b[1] is None for b in blocks], dtype=bool)
    t_alloc = np.array([b[1] or 0 for b in blocks], dtype=np.int64)
    t_free = np.maximum(t_alloc, [b[2] for b in blocks]).astype(np.int64) if blocks else np.zeros(0, np.int64)
    freed = np.array([b[3] or p for b, p in zip(blocks, pre)], dtype=bool)
    total = np.array([-1 if b[4] is None else b[4] for b in blocks], dtype=np.int64)
    return _BlockArrays(size, t_alloc, pre, t_free, freed, total)


@given(blocks=BLOCKS)
def test_event_order_is_time_then_frees_then_file_order(blocks: list[tuple]) -> None:
    """The curve equals the one built with an explicit lexsort over (time, kind, row)."""
    size, t_alloc, pre, t_free, freed, _, _ = arrays = block_arrays(blocks)
    _, curve = _reconcile_blocks("PTA", arrays)
    free_idx, alloc_idx = np.flatnonzero(freed), np.flatnonzero(~pre)
    times = np.concatenate([t_free[free_idx], t_alloc[alloc_idx]])
    kinds = np.concatenate([np.zeros(len(free_idx)), np.ones(len(alloc_idx))])
    rows = np.concatenate([free_idx, alloc_idx])
    order = np.lexsort((rows, kinds, times))
    deltas = np.concatenate([-size[free_idx], size[alloc_idx]])[order]
    assert curve.t_ns.tolist() == times[order].tolist()
    assert (curve.allocated - curve.start).tolist() == np.cumsum(deltas).tolist()


@given(blocks=BLOCKS, picks=st.lists(st.booleans(), min_size=50, max_size=50))
def test_a_components_blocks_reconcile_as_if_they_were_alone(blocks: list[tuple], picks: list[bool]) -> None:
    """reconcile reads a component's blocks through a mask over the whole table's columns (no copy):
    its facts and curve equal those of its blocks copied out."""
    whole = block_arrays(blocks)
    member = np.array(picks[:len(blocks)], dtype=bool)
    masked_facts, masked = _reconcile_blocks("PTA", whole._replace(member=member))
    alone_facts, alone = _reconcile_blocks("PTA", _BlockArrays(*(column[member] for column in whole[:6])))
    assert masked_facts == alone_facts
    assert (masked.t_ns.tolist(), masked.allocated.tolist(), masked.start) == (
        alone.t_ns.tolist(), alone.allocated.tolist(), alone.start)


@given(st.lists(st.integers(-3, 3), min_size=1, max_size=300), st.integers(0, 10_000))
def test_mode_is_np_unique_argmax(values: list[int], majority: int) -> None:
    """Majorities (the sampled shortcut) and ties (the full count) alike."""
    array = np.array(values + [2] * min(majority, 3 * len(values)), dtype=np.int64)
    uniques, counts = np.unique(array, return_counts=True)
    assert _mode(array) == (int(uniques[np.argmax(counts)]), int(counts.max()))


def test_the_reports_say_how_far_the_blocks_file_agrees_with_the_series_file() -> None:
    """The blocks' agreement with their own baseline cannot show that two files tell of different allocations
    (a real MindStudio fixture: GE blocks 100% self-consistent, none inside memory_record.csv's GE window): the
    text and HTML reports state the cross-file figure too, and doubt it where it is low."""
    from helpers import PTA271, run_cli

    result = run_cli(["inspect", PTA271])
    assert result.rc == 0, result.stderr
    assert "    PTA blocks against the PTA series of memory_record.csv: windows overlap 100.0%, 3103 of 3103 blocks' " \
           "totals found in it\n" in result.stdout
    apart = {"series_source": "/p/ASCEND_PROFILER_OUTPUT/memory_record.csv", "blocks_source": "operator_memory.csv",
             "window_overlap": 0.0, "checked_blocks": 28, "agreeing_blocks": 0, "agreement": 0.0}
    assert rc.series_consistency_sentence("GE", apart) == (
        "GE blocks against the GE series of memory_record.csv: windows overlap 0.0%, 0 of 28 blocks' totals found in "
        "it (from different windows or runs?)")
    untimed = {**apart, "window_overlap": None, "checked_blocks": 0, "agreeing_blocks": 0, "agreement": None}
    assert rc.series_consistency_sentence("PTA", untimed) == \
        "PTA blocks against the PTA series of memory_record.csv: no times to compare"

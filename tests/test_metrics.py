"""memgate.metrics' building blocks on hand-made tables: the blocks live at a moment and their bytes per
operator and owner, the largest holders, each operator's largest block, step floors and the step of a
moment, and the persistent growth per step (against the plain definition in tests/groundtruth.py).

The metrics of whole profiles are checked against each format's ground truth in the loaders' suites."""

from __future__ import annotations

import groundtruth
import numpy as np
import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from memgate.metrics import (
    OTHER,
    bytes_at,
    live_rows,
    op_max_block_bytes,
    persistent_growth,
    step_at,
    step_floors,
    top_at,
)
from memgate.model import BLOCK_COLUMNS, typed_blocks
from memgate.table import Table

# ---- the blocks at a moment ----------------------------------------------------------------------------


def _blocks(rows: list[tuple[int, int | None, int | None, str | None, str | None, str | None]]) -> Table:
    frame = pd.DataFrame({
        "size": pd.array([r[0] for r in rows], dtype="Int64"),
        "t_alloc": pd.array([r[1] for r in rows], dtype="Int64"),
        "t_free": pd.array([r[2] for r in rows], dtype="Int64"),
        "op": pd.array([r[3] for r in rows], dtype="string"),
        "stream": pd.array([None] * len(rows), dtype="string"),
        "owner": pd.array([r[4] for r in rows], dtype="string"),
        "component": pd.array([r[5] for r in rows], dtype="string"),
        "alloc_total": pd.array([None] * len(rows), dtype="Int64"),
    })
    return typed_blocks(frame[list(BLOCK_COLUMNS)])


def test_bytes_at_liveness_components_and_unnamed() -> None:
    blocks = _blocks([
        (10, 5, None, "a", "X", "PTA"),  # allocated at the moment: live
        (20, None, 6, "a", "X", "PTA"),  # before the window, freed after: live
        (40, 6, None, "b", "Y", "PTA"),  # allocated after: not live
        (80, 1, 5, "b", "Y", "PTA"),  # freed at the moment: not live
        (160, 1, None, "b", None, None),  # no component: counted; no owner: not named
        (320, 1, None, "c", "Z", "GE"),  # another component: filtered out
    ])
    assert bytes_at(blocks, live_rows(blocks, 5, ("PTA",)), "owner") == {"X": 30}
    assert bytes_at(blocks, live_rows(blocks, 5, ("PTA",)), "op") == {"b": 160, "a": 30}
    assert bytes_at(blocks, live_rows(blocks, 5, ()), "owner") == {"Z": 320, "X": 30}
    none = blocks.take(np.zeros(0, dtype=np.int64))
    assert bytes_at(none, live_rows(none, 5, ()), "owner") == {}


def test_bytes_at_top_n_and_other() -> None:
    # owners o0..o11 hold 100+k bytes; two of them hold the same (ties by name)
    rows: list[tuple[int, int | None, int | None, str | None, str | None, str | None]] = [
        (100 + k, 0, None, None, f"o{k:02d}", None) for k in range(12)]
    rows.append((111, 0, None, None, "o00", None))  # o00: 100 + 111 = 211, the largest
    result = bytes_at(_blocks(rows), live_rows(_blocks(rows), 0, ()), "owner")
    assert list(result) == ["o00", "o11", "o10", "o09", "o08", "o07", "o06", "o05", "o04", "o03", OTHER]
    assert result["o00"] == 211 and result[OTHER] == 101 + 102
    only_ten = bytes_at(_blocks(rows[:10]), live_rows(_blocks(rows[:10]), 0, ()), "owner")
    assert OTHER not in only_ten and len(only_ten) == 10


def test_op_max_block_bytes_counts_blocks_allocated_in_the_window_with_an_operator() -> None:
    blocks = _blocks([
        (10, 5, None, "aten::mm", None, "PTA"),
        (30, 6, 9, "aten::mm", None, "PTA"),  # freed again: still the largest it allocated
        (99, None, 3, "pre", None, "PTA"),  # allocated before the window: not this window's operator
        (7, 2, None, "", None, "PTA"),  # an empty name is no operator
        (5, 1, None, None, None, None),
        (4, 4, None, "cann::x", None, "GE"),
    ])
    assert op_max_block_bytes(blocks) == {"aten::mm": 30, "cann::x": 4}


def test_top_at_lists_the_largest_live_blocks_first() -> None:
    blocks = _blocks([(10, 5, None, "aten::mm", None, "PTA"), (30, 6, 9, "aten::add", "enc", "PTA"),
                      (99, None, 3, "pre", None, "PTA"), (4, 4, None, "cann::x", None, "GE")])
    top = top_at(blocks, live_rows(blocks, 6, ()), 2)
    assert top == [{"size": 30, "op": "aten::add", "stream": None, "owner": "enc", "t_alloc": 6, "component": "PTA"},
                   {"size": 10, "op": "aten::mm", "stream": None, "owner": None, "t_alloc": 5, "component": "PTA"}]
    assert top_at(blocks, live_rows(blocks, 100, ("XX",)), 2) == []


# ---- steps ---------------------------------------------------------------------------------------------


def _steps(*rows: tuple[int, int | None, int | None]) -> Table:
    return Table.from_pandas(pd.DataFrame(rows, columns=["step", "t_start", "t_end"]).astype("Int64"))


def test_a_steps_floor_counts_the_level_it_starts_at_and_the_last_row_of_each_instant() -> None:
    times = np.array([0, 5, 5, 12, 18, 25], dtype=np.int64)
    allocated = np.array([100, 50, 300, 80, 90, 40], dtype=np.int64)  # at 5: 50 then 300, the level is 300
    floors, sampled = step_floors(_steps((1, 0, 10), (2, 10, 20), (3, 30, 40)), times, allocated)
    assert floors.tolist() == [100, 80, 40]  # step 3 holds no sample: it starts at the level of 25
    assert sampled.tolist() == [True, True, True]
    floors, sampled = step_floors(_steps((0, -10, -5)), times, allocated)
    assert sampled.tolist() == [False]  # nothing in or before it: no floor


def test_the_step_of_a_moment() -> None:
    steps = _steps((1, 0, 10), (2, 10, 20), (3, None, None))
    assert [step_at(steps, t) for t in (None, -1, 0, 5, 10, 15, 20, 21)] == [None, None, 1, 1, 1, 2, 2, None]


# ---- persistent growth ---------------------------------------------------------------------------------


@given(st.lists(st.integers(0, 1 << 40), min_size=5, max_size=400))
def test_persistent_growth_matches_the_plain_definition(floors: list[int]) -> None:
    """The vectorized suffix minimum and run minimum against plain loops over the definition."""
    assert persistent_growth(np.array(floors, dtype=np.int64)) == groundtruth.persistent_growth(floors)


def test_persistent_growth_of_ten_thousand_steps_is_exact() -> None:
    floors = np.arange(10_000, dtype=np.int64) * 300_007 + (np.arange(10_000) % 7) * 1_000
    assert persistent_growth(floors) == groundtruth.persistent_growth(floors.tolist())


def test_persistent_growth_drops_what_is_freed_later_and_one_time_jumps() -> None:
    assert persistent_growth(np.array([0, 100, 200, 300, 400], dtype=np.int64)) == 100  # a leak each step
    assert persistent_growth(np.array([0, 500, 0, 500, 0], dtype=np.int64)) == 0  # held a while, then freed
    assert persistent_growth(np.array([0, 0, 1000, 1000, 1000, 1000, 1000], dtype=np.int64)) == 0  # filled once

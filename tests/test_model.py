"""memgate.model: the normalized profile every loader fills. Steps a writer recorded are distinct and one
after another, byte counts stay inside the range int64 sums can hold, memory_record's rows split into one
time-ordered series per (device, component) as a pandas groupby would, and a profile's info travels as JSON."""

from __future__ import annotations

import json
from itertools import pairwise

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers import PTA271
from hypothesis import given
from hypothesis import strategies as st

from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.model import (
    SERIES_COLUMNS,
    DeviceModel,
    Profile,
    ProfileInfo,
    check_byte_ranges,
    check_bytes,
    check_steps,
    split_series,
    step_number,
    typed_blocks,
)
from memgate.readers import convert
from memgate.report import profile_entry
from memgate.table import Table

# ---- steps ---------------------------------------------------------------------------------------------


def steps(*rows: tuple[int, int | None, int | None]) -> Table:
    return Table.from_pandas(pd.DataFrame(rows, columns=["step", "t_start", "t_end"]).astype("Int64"))


def test_steps_one_after_another_pass() -> None:
    check_steps(steps((1, 0, 10), (2, 10, 20), (3, 25, 30)), "f")  # touching is fine
    check_steps(steps((3, 25, 30), (1, 0, 10), (2, 10, 20)), "f")  # in any row order
    check_steps(steps((1, None, None), (2, None, None)), "f")  # numbers without times
    check_steps(steps((1, 0, 0), (2, 0, 0)), "f")  # two empty steps at one instant do not overlap
    check_steps(steps((7, 5, 9)), "f")
    check_steps(steps(), "f")


def test_a_repeated_step_names_both() -> None:
    with pytest.raises(InputError) as info:
        check_steps(steps((1, 0, 10), (2, 10, 20), (1, 30, 40)), "trace.json", column="ProfilerStep",
                    where=["[3]", "[9]", "[12]"])
    err = info.value
    assert (err.file, err.column, err.message) == ("trace.json", "ProfilerStep", "step 1 appears twice")
    assert (err.expected, err.found) == ("each step once", "step 1 ([3]) and again ([12])")
    with pytest.raises(InputError, match="step 4 appears twice"):
        check_steps(steps((4, None, None), (4, None, None)), "f")


@pytest.mark.parametrize(("rows", "message", "found"), [
    (((1, 0, 10), (2, 9, 20)), "steps 1 and 2 overlap", "step 1 0..10 ns, step 2 9..20 ns"),
    (((2, 9, 20), (1, 0, 10)), "steps 1 and 2 overlap", "step 1 0..10 ns, step 2 9..20 ns"),
    (((1, 0, 100), (2, 10, 20), (3, 30, 40)), "steps 1 and 2 overlap", "step 1 0..100 ns, step 2 10..20 ns"),
    (((1, 0, 10), (2, 10, 20), (3, 15, 15)), "steps 2 and 3 overlap", "step 2 10..20 ns, step 3 15..15 ns"),
])
def test_overlapping_steps_name_both(rows: tuple[tuple[int, int, int], ...], message: str, found: str) -> None:
    with pytest.raises(InputError) as info:
        check_steps(steps(*rows), "f")
    assert (info.value.message, info.value.found) == (message, found)


def test_a_step_number_past_int64_is_refused() -> None:
    assert step_number("9223372036854775807", "t.json", "name") == 2**63 - 1
    with pytest.raises(InputError) as info:
        step_number("9223372036854775808", "t.json", "name")
    assert info.value.one_line() == ("t.json: column 'name': step number out of range; expected a step number up to "
                                     "9223372036854775807, found '9223372036854775808'")
    with pytest.raises(InputError) as info:
        step_number("9" * 5000, "t.json", "name")  # never turned into an int of thousands of digits
    assert info.value.found == "9" * 30 + "..."


# ---- byte counts ---------------------------------------------------------------------------------------


def test_byte_counts_past_2_56_are_refused_and_sums_past_2_62() -> None:
    check_bytes(np.array([1 << 56, -(1 << 56)], dtype=np.int64), "f", "c")  # at the bound: fine
    check_bytes(np.array([], dtype=np.int64), "f", "c", summed=True)
    for value in ((1 << 56) + 1, -(1 << 56) - 1):
        with pytest.raises(InputError) as info:
            check_bytes(np.array([5, value], dtype=np.int64), "f", "c")
        assert info.value.one_line() == ("f: column 'c': byte count out of range; expected a byte count within "
                                         f"2**56 (64 PiB) of 0, found '{value}'")
    many = np.full(200, 1 << 55, dtype=np.int64)  # each in range; 200 of them add up past 2**62
    check_bytes(many, "f", "c")  # not summed: fine
    with pytest.raises(InputError, match="they add up past int64") as info:
        check_bytes(many, "f", "c", summed=True)
    assert info.value.found == "200 counts summing to 7.21e+18 bytes"


def test_block_sizes_summing_past_int64_are_refused_before_any_curve() -> None:
    # every size in range, 600 of 2**53 sum past 2**62: the curves would wrap
    n = 600
    blocks = typed_blocks(pd.DataFrame({"size": np.full(n, 2**53), "t_alloc": np.arange(n), "t_free": None,
                                        "op": None, "stream": None, "owner": None, "component": "PTA",
                                        "alloc_total": None}))
    profile = Profile(path="p", format="test", rank="0", devices=(DeviceModel("npu:0", blocks=blocks),))
    with pytest.raises(InputError) as info:
        check_byte_ranges(profile)
    assert (info.value.message, info.value.column) == ("byte counts out of range: they add up past int64",
                                                       "npu:0 block sizes")


# ---- memory_record's split into series, against pandas --------------------------------------------------

ROWS = st.lists(st.tuples(st.sampled_from(["npu:0", "npu:1"]), st.sampled_from(["APP", "PTA", "GE"]),
                          st.one_of(st.none(), st.integers(0, 20)), st.one_of(st.none(), st.integers(0, 9))),
                max_size=60)


@given(rows=ROWS)
def test_split_series_is_groupby_then_stable_time_sort(rows: list[tuple]) -> None:
    got = split_series(_record_frame(rows))
    want = _groupby_then_time_sort(rows)
    assert [(d, c) for d, c, _ in got] == [(d, c) for d, c, _ in want]
    for (_, _, g), (_, _, w) in zip(got, want):
        pd.testing.assert_frame_equal(g.to_pandas(), w.astype("Int64"))


def _record_frame(rows: list[tuple]) -> pd.DataFrame:
    """(device, component, t_ns, value) rows as memory_record's columns; active numbers the rows."""
    return pd.DataFrame({"device": pd.Series([r[0] for r in rows], dtype="string"),
                         "component": pd.Series([r[1] for r in rows], dtype="string"),
                         "t_ns": pd.array([r[2] for r in rows], dtype="Int64"),
                         "allocated": pd.array([r[3] for r in rows], dtype="Int64"),
                         "reserved": pd.array([r[3] for r in rows], dtype="Int64"),
                         "active": pd.array(list(range(len(rows))), dtype="Int64")})


def _groupby_then_time_sort(rows: list[tuple]) -> list[tuple[str, str, pd.DataFrame]]:
    frame = _record_frame(rows)
    return [(str(d), str(c), g[list(SERIES_COLUMNS)].sort_values("t_ns", kind="stable").reset_index(drop=True))
            for (d, c), g in frame.groupby(["device", "component"], sort=True)]


MANY_ROWS = st.lists(st.tuples(st.sampled_from([f"npu:{i}" for i in range(8)] + [None]),
                               st.sampled_from(["APP", "PTA", "GE", None]),
                               st.one_of(st.none(), st.integers(0, 20)), st.one_of(st.none(), st.integers(0, 9))),
                     max_size=80)


@given(rows=st.one_of(ROWS, MANY_ROWS), cuts=st.lists(st.integers(0, 80), max_size=6))
def test_split_of_arrow_chunks_is_groupby_then_stable_time_sort(rows: list[tuple], cuts: list[int]) -> None:
    """memory_record's split: dictionary chunks (each with its own dictionary) and int64 chunks with
    nulls, cut anywhere; 24 pairs take the sorting path, a few the comparison path."""
    from memgate.loaders.ascend.torch_npu import _pair_codes
    from memgate.model import split_chunks

    bounds = sorted({0, len(rows), *(c for c in cuts if c < len(rows))})
    spans = list(pairwise(bounds)) or [(0, 0)]

    def chunked(values: list, text: bool) -> pa.ChunkedArray:
        if text:
            return pa.chunked_array([pc.dictionary_encode(pa.array(values[a:b], type=pa.string())) for a, b in spans])
        return pa.chunked_array([pa.array(values[a:b], type=pa.int64()) for a, b in spans])

    columns = {"t_ns": [r[2] for r in rows], "allocated": [r[3] for r in rows], "reserved": [r[3] for r in rows],
               "active": list(range(len(rows)))}
    pairs, names = _pair_codes(chunked([r[0] for r in rows], True), chunked([r[1] for r in rows], True))
    got = split_chunks(pairs, names, lambda c: convert.int64_chunks(chunked(columns[c], False)))
    want = _groupby_then_time_sort(rows)
    assert [(d, c) for d, c, _ in got] == [(d, c) for d, c, _ in want]
    for (_, _, g), (_, _, w) in zip(got, want):
        pd.testing.assert_frame_equal(g.to_pandas(), w.astype("Int64"))


# ---- the profile's info --------------------------------------------------------------------------------


def test_profile_info_round_trips_through_json() -> None:
    profile = load(next(iter(discover(PTA271))))
    info = ProfileInfo.of(profile)
    assert ProfileInfo.from_json(json.loads(json.dumps(info.as_json()))) == info
    assert profile_entry(info, [])["steps"] == list(info.steps)

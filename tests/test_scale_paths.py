"""The paths that make big inputs cheap give the same answers as the plain ones:

- a warm run reads metric results back from the cache without loading the profile's frames;
- CSV files are streamed in blocks: errors in any block name the file's line, results do not
  depend on the block size;
- split_series, the block reconciliation and the baseline's mode agree with the pandas / lexsort /
  np.unique formulations.
"""

from __future__ import annotations

import json
import shutil
from itertools import pairwise
from pathlib import Path

import groundtruth
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from helpers import PTA21_L1, PTA271, SAMPLES
from hypothesis import given
from hypothesis import strategies as st

from memgate.cache import ProfileCache, open_profile
from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.metrics import MetricOptions, persistent_growth, profile_metrics
from memgate.model import SERIES_COLUMNS, ProfileInfo, split_series
from memgate.readers import convert, csvtable
from memgate.reconcile import _BlockArrays, _mode, _reconcile_blocks
from memgate.report import profile_entry
from memgate.session import process_profile

KINETO = SAMPLES / "torch" / "cpu_train_leak_profile_memory.json"
SNAPSHOT = SAMPLES / "torch" / "snapshot_newest_compile_context_windows_decomfl.pickle"


# ---- metric results in the cache ------------------------------------------------------------------


@pytest.mark.parametrize("path", [PTA271, KINETO, SNAPSHOT], ids=lambda p: p.name)
def test_warm_run_judges_from_stored_results_without_loading(path: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (found,) = discover(path)
    cache = ProfileCache(tmp_path / "cache")
    cold = process_profile(found, cache=cache)
    assert cold.error is None
    plain = process_profile(found)
    assert cold.entry == plain.entry
    # the second run must not load anything: every loader now fails
    monkeypatch.setattr("memgate.cache.load", lambda f: pytest.fail("loaded the profile on a warm run"))
    monkeypatch.setattr("memgate.cache._deserialize", lambda *a: pytest.fail("read the frames on a warm run"))
    warm = process_profile(found, cache=cache)
    assert warm.entry == plain.entry
    assert json.dumps(warm.entry) == json.dumps(plain.entry)


def test_missing_result_loads_the_frames_once(tmp_path: Path) -> None:
    (found,) = discover(PTA21_L1)
    cache = ProfileCache(tmp_path / "cache")
    open_profile(found, cache).get()
    warm = open_profile(found, cache)
    assert warm.get() is not None and warm._profile is None  # from the store
    other = warm.get(MetricOptions(warmup_steps=0))  # another warmup: not stored yet, computed from the cached frames
    assert warm._profile is not None
    assert [m.as_json() for m in other] == [m.as_json() for m in profile_metrics(load(found), MetricOptions(warmup_steps=0))]


def test_corrupt_result_file_is_recomputed(tmp_path: Path) -> None:
    (found,) = discover(PTA21_L1)
    cache = ProfileCache(tmp_path / "cache")
    want = [m.as_json() for m in open_profile(found, cache).get()]
    (result,) = list((tmp_path / "cache").glob("*/metrics-*.json"))
    result.write_text('{"key": "x", "devices": [')
    assert [m.as_json() for m in open_profile(found, cache).get()] == want
    assert json.loads(result.read_text())["devices"] == want  # written again, whole


def test_profile_info_round_trips_through_json() -> None:
    profile = load(next(iter(discover(PTA271))))
    info = ProfileInfo.of(profile)
    assert ProfileInfo.from_json(json.loads(json.dumps(info.as_json()))) == info
    assert profile_entry(info, [])["steps"] == list(info.steps)


# ---- streamed CSV -----------------------------------------------------------------------------------


def _small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(csvtable, "BLOCK_BYTES", 4096)  # many blocks even for a small sample


def test_block_size_does_not_change_the_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    (found,) = discover(PTA271)
    want = [m.as_json() for m in profile_metrics(load(found))]
    _small_blocks(monkeypatch)
    assert [m.as_json() for m in profile_metrics(load(found))] == want


@pytest.mark.parametrize("where", [0.1, 0.5, 0.97])
@pytest.mark.parametrize("bad", ["12x.5", "1e400"])
def test_error_in_any_block_names_its_line(where: float, bad: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A malformed cell (pattern) or one past int64 (conversion), early, mid-file or near the end."""
    _small_blocks(monkeypatch)
    shutil.copytree(PTA271, tmp_path / "p")
    path = next((tmp_path / "p").rglob("operator_memory.csv"))
    lines = path.read_text().splitlines(keepends=True)
    line = max(2, int(len(lines) * where))
    cells = lines[line - 1].split(",")
    column = lines[0].split(",").index("Allocation Total Allocated(MB)")
    cells[column] = bad
    lines[line - 1] = ",".join(cells)
    path.write_text("".join(lines))
    with pytest.raises(InputError) as info:
        load(next(iter(discover(tmp_path / "p"))))
    assert (info.value.file, info.value.line, info.value.column) == (str(path), line, "Allocation Total Allocated(MB)")
    assert repr(bad) in str(info.value.found)


# ---- split_series and reconciliation against their plain formulations -----------------------------

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
    from memgate.loaders.torch_npu import _pair_codes
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


@given(st.lists(st.integers(0, 1 << 40), min_size=5, max_size=400))
def test_persistent_growth_matches_the_plain_definition(floors: list[int]) -> None:
    """The vectorized suffix minimum and run minimum against plain loops over the definition."""
    assert persistent_growth(np.array(floors, dtype=np.int64)) == groundtruth.persistent_growth(floors)


def test_persistent_growth_of_ten_thousand_steps_is_exact() -> None:
    floors = np.arange(10_000, dtype=np.int64) * 300_007 + (np.arange(10_000) % 7) * 1_000
    assert persistent_growth(floors) == groundtruth.persistent_growth(floors.tolist())

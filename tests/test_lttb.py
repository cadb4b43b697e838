"""LTTB downsampling (memgate.lttb): properties, and agreement with a plain-loop reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memgate.lttb import downsample_steps, lttb

EPOCH = 1_764_246_877_073_569_640


def reference_lttb(t: list[int], y: list[int], n_out: int) -> list[int]:
    """Steinarsson's LTTB written as plain loops, bucket edges in integer arithmetic."""
    n = len(y)
    if n <= n_out:
        return list(range(n))
    if n_out == 2:
        return [0, n - 1]
    x = [float(v - t[0]) for v in t]
    yy = [float(v) for v in y]
    b = n_out - 2
    kept, a = [0], 0
    for i in range(b):
        lo, hi = i * (n - 2) // b + 1, (i + 1) * (n - 2) // b + 1
        nlo, nhi = hi, min((i + 2) * (n - 2) // b + 1, n)
        avg_x = sum(x[nlo:nhi]) / (nhi - nlo)
        avg_y = sum(yy[nlo:nhi]) / (nhi - nlo)
        best, chosen = -1.0, lo
        for j in range(lo, hi):
            area = abs((x[a] - avg_x) * (yy[j] - yy[a]) - (x[a] - x[j]) * (avg_y - yy[a]))
            if area > best:
                best, chosen = area, j
        kept.append(chosen)
        a = chosen
    kept.append(n - 1)
    return kept


@st.composite
def series(draw: st.DrawFn, max_len: int = 250) -> tuple[np.ndarray, np.ndarray]:
    """Epoch-ns times (ties allowed) and byte values, random-walk or flat-stepped."""
    n = draw(st.integers(1, max_len))
    gaps = draw(st.lists(st.integers(0, 10_000_000), min_size=n, max_size=n))
    t = np.cumsum(np.array(gaps, dtype=np.int64)) + draw(st.integers(EPOCH, EPOCH + 10**12))
    values = draw(st.lists(st.one_of(st.integers(0, 1 << 36), st.sampled_from((0, 512, 1 << 30))),
                           min_size=n, max_size=n))
    return t, np.array(values, dtype=np.int64)


@given(data=series(), n_out=st.integers(2, 120))
def test_lttb_properties(data: tuple[np.ndarray, np.ndarray], n_out: int) -> None:
    t, y = data
    idx = lttb(t, y, n_out)
    n = len(y)
    assert idx.dtype == np.int64
    assert np.all(np.diff(idx) > 0), "sorted and unique"
    assert idx[0] == 0 and idx[-1] == n - 1
    assert int(np.argmax(y)) in idx.tolist()
    assert y[idx].max() == y.max(), "the drawn peak is the exact peak"
    assert len(idx) <= n_out + 1
    if n <= n_out:
        assert idx.tolist() == list(range(n))
    else:
        assert len(idx) >= n_out  # LTTB fills every bucket


@given(data=series(), n_out=st.integers(2, 120))
def test_lttb_matches_reference(data: tuple[np.ndarray, np.ndarray], n_out: int) -> None:
    t, y = data
    expected = sorted(set(reference_lttb(t.tolist(), y.tolist(), n_out)) | {int(np.argmax(y))})
    assert lttb(t, y, n_out).tolist() == expected


@pytest.mark.parametrize("seed", range(8))
def test_lttb_matches_reference_on_random_walks(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(500, 5000))
    t = EPOCH + np.cumsum(rng.integers(0, 50_000, n)).astype(np.int64)
    y = (4 << 30) + np.cumsum(rng.integers(-(1 << 22), 1 << 22, n)).astype(np.int64)
    n_out = int(rng.integers(3, 400))
    expected = sorted(set(reference_lttb(t.tolist(), y.tolist(), n_out)) | {int(np.argmax(y))})
    got = lttb(t, y, n_out)
    assert got.tolist() == expected
    assert len(got) in (n_out, n_out + 1)


def test_lttb_keeps_a_lone_spike_that_buckets_would_average_away() -> None:
    # A one-sample spike in a long flat run: whatever LTTB picks, the peak must survive.
    y = np.full(100_000, 7 << 30, dtype=np.int64)
    y[54_321] = (7 << 30) + 4096
    t = EPOCH + np.arange(len(y), dtype=np.int64) * 10
    idx = lttb(t, y, 50)
    assert 54_321 in idx.tolist() and len(idx) <= 51


def test_lttb_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="n_out must be an integer >= 2"):
        lttb([1, 2, 3], [1, 2, 3], 1)
    with pytest.raises(ValueError, match="one length"):
        lttb([1, 2, 3], [1, 2], 2)


def _held_values(y: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The value a step-after drawing of the kept points shows at every original sample."""
    return y[idx[np.searchsorted(idx, np.arange(len(y)), side="right") - 1]]


@given(data=series(), n_out=st.integers(2, 120))
def test_downsample_steps_properties(data: tuple[np.ndarray, np.ndarray], n_out: int) -> None:
    t, y = data
    idx = downsample_steps(t, y, n_out)
    n = len(y)
    assert np.all(np.diff(idx) > 0)
    assert idx[0] == 0 and idx[-1] == n - 1
    assert int(np.argmax(y)) in idx.tolist()
    assert len(idx) <= n_out + 1
    changes = 1 + int(np.count_nonzero(y[1:] != y[:-1]))
    if n <= n_out or changes + 1 <= n_out:
        # Lossless: the step-after picture of the kept points is the original at every sample.
        assert np.array_equal(_held_values(y, idx), y)


def test_downsample_steps_flat_runs_cost_nothing() -> None:
    # 1M samples, 3 levels: 4 change points + the last sample are all that a step picture needs.
    y = np.repeat(np.array([1 << 30, 3 << 30, 2 << 30, 5 << 29], dtype=np.int64), 250_000)
    t = EPOCH + np.arange(len(y), dtype=np.int64) * 1000
    idx = downsample_steps(t, y, 2000)
    assert idx.tolist() == [0, 250_000, 500_000, 750_000, 999_999]
    assert np.array_equal(_held_values(y, idx), y)


def _old_downsample_steps(t: np.ndarray, y: np.ndarray, n_out: int) -> np.ndarray:
    """downsample_steps as it was before it went linear: np.unique over indices already in order."""
    n = len(y)
    if n <= n_out:
        return np.arange(n, dtype=np.int64)
    changes = np.flatnonzero(y[1:] != y[:-1]) + 1
    idx = np.unique(np.concatenate(([0], changes, [n - 1]))).astype(np.int64)
    if len(idx) <= n_out:
        return idx
    return np.asarray(idx[np.unique(lttb(t[idx], y[idx], n_out))], dtype=np.int64)


@pytest.mark.parametrize("seed", range(40))
def test_downsample_steps_equals_the_old_implementation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 4000))
    y = rng.integers(0, int(rng.integers(1, 8)), n).astype(np.int64) << 20  # few levels: long runs, repeats
    if seed % 4 == 0:
        y[-1] = y[-2] + 1  # the last sample is a change point (a duplicate of n - 1 before)
    t = EPOCH + np.cumsum(rng.integers(0, 1000, n)).astype(np.int64)
    if seed % 2:
        t = rng.permutation(t)  # unsorted times: the indices do not depend on them, the result must not change
    for n_out in (2, 3, int(rng.integers(2, n + 2)), n - 1, n, n + 1):
        new = downsample_steps(t, y, n_out)
        assert new.dtype == np.int64
        assert np.array_equal(new, _old_downsample_steps(t, y, n_out)), (seed, n_out)


@pytest.mark.parametrize("seed", range(20))
def test_sorted_unique_equals_np_unique(seed: int) -> None:
    from memgate.lttb import _sorted_unique

    rng = np.random.default_rng(seed)
    values = rng.integers(0, 50, int(rng.integers(0, 200)))
    for case in (values, np.sort(values)):
        got = _sorted_unique(case)
        assert got.dtype == np.int64 and np.array_equal(got, np.unique(case))


def test_downsample_steps_is_linear_on_a_million_points(monkeypatch: pytest.MonkeyPatch) -> None:
    # A million change points, already in order: no sort or hash set over them (np.unique took ~1 s
    # of a report here). Checked by refusing np.unique, not by a clock, so a busy machine cannot flake.
    rng = np.random.default_rng(0)
    y = np.cumsum(rng.integers(-100, 101, 1_000_000)).astype(np.int64)
    t = EPOCH + np.arange(len(y), dtype=np.int64) * 1000
    expected = _old_downsample_steps(t, y, 2000)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("np.unique over indices already in order")

    monkeypatch.setattr(np, "unique", refuse)
    idx = downsample_steps(t, y, 2000)
    assert len(idx) <= 2001 and np.array_equal(idx, expected)  # + the peak when LTTB missed it

"""Largest-Triangle-Three-Buckets downsampling for drawing memory curves. Pure numpy.

Only the *picture* is downsampled: every number a report prints comes from the metrics, never
from the kept points. :func:`lttb` returns indices of kept samples (so the kept points are real
samples, exact values at exact times) and always keeps the first, the last and the global-max
sample, so the drawn peak is the exact peak.

Step-shaped curves. An allocator total is a held value: it changes only at an allocation or a
free and stays flat until the next event, so renderers draw it step-after (``H`` then ``V``), not
as straight ramps between samples. :func:`downsample_steps` exploits that before LTTB runs: a
sample that repeats the previous value adds nothing to a step-after picture, so only the change
points (plus the first and the last sample) are kept — a lossless reduction that often suffices
on its own (long flat stretches between steps). Only when the change points still exceed the
budget does LTTB choose among them; its triangle areas then favour the corners of big jumps,
and a dropped change point merely extends the previous kept level a little (never past the peak,
which is always kept).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["downsample_steps", "lttb"]


def _check(t: npt.ArrayLike, y: npt.ArrayLike, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    t_arr, y_arr = np.asarray(t), np.asarray(y)
    if t_arr.ndim != 1 or y_arr.shape != t_arr.shape:
        raise ValueError(f"t and y must be 1-D arrays of one length (got shapes {t_arr.shape} and {y_arr.shape})")
    if isinstance(n_out, bool) or not isinstance(n_out, (int, np.integer)) or n_out < 2:
        raise ValueError(f"n_out must be an integer >= 2 (first and last point), got {n_out!r}")
    return t_arr, y_arr


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of int indices as int64, linear when they are already in order (numpy's
    ``unique`` hashes or sorts: a second for a million indices that need neither)."""
    values = np.asarray(values, dtype=np.int64)
    if len(values) and (values[1:] >= values[:-1]).all():
        return values[np.r_[True, values[1:] != values[:-1]]]
    return np.unique(values)


def lttb(t: npt.ArrayLike, y: npt.ArrayLike, n_out: int) -> np.ndarray:
    """Indices (sorted, unique, int64) of at most ``n_out`` samples, plus the argmax if LTTB missed it.

    ``t`` must be non-decreasing (int64 ns or floats). When ``len(y) <= n_out`` every index is
    returned. Bucket ``i`` of ``n_out - 2`` spans ``[i*(n-2)//b + 1, (i+1)*(n-2)//b + 1)`` in integer
    arithmetic (no float rounding at the edges); the loop over buckets is sequential by nature
    (each choice depends on the previous one), the work inside a bucket is vectorized.
    """
    t_arr, y_arr = _check(t, y, n_out)
    n = len(y_arr)
    if n <= n_out:
        return np.arange(n, dtype=np.int64)
    peak = int(np.argmax(y_arr))  # first occurrence of the maximum
    if n_out == 2:
        return np.unique(np.array([0, peak, n - 1], dtype=np.int64))
    # Relative time keeps float64 exact for int64 epoch nanoseconds (hours of ns fit in 2**53).
    x = (t_arr - t_arr[0]).astype(np.float64)
    yf = y_arr.astype(np.float64)
    buckets = n_out - 2
    edges = (np.arange(buckets + 1, dtype=np.int64) * (n - 2)) // buckets + 1  # edges[-1] == n - 1
    # The "third" point of bucket i: the mean of bucket i+1; for the last bucket, the last sample.
    starts = edges[1:-1]
    counts = np.diff(edges)[1:]
    avg_x = np.append(np.add.reduceat(x[1 : n - 1], starts - 1) / counts, x[n - 1])
    avg_y = np.append(np.add.reduceat(yf[1 : n - 1], starts - 1) / counts, yf[n - 1])
    kept = np.empty(n_out, dtype=np.int64)
    kept[0], kept[-1] = 0, n - 1
    a = 0
    for i in range(buckets):
        lo, hi = int(edges[i]), int(edges[i + 1])
        ax, ay, cx, cy = x[a], yf[a], avg_x[i], avg_y[i]
        # Twice the triangle area (the factor does not change the argmax).
        area = np.abs((ax - cx) * (yf[lo:hi] - ay) - (ax - x[lo:hi]) * (cy - ay))
        a = lo + int(np.argmax(area))
        kept[i + 1] = a
    if peak not in (0, n - 1) and not np.any(kept == peak):
        kept = np.insert(kept, np.searchsorted(kept, peak), peak)  # kept is in order: keep it so
    return _sorted_unique(kept)


def downsample_steps(t: npt.ArrayLike, y: npt.ArrayLike, n_out: int) -> np.ndarray:
    """Indices to draw a step-after curve with at most ``n_out`` (+1 for the peak) samples.

    First the lossless cut (drop samples repeating the previous value), then :func:`lttb` over the
    change points when they are still too many. The first sample of the global maximum is a change
    point, so the peak survives both stages.
    """
    t_arr, y_arr = _check(t, y, n_out)
    n = len(y_arr)
    if n <= n_out:
        return np.arange(n, dtype=np.int64)
    changes = np.flatnonzero(y_arr[1:] != y_arr[:-1]) + 1  # ascending, each >= 1: no sort needed
    last = np.array([] if len(changes) and changes[-1] == n - 1 else [n - 1], dtype=np.int64)
    idx = np.concatenate((np.zeros(1, dtype=np.int64), changes.astype(np.int64), last))
    if len(idx) <= n_out:
        return idx
    return np.asarray(idx[lttb(t_arr[idx], y_arr[idx], n_out)], dtype=np.int64)

"""The metrics of DESIGN.md, per device, computed from the normalized model. Pure."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from memgate.model import APP_COMPONENT, FRAMEWORK_COMPONENTS, DeviceModel, Profile
from memgate.reconcile import DeviceFacts, reconcile

TOP_N = 10
METRIC_KEYS = (
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "peak_app_reserved_bytes",
    "fragmentation",
    "step_growth_bytes",
    "leaked_bytes",
    "op_max_block_bytes",
    "top_at_peak",
)
# Which block components make up a framework series (who can hold its peak).
SERIES_PARTS = {"PTA+GE": ("PTA", "GE"), "MindSpore+GE": ("MindSpore", "GE")}


@dataclass(frozen=True)
class DeviceMetrics:
    device: str
    component: str | None  # the framework series used, or "blocks" when rebuilt from blocks
    source: str | None
    values: dict[str, Any]  # METRIC_KEYS → value (None when not measurable)
    missing: dict[str, str]  # metric → what is missing to measure it
    peak_t_ns: int | None
    peak_step: int | None
    facts: DeviceFacts = field(default_factory=DeviceFacts)

    def as_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "component": self.component,
            "source": self.source,
            "peak_t_ns": self.peak_t_ns,
            "peak_step": self.peak_step,
            "metrics": dict(self.values),
            "not_measurable": dict(sorted(self.missing.items())),
            "reconciliation": self.facts.as_json(),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> DeviceMetrics:
        """The metrics :meth:`as_json` wrote (a cached result; its facts carry no curves)."""
        return cls(device=doc["device"], component=doc["component"], source=doc["source"],
                   values=dict(doc["metrics"]), missing=dict(doc["not_measurable"]), peak_t_ns=doc["peak_t_ns"],
                   peak_step=doc["peak_step"], facts=DeviceFacts.from_json(doc["reconciliation"]))


def framework_component(device: DeviceModel, override: str | None = None) -> str | None:
    if override is not None:
        return override if override in device.series else None
    for name in FRAMEWORK_COMPONENTS:
        series = device.series.get(name)
        if series is not None and series.frame["allocated"].notna().any():
            return name
    return None


def device_metrics(
    profile: Profile, device: DeviceModel, *, component: str | None = None, warmup_steps: int = 1
) -> DeviceMetrics:
    facts = reconcile(device)
    values: dict[str, Any] = dict.fromkeys(METRIC_KEYS)
    missing: dict[str, str] = {}
    name = framework_component(device, component)
    times: np.ndarray
    allocated: np.ndarray
    source: str | None
    if name is not None:
        frame = device.series[name].frame.dropna(subset=["allocated"])
        times = frame["t_ns"].to_numpy(dtype=np.int64)
        allocated = frame["allocated"].to_numpy(dtype=np.int64)
        reserved = device.series[name].frame["reserved"].dropna().to_numpy(dtype=np.int64)
        source = device.series[name].source
    elif component is not None:
        raise_missing = f"no {component!r} series on {device.device} (has: {', '.join(sorted(device.series)) or 'none'})"
        for key in ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation", "step_growth_bytes"):
            missing[key] = raise_missing
        times = allocated = reserved = np.array([], dtype=np.int64)
        source = None
    elif facts.curves:
        name = "blocks"
        times, allocated = blocks_total(facts, block_components(device, name))
        reserved = np.array([], dtype=np.int64)
        source = device.blocks_source
    else:
        times = allocated = reserved = np.array([], dtype=np.int64)
        source = None
        why = "no allocator series and no blocks (record with profile_memory=True)"
        for key in ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation", "step_growth_bytes"):
            missing[key] = why

    peak_t: int | None = None
    if len(allocated):
        at = int(np.argmax(allocated))
        values["peak_allocated_bytes"] = int(allocated[at])
        peak_t = int(times[at])
    if len(reserved):
        values["peak_reserved_bytes"] = int(reserved.max())
    elif "peak_reserved_bytes" not in missing:
        missing["peak_reserved_bytes"] = f"the {name or 'framework'} data has no reserved totals"
    peak_alloc, peak_res = values["peak_allocated_bytes"], values["peak_reserved_bytes"]
    if peak_alloc is not None and peak_res:
        values["fragmentation"] = 1.0 - peak_alloc / peak_res
    elif "fragmentation" not in missing:
        missing["fragmentation"] = "needs peak allocated and a non-zero peak reserved of the same series"

    app = device.series.get(APP_COMPONENT)
    app_reserved = app.frame["reserved"].dropna() if app is not None else pd.Series([], dtype="Int64")
    if len(app_reserved):
        values["peak_app_reserved_bytes"] = int(app_reserved.max())
    else:
        missing["peak_app_reserved_bytes"] = "no APP (whole-process) series in this profile"

    steps = _usable_steps(profile.steps, warmup_steps)
    if len(allocated):
        growth, why = _step_growth(steps, times, allocated, warmup_steps, profile.steps)
        values["step_growth_bytes"] = growth
        if why:
            missing["step_growth_bytes"] = why
    leaked, why = _leaked(device, steps, warmup_steps, profile.steps, block_components(device, name))
    values["leaked_bytes"] = leaked
    if why:
        missing["leaked_bytes"] = why

    blocks = device.blocks
    op_max = op_max_block_bytes(blocks)
    if op_max:
        values["op_max_block_bytes"] = op_max
    else:
        values["op_max_block_bytes"] = {}
        if len(blocks) == 0:
            missing["op_max_block_bytes"] = "no per-block data (operator_memory / allocation events)"
    parts = block_components(device, name) or ()
    values["top_at_peak"] = top_at(blocks, peak_t, parts) if peak_t is not None else []
    # What the loader knows cannot be measured from this file (e.g. a snapshot without history).
    for key, why in (profile.metadata.get("not_measurable") or {}).items():
        values[key] = [] if key == "top_at_peak" else None
        missing[key] = str(why)
    return DeviceMetrics(
        device=device.device,
        component=name,
        source=source,
        values=values,
        missing=missing,
        peak_t_ns=peak_t,
        peak_step=step_at(profile.steps, peak_t),
        facts=facts,
    )


# Blocks-only devices: which block components are the framework allocator, by preference. Others
# (msMemScope HAL, the driver's segments under the PTA blocks) would count the same bytes twice.
BLOCK_GROUPS = (("PTA", "GE"), ("MindSpore", "GE"), ("MINDSPORE",), ("allocator",), ("ATB",))


def block_components(device: DeviceModel, series: str | None) -> tuple[str, ...] | None:
    """The block components that make up ``series`` (None: every component counts)."""
    if series in SERIES_PARTS:
        return SERIES_PARTS[series]
    if series not in (None, "blocks"):
        return (series,)
    present = set(device.blocks["component"].dropna().astype(str))
    for group in BLOCK_GROUPS:
        chosen = tuple(c for c in group if c in present)
        if chosen:
            return chosen
    return None


def blocks_total(facts: DeviceFacts, components: tuple[str, ...] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sum the per-component block curves into one allocated curve, one point per instant.

    The first point is the window's opening level (baseline + blocks allocated before it), 1 ns
    before the first event: a window that opens by freeing can peak there. After that, only the
    state after every event of an instant is kept: the components' events at one timestamp
    interleave in an order the blocks do not record, so a point between them is no real moment.
    """
    curves = [c for name, c in facts.curves.items() if components is None or name in components]
    start = int(sum(c.start for c in curves))
    times = np.concatenate([c.t_ns for c in curves]).astype(np.int64)
    if len(times) == 0:
        return np.array([0], dtype=np.int64), np.array([start], dtype=np.int64)
    deltas = np.concatenate([np.diff(c.allocated.astype(np.int64), prepend=np.int64(c.start)) for c in curves])
    order = np.argsort(times, kind="stable")
    times = times[order]
    total = start + np.cumsum(deltas[order])
    end_of_instant = np.append(times[1:] != times[:-1], True)
    return (np.concatenate([[times[0] - 1], times[end_of_instant]]).astype(np.int64),
            np.concatenate([[start], total[end_of_instant]]).astype(np.int64))


def _usable_steps(steps: pd.DataFrame, warmup_steps: int) -> pd.DataFrame:
    timed = steps.dropna(subset=["t_start", "t_end"]).sort_values("step", kind="stable")
    return timed.iloc[warmup_steps:] if warmup_steps > 0 else timed


def _describe_steps(all_steps: pd.DataFrame) -> str:
    numbers = [str(int(s)) for s in all_steps["step"].dropna()]
    timed = int(all_steps.dropna(subset=["t_start", "t_end"]).shape[0])
    listed = ", ".join(numbers[:5]) + (", …" if len(numbers) > 5 else "")
    return f"{len(numbers)} step(s){' (' + listed + ')' if numbers else ''}, {timed} with start/end times"


def _step_growth(
    steps: pd.DataFrame, times: np.ndarray, allocated: np.ndarray, warmup: int, all_steps: pd.DataFrame
) -> tuple[int | float | None, str | None]:
    if len(steps) < 2:
        return None, (
            f"needs at least 2 timed steps after {warmup} warmup step(s); the profile has "
            f"{_describe_steps(all_steps)} (profile more steps, e.g. schedule active>=3)"
        )
    # Memory rows and step records that never overlap come from different windows (or runs): a
    # quiet step is fine, but not a profile whose every sample lies outside every step.
    timed = all_steps.dropna(subset=["t_start", "t_end"])
    starts = timed["t_start"].to_numpy(dtype=np.int64)
    inside = np.searchsorted(times, timed["t_end"].to_numpy(dtype=np.int64), side="right") - np.searchsorted(
        times, starts, side="left")
    if not inside.any():
        numbers = ", ".join(str(int(n)) for n in timed["step"])
        return None, (f"no allocator sample falls inside any step ({numbers}): the memory rows and the step "
                      "records do not overlap (were both recorded in the same run and profiling window?)")
    ends = steps["t_end"].to_numpy(dtype=np.int64)
    idx = np.searchsorted(times, ends, side="right") - 1
    xs = steps["step"].to_numpy(dtype=np.int64)[idx >= 0]
    ys = allocated[idx[idx >= 0]]
    if len(xs) < 2:
        return None, "fewer than 2 steps end after the first allocator sample"
    return theil_sen(list(map(int, xs)), list(map(int, ys))), None


_PAIR_CHUNK = 1 << 20  # pairs per numpy pass: bounded memory whatever the number of steps (~80 MiB)
_BINS = 1 << 16
_EXACT_LIMIT = 1 << 16  # candidates ordered exactly at the end


def theil_sen(xs: list[int], ys: list[int]) -> int | float:
    """Median of pairwise slopes, exact; an int when the median is a whole number.

    The n(n-1)/2 slopes are never all held at once (thousands of steps give tens of millions): the
    median is selected by histogram passes over chunks of pairs on the float slopes, and the last
    few candidates, widened by a margin far above float rounding, are ordered exactly as reduced
    fractions (equal slopes are counted, not sorted one by one).
    """
    x = np.asarray(xs, dtype=np.int64)
    y = np.asarray(ys, dtype=np.int64)
    m, lo, hi = 0, np.inf, -np.inf
    for _, _, f in _slopes(x, y):
        m += len(f)
        if len(f):
            lo, hi = min(lo, float(f.min())), max(hi, float(f.max()))
    if m == 0:
        return 0
    ranks = [m // 2] if m % 2 else [m // 2 - 1, m // 2]
    picked = _select(x, y, ranks, lo, hi)
    median = picked[0] if m % 2 else (picked[0] + picked[1]) / 2
    return int(median) if median.denominator == 1 else float(median)


def _slopes(x: np.ndarray, y: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(dy, dx > 0, dy / dx) of every pair with distinct x, a chunk of rows at a time."""
    n = len(x)
    counts = np.arange(n - 1, -1, -1, dtype=np.int64)  # pairs (i, j > i) of row i
    ends = np.cumsum(counts)
    row = 0
    while row < n - 1:
        stop = max(row + 1, int(np.searchsorted(ends, ends[row] - counts[row] + _PAIR_CHUNK, side="right")))
        stop = min(stop, n)
        rows = np.arange(row, stop, dtype=np.int64)
        c = counts[row:stop]
        total = int(c.sum())
        i = np.repeat(rows, c)
        j = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(c) - c, c) + np.repeat(rows + 1, c)
        dx, dy = x[j] - x[i], y[j] - y[i]
        keep = dx != 0
        dx, dy = dx[keep], dy[keep]
        sign = np.sign(dx)
        dx, dy = dx * sign, dy * sign
        yield dy, dx, dy / dx
        row = stop


def _select(x: np.ndarray, y: np.ndarray, ks: list[int], lo: float, hi: float) -> list[Fraction]:
    """The exact ks-th smallest slopes (0-based, ascending, one or two adjacent ranks), knowing every
    float slope lies in [lo, hi].

    Each pass counts the slopes below ``lo`` and bins those in [lo, hi]; binning is monotone in
    the slope, so the ranks lie in the bins where the counts reach them, and the next window is
    those bins and their neighbours (a margin far above any rounding at the bin edges).
    """
    # distinct slopes p/q (0 < q <= the x span) differ by at least 1/span**2: a window narrower than
    # that holds a single exact value, up to float rounding
    span = int(x.max() - x.min())
    floor = 0.25 / float(span) ** 2
    while hi - lo > max(max(abs(lo), abs(hi)) * 1e-9, floor):
        width = hi - lo
        below = 0
        hist = np.zeros(_BINS, dtype=np.int64)
        for _, _, f in _slopes(x, y):
            below += int(np.count_nonzero(f < lo))
            inside = f[(f >= lo) & (f <= hi)]
            hist += np.bincount(np.minimum(((inside - lo) / width * _BINS).astype(np.int64), _BINS - 1),
                                minlength=_BINS)
        cumulative = np.cumsum(hist)
        bins = [int(np.searchsorted(cumulative, k - below, side="right")) for k in ks]
        first, last = max(bins[0] - 1, 0), min(bins[-1] + 1, _BINS - 1)
        lo, hi = lo + width * first / _BINS, lo + width * (last + 1) / _BINS
        if int(hist[first:last + 1].sum()) <= _EXACT_LIMIT or hi - lo >= width:
            break
    # exact: every slope within a margin of [lo, hi], as reduced fractions with multiplicities
    tol = max(abs(lo), abs(hi)) * 1e-9 + 1e-300
    counted: dict[tuple[int, int], int] = {}
    exact_below = 0
    for dy, dx, f in _slopes(x, y):
        exact_below += int(np.count_nonzero(f < lo - tol))
        near = (f >= lo - tol) & (f <= hi + tol)
        num, den = dy[near], dx[near]
        if not len(num):
            continue
        g = np.gcd(num, den)
        num, den = num // g, den // g
        if (num == num[0]).all() and (den == den[0]).all():  # one slope many times (a steady leak): no sort
            pairs, mult = [(int(num[0]), int(den[0]))], [len(num)]
        else:
            unique, counts = np.unique(np.stack([num, den], axis=1), axis=0, return_counts=True)
            pairs, mult = [tuple(pq) for pq in unique.tolist()], counts.tolist()
        for (p, q), c in zip(pairs, mult):
            counted[(p, q)] = counted.get((p, q), 0) + c
    found: list[Fraction] = []
    seen = exact_below  # slopes ordered so far
    for (p, q) in sorted(counted, key=lambda pq: Fraction(pq[0], pq[1])):
        seen += counted[(p, q)]
        while len(found) < len(ks) and ks[len(found)] < seen:
            found.append(Fraction(p, q))
        if len(found) == len(ks):
            return found
    raise AssertionError("median slope not found")  # pragma: no cover - the counts cover rank k


def _leaked(
    device: DeviceModel, steps: pd.DataFrame, warmup: int, all_steps: pd.DataFrame,
    components: tuple[str, ...] | None,
) -> tuple[int | None, str | None]:
    blocks = device.blocks
    if components is not None:
        blocks = blocks[blocks["component"].isin(components)]
    if len(blocks) == 0:
        return None, "no per-block data (operator_memory / allocation events) to find unfreed blocks"
    if len(steps) == 0:
        return None, (
            f"needs at least 1 timed step after {warmup} warmup step(s); the profile has {_describe_steps(all_steps)}"
        )
    open_blocks = blocks[blocks["t_free"].isna() & blocks["t_alloc"].notna()]
    t = open_blocks["t_alloc"].to_numpy(dtype=np.int64)
    inside = np.zeros(len(t), dtype=bool)
    for start, end in zip(steps["t_start"].to_numpy(dtype=np.int64), steps["t_end"].to_numpy(dtype=np.int64)):
        inside |= (t >= start) & (t <= end)
    return int(open_blocks["size"].to_numpy(dtype=np.int64)[inside].sum()), None


def op_max_block_bytes(blocks: pd.DataFrame) -> dict[str, int]:
    """The largest block each operator allocated inside the window, by operator name.

    On operator codes with numpy: blocks can be millions of rows, and a groupby would copy them.
    """
    named = (blocks["t_alloc"].notna() & blocks["op"].notna() & (blocks["op"] != "") & blocks["size"].notna())
    codes, names = pd.factorize(blocks["op"])
    keep = named.to_numpy(dtype=bool) & (codes >= 0)
    codes = codes[keep]
    sizes = blocks["size"].to_numpy(dtype=np.int64, na_value=0)[keep]
    largest = np.full(len(names), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(largest, codes, sizes)
    seen = np.bincount(codes, minlength=len(names)) > 0
    return {str(names[i]): int(largest[i]) for i in sorted(np.flatnonzero(seen), key=lambda i: str(names[i]))}


def top_at(blocks: pd.DataFrame, t_ns: int, components: tuple[str | None, ...], n: int = TOP_N) -> list[dict[str, Any]]:
    """The ``n`` largest blocks live at ``t_ns`` (allocated at or before it, not yet freed)."""
    if len(blocks) == 0:
        return []
    live = (blocks["t_alloc"].isna() | (blocks["t_alloc"] <= t_ns)) & (blocks["t_free"].isna() | (blocks["t_free"] > t_ns))
    if components:
        live &= blocks["component"].isin([c for c in components if c]) | blocks["component"].isna()
    rows = np.flatnonzero(live.fillna(False).to_numpy(dtype=bool))
    # the n largest, ties in block order (a stable sort on -size); only those rows are copied
    largest = np.argsort(-blocks["size"].to_numpy(dtype=np.int64)[rows], kind="stable")[:n]
    chosen = blocks.iloc[rows[largest]]
    result = []
    for row in chosen.itertuples(index=False):
        result.append(
            {
                "size": int(row.size),
                "op": None if pd.isna(row.op) else str(row.op),
                "stream": None if pd.isna(row.stream) else str(row.stream),
                "owner": None if pd.isna(row.owner) else str(row.owner),
                "t_alloc": None if pd.isna(row.t_alloc) else int(row.t_alloc),
                "component": None if pd.isna(row.component) else str(row.component),
            }
        )
    return result


def step_at(steps: pd.DataFrame, t_ns: int | None) -> int | None:
    if t_ns is None:
        return None
    timed = steps.dropna(subset=["t_start", "t_end"])
    hit = timed[(timed["t_start"] <= t_ns) & (timed["t_end"] >= t_ns)]
    return int(hit["step"].iloc[0]) if len(hit) else None


def profile_metrics(profile: Profile, *, component: str | None = None, warmup_steps: int = 1) -> list[DeviceMetrics]:
    return [device_metrics(profile, d, component=component, warmup_steps=warmup_steps) for d in profile.devices]

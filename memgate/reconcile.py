"""Reconcile a device's blocks against the totals the writer recorded.

Pure functions over the normalized model. The block list of a profile only covers the profiling
window, while the allocator totals written next to each block (torch_npu ``Allocation Total
Allocated``, Kineto ``Total Allocated``) include memory allocated before it. The difference, the
pre-window baseline, is estimated once per block and the most common estimate wins; the share of
blocks that agree with it is reported as the consistency figure, never hidden.

Across files: where a writer records blocks in one file and the allocator's totals in another
(torch_npu operator_memory.csv beside memory_record.csv, their MindSpore and CANN twins, the db
tables), :class:`SeriesConsistency` says how far the two agree: the share of the blocks' time span
the series covers, and the share of blocks whose recorded total equals a sample of the series at the
block's allocation time (the same event, written twice: 100% in every real profile checked). Files of
different runs or windows show here as a low figure; the loaders refuse the ones that cannot belong
together at all (no time overlap, other devices).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from memgate.lazy import lazy_module
from memgate.model import DeviceModel, Series
from memgate.table import Table

if TYPE_CHECKING:
    import numpy as np
else:  # imported on first use: pytest loads the plugin, and so this module, on every run
    np = lazy_module("numpy", globals(), "np")


@dataclass(frozen=True)
class BlockCurve:
    """The allocated curve rebuilt from blocks: ``baseline + live block bytes`` at each event."""

    t_ns: np.ndarray  # int64, one entry per alloc/free event, time order (frees first on ties)
    allocated: np.ndarray  # int64, after the event
    start: int  # allocated at the window start (baseline + blocks live before it)


@dataclass(frozen=True)
class ComponentFacts:
    component: str
    blocks: int
    pre_window_blocks: int  # freed inside the window, allocated before it
    open_blocks: int  # still live when the window ended
    baseline_bytes: int  # allocator total at window start that no block row accounts for
    consistency: float | None  # share of blocks whose recorded total agrees with the baseline
    checked_blocks: int


@dataclass(frozen=True)
class SeriesConsistency:
    """How a component's blocks agree with the series of the same name (often another file)."""

    series_source: str  # the file (and table) of the series
    blocks_source: str | None
    window_overlap: float | None  # share of the blocks' time span inside the series' span (None: no times)
    checked_blocks: int  # blocks with a recorded total and an allocation time
    agreeing_blocks: int  # ... whose total equals a series sample at their allocation time
    agreement: float | None  # agreeing / checked (None when none could be checked)

    def as_json(self) -> dict[str, object]:
        return {"series_source": self.series_source, "blocks_source": self.blocks_source,
                "window_overlap": self.window_overlap, "checked_blocks": self.checked_blocks,
                "agreeing_blocks": self.agreeing_blocks, "agreement": self.agreement}


def series_consistency_sentence(component: str, doc: dict[str, Any]) -> str:
    """``GE blocks against the GE series of memory_record.csv: windows overlap 0.0%, 0 of 28 blocks' totals
    found in it (from different windows or runs?)`` (a ``SeriesConsistency`` as JSON): whether two files tell
    of the same allocations, which the blocks' agreement with their own baseline cannot show."""
    overlap, checked = doc.get("window_overlap"), doc.get("checked_blocks") or 0
    source = Path(str(doc.get("series_source") or "").split(", ")[0]).name
    parts = [f"windows overlap {overlap:.1%}" if overlap is not None else "no times to compare"]
    if checked:
        parts.append(f"{doc.get('agreeing_blocks')} of {checked} blocks' totals found in it")
    sentence = f"{component} blocks against the {component} series of {source}: {', '.join(parts)}"
    doubtful = (overlap is not None and overlap < 0.5) or (checked and (doc.get("agreement") or 0) < 0.5)
    return sentence + (" (from different windows or runs?)" if doubtful else "")


@dataclass(frozen=True)
class DeviceFacts:
    components: dict[str, ComponentFacts] = field(default_factory=dict)
    sum_checks: dict[str, float] = field(default_factory=dict)  # e.g. PTA+GE → share of rows = PTA + GE
    curves: dict[str, BlockCurve] = field(default_factory=dict)
    # per block component with a series of the same name: blocks ↔ series across files
    consistency: dict[str, SeriesConsistency] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {
            "consistency": {name: c.as_json() for name, c in sorted(self.consistency.items())},
            "components": {
                name: {
                    "blocks": f.blocks,
                    "pre_window_blocks": f.pre_window_blocks,
                    "open_blocks": f.open_blocks,
                    "baseline_bytes": f.baseline_bytes,
                    "consistency": f.consistency,
                    "checked_blocks": f.checked_blocks,
                }
                for name, f in sorted(self.components.items())
            },
            "sum_checks": dict(sorted(self.sum_checks.items())),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> DeviceFacts:
        """The facts :meth:`as_json` wrote (the curves are not kept: only the chart draws them)."""
        return cls(
            components={name: ComponentFacts(component=name, **fields) for name, fields in doc["components"].items()},
            sum_checks=dict(doc["sum_checks"]),
            consistency={name: SeriesConsistency(**fields) for name, fields in doc.get("consistency", {}).items()},
        )


class _BlockArrays(NamedTuple):
    """The block columns reconciliation reads, as numpy (missing → 0, with a mask), and which
    blocks are the component's (``member``; None: all). The columns are the whole table's, never
    copied per component: a 5M-block file would hold each column twice."""

    size: np.ndarray
    t_alloc: np.ndarray
    pre: np.ndarray  # no t_alloc: allocated before the window
    t_free: np.ndarray
    freed: np.ndarray
    alloc_total: np.ndarray  # -1 where missing
    member: np.ndarray | None = None

    @classmethod
    def of(cls, blocks: Table) -> _BlockArrays:
        t_alloc, t_free = blocks.ints("t_alloc"), blocks.ints("t_free")
        return cls(size=blocks.ints("size").values, t_alloc=t_alloc.values, pre=t_alloc.isna(), t_free=t_free.values,
                   freed=t_free.present(), alloc_total=blocks.ints("alloc_total").filled(-1))

    def mine(self, mask: np.ndarray) -> np.ndarray:
        """``mask`` over the component's blocks only."""
        return mask if self.member is None else mask & self.member


def reconcile(device: DeviceModel) -> DeviceFacts:
    facts = DeviceFacts()
    # The sum checks first: they hold their arrays only while they run, the block curves are kept.
    for total, parts in device.sum_components.items():
        share = _sum_check(device, total, parts)
        if share is not None:
            facts.sum_checks[total] = share
    # Per component (sorted; missing = "allocator", last), on numpy columns: a pandas groupby would
    # copy every column of a multi-million-row frame.
    blocks = device.blocks
    component = blocks.texts("component")
    codes, names = component.codes, component.names.tolist()
    groups = [(name, codes == names.index(name)) for name in sorted(component.used())]
    if (codes < 0).any():
        groups.append(("allocator", codes < 0))
    columns = _BlockArrays.of(blocks)
    for name, member in groups:
        arrays = columns._replace(member=None if member.all() else member)
        series = device.series.get(name)
        # Only across files: a series read from the blocks' own events (a Kineto trace's totals, a
        # snapshot's trace, msMemScope's Attr) agrees with them by construction, and would say so.
        if series is not None and series.source != device.blocks_source:
            facts.consistency[name] = series_consistency(series, arrays, device.blocks_source)
        component_facts, curve = _reconcile_blocks(name, arrays)
        facts.components[name] = component_facts
        facts.curves[name] = curve
    return facts


def series_consistency(series: Series, blocks: _BlockArrays, blocks_source: str | None) -> SeriesConsistency:
    """The blocks of a component against the series of the same name: time overlap and totals."""
    times = series.frame.ints("t_ns")
    timed = times.present()
    t = times.values[timed]
    values = series.frame.ints("allocated").filled(-1)[timed]
    if len(t) and not (t[1:] >= t[:-1]).all():
        order = np.argsort(t, kind="stable")
        t, values = t[order], values[order]
    allocated_here = blocks.mine(~blocks.pre)
    alloc_times = blocks.t_alloc[allocated_here]
    free_times = blocks.t_free[blocks.mine(blocks.freed)]
    overlap: float | None = None
    if (len(alloc_times) or len(free_times)) and len(t):
        lo = min(int(x.min()) for x in (alloc_times, free_times) if len(x))
        hi = max(int(x.max()) for x in (alloc_times, free_times) if len(x))
        inside = min(hi, int(t[-1])) - max(lo, int(t[0]))
        overlap = (1.0 if inside >= 0 else 0.0) if hi == lo else max(inside, 0) / (hi - lo)
    del free_times
    # A block's recorded total against every sample of the series at its allocation time (the rows of
    # one instant are in an order the writer chose: any of them may be the one written with the block).
    recorded = blocks.alloc_total[allocated_here]
    checkable = recorded >= 0
    at, total = alloc_times[checkable], recorded[checkable]
    del alloc_times, checkable, recorded, allocated_here
    if len(at) and not (at[1:] >= at[:-1]).all():  # sorted needles: searchsorted walks, never jumps
        order = np.argsort(at)
        at, total = at[order], total[order]
    index = np.searchsorted(t, at, side="left")
    pending = np.flatnonzero(index < len(t))
    agreeing = 0
    while len(pending):
        pending = pending[t[index[pending]] == at[pending]]  # still a sample of the block's instant
        hit = values[index[pending]] == total[pending]
        agreeing += int(hit.sum())
        pending = pending[~hit]
        index[pending] += 1
        pending = pending[index[pending] < len(t)]
    checked = len(at)
    return SeriesConsistency(series_source=series.source, blocks_source=blocks_source, window_overlap=overlap,
                             checked_blocks=checked, agreeing_blocks=agreeing,
                             agreement=agreeing / checked if checked else None)


def _reconcile_blocks(component: str, blocks: _BlockArrays) -> tuple[ComponentFacts, BlockCurve]:
    size, t_alloc, pre, t_free, freed, alloc_total, _ = blocks
    pre_here, open_here = blocks.mine(pre), blocks.mine(~freed)
    start_live = int(size[pre_here].sum())

    # Events [*frees, *allocs] in time order, frees first at the same ns, each kind in file order;
    # built in place where it can: a 5M-block file makes 10M events.
    index = np.int32 if 2 * len(size) < 2**31 else np.int64  # half the memory of the index arrays
    alloc_idx: np.ndarray = np.flatnonzero(blocks.mine(~pre)).astype(index)
    free_idx: np.ndarray = np.flatnonzero(blocks.mine(freed)).astype(index)
    free_count = len(free_idx)
    times = np.empty(free_count + len(alloc_idx), dtype=np.int64)
    running = np.empty_like(times)
    # gathered straight into their halves (mode="clip": the indices are in range; "raise" buffers a copy)
    np.take(t_free, free_idx, out=times[:free_count], mode="clip")
    np.take(t_alloc, alloc_idx, out=times[free_count:], mode="clip")
    np.take(size, free_idx, out=running[:free_count], mode="clip")
    np.negative(running[:free_count], out=running[:free_count])
    np.take(size, alloc_idx, out=running[free_count:], mode="clip")
    del free_idx
    # A stable sort keeps frees (first in the array) before allocs at the same ns, and file order
    # within each kind: the same as lexsort((row, kind, time)) at a fraction of the memory.
    order: np.ndarray = np.argsort(times, kind="stable").astype(index)
    unsorted_times, times = times, times[order]
    running = np.take(running, order, out=unsorted_times, mode="clip")  # into the buffer just let go of
    del unsorted_times
    np.cumsum(running, out=running)
    running += start_live

    checked = 0
    consistency: float | None = None
    baseline = 0
    if (alloc_total >= 0).any():
        # Each allocation's place in time order (``order`` inverted): the running total after it is
        # read in allocation order, where its recorded total is; masking 10M events costs more.
        place = np.empty(len(order), dtype=index)
        place[order] = np.arange(len(order), dtype=index)
        after = running[place[free_count:]]
        del place
        recorded = alloc_total[alloc_idx]
        has_total = recorded >= 0
        estimates = recorded - after if has_total.all() else recorded[has_total] - after[has_total]
        del recorded, has_total, after
        checked = len(estimates)
        if checked:
            baseline, agreeing = _mode(estimates)
            consistency = float(agreeing / checked)
    facts = ComponentFacts(
        component=component,
        blocks=len(size) if blocks.member is None else int(blocks.member.sum()),
        pre_window_blocks=int(pre_here.sum()),
        open_blocks=int(open_here.sum()),
        baseline_bytes=baseline,
        consistency=consistency,
        checked_blocks=checked,
    )
    running += baseline
    curve = BlockCurve(t_ns=times, allocated=running, start=start_live + baseline)
    return facts, curve


def _mode(values: np.ndarray) -> tuple[int, int]:
    """(most common value, its count), the smallest such value on a tie, as np.unique would give.
    May sort ``values`` in place (the caller's own array).

    Consistent blocks agree on one baseline, so the mode is usually a majority: found from a sample
    and confirmed with one linear count instead of sorting millions of estimates. Otherwise the
    values are sorted in place and counted run by run (np.unique would sort a copy).
    """
    sample = values[:: max(1, len(values) // 4096)]
    sample_values, sample_counts = np.unique(sample, return_counts=True)
    candidate = sample_values[np.argmax(sample_counts)]
    count = int(np.count_nonzero(values == candidate))
    if 2 * count > len(values):  # a majority is the only mode
        return int(candidate), count
    values.sort()
    # The longest run of equal values, by bisection on its length: a run of L exists where a value
    # equals the one L-1 places on. One bool array at a time, where listing every run would hold
    # three int64 arrays as long as the values (the peak memory of a file of millions of blocks).
    n = len(values)
    longest, too_long = 1, n // 2 + 1  # no majority: the mode covers at most half
    while too_long - longest > 1:
        length = (longest + too_long) // 2
        if (values[length - 1:] == values[:n - length + 1]).any():
            longest = length
        else:
            too_long = length
    first = int(np.argmax(values[longest - 1:] == values[:n - longest + 1]))  # the smallest value on a tie
    return int(values[first]), longest


def _sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` for int64, linear when the values are already in order (a series' times are)."""
    if len(values) and (values[1:] >= values[:-1]).all():
        return values[np.r_[True, values[1:] != values[:-1]]]
    return np.unique(values)


def _sum_check(device: DeviceModel, total: str, parts: tuple[str, ...]) -> float | None:
    """Share of ``total`` rows equal to the sum of each part's latest value at that time.

    Compared at the end of each instant: rows sharing a timestamp are written in an order the
    per-component frames no longer hold, so their intermediate sums are not comparable. Vectorized:
    each part's value at a time is its last non-null sample at or before it (searchsorted).
    """
    if total not in device.series or not any(p in device.series for p in parts):
        return None
    target_t, target_v = _timed_values(device.series[total].frame)
    if not len(target_t):
        return None
    # the total at the end of each instant: its last non-null value per timestamp (null if none)
    t_inst = _sorted_unique(target_t)
    valid = ~np.isnan(target_v)
    if valid.all():  # the last row of each instant, instants in order
        total_alloc = target_v[np.r_[target_t[1:] != target_t[:-1], True]]
    else:
        tv, vv = target_t[valid], target_v[valid]
        ends = np.r_[tv[1:] != tv[:-1], True] if len(tv) else np.zeros(0, dtype=bool)
        total_alloc = np.full(len(t_inst), np.nan)
        total_alloc[np.searchsorted(t_inst, tv[ends])] = vv[ends]
        del tv, vv, ends
    del target_t, target_v, valid
    expected = np.zeros(len(t_inst), dtype=np.float64)
    seen = np.zeros(len(t_inst), dtype=bool)
    for part in parts:
        if part not in device.series:
            continue
        t_any, v_any = _timed_values(device.series[part].frame)
        if not len(t_any):
            continue
        # a part whose only samples at an instant are null still counts as present (pivot/ffill kept the
        # row): every instant from its first sample on (times are sorted, so these are suffixes)
        seen[np.searchsorted(t_inst, t_any[0], side="left"):] = True
        valid = ~np.isnan(v_any)
        t_part, v_part = (t_any, v_any) if valid.all() else (t_any[valid], v_any[valid])
        del t_any, v_any, valid
        at = np.searchsorted(t_part, t_inst, side="right") - 1  # the last sample at or before each instant
        first = int(np.searchsorted(at, 0, side="left"))  # instants before the part's first value have none
        expected[first:] += v_part[at[first:]]
        del t_part, v_part, at
    expected[~seen] = np.nan
    agree = expected == total_alloc
    return float(agree.mean())


def _timed_values(frame: Table) -> tuple[np.ndarray, np.ndarray]:
    """A series' (t_ns, allocated as float, NaN when missing) where t_ns is known, stably time-sorted."""
    times = frame.ints("t_ns")
    timed = times.present()
    t = times.values
    v = frame.ints("allocated").floats()
    if not timed.all():
        t, v = t[timed], v[timed]
    if len(t) and not (t[1:] >= t[:-1]).all():
        order = np.argsort(t, kind="stable")
        t, v = t[order], v[order]
    return t, v

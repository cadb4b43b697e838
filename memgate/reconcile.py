"""Reconcile a device's blocks against the totals the writer recorded.

Pure functions over the normalized model. The block list of a profile only covers the profiling
window, while the allocator totals written next to each block (torch_npu ``Allocation Total
Allocated``, Kineto ``Total Allocated``) include memory allocated before it. The difference, the
pre-window baseline, is estimated once per block and the most common estimate wins; the share of
blocks that agree with it is reported as the consistency figure, never hidden.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memgate.model import DeviceModel


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
class DeviceFacts:
    components: dict[str, ComponentFacts] = field(default_factory=dict)
    sum_checks: dict[str, float] = field(default_factory=dict)  # e.g. PTA+GE → share of rows = PTA + GE
    curves: dict[str, BlockCurve] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        return {
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


def reconcile(device: DeviceModel) -> DeviceFacts:
    facts = DeviceFacts()
    blocks = device.blocks
    for component, group in blocks.groupby("component", sort=True, dropna=False):
        name = "allocator" if pd.isna(component) else str(component)
        component_facts, curve = _reconcile_blocks(name, group)
        facts.components[name] = component_facts
        facts.curves[name] = curve
    for total, parts in device.sum_components.items():
        share = _sum_check(device, total, parts)
        if share is not None:
            facts.sum_checks[total] = share
    return facts


def _reconcile_blocks(component: str, blocks: pd.DataFrame) -> tuple[ComponentFacts, BlockCurve]:
    size = blocks["size"].to_numpy(dtype=np.int64)
    t_alloc = blocks["t_alloc"]
    t_free = blocks["t_free"]
    pre = t_alloc.isna().to_numpy()
    freed = t_free.notna().to_numpy()
    start_live = int(size[pre].sum())

    # Events: frees (kind 0) before allocs (kind 1) at the same ns; allocs keep file order.
    alloc_idx = np.flatnonzero(~pre)
    free_idx = np.flatnonzero(freed)
    times = np.concatenate([t_free.to_numpy(dtype=np.int64, na_value=0)[free_idx],
                            t_alloc.to_numpy(dtype=np.int64, na_value=0)[alloc_idx]])
    kinds = np.concatenate([np.zeros(len(free_idx), np.int8), np.ones(len(alloc_idx), np.int8)])
    rows = np.concatenate([free_idx, alloc_idx])
    deltas = np.concatenate([-size[free_idx], size[alloc_idx]])
    order = np.lexsort((rows, kinds, times))
    running = start_live + np.cumsum(deltas[order])

    totals = blocks["alloc_total"]
    checked = 0
    consistency: float | None = None
    baseline = 0
    if totals.notna().any():
        is_alloc_event = kinds[order] == 1
        event_rows = rows[order][is_alloc_event]
        live_at_alloc = running[is_alloc_event]
        recorded = totals.to_numpy(dtype=np.int64, na_value=-1)[event_rows]
        has_total = recorded >= 0
        estimates = recorded[has_total] - live_at_alloc[has_total]
        checked = len(estimates)
        if checked:
            values, counts = np.unique(estimates, return_counts=True)
            baseline = int(values[np.argmax(counts)])
            consistency = float(counts.max() / checked)
    facts = ComponentFacts(
        component=component,
        blocks=len(blocks),
        pre_window_blocks=int(pre.sum()),
        open_blocks=int((~freed).sum()),
        baseline_bytes=baseline,
        consistency=consistency,
        checked_blocks=checked,
    )
    curve = BlockCurve(t_ns=times[order], allocated=running + baseline, start=start_live + baseline)
    return facts, curve


def _sum_check(device: DeviceModel, total: str, parts: tuple[str, ...]) -> float | None:
    """Share of ``total`` rows equal to the sum of each part's latest value at that time.

    Compared at the end of each instant: rows sharing a timestamp are written in an order the
    per-component frames no longer hold, so their intermediate sums are not comparable. Vectorized:
    each part's value at a time is its last non-null sample at or before it (searchsorted).
    """
    if total not in device.series or not any(p in device.series for p in parts):
        return None
    target = device.series[total].frame
    timed = target["t_ns"].notna().to_numpy()
    if not timed.any():
        return None
    # the total at the end of each instant: its last non-null value per timestamp (null if none)
    target_t = target["t_ns"].to_numpy(dtype=np.int64, na_value=0)[timed]
    target_v = target["allocated"].to_numpy(dtype=np.float64, na_value=np.nan)[timed]
    t_inst = np.unique(target_t)
    valid = ~np.isnan(target_v)
    o = np.lexsort((np.arange(len(target_t))[valid], target_t[valid]))
    tv, vv = target_t[valid][o], target_v[valid][o]
    ends = np.r_[tv[1:] != tv[:-1], True] if len(tv) else np.zeros(0, dtype=bool)
    total_alloc = np.full(len(t_inst), np.nan)
    total_alloc[np.searchsorted(t_inst, tv[ends])] = vv[ends]
    expected = np.zeros(len(t_inst), dtype=np.float64)
    seen = np.zeros(len(t_inst), dtype=bool)
    for part in parts:
        if part not in device.series:
            continue
        frame = device.series[part].frame
        values = frame["allocated"]
        has_t = frame["t_ns"].notna().to_numpy()
        keep = values.notna().to_numpy() & has_t
        t_part = frame["t_ns"].to_numpy(dtype=np.int64, na_value=0)[keep]
        v_part = values.to_numpy(dtype=np.float64, na_value=np.nan)[keep]
        o = np.argsort(t_part, kind="stable")
        t_part, v_part = t_part[o], v_part[o]
        at = np.searchsorted(t_part, t_inst, side="right") - 1  # the last sample at or before each instant
        has = at >= 0
        expected[has] += v_part[at[has]]
        seen |= has
        # a part whose only samples at an instant are null still counts as present (pivot/ffill kept the row)
        t_any = np.sort(frame["t_ns"].to_numpy(dtype=np.int64, na_value=0)[has_t])
        seen |= np.searchsorted(t_any, t_inst, side="right") > 0
    expected[~seen] = np.nan
    agree = expected == total_alloc
    return float(agree.mean())

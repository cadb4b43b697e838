"""The metrics of docs/design.md (listed in :mod:`memgate.metric_specs`), per device, computed from the
normalized model. Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memgate import hints, metric_specs
from memgate.categories import COLUMN as CATEGORY
from memgate.categories import bytes_by_category
from memgate.lazy import lazy_module
from memgate.metric_specs import SPEC_OF, details_of
from memgate.model import APP_COMPONENT, FRAMEWORK_COMPONENTS, DeviceModel, PoolState, Profile, steps_in_order
from memgate.reconcile import DeviceFacts, reconcile
from memgate.sizes import format_size
from memgate.table import Table, Texts

if TYPE_CHECKING:
    import numpy as np
else:  # imported on first use: pytest loads the plugin, and so this module, on every run
    np = lazy_module("numpy", globals(), "np")

TOP_N = 10
TOP_HOLDERS = 50  # blocks kept in top_at_peak: failure details show 5 holder lines, each -v 5 more
METRIC_KEYS = metric_specs.METRIC_KEYS  # the report's keys (the session and loaders read them here)
OTHER = "(other)"  # the key summing the names past the top N in op/owner_bytes_at_peak
# Which block components make up a framework series (who can hold its peak).
SERIES_PARTS = {"PTA+GE": ("PTA", "GE"), "MindSpore+GE": ("MindSpore", "GE")}
# Counted steps step_growth needs: w = (n-1)//2 intervals per run, and n >= 5 leaves a run of w
# intervals beside any single one (a one-time jump can then never be in every run).
MIN_GROWTH_STEPS = 5
# The metrics measured on the framework series, on each allocator pool, on the pool at a snapshot's dump.
_SERIES_KEYS = metric_specs.keys_where(source="framework series")
_POOL_KEYS = metric_specs.keys_where(source="allocator pools")
_DUMP_KEYS = metric_specs.keys_where(source="pool at the dump")


@dataclass(frozen=True)
class MetricOptions:
    """What a budget may change about how its metrics are measured (the cache keys results on it)."""

    component: str | None = None  # series override (PTA, GE, MindSpore+GE, ...)
    warmup_steps: int = 1  # timed steps dropped before growth and leaks are measured
    leak_horizon_steps: int = 1  # last counted steps whose live blocks may still be freed later

    def as_json(self) -> dict[str, Any]:
        return {"component": self.component, "warmup_steps": self.warmup_steps,
                "leak_horizon_steps": self.leak_horizon_steps}


@dataclass(frozen=True)
class PoolMetrics:
    """One allocator pool (a series with its own reserved figure): what fragmentation is judged on."""

    peak_allocated_bytes: int
    peak_reserved_bytes: int
    fragmentation: float | None  # None when the pool reserved nothing
    external_fragmentation: float
    reserved_before_window: bool  # reserved at its maximum from the pool's first sample

    def as_json(self) -> dict[str, Any]:
        return {"peak_allocated_bytes": self.peak_allocated_bytes, "peak_reserved_bytes": self.peak_reserved_bytes,
                "fragmentation": self.fragmentation, "external_fragmentation": self.external_fragmentation,
                "reserved_before_window": self.reserved_before_window}


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
    pools: dict[str, PoolMetrics] = field(default_factory=dict)
    # metric → the pool its value comes from (fragmentation, external_fragmentation)
    pool_of: dict[str, str] = field(default_factory=dict)
    # metric → what a reader must know to read the value right (window-relative, reserved before the window)
    notes: dict[str, str] = field(default_factory=dict)
    # bytes the writer's totals carried in from before the window and that no block accounts for,
    # left out of a window-relative peak (None: the totals are absolute)
    carried_over_bytes: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "component": self.component,
            "source": self.source,
            "peak_t_ns": self.peak_t_ns,
            "peak_step": self.peak_step,
            "metrics": dict(self.values),
            "not_measurable": dict(sorted(self.missing.items())),
            "pools": {name: pool.as_json() for name, pool in sorted(self.pools.items())},
            "pool_of": dict(sorted(self.pool_of.items())),
            "notes": dict(sorted(self.notes.items())),
            "window_relative": self.carried_over_bytes is not None,
            "carried_over_bytes": self.carried_over_bytes,
            "reconciliation": self.facts.as_json(),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> DeviceMetrics:
        """The metrics :meth:`as_json` wrote (a cached result; its facts carry no curves)."""
        return cls(device=doc["device"], component=doc["component"], source=doc["source"],
                   values=dict(doc["metrics"]), missing=dict(doc["not_measurable"]), peak_t_ns=doc["peak_t_ns"],
                   peak_step=doc["peak_step"], facts=DeviceFacts.from_json(doc["reconciliation"]),
                   pools={name: PoolMetrics(**pool) for name, pool in doc["pools"].items()},
                   pool_of=dict(doc["pool_of"]), notes=dict(doc["notes"]),
                   carried_over_bytes=doc["carried_over_bytes"])


def framework_component(device: DeviceModel, override: str | None = None) -> str | None:
    if override is not None:
        return override if override in device.series else None
    for name in FRAMEWORK_COMPONENTS:
        series = device.series.get(name)
        if series is not None and series.frame.ints("allocated").any_present():
            return name
    return None


@dataclass
class _Figures:
    """What :func:`device_metrics` has found so far, each metric family adding its own."""

    values: dict[str, Any]  # METRIC_KEYS → value, then details (live_at_peak_count)
    missing: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    pool_of: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Curve:
    """The series the peaks, growth and holders are measured on: a framework series, or the blocks' sum."""

    name: str | None  # the framework series, "blocks" when rebuilt from blocks, None without one
    source: str | None
    times: np.ndarray
    allocated: np.ndarray  # window-relative totals: less what they carried in (``carried``)
    reserved: np.ndarray
    carried: int | None = None  # None: the totals are absolute


def device_metrics(profile: Profile, device: DeviceModel, options: MetricOptions | None = None) -> DeviceMetrics:
    """Every metric of :mod:`memgate.metric_specs` for one device, family by family."""
    options = options or MetricOptions()
    facts = reconcile(device)
    figures = _Figures(values=dict.fromkeys(METRIC_KEYS))
    curve = _framework_curve(profile, device, options.component, facts, figures)
    peak_t = _peaks(curve, figures)
    unmeasured = profile.not_measurable(device.device)
    if "peak_allocated_bytes" in unmeasured:
        peak_t = None  # the loader says there is no peak: no moment, step or blocks of it either
    pools = _pools(device, options.component, curve.name, figures)
    _requested_peak(device, figures)
    _app_peak(profile, device, figures)
    steps = device.steps if device.steps is not None else profile.steps
    _steps_and_leaks(profile, device, options, curve, steps, figures)
    _dump_values(device.dump_state, figures)
    _blocks_at_peak(device, curve.name, peak_t, figures)
    _out_of_memory(device, curve.name, steps, figures)
    pools = _loader_not_measurable(unmeasured, figures, pools)
    for key in metric_specs.OPTIONAL_KEYS:  # absent where not measured: other profiles report as before
        if figures.values.get(key) is None:
            figures.values.pop(key, None)
            figures.missing.pop(key, None)
    return DeviceMetrics(
        device=device.device,
        component=curve.name,
        source=curve.source,
        values=figures.values,
        missing=figures.missing,
        peak_t_ns=peak_t,
        peak_step=step_at(steps, peak_t),
        facts=facts,
        pools=pools,
        pool_of=figures.pool_of,
        notes=figures.notes,
        carried_over_bytes=curve.carried,
    )


def _framework_curve(profile: Profile, device: DeviceModel, component: str | None, facts: DeviceFacts,
                     figures: _Figures) -> _Curve:
    """The framework series (``component`` where a budget names one), else the blocks' sum; where
    there is neither, the metrics measured on it are said missing."""
    empty = np.array([], dtype=np.int64)
    name = framework_component(device, component)
    if name is not None:
        frame = device.series[name].frame
        has_allocated = frame.ints("allocated").present()
        times = frame.ints("t_ns").values[has_allocated]
        allocated = frame.ints("allocated").values[has_allocated]
        carried = _carried_over(facts, block_components(device, name)) if device.window_relative else None
        return _Curve(name, device.series[name].source, times, allocated if carried is None else allocated - carried,
                      frame.ints("reserved").known(), carried)
    if component is not None:
        why = f"no {component!r} series on {device.device} (has: {', '.join(sorted(device.series)) or 'none'})"
        for key in (*_SERIES_KEYS, *_POOL_KEYS):
            figures.missing[key] = why
        return _Curve(None, None, empty, empty, empty)
    if facts.curves:
        parts = block_components(device, "blocks")
        times, allocated = blocks_total(facts, parts)
        carried = _carried_over(facts, parts) if device.window_relative else None
        return _Curve("blocks", device.blocks_source, times, allocated if carried is None else allocated - carried,
                      empty, carried)
    why = hints.no_memory_data(profile.format, profile.metadata)
    for key in _SERIES_KEYS:
        figures.missing[key] = why
    return _Curve(None, None, empty, empty, empty)


def _peaks(curve: _Curve, figures: _Figures) -> int | None:
    """peak_allocated_bytes and peak_reserved_bytes of the curve; returns the peak's time."""
    values, notes = figures.values, figures.notes
    peak_t: int | None = None
    if len(curve.allocated):
        at = int(np.argmax(curve.allocated))
        values["peak_allocated_bytes"] = int(curve.allocated[at])
        peak_t = int(curve.times[at])
        carried = curve.carried
        if carried is not None:
            notes["peak_allocated_bytes"] = (
                "window-relative: the writer's totals leave out memory allocated before profiling started"
                + (f"; {format_size(carried)} the totals carried in from before the first event (live since a "
                   "warm-up step, or counted by an earlier profiling session of the process) are left out"
                   if carried else ""))
    if len(curve.reserved):
        values["peak_reserved_bytes"] = int(curve.reserved.max())
    elif "peak_reserved_bytes" not in figures.missing:
        figures.missing["peak_reserved_bytes"] = f"the {curve.name or 'framework'} data has no reserved totals"
    return peak_t


def _pools(device: DeviceModel, component: str | None, name: str | None, figures: _Figures) -> dict[str, PoolMetrics]:
    """fragmentation and external_fragmentation: each the worst pool's, the pool named where it is worse."""
    judged_pools = [] if component is not None and name is None else pool_components(device, component)
    pools: dict[str, PoolMetrics] = {}
    contradicted: list[str] = []  # pools whose totals contradict each other: no figure of theirs is judged
    for pool in judged_pools:
        if (measured := pool_metrics(device.series[pool].frame)) is None:
            continue
        if measured.peak_allocated_bytes > measured.peak_reserved_bytes:  # 1 - a/r < 0 would pass any budget
            contradicted.append(f"{pool} allocates more than it ever reserves (peak allocated "
                                f"{measured.peak_allocated_bytes} > peak reserved {measured.peak_reserved_bytes} bytes)")
            continue
        pools[pool] = measured
    values, missing, notes, pool_of = figures.values, figures.missing, figures.notes, figures.pool_of
    for key in _POOL_KEYS:
        judged = {pool: getattr(m, key) for pool, m in pools.items() if getattr(m, key) is not None}
        if judged:
            worst = max(sorted(judged), key=lambda pool: judged[pool])
            values[key] = judged[worst]
            if judged[worst] > 0:  # a pool is named only where one is worse than the others
                pool_of[key] = worst
            if contradicted:
                notes[key] = "left out: " + "; ".join(contradicted)
        elif key not in missing:
            missing[key] = ("; ".join(contradicted) + ": its totals contradict each other" if contradicted
                            else f"the {component!r} series has no allocated and reserved totals" if component is not None
                            else "no allocator pool with both allocated and reserved totals (fragmentation is judged "
                                 "per pool: PTA, GE, MindSpore, the caching allocator, an msMemScope pool)")
    if "fragmentation" in pool_of and pools[pool_of["fragmentation"]].reserved_before_window:
        before = (f"{pool_of['fragmentation']} reserved is at its maximum from its first sample: the value reflects "
                  "memory reserved before the window")
        notes["fragmentation"] = "; ".join(filter(None, [before, notes.get("fragmentation")]))
    return pools


def _requested_peak(device: DeviceModel, figures: _Figures) -> None:
    """peak_requested_bytes: a snapshot's peak in the sizes the program asked for."""
    values = figures.values
    if device.requested_peak is not None:
        values["peak_requested_bytes"] = device.requested_peak
        if values["peak_allocated_bytes"] is not None:
            figures.notes["peak_requested_bytes"] = (
                f"{format_size(values['peak_allocated_bytes'] - device.requested_peak)} "
                "below peak_allocated_bytes: the allocator's rounding of the blocks")
    else:
        figures.missing["peak_requested_bytes"] = ("only a memory snapshot records the requested sizes beside the "
                                                   "allocator's blocks")


def _app_peak(profile: Profile, device: DeviceModel, figures: _Figures) -> None:
    """peak_app_reserved_bytes: the whole process's device memory (Ascend APP, CUDA NVML samples)."""
    values = figures.values
    app = device.series.get(APP_COMPONENT)
    app_reserved = app.frame.ints("reserved").known() if app is not None else np.zeros(0, dtype=np.int64)
    if not len(app_reserved):
        figures.missing["peak_app_reserved_bytes"] = "no APP (whole-process) series in this profile"
        return
    values["peak_app_reserved_bytes"] = int(app_reserved.max())
    sampled = profile.metadata.get("device_memory")
    if isinstance(sampled, dict) and values["peak_reserved_bytes"] is not None:
        # CUDA: the recorder sampled the device through NVML; say whose memory it is and what lies outside
        scope = ("this process's device memory" if sampled.get("scope") == "process"
                 else "the whole device's memory in use (all processes: NVML could not attribute it)")
        figures.notes["peak_app_reserved_bytes"] = (
            f"{scope}, sampled by {sampled.get('source')} once per step; "
            f"{format_size(max(values['peak_app_reserved_bytes'] - values['peak_reserved_bytes'], 0))} above the "
            "caching allocator's peak reserved (CUDA context, NCCL, library workspaces, other allocations)")


def _steps_and_leaks(profile: Profile, device: DeviceModel, options: MetricOptions, curve: _Curve, steps: Table,
                     figures: _Figures) -> None:
    """step_growth_bytes, leaked_bytes and leak_undetermined_bytes over the counted steps."""
    values, missing = figures.values, figures.missing
    counted = _counted_steps(steps, options.warmup_steps)
    if len(curve.allocated):
        growth, growth_gap = _step_growth(counted, curve.times, curve.allocated, options.warmup_steps, steps, profile)
        values["step_growth_bytes"] = growth
        if growth_gap:
            missing["step_growth_bytes"] = growth_gap
    leaks, leak_gap = _leaked(device, counted, options, steps, block_components(device, curve.name), profile)
    values["leaked_bytes"], values["leak_undetermined_bytes"] = leaks
    if leak_gap:
        missing["leaked_bytes"] = missing["leak_undetermined_bytes"] = leak_gap


def _blocks_at_peak(device: DeviceModel, name: str | None, peak_t: int | None, figures: _Figures) -> None:
    """op_max_block_bytes, and the blocks live at the peak: top_at_peak (with live_at_peak_count),
    op_bytes_at_peak, owner_bytes_at_peak, and category_bytes_at_peak where the blocks have categories."""
    values = figures.values
    blocks = device.blocks
    op_max = op_max_block_bytes(blocks)
    if op_max:
        values["op_max_block_bytes"] = op_max
    else:
        values["op_max_block_bytes"] = {}
        if len(blocks) == 0:
            figures.missing["op_max_block_bytes"] = "no per-block data (operator_memory / allocation events)"
    at_peak = live_rows(blocks, peak_t, block_components(device, name) or ()) if peak_t is not None else None
    values["top_at_peak"] = top_at(blocks, at_peak) if at_peak is not None else []
    # how many blocks are live at the peak: top_at_peak keeps only the largest TOP_HOLDERS of them
    values["live_at_peak_count"] = len(at_peak) if at_peak is not None else None
    values["op_bytes_at_peak"] = bytes_at(blocks, at_peak, "op") if at_peak is not None else {}
    values["owner_bytes_at_peak"] = bytes_at(blocks, at_peak, "owner") if at_peak is not None else {}
    if CATEGORY in blocks:  # a tracked recording's blocks (memgate.categories)
        values["category_bytes_at_peak"] = bytes_by_category(blocks, at_peak) if at_peak is not None else {}


OOM_PEAK_NOTE = "the peak is a lower bound of what the run needed"
_PEAK_KEYS = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_requested_bytes")


def _out_of_memory(device: DeviceModel, name: str | None, steps: Table, figures: _Figures) -> None:
    """oom_count and its detail ooms (each error: the request, free memory, allocated and reserved then,
    its step, the blocks live at it); a peak of a window with an out-of-memory error says it is a lower bound."""
    if device.ooms is None:
        figures.missing["oom_count"] = ("only a memory snapshot with history (its oom entries) or a memgate "
                                        "recording records out-of-memory errors")
        figures.values["ooms"] = []
        return
    components = block_components(device, name) or ()
    details = []
    for oom in device.ooms:
        rows = live_rows(device.blocks, oom.t_ns, components)
        blocks = device.blocks
        details.append({
            "size": oom.requested, "device_free": oom.device_free,
            "allocated": oom.allocated if oom.allocated is not None else _level_at(device, name, "allocated", oom.t_ns),
            "reserved": oom.reserved if oom.reserved is not None else _level_at(device, name, "reserved", oom.t_ns),
            "capacity": oom.capacity, "t_ns": oom.t_ns, "step": oom.step if oom.step is not None else _step_of(steps, oom.t_ns), "stream": oom.stream,
            "op": oom.op, "owner": oom.owner, "source": oom.source, "message": oom.message,
            "live_count": len(rows), "live_bytes": int(blocks.ints("size").values[rows].sum()),
            "holders": top_at(blocks, rows) if len(rows) else [],
            **({"categories": bytes_by_category(blocks, rows)} if CATEGORY in blocks else {}),
        })
    figures.values["oom_count"] = len(details)
    figures.values["ooms"] = details
    if not details:
        return
    last = device.ooms[-1]
    t_alloc = device.blocks.ints("t_alloc")
    ended = not (t_alloc.present() & (t_alloc.values > last.t_ns)).any()  # nothing allocated after it
    request = f" (a request of {format_size(last.requested)} did not fit)" if last.requested is not None else ""
    note = (f"the window {'ended in' if ended else 'holds'} an out-of-memory error{request}: {OOM_PEAK_NOTE}"
            if len(details) == 1 else
            f"the window holds {len(details)} out-of-memory errors: {OOM_PEAK_NOTE}")
    for key in _PEAK_KEYS:
        if figures.values.get(key) is not None:
            figures.notes[key] = "; ".join(filter(None, [note, figures.notes.get(key)]))


def _step_of(steps: Table, t_ns: int) -> int | None:
    """The step running at ``t_ns``: the timed step around it, else the last step that started before it and
    never ended (an out-of-memory error ends a step before its END is written)."""
    around = step_at(steps, t_ns)
    if around is not None:
        return around
    start, end, number = steps.ints("t_start"), steps.ints("t_end"), steps.ints("step")
    open_rows = np.flatnonzero(start.present() & end.isna() & number.present() & (start.values <= t_ns))
    if not len(open_rows):
        return None
    return int(number.values[open_rows[np.argmax(start.values[open_rows])]])


def _level_at(device: DeviceModel, name: str | None, column: str, t_ns: int) -> int | None:
    """The framework series' ``column`` at ``t_ns`` (its last sample at or before it), where it has one."""
    series = device.series.get(name) if name is not None else None
    if series is None:
        return None
    times, values = series.frame.ints("t_ns"), series.frame.ints(column)
    known = times.present() & values.present() & (times.values <= t_ns)
    rows = np.flatnonzero(known)
    return int(values.values[rows[-1]]) if len(rows) else None


def _loader_not_measurable(unmeasured: dict[str, str], figures: _Figures,
                           pools: dict[str, PoolMetrics]) -> dict[str, PoolMetrics]:
    """What the loader knows cannot be measured on the device (:meth:`Profile.not_measurable`; e.g. a
    snapshot without history): each such metric emptied and said missing; returns the pools left to show."""
    for key, why in unmeasured.items():
        spec = SPEC_OF.get(key)
        figures.values[key] = spec.empty if spec is not None else None
        for detail in details_of(key):
            figures.values[detail] = SPEC_OF[detail].empty
        figures.missing[key] = str(why)
        figures.pool_of.pop(key, None)
        figures.notes.pop(key, None)
        if key in _POOL_KEYS:
            # the pools are fragmentation's breakdown: a snapshot without history has one sample, the
            # dump, whose 1 - allocated/reserved is the cache the allocator kept, not fragmentation
            pools = {}
    return pools


def pool_components(device: DeviceModel, override: str | None = None) -> list[str]:
    """The allocator pools of a device: series with their own allocated and reserved totals.

    Combined series (PTA+GE = PTA + GE) and the whole process (APP) are not pools: a peak of a sum
    and a reserved of a sum fall at different moments of different allocators.
    """
    if override is not None:
        names: list[str] = [p for p in SERIES_PARTS.get(override, (override,)) if p in device.series]
    else:
        combined = set(SERIES_PARTS) | set(device.sum_components)
        names = [n for n in sorted(device.series) if n not in combined and n != APP_COMPONENT]
    return [n for n in names if device.series[n].frame.ints("allocated").any_present()
            and device.series[n].frame.ints("reserved").any_present()]


def pool_metrics(frame: Table) -> PoolMetrics | None:
    """Fragmentation figures of one pool's series (rows in time order); None without both totals."""
    allocated_ints, reserved_ints = frame.ints("allocated"), frame.ints("reserved")
    if not allocated_ints.any_present() or not reserved_ints.any_present():
        return None
    peak_alloc = int(allocated_ints.known().max())
    res_values = reserved_ints.known()
    peak_res = int(res_values.max())
    # External: at each growth of reserved, the share of the grown pool that sat free just before.
    # allocated "just before" = the latest known allocated at the row before the growth. Computed at
    # the growths only (a handful): float copies of a 10M-row series would cost ~0.5 GB.
    grew = np.flatnonzero(res_values[1:] > res_values[:-1])  # growth between known rows k and k+1
    external = 0.0
    if len(grew):
        before_row = grew if reserved_ints.missing is None else np.flatnonzero(reserved_ints.present())[grew]
        if allocated_ints.missing is None:
            before_alloc = allocated_ints.values[before_row].astype(np.float64)
        else:
            known_rows = np.flatnonzero(allocated_ints.present())
            at = np.searchsorted(known_rows, before_row, side="right") - 1
            before_alloc = np.where(at >= 0, allocated_ints.values[known_rows[np.maximum(at, 0)]], np.nan)
        known = ~np.isnan(before_alloc)
        grown_from = res_values[grew].astype(np.float64)
        free_before = np.clip(grown_from - before_alloc, 0, None)
        shares = free_before[known] / res_values[grew + 1][known]
        if len(shares):
            external = float(shares.max())
    return PoolMetrics(
        peak_allocated_bytes=peak_alloc,
        peak_reserved_bytes=peak_res,
        fragmentation=1.0 - peak_alloc / peak_res if peak_res > 0 else None,
        external_fragmentation=external,
        reserved_before_window=bool(res_values[0] == peak_res),
    )


def _carried_over(facts: DeviceFacts, components: tuple[str, ...] | None) -> int:
    """Bytes the writer's totals held at the window start that no block of the window accounts for."""
    return sum(f.baseline_bytes for c, f in facts.components.items() if components is None or c in components)


def _dump_values(state: PoolState | None, figures: _Figures) -> None:
    """The pool at a snapshot's dump: allocated_at_dump_bytes, reserved_at_dump_bytes,
    largest_free_block_bytes, free_block_fragmentation."""
    values = figures.values
    if state is None:
        why = "only a memory snapshot records the pool's final state (segments and their free blocks)"
        for key in _DUMP_KEYS:
            figures.missing[key] = why
        return
    values["allocated_at_dump_bytes"] = state.allocated
    values["reserved_at_dump_bytes"] = state.reserved
    values["largest_free_block_bytes"] = state.largest_free_block
    values["free_block_fragmentation"] = (1.0 - state.largest_free_block / state.free_bytes) if state.free_bytes else 0.0
    figures.notes["allocated_at_dump_bytes"] = ("the allocator's block sizes, as torch.cuda.memory_allocated() counts "
                                                "them" if state.size_basis == "rounded" else
                                                f"sizes as {state.size_basis}, the basis of peak_allocated_bytes")


# Blocks-only devices: which block components are the framework allocator, by preference. Others
# (msMemScope HAL, the driver's segments under the PTA blocks) would count the same bytes twice.
BLOCK_GROUPS = (("PTA", "GE"), ("MindSpore", "GE"), ("MINDSPORE",), ("allocator",), ("ATB",))


def block_components(device: DeviceModel, series: str | None) -> tuple[str, ...] | None:
    """The block components that make up ``series`` (None: every component counts)."""
    if series in SERIES_PARTS:
        return SERIES_PARTS[series]
    if series not in (None, "blocks"):
        return (series,)
    present = set(device.blocks.texts("component").used())
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


def _timed_steps(steps: Table) -> Table:
    """The steps with a start and an end time, in table order."""
    return steps.take(steps.ints("t_start").present() & steps.ints("t_end").present())


def _counted_steps(steps: Table, warmup_steps: int) -> Table:
    """The timed steps in step order (missing numbers last), minus the first ``warmup_steps``."""
    ordered = steps_in_order(_timed_steps(steps))
    return ordered.take(np.arange(warmup_steps, len(ordered))) if warmup_steps > 0 else ordered


def _describe_steps(all_steps: Table) -> str:
    numbers = [str(int(s)) for s in all_steps.ints("step").known()]
    timed = len(_timed_steps(all_steps))
    listed = ", ".join(numbers[:5]) + (", …" if len(numbers) > 5 else "")
    return f"{len(numbers)} step(s){' (' + listed + ')' if numbers else ''}, {timed} with start/end times"


def _record_more(needed: int, warmup: int, profile: Profile) -> str:
    return hints.record_more_steps(profile.format, profile.metadata, needed, warmup)  # in the recording tool's words


def _step_growth(
    counted: Table, times: np.ndarray, allocated: np.ndarray, warmup: int, all_steps: Table,
    profile: Profile,
) -> tuple[int | None, str | None]:
    if len(counted) < MIN_GROWTH_STEPS:
        return None, (
            f"needs at least {MIN_GROWTH_STEPS} counted steps (timed steps after {warmup} warmup step(s)) to tell "
            f"steady growth from a one-time jump; the profile has {_describe_steps(all_steps)}: "
            + _record_more(MIN_GROWTH_STEPS, warmup, profile))
    # Memory rows and step records that never overlap come from different windows (or runs): a
    # quiet step is fine, but not a profile whose every sample lies outside every step.
    timed = _timed_steps(all_steps)
    starts = timed.ints("t_start").values
    inside = np.searchsorted(times, timed.ints("t_end").values, side="right") - np.searchsorted(
        times, starts, side="left")
    if not inside.any():
        numbers = ", ".join("<NA>" if n is None else str(n) for n in timed.ints("step").tolist())
        return None, (f"no allocator sample falls inside any step ({numbers}): the memory rows and the step "
                      "records do not overlap (were both recorded in the same run and profiling window?)")
    floors, sampled = step_floors(counted, times, allocated)
    floors = floors[sampled]
    if len(floors) < MIN_GROWTH_STEPS:
        return None, (f"only {len(floors)} of {len(counted)} counted steps have an allocator sample in or before "
                      f"them; step_growth needs {MIN_GROWTH_STEPS}")
    return persistent_growth(floors), None


def step_floors(steps: Table, times: np.ndarray, allocated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each step's floor: the lowest allocated level during it, counting the level it starts at.

    Levels are taken after every event of an instant (rows between the events of one instant are in
    an order the writer chose, no real moment). Returns (floors, sampled): a step with no sample in or
    before it has no floor.
    """
    last_of_instant = np.append(times[1:] != times[:-1], True)
    times, allocated = times[last_of_instant], allocated[last_of_instant]
    first = np.searchsorted(times, steps.ints("t_start").values, side="right") - 1
    stop = np.searchsorted(times, steps.ints("t_end").values, side="right")
    floors = np.zeros(len(first), dtype=np.int64)
    sampled = np.zeros(len(first), dtype=bool)
    for i, (lo, hi) in enumerate(zip(np.maximum(first, 0).tolist(), stop.tolist())):
        if hi > lo:
            floors[i], sampled[i] = int(allocated[lo:hi].min()), True
    return floors, sampled


def persistent_growth(floors: np.ndarray) -> int:
    """Integer bytes/step that memory grew by at least over every run of half the step intervals.

    The suffix minimum of the floors is the level memory never again goes below: what a step holds
    only for a while (a buffer kept k steps, accumulated gradients, allocator noise) drops out of
    it. Over runs of w = (n-1)//2 intervals, the slowest run's average growth is kept: a one-time
    jump (lazily created optimizer state, a cache filled once) misses at least one run, while a
    leak every step or every other step is in all of them.
    """
    kept = np.minimum.accumulate(floors[::-1])[::-1]
    w = (len(kept) - 1) // 2
    return int((kept[w:] - kept[:-w]).min()) // w


def _leaked(
    device: DeviceModel, counted: Table, options: MetricOptions, all_steps: Table,
    components: tuple[str, ...] | None, profile: Profile,
) -> tuple[tuple[int | None, int | None], str | None]:
    """(leaked, undetermined) bytes of blocks allocated in counted steps and live when the last one ends."""
    blocks = device.blocks
    # the component's blocks as a mask: a copy of every column of a 5M-block table costs ~300 MB
    mine = blocks.texts("component").isin(components) if components is not None else None
    if (len(blocks) == 0) if mine is None else not mine.any():
        return (None, None), "no per-block data (operator_memory / allocation events) to find unfreed blocks"
    horizon = options.leak_horizon_steps
    if len(counted) < horizon + 1:
        return (None, None), (
            f"needs at least {horizon + 1} counted steps (leak_horizon_steps={horizon}, plus one whose blocks had "
            f"{horizon} step(s) to be freed) after {options.warmup_steps} warmup step(s); the profile has "
            f"{_describe_steps(all_steps)}: " + _record_more(horizon + 1, options.warmup_steps, profile))
    decided_rows, undetermined_rows = _open_rows(blocks, counted, horizon, mine)
    size = blocks.ints("size").values
    return (int(size[decided_rows].sum()), int(size[undetermined_rows].sum())), None


def _open_rows(blocks: Table, counted: Table, horizon: int, mine: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The rows of the blocks allocated in a counted step and still live when the last one ends: those of
    the steps before the horizon (leaked) and those of the horizon's steps (undetermined)."""
    starts = counted.ints("t_start").values
    ends = counted.ints("t_end").values
    # Live when the counted steps end: what is freed between the last step and the end of the window
    # (a test's locals, a training function returning) was held through every later step all the same.
    t_free = blocks.ints("t_free")
    is_open = (t_free.isna() | (t_free.values > int(ends.max()))) & blocks.ints("t_alloc").present()
    if mine is not None:
        is_open &= mine
    rows = np.flatnonzero(is_open)
    t = blocks.ints("t_alloc").values[rows]
    decided = len(counted) - horizon
    # Each block to the latest-starting counted step that contains it (steps in step order; the
    # horizon is the last steps of that order).
    by_start = np.argsort(starts, kind="stable")
    at = np.searchsorted(starts[by_start], t, side="right") - 1
    step = np.where(at >= 0, by_start[np.maximum(at, 0)], -1)
    inside = (step >= 0) & (t <= ends[np.maximum(step, 0)])
    return rows[inside & (step < decided)], rows[inside & (step >= decided)]


@dataclass(frozen=True)
class Grown:
    """The blocks a growth or leak check is about: allocated in the counted steps and still live when
    the last of them ended (:func:`grown_blocks`)."""

    device: str
    holders: list[dict[str, Any]]  # the largest of them
    count: int
    total: int
    steps: str  # the steps they were allocated in, in words


def grown_blocks(profile: Profile, device: DeviceModel, options: MetricOptions, *, undetermined: bool) -> Grown | None:
    """The blocks ``leaked`` counts (with ``undetermined``: also those of the leak horizon's steps, what
    ``step_growth`` sees grow): allocated in a counted step and still live when the counted steps end.
    None where the device has no blocks of its framework series or too few steps to say."""
    if profile.metadata.get("memory_events_without_addr"):
        return None  # no free is matched to its allocation: what is still live is unknown
    blocks = device.blocks
    components = block_components(device, framework_component(device, options.component))
    mine = blocks.texts("component").isin(components) if components is not None else None
    steps = device.steps if device.steps is not None else profile.steps
    counted = _counted_steps(steps, options.warmup_steps)
    horizon = options.leak_horizon_steps
    if len(blocks) == 0 or len(counted) < horizon + 1 or (mine is not None and not mine.any()):
        return None
    decided, later = _open_rows(blocks, counted, horizon, mine)
    rows = np.sort(np.concatenate([decided, later])) if undetermined else decided
    numbers = [str(n) for n in counted.ints("step").known().tolist()]
    shown = numbers if undetermined else numbers[:len(counted) - horizon]
    words = f"step {shown[0]}" if len(shown) == 1 else f"steps {shown[0]}–{shown[-1]}" if shown else "the counted steps"
    return Grown(device.device, top_at(blocks, rows, TOP_HOLDERS) if len(rows) else [], len(rows),
                 int(blocks.ints("size").values[rows].sum()),
                 f"allocated in {words} and still allocated when step {numbers[-1]} ended" if numbers
                 else f"allocated in {words} and still allocated when they ended")


def op_max_block_bytes(blocks: Table) -> dict[str, int]:
    """The largest block each operator allocated inside the window, by operator name.

    On operator codes with numpy: blocks can be millions of rows, and a groupby would copy them.
    """
    op = blocks.texts("op")
    codes, names = op.codes, op.names
    keep = blocks.ints("t_alloc").present() & blocks.ints("size").present() & (codes >= 0)
    if "" in names.tolist():  # an empty name is no operator
        keep &= codes != names.tolist().index("")
    codes = codes[keep]
    sizes = blocks.ints("size").values[keep]
    largest = np.full(len(names), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(largest, codes, sizes)
    seen = np.bincount(codes, minlength=len(names)) > 0
    return {str(names[i]): int(largest[i]) for i in sorted(np.flatnonzero(seen), key=lambda i: str(names[i]))}


def live_rows(blocks: Table, t_ns: int, components: tuple[str | None, ...]) -> np.ndarray:
    """Row positions of the blocks of ``components`` (all when empty; a block without one counts)
    live at ``t_ns``: allocated at or before it, not yet freed."""
    t_alloc, t_free = blocks.ints("t_alloc"), blocks.ints("t_free")
    live = (t_alloc.isna() | (t_alloc.values <= t_ns)) & (t_free.isna() | (t_free.values > t_ns))
    if components:
        component = blocks.texts("component")
        live &= component.isin([c for c in components if c]) | component.isna()
    return np.flatnonzero(live)


def bytes_at(blocks: Table, rows: np.ndarray, column: str, n: int = TOP_N) -> dict[str, int]:
    """Bytes of the blocks at ``rows`` (:func:`live_rows` at a moment) per value of ``column``
    (``op`` or ``owner``).

    The ``n`` largest names (ties by name), the rest summed under ``"(other)"`` (omitted when 0);
    blocks without a name are not counted.
    """
    if len(rows) == 0:
        return {}
    text = blocks.texts(column)
    codes, names = text.codes[rows], text.names
    sizes = blocks.ints("size").values[rows]
    named = codes >= 0
    totals = np.zeros(len(names), dtype=np.int64)
    np.add.at(totals, codes[named], sizes[named])
    held = np.bincount(codes[named], minlength=len(names)) > 0
    order = sorted((i for i in np.flatnonzero(held).tolist() if str(names[i]) != ""),
                   key=lambda i: (-int(totals[i]), str(names[i])))
    result = {str(names[i]): int(totals[i]) for i in order[:n]}
    rest = sum(int(totals[i]) for i in order[n:])
    if rest:
        result[OTHER] = rest
    return result


def top_at(blocks: Table, rows: np.ndarray, n: int = TOP_HOLDERS) -> list[dict[str, Any]]:
    """The ``n`` largest blocks at ``rows`` (:func:`live_rows` at a moment)."""
    if len(rows) == 0:
        return []
    sizes = blocks.ints("size").values[rows]
    # the n largest; equal sizes by what the blocks are (earliest allocated first, then op, owner,
    # stream, component by name), never by their rows' order: the same run written in another row
    # order lists the same blocks
    cut = np.partition(sizes, len(sizes) - n)[len(sizes) - n] if len(sizes) > n else sizes.min()
    tied = sizes >= cut
    tied_rows = rows[tied]
    keys = [_name_rank(blocks.texts(c).take(tied_rows)) for c in ("component", "stream", "owner", "op")]
    keys += [blocks.ints("t_alloc").take(tied_rows).filled(np.iinfo(np.int64).min), -sizes[tied]]
    shown = ("size", "op", "stream", "owner", "t_alloc", "component") + ((CATEGORY,) if CATEGORY in blocks else ())
    chosen = blocks.select(shown).take(tied_rows[np.lexsort(keys)[:n]])
    return chosen.records()


def _name_rank(texts: Texts) -> np.ndarray:
    """Each row's place in the sorted names (-1 where missing), for sorting rows by name."""
    rank = np.empty(len(texts.names), dtype=np.int64)
    rank[sorted(range(len(texts.names)), key=texts.names.__getitem__)] = np.arange(len(texts.names))
    return np.where(texts.codes >= 0, rank[np.maximum(texts.codes, 0)] if len(rank) else -1, -1)


def step_at(steps: Table, t_ns: int | None) -> int | None:
    if t_ns is None:
        return None
    timed = _timed_steps(steps)
    hit = np.flatnonzero((timed.ints("t_start").values <= t_ns) & (timed.ints("t_end").values >= t_ns))
    return timed.ints("step").item(int(hit[0])) if len(hit) else None


def profile_metrics(profile: Profile, options: MetricOptions | None = None) -> list[DeviceMetrics]:
    return [device_metrics(profile, d, options) for d in profile.devices]

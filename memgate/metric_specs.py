"""Every metric memgate reports, listed once: what it is, what it needs, how it is budgeted, compared and suggested.

The rest of memgate derives its lists of metrics from :data:`SPECS` (the JSON report's keys, the
budget keys and their kinds, the rows of ``memgate inspect`` and of the HTML page), so adding a metric
is one entry here plus its computation in :mod:`memgate.metrics`; tests/test_metric_specs.py holds the
JSON schemas and the docs in step with this table. The definitions themselves are in docs/design.md
(Metrics).

What a metric needs is a set of :class:`Fact`: a loader says which facts a profile lacks and why,
never which metrics (:func:`not_measurable` turns "lacks fact F because R" into "metric M is not
measurable: R" for every metric whose spec needs F).

This module sits at the bottom of the import graph: it imports nothing of memgate's.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

# What a value counts: bytes, a share (0..1), or a number of things.
Unit = Literal["bytes", "ratio", "count"]
# How a value is shaped in the report: one number, a number per operator or owner name, or a list of blocks.
Shape = Literal["value", "by name", "blocks"]
# What a metric is measured on (which data a profile must record for it).
Source = Literal[
    "framework series",  # the allocator totals of the framework series (PTA+GE, the caching allocator, ...)
    "allocator pools",  # each pool's own allocated and reserved totals; the worst pool, named in pool_of
    "APP series",  # the whole process's device memory (Ascend APP, CUDA NVML samples)
    "requested sizes",  # the sizes the program requested, before the allocator's rounding
    "blocks",  # per-block rows or allocation events (with steps, for leaks)
    "pool at the dump",  # a snapshot's segments and their free blocks when it was dumped
    "out-of-memory events",  # a snapshot's oom trace entries, a recording's out-of-memory error
]


class Fact(enum.Enum):
    """What a profile records that a metric may need; a loader names the facts a profile lacks, with why."""

    MEMORY = "any record of the device's memory"  # every metric needs it (implicit in MetricSpec.needs)
    HISTORY = "the whole allocation history of the window"  # a snapshot without history, or whose ring buffer filled
    PAIRING = "each free paired with its allocation (by address)"  # Kineto [memory] events without Addr
    BLOCKS = "each allocation on its own (size and lifetime)"  # a memory timeline records sizes by category
    TOTALS = "the allocator's recorded totals (the level memory stood at)"  # Kineto events without Total Allocated
    WINDOW_START = "what was allocated before the window, told apart"  # Kineto CPU totals without Addr
    OPERATORS = "the operator that made each allocation"  # a Kineto trace without operator spans


# How `memgate suggest` proposes a limit for a budget key:
#   "worst": the worst profile's value plus headroom, never below the smallest suggested peak or ratio
#   "least": the cleanest profile's value plus headroom, no floor (growth and leaks: 0 measured stays 0)
#   "worst, no floor": the worst profile's value plus headroom, no floor
#   "never": not suggested (Budgeted.not_suggested says why)
Suggest = Literal["worst", "least", "worst, no floor", "never"]
# The kind budgets, compare and the reports judge and print a budgeted value as.
BudgetKind = Literal["size", "ratio"]


@dataclass(frozen=True)
class Budgeted:
    """How a metric is budgeted: its key in a budget file or marker, and how a limit is suggested."""

    key: str  # e.g. peak_allocated (the report key without _bytes)
    suggest: Suggest = "worst"
    not_suggested: str = ""  # why no limit is suggested, where suggest is "never"


@dataclass(frozen=True)
class MetricSpec:
    """One metric of a device: its report key and everything the reports, budgets and comparisons
    need to know about it, apart from how it is computed (:mod:`memgate.metrics`)."""

    key: str  # the JSON report's key (DeviceMetrics.values), e.g. peak_allocated_bytes
    unit: Unit
    source: Source
    description: str  # one line: what it measures (the HTML page's tooltip)
    shape: Shape = "value"
    budget: Budgeted | None = None  # None: no budget key judges it directly
    # A regression is a larger value (budgets pass when value <= limit). False where more is no cost
    # (a larger free block serves a larger request): a limit on it fails on improvements.
    larger_is_worse: bool = True
    per_step: bool = False  # bytes per counted step (step_growth)
    at_peak: bool = False  # of the blocks live at the peak moment (a profile's: its largest peak's device)
    # The facts it needs beside Fact.MEMORY: where a loader says a profile lacks one, the metric is not measurable
    # with the loader's reason (not_measurable).
    needs: frozenset[Fact] = frozenset()
    # Where a snapshot without history cannot measure it: the metric that judges the pool at the dump instead.
    stand_in: str | None = None
    formats: tuple[str, ...] = ()  # the only formats that record its source; () = any format that records it
    baselined: bool = True  # saved in a baseline (who held the peak is no number a baseline compares)
    nullable: bool = True  # null in the report when not measurable; else an empty {} or []
    detail_of: str | None = None  # a figure that qualifies another metric (not in METRIC_KEYS)
    # Absent from a device's metrics (not null, not said missing) where not measured: a figure only some
    # recordings carry (a tracked recording's categories), so every other profile reports as before.
    optional: bool = False

    @property
    def kind(self) -> BudgetKind:
        """``"size"`` or ``"ratio"``: how budgets, compare and the reports judge and print the value."""
        if self.unit == "ratio":
            return "ratio"
        if self.unit == "bytes" and self.shape == "value":
            return "size"
        raise ValueError(f"{self.key} is no single size or ratio (unit {self.unit}, shape {self.shape})")

    @property
    def empty(self) -> None | dict[str, int] | list[dict[str, object]]:
        """The value when it is not measurable: None, or an empty dict / list where the report never holds null."""
        if self.nullable:
            return None
        return [] if self.shape == "blocks" else {}


_SNAPSHOTS = ("torch_snapshot", "torch_recording")  # a recording carries a snapshot beside its trace
_PEAK = frozenset({Fact.HISTORY, Fact.TOTALS})  # a level over the window: its history and the level it stood at
_HELD = frozenset({Fact.HISTORY, Fact.PAIRING})  # the blocks live at a moment: every allocation and its free

SPECS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "peak_allocated_bytes", "bytes", "framework series",
        "max of the framework series' allocated bytes: what the run needed at its worst moment",
        budget=Budgeted("peak_allocated"), needs=_PEAK | {Fact.WINDOW_START}),
    MetricSpec(
        "peak_requested_bytes", "bytes", "requested sizes",
        "snapshot: the allocated peak in the bytes the program requested (before the allocator's rounding)",
        needs=frozenset({Fact.HISTORY}), formats=_SNAPSHOTS),
    MetricSpec(
        "peak_reserved_bytes", "bytes", "framework series",
        "max of the framework series' reserved bytes: what it took from the device",
        budget=Budgeted("peak_reserved"), needs=_PEAK),
    MetricSpec(
        "peak_app_reserved_bytes", "bytes", "APP series",
        "max of the whole-process (APP) reserved bytes: what the device saw the process hold",
        budget=Budgeted("peak_app_reserved"),
        formats=("torch_npu", "ascend_db", "mindspore", "cann", "torch_recording")),
    MetricSpec(
        "fragmentation", "ratio", "allocator pools",
        "per allocator pool 1 − peak allocated ÷ peak reserved; the worst pool (named)",
        budget=Budgeted("fragmentation"), needs=_PEAK, stand_in="free_block_fragmentation"),
    MetricSpec(
        "external_fragmentation", "ratio", "allocator pools",
        "per pool, at each growth of reserved: the free share of the pool just before it grew ÷ reserved just "
        "after; the largest (0: the pool never grew with memory free)",
        budget=Budgeted("external_fragmentation"), needs=_PEAK,
        stand_in="free_block_fragmentation"),
    MetricSpec(
        "step_growth_bytes", "bytes", "framework series",
        "bytes per step of persistent growth over the counted steps (one-time jumps and periodic patterns do not "
        "move it)",
        budget=Budgeted("step_growth", suggest="least"), per_step=True, needs=frozenset({Fact.HISTORY})),
    MetricSpec(
        "leaked_bytes", "bytes", "blocks",
        "bytes of blocks allocated in a counted step (except the last leak_horizon_steps) and still live when the "
        "last counted step ends",
        budget=Budgeted("leaked", suggest="least"), needs=_HELD | {Fact.BLOCKS}),
    MetricSpec(
        "leak_undetermined_bytes", "bytes", "blocks",
        "bytes allocated in the last leak_horizon_steps counted steps and still live at the end",
        budget=Budgeted("leak_undetermined", suggest="worst, no floor"), needs=_HELD | {Fact.BLOCKS}),
    MetricSpec(
        "allocated_at_dump_bytes", "bytes", "pool at the dump",
        "snapshot: bytes of active blocks when it was dumped",
        budget=Budgeted("allocated_at_dump"), formats=_SNAPSHOTS),
    MetricSpec(
        "reserved_at_dump_bytes", "bytes", "pool at the dump",
        "snapshot: bytes of all segments when it was dumped",
        budget=Budgeted("reserved_at_dump"), formats=_SNAPSHOTS),
    MetricSpec(
        "largest_free_block_bytes", "bytes", "pool at the dump",
        "snapshot: the largest cached (inactive) block at the dump",
        budget=Budgeted("largest_free_block", suggest="never", not_suggested=(
            "a larger free block is no regression (use free_block_fragmentation, reserved_at_dump)")),
        larger_is_worse=False, formats=_SNAPSHOTS),
    MetricSpec(
        "free_block_fragmentation", "ratio", "pool at the dump",
        "snapshot: 1 − largest inactive block ÷ all inactive bytes",
        budget=Budgeted("free_block_fragmentation"), formats=_SNAPSHOTS),
    MetricSpec(
        "op_max_block_bytes", "bytes", "blocks",
        "per operator, the largest single block it allocated (op_caps budgets it by glob)",
        shape="by name", needs=frozenset({Fact.BLOCKS, Fact.OPERATORS})),
    MetricSpec(
        "top_at_peak", "bytes", "blocks",
        "the largest blocks live at the peak moment, with op, owner, stream and component: who holds the peak",
        shape="blocks", at_peak=True, needs=_HELD | {Fact.BLOCKS}, baselined=False, nullable=False),
    MetricSpec(
        "op_bytes_at_peak", "bytes", "blocks",
        "bytes of the blocks live at the peak per operator: the 10 largest, the rest under (other)",
        shape="by name", at_peak=True, needs=_HELD | {Fact.OPERATORS}, nullable=False),
    MetricSpec(
        "owner_bytes_at_peak", "bytes", "blocks",
        "bytes of the blocks live at the peak per owner (innermost nn.Module, user frame or msMemScope owner): the "
        "10 largest, the rest under (other); owner_caps budgets them by glob",
        shape="by name", at_peak=True, needs=_HELD, nullable=False),
    MetricSpec(
        "category_bytes_at_peak", "bytes", "blocks",
        "bytes of the blocks live at the peak per category (parameters, buffers, gradients, optimizer_state, "
        "activations, other), attributed by address and lifetime to the storages a tracked recording noted; "
        "category_caps budgets them",
        shape="by name", at_peak=True, needs=_HELD, nullable=False, optional=True, formats=("torch_recording",)),
    MetricSpec(
        "live_at_peak_count", "count", "blocks",
        "how many blocks are live at the peak (top_at_peak lists only the largest of them)",
        at_peak=True, baselined=False, detail_of="top_at_peak"),
    MetricSpec(
        "oom_count", "count", "out-of-memory events",
        "out-of-memory errors in the window (a snapshot's oom entries, a recording stopped by one); the oom budget "
        "key limits them (oom = 0)",
        baselined=False, formats=_SNAPSHOTS),
    MetricSpec(
        "ooms", "bytes", "out-of-memory events",
        "each out-of-memory error: the request that did not fit, the device's free memory, allocated and reserved "
        "then, its step, and the blocks live at that moment (the holders)",
        shape="blocks", baselined=False, nullable=False, detail_of="oom_count"),
)

SPEC_OF: dict[str, MetricSpec] = {spec.key: spec for spec in SPECS}
# Budget keys judged beside the device metrics (no report key), each with the metric whose history it reads:
# where a loader says that metric is not measurable on a device, so is the budget key, for the same reason.
# left_allocated reads what leaked_bytes reads: blocks allocated in the window, paired with their frees.
LEFT_ALLOCATED = "left_allocated"  # bytes allocated in the window and still allocated at its end (memgate.leftover)
HISTORY_OF: dict[str, str] = {LEFT_ALLOCATED: "leaked_bytes"}
# The budget key judged beside the metrics on oom_count: how many out-of-memory errors the window may hold.
OOM = "oom"
OOM_KEY = "oom_count"
# The metrics of a device, in report order (DeviceMetrics.values holds these, then their details).
METRIC_KEYS: tuple[str, ...] = tuple(spec.key for spec in SPECS if spec.detail_of is None)
# The metrics absent from a device's metrics where not measured (MetricSpec.optional).
OPTIONAL_KEYS: tuple[str, ...] = tuple(spec.key for spec in SPECS if spec.optional)
# Budget key → spec, in the order budgets, reports and suggestions list them.
BUDGET_SPECS: dict[str, MetricSpec] = {spec.budget.key: spec for spec in SPECS if spec.budget is not None}


def budget_limits(specs: tuple[MetricSpec, ...] = SPECS) -> dict[str, tuple[str, str]]:
    """Budget key → (report key, kind): what :data:`memgate.budgets.LIMITS` holds, in its order."""
    return {spec.budget.key: (spec.key, spec.kind) for spec in specs if spec.budget is not None}


def budget_keys_suggested(*rules: Suggest) -> tuple[str, ...]:
    """The budget keys whose limit ``memgate suggest`` proposes by one of ``rules``, in budget-key order."""
    return tuple(key for key, spec in BUDGET_SPECS.items() if spec.budget is not None and spec.budget.suggest in rules)


def not_suggested() -> dict[str, str]:
    """Budget key → why ``memgate suggest`` proposes no limit for it."""
    return {key: spec.budget.not_suggested for key, spec in BUDGET_SPECS.items()
            if spec.budget is not None and spec.budget.suggest == "never"}


def budget_key(report_key: str) -> str:
    """The budget key that judges a report key (``peak_allocated_bytes`` → ``peak_allocated``)."""
    budget = SPEC_OF[report_key].budget
    if budget is None:
        raise KeyError(f"{report_key} has no budget key")
    return budget.key


def keys_where(*, unit: Unit | None = None, shape: Shape | None = None, source: Source | None = None,
               needs: Fact | None = None, baselined: bool | None = None) -> tuple[str, ...]:
    """The report keys of the specs that match every given field, in :data:`SPECS` order."""
    return tuple(spec.key for spec in SPECS
                 if (unit is None or spec.unit == unit) and (shape is None or spec.shape == shape)
                 and (source is None or spec.source == source)
                 and (needs is None or needs in spec.needs)
                 and (baselined is None or spec.baselined == baselined))


def not_measurable(lacks: Mapping[Fact, str], *, stand_ins: bool = False,
                   specs: tuple[MetricSpec, ...] = SPECS) -> dict[str, str]:
    """Report key → why, for what a profile lacking ``lacks`` (fact → why, as its loader says) cannot measure:
    every metric whose spec needs a lacked fact (every one for Fact.MEMORY), with the first lacked fact's reason,
    facts in the order given and each fact's metrics in table order. Details follow their metric, and an optional
    metric is absent rather than not measurable, so neither is listed. ``stand_ins``: where the profile holds the
    pool at the dump (a snapshot), a reason names the metric that judges it instead (MetricSpec.stand_in)."""
    why: dict[str, str] = {}
    for fact, reason in lacks.items():
        for spec in specs:
            if (fact is Fact.MEMORY or fact in spec.needs) and spec.detail_of is None and not spec.optional:
                stand_in = f"; {spec.stand_in} judges the pool at the dump" if stand_ins and spec.stand_in else ""
                why.setdefault(spec.key, reason + stand_in)
    return why


def regained(unmeasured: Mapping[str, str], fact: Fact) -> dict[str, str]:
    """``unmeasured`` (report key → why) less the metrics that need ``fact``: what stays not measurable where another
    file of the profile records the fact (a recording's snapshot names the operators its trace lacks)."""
    return {key: why for key, why in unmeasured.items() if fact not in SPEC_OF[key].needs}


def details_of(key: str) -> tuple[str, ...]:
    """The report keys that qualify ``key`` (``top_at_peak`` → ``live_at_peak_count``)."""
    return tuple(spec.key for spec in SPECS if spec.detail_of == key)


def _check(specs: tuple[MetricSpec, ...]) -> None:
    """What the table must hold for the lists derived from it to be right (checked on import)."""
    keys = [spec.key for spec in specs]
    budget_keys = [spec.budget.key for spec in specs if spec.budget is not None]
    for what, names in (("report key", keys), ("budget key", budget_keys)):
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"metric specs: {what} listed twice: {', '.join(twice)}")
    history = {spec.key for spec in specs if Fact.HISTORY in spec.needs}
    for key, metric in HISTORY_OF.items():
        if key in keys or key in budget_keys or metric not in history:
            raise ValueError(f"metric specs: {key} must be no metric and read the history of one that needs it")
    for spec in specs:
        if spec.budget is not None:
            _ = spec.kind  # raises where a budgeted metric is no single size or ratio
            if (spec.budget.suggest == "never") != bool(spec.budget.not_suggested):
                raise ValueError(f"metric specs: {spec.key}: a metric never suggested says why, and only it")
        if not spec.larger_is_worse and (spec.budget is None or spec.budget.suggest != "never"):
            raise ValueError(f"metric specs: {spec.key}: a limit on what is no cost is never suggested")
        if spec.detail_of is not None and spec.detail_of not in keys:
            raise ValueError(f"metric specs: {spec.key} qualifies {spec.detail_of}, which is no metric")
        if spec.stand_in is not None and (spec.stand_in not in keys or Fact.HISTORY not in spec.needs):
            raise ValueError(f"metric specs: {spec.key}: a stand-in is a metric, for one a snapshot without history "
                             "cannot measure")
        if spec.detail_of is not None and spec.needs:
            raise ValueError(f"metric specs: {spec.key}: a detail needs what the metric it qualifies needs")
        if spec.optional and (spec.nullable or spec.budget is not None):
            raise ValueError(f"metric specs: {spec.key}: an optional metric is absent, never null, and no budget "
                             "key judges it directly")


_check(SPECS)

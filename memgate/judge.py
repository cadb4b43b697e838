"""Judging a profile against the budgets (:mod:`memgate.budgets` declares them). Pure.

A check is one (profile, budget, metric): :func:`judge` finds the value on every device the budget
selects, resolves the limit there (a share of the capacity: :func:`resolve_limit`), and keeps the
worst device as the :class:`~memgate.verdict.Outcome`. ``rank_imbalance`` is judged over every
profile a budget selects (:func:`judge_rank_imbalance`). A metric the profile cannot support raises
:class:`~memgate.errors.NotMeasurable` naming what is missing, never a silent pass. A budget that selects
none of a profile's devices is not selected there (a skip); one that selects no device of any profile of the
run is an error (:func:`selects_nothing`), unless the run allows it (``--memgate-allow-unselected``).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from memgate.budgets import CROSS_RANK, LEFT, LIMITS, Budget
from memgate.errors import ConfigError, MemgateError, NotMeasurable, NotSelected, SelectsNothing, printable
from memgate.leftover import LeftOn, left_on
from memgate.metric_cache import MetricCache
from memgate.metric_specs import OOM, OOM_KEY
from memgate.metrics import DeviceMetrics, grown_blocks
from memgate.model import ProfileInfo
from memgate.owners import respelled_glob
from memgate.rows import CheckRow, RankSpread
from memgate.sizes import format_share, format_size
from memgate.verdict import Blocks, Outcome, format_value, oom_cause, source_lines, verdict_line

# A device's value of a check, the device, and what the verdict line adds after the device
Candidate = tuple[int | float, DeviceMetrics, str]


def capacity_of(info: ProfileInfo, device: str, budget: Budget) -> tuple[int | None, str]:
    """The device's capacity in bytes and where it came from: the profile, else the budget's ``device_capacity``."""
    recorded = (info.metadata.get("device_capacity_bytes") or {}).get(device)
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0:
        return recorded, "recorded in the profile"
    if budget.device_capacity is not None:
        return budget.device_capacity, f"device_capacity of budget {budget.name!r}"
    return None, ""


def resolve_limit(info: ProfileInfo, device: str, budget: Budget, metric: str) -> tuple[int | float, str]:
    """The limit of ``metric`` in bytes (or a ratio) on ``device``, and how a share of the capacity resolved."""
    if metric not in budget.shares:
        limit = budget.declared_limit(metric)
        assert not isinstance(limit, str)
        return limit, ""
    share = budget.shares[metric]
    capacity, source = capacity_of(info, device, budget)
    if capacity is None:
        raise ConfigError(f"{budget.name}.{metric} = {format_share(share)} needs the capacity of {device}, "
                          "which the profile does not record", file=info.path,
                          expected=f'device_capacity = "64 GiB" (the device\'s memory) in budget {budget.name!r}')
    limit = int(share * capacity)
    return limit, f"limit {format_share(share)} of {format_size(capacity)} ({source}) = {limit} bytes"


def selects_device(budget: Budget, device: str) -> bool:
    """Whether one of the budget's ``devices`` globs matches ``device``."""
    return any(fnmatch.fnmatchcase(device, g.strip()) for g in budget.devices.split(","))


def selected_devices(cache: MetricCache, budget: Budget) -> list[DeviceMetrics]:
    """The profile's devices the budget's ``devices`` globs select."""
    return [m for m in cache.get(budget.options) if selects_device(budget, m.device)]


# ---- what a budget selects in the whole run ------------------------------------------------------

ALLOW_UNSELECTED = "--memgate-allow-unselected where they are optional"  # memgate check takes it too
_LISTED = 10  # ranks or devices named in the error, the rest counted


@dataclass(frozen=True)
class Offered:
    """What one profile of a run offers a budget's ``ranks`` and ``devices``: its rank and its devices."""

    rank: str
    devices: tuple[str, ...]

    @classmethod
    def of_entry(cls, entry: dict[str, Any]) -> Offered:
        """From a profile's report entry (:func:`memgate.report.profile_entry`)."""
        return cls(str(entry["rank"]), tuple(str(d["device"]) for d in entry["devices"]))


def selects_any(budget: Budget, offered: Offered) -> bool:
    """Whether the budget selects the profile's rank and one of its devices."""
    return budget.selects_rank(offered.rank) and any(selects_device(budget, d) for d in offered.devices)


def selects_nothing(budget: Budget, offered: Sequence[Offered], where: str = "the run",
                    has: str = "it has") -> SelectsNothing | None:
    """The error where ``budget`` selects no device of any profile of a run (``offered``: each readable
    profile's rank and devices; ``where`` / ``has``: how the message names them), naming what it selects and
    what the run has; None where it selects one, or where the run has no readable profile (its load errors
    say what is wrong)."""
    if not offered or any(selects_any(budget, o) for o in offered):
        return None
    ranked = [o for o in offered if budget.selects_rank(o.rank)]
    if not ranked:
        what = f"ranks {budget.ranks!r} selects no rank of {where} ({has} {_listed(o.rank for o in offered)})"
    elif len(ranked) == len(offered):
        what = (f"devices {budget.devices!r} selects no device of {where} "
                f"({has} {_listed(d for o in offered for d in o.devices)})")
    else:
        what = (f"devices {budget.devices!r} selects no device of the ranks {budget.ranks!r} selects in {where} "
                f"(they have {_listed(d for o in ranked for d in o.devices)})")
    return SelectsNothing(f"budget {budget.name!r}: {what}",
                          expected=f"ranks and devices that select a device of {where}, or {ALLOW_UNSELECTED}")


def _listed(names: Iterable[str]) -> str:
    """Each name once, in the run's order; past ``_LISTED``, how many more."""
    unique = list(dict.fromkeys(names))
    more = f" and {len(unique) - _LISTED} more" if len(unique) > _LISTED else ""
    return (", ".join(unique[:_LISTED]) or "none") + more


def judge_selection(budgets: Sequence[Budget], offered: Sequence[Offered], root: str) -> dict[str, list[CheckRow]]:
    """Budget name → an error row per check, for each budget that selects no device of the run."""
    rows = {}
    for budget in budgets:
        error = selects_nothing(budget, offered)
        if error is not None:
            rows[budget.name] = [CheckRow.unjudged(None, root, budget, metric, error) for metric in budget.checks()]
    return rows


def _op_cap(devices: list[DeviceMetrics], metric: str, path: str) -> list[Candidate]:
    """``op_caps[glob]``: per device, the largest block of an operator the glob matches."""
    glob = metric[len("op_caps["):-1]
    candidates: list[Candidate] = []
    for m in devices:
        ops = m.values.get("op_max_block_bytes") or {}
        matching = {op: size for op, size in ops.items() if fnmatch.fnmatchcase(op, glob)}
        if matching:
            op = max(matching, key=lambda o: (matching[o], o))
            candidates.append((matching[op], m, f"op {op}"))
    if not candidates:
        reasons = "; ".join(m.missing.get("op_max_block_bytes", "") for m in devices if m.missing.get("op_max_block_bytes"))
        raise NotMeasurable(f"{metric}: no operator name matches {glob!r}" + (f" ({reasons})" if reasons else ""),
                            file=path)
    return candidates


def _owner_cap(devices: list[DeviceMetrics], glob: str) -> list[Candidate]:
    """Per device: the bytes at the peak of the owners matching ``glob``, summed, and the largest of them."""
    out = []
    for m in devices:
        owners = m.values.get("owner_bytes_at_peak")
        if not isinstance(owners, dict):
            continue
        matching = {o: size for o, size in owners.items() if fnmatch.fnmatchcase(o, glob)}
        if matching:
            top = max(matching, key=lambda o: (matching[o], o))
            out.append((sum(matching.values()), m, f"largest owner {top} {format_size(matching[top])}"))
    return out


def _owner_caps(devices: list[DeviceMetrics], metric: str, path: str) -> list[Candidate]:
    """``owner_caps[glob]``: per device, the bytes the matching owners hold at the peak."""
    glob = metric[len("owner_caps["):-1]
    candidates = _owner_cap(devices, glob)
    if not candidates:
        known = sorted({o for m in devices for o in (m.values.get("owner_bytes_at_peak") or {})})
        respelled = respelled_glob(glob)
        raise NotMeasurable(f"{metric}: no owner of a block live at the peak matches {glob!r}"
                            + (f" (owners: {', '.join(known[:10])})" if known else " (the profile records no owners)")
                            + (f"; a Python frame owner is spelled 'function (file:line)': {respelled!r}?"
                               if respelled is not None else ""),
                            file=path)
    return candidates


def _category_caps(devices: list[DeviceMetrics], metric: str, path: str) -> list[Candidate]:
    """``category_caps[category]``: per device, the bytes of that category live at the peak."""
    category = metric[len("category_caps["):-1]
    candidates: list[Candidate] = []
    for m in devices:
        by_category = m.values.get("category_bytes_at_peak")
        if isinstance(by_category, dict) and by_category:
            step = f", step {m.peak_step}" if m.peak_step is not None else ""
            candidates.append((int(by_category.get(category, 0)), m, f"{category} at the peak{step}"))
    if not candidates:
        raise NotMeasurable(f"{metric}: the profile records no categories: record it with memgate_record (or "
                            "memgate.record) and track the model and optimizer (rec.track(model, optimizer))",
                            file=path)
    return candidates


def _left_allocated(cache: MetricCache, devices: list[DeviceMetrics], path: str) -> tuple[list[Candidate],
                                                                                             dict[str, LeftOn]]:
    """``left_allocated``: per device, the bytes allocated in the window and still allocated at its end
    (:mod:`memgate.leftover`); and each device's blocks left, for the holders."""
    wanted = {m.device for m in devices}
    left = {d.device: left_on(cache.profile, d) for d in cache.profile.devices if d.device in wanted}
    candidates: list[Candidate] = []
    for m in devices:
        found = left.get(m.device)
        if found is not None and found.bytes is not None:
            candidates.append((found.bytes, m, f"{found.count} block(s) still allocated at the end of the window"))
    if not candidates:
        why = "; ".join(f"{d}: {f.why}" for d, f in left.items()) or "no device"
        raise NotMeasurable(f"{LEFT} is not measurable: {why}", file=path)
    return candidates, left


def _out_of_memory(devices: list[DeviceMetrics], path: str) -> list[Candidate]:
    """``oom``: per device, how many out-of-memory errors its window holds, the last one in words."""
    candidates: list[Candidate] = []
    for m in devices:
        count = m.values.get(OOM_KEY)
        if count is None:
            continue
        ooms = m.values.get("ooms") or []
        last = ooms[-1] if ooms else {}
        extra = []
        if last.get("step") is not None:
            extra.append(f"step {last['step']}")
        if isinstance(last.get("size"), int):
            extra.append(f"a request of {format_size(last['size'])} did not fit")
        candidates.append((int(count), m, ", ".join(extra)))
    if not candidates:
        why = "; ".join(f"{m.device}: {m.missing.get(OOM_KEY, 'no data')}" for m in devices)
        raise NotMeasurable(f"{OOM} is not measurable: {why}", file=path)
    return candidates


def _measured(devices: list[DeviceMetrics], metric: str, path: str) -> list[Candidate]:
    """A budget key of LIMITS: per device its value, with the step, pool and note the verdict names."""
    key = LIMITS[metric][0]
    measured = [(m.values[key], m) for m in devices if m.values.get(key) is not None]
    if not measured:
        why = "; ".join(f"{m.device}: {m.missing.get(key, 'no data')}" for m in devices)
        raise NotMeasurable(f"{metric} is not measurable: {why}", file=path)
    candidates: list[Candidate] = []
    for value, m in measured:
        extras = []
        if m.peak_step is not None and metric == "peak_allocated":
            extras.append(f"step {m.peak_step}")
        if key in m.pool_of:
            extras.append(f"pool {m.pool_of[key]}")
        if key in m.notes:
            extras.append(m.notes[key])
        candidates.append((value, m, ", ".join(extras)))
    return candidates


def judge(cache: MetricCache, budget: Budget, metric: str) -> Outcome:
    """Judge one (profile, budget, metric); raise NotMeasurable when the profile lacks the data."""
    profile = cache.info
    devices = selected_devices(cache, budget)
    if not devices:
        raise NotSelected(f"not selected: budget {budget.name!r} selects devices={budget.devices!r}, the profile has "
                          f"{', '.join(d.device for d in cache.get(budget.options)) or 'none'}", file=profile.path)
    left: dict[str, LeftOn] = {}  # left_allocated: each device's blocks left, its failure's cause
    if metric.startswith("op_caps["):
        candidates, kind = _op_cap(devices, metric, profile.path), "size"
    elif metric.startswith("owner_caps["):
        candidates, kind = _owner_caps(devices, metric, profile.path), "size"
    elif metric.startswith("category_caps["):
        candidates, kind = _category_caps(devices, metric, profile.path), "size"
    elif metric == LEFT:
        (candidates, left), kind = _left_allocated(cache, devices, profile.path), "size"
    elif metric == OOM:
        candidates, kind = _out_of_memory(devices, profile.path), "count"
    else:
        candidates, kind = _measured(devices, metric, profile.path), LIMITS[metric][1]
    # The worst device: the most over (or least under) its limit; with one limit for all, the largest value.
    judged = []
    for value, m, extra in candidates:
        limit, resolved = resolve_limit(profile, m.device, budget, metric)
        judged.append((value - limit, value, limit, m, ", ".join(x for x in (extra, resolved) if x)))
    _, value, limit, worst, extra = max(judged, key=lambda c: c[0])
    estimate = profile.metadata.get("estimate")  # memgate.estimate's figures: never shown as a measurement
    named = f" (estimate for {estimate.get('device')})" if isinstance(estimate, dict) else ""
    where = f"rank {profile.rank} {worst.device}{named}" + (f", {extra}" if extra else "")
    passed = value <= limit
    return Outcome(
        profile_path=profile.path,
        rank=profile.rank,
        budget=budget.name,
        metric=metric,
        limit=limit,
        value=value,
        passed=passed,
        device=worst.device,
        step=None if metric == LEFT else _oom_step(worst) if metric == OOM else worst.peak_step,
        message=verdict_line(metric, kind, value, limit, where),
        holders=tuple(worst.values.get("top_at_peak") or ()),
        where=source_lines(worst, profile),
        share=budget.shares.get(metric),
        live_count=worst.values.get("live_at_peak_count"),
        categories=dict(worst.values.get("category_bytes_at_peak") or {}) if _at_the_peak(metric) else {},
        cause=None if passed else _cause(cache, budget, metric, worst, left),
    )


def _oom_step(metrics: DeviceMetrics) -> int | None:
    """The step of the device's last out-of-memory error."""
    ooms = metrics.values.get("ooms") or []
    return ooms[-1].get("step") if ooms else None


def _cause(cache: MetricCache, budget: Budget, metric: str, worst: DeviceMetrics,
           left: dict[str, LeftOn]) -> Blocks | None:
    """What a failed left_allocated, step_growth, leaked or oom check is about: the blocks left at the end
    of the window, those allocated in the counted steps and still live when they ended
    (:func:`memgate.metrics.grown_blocks`), or the out-of-memory error and the blocks live at it; None for
    checks measured at the peak."""
    device = worst.device
    if metric == OOM:
        ooms = worst.values.get("ooms") or []
        return oom_cause(ooms[-1], device) if ooms else None
    if metric == LEFT:
        gone = left[device]
        return Blocks(f"left allocated at the end of the window ({device})", tuple(gone.holders), gone.count,
                      gone.bytes)
    if metric not in ("step_growth", "leaked"):
        return None
    model = next((d for d in cache.profile.devices if d.device == device), None)
    grown = grown_blocks(cache.profile, model, budget.options, undetermined=metric == "step_growth") \
        if model is not None else None
    if grown is None or not grown.count:
        return None
    return Blocks(f"{'grew' if metric == 'step_growth' else 'leaked'}: {grown.steps} ({device})",
                  tuple(grown.holders), grown.count, grown.total)


def _at_the_peak(metric: str) -> bool:
    """A check whose value is measured at the allocated peak: its failure shows the peak by category."""
    return metric == "peak_allocated" or metric.startswith(("category_caps[", "owner_caps["))


def judge_profile(cache: MetricCache, budgets: Sequence[Budget]) -> list[CheckRow]:
    """The rows of every budget that selects this profile's rank: each check's verdict, or why it
    could not be judged."""
    profile = cache.info
    rows = []
    for budget in budgets:
        if not budget.selects_rank(profile.rank):
            continue
        for metric in budget.checks():
            try:
                rows.append(CheckRow.judged(judge(cache, budget, metric)))
            except MemgateError as exc:
                rows.append(CheckRow.unjudged(profile, profile.path, budget, metric, exc))
    return rows


# ---- across ranks --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RankValue:
    """One profile's value of a metric, as a rank_imbalance judges it (its worst selected device)."""

    profile: str
    rank: str
    value: int | float | None
    device: str | None
    why: str = ""  # when value is None: why the profile could not be measured


def rank_value(cache: MetricCache, budget: Budget, metric: str) -> RankValue:
    """The value of budget key ``metric`` on this profile's worst device the budget selects."""
    info = cache.info
    key = LIMITS[metric][0]
    devices = selected_devices(cache, budget)
    measured = [(m.values[key], m.device) for m in devices if m.values.get(key) is not None]
    if not measured:
        why = "; ".join(f"{m.device}: {m.missing.get(key, 'no data')}" for m in devices) or "no device selected"
        return RankValue(info.path, info.rank, None, None, why)
    value, device = max(measured, key=lambda c: c[0])
    return RankValue(info.path, info.rank, value, device)


def rank_values(cache: MetricCache, budgets: Sequence[Budget]) -> dict[tuple[str, str], RankValue]:
    """This profile's value of every metric a budget's rank_imbalance asks for (where it selects the rank)."""
    out = {}
    for budget in budgets:
        if budget.rank_imbalance and budget.selects_rank(cache.info.rank):
            for metric in budget.rank_imbalance:
                try:
                    out[(budget.name, metric)] = rank_value(cache, budget, metric)
                except MemgateError as exc:
                    out[(budget.name, metric)] = RankValue(cache.info.path, cache.info.rank, None, None, exc.one_line())
    return out


def judge_rank_imbalance(budget: Budget, metric: str, values: Sequence[RankValue], root: str = "") -> CheckRow:
    """``rank_imbalance[metric]`` over the profiles the budget selects: ``1 - min/max``, as a row.

    Raises NotMeasurable when fewer than two selected profiles measure the metric.
    """
    check = f"{CROSS_RANK}[{metric}]"
    limit = budget.rank_imbalance[metric]
    selected = [v for v in values if budget.selects_rank(v.rank)]
    missing = [v for v in selected if v.value is None]
    if missing:
        raise NotMeasurable(f"{check}: {metric} is not measurable on rank {missing[0].rank}: {missing[0].why}",
                            file=missing[0].profile)
    if len(selected) < 2:
        raise NotMeasurable(f"{check} needs at least two ranks; budget {budget.name!r} selects "
                            f"{len(selected)} profile(s) under {root or 'the root'} (ranks={budget.ranks!r})",
                            file=root or None)
    kind = LIMITS[metric][1]
    best = min(selected, key=lambda v: (v.value, v.rank))
    worst = max(selected, key=lambda v: (v.value, v.rank))
    assert best.value is not None and worst.value is not None
    ratio = 0.0 if worst.value <= 0 else 1 - best.value / worst.value
    passed = ratio <= limit
    word = "within" if passed else "exceeds"
    message = printable(f"{check} {ratio:.4f} {word} budget {limit:.4f} over {len(selected)} ranks — "
                        f"worst rank {worst.rank} {worst.device} {format_value(worst.value, kind)}, "
                        f"best rank {best.rank} {best.device} {format_value(best.value, kind)}")  # one line
    return CheckRow(root, ",".join(sorted({v.rank for v in selected})), budget.name, check, limit, ratio, passed,
                    worst.device, message, spread=RankSpread(worst.rank, best.rank, worst.value, best.value,
                                                             worst.profile, best.profile))


def judge_cross_rank(budgets: Sequence[Budget], values: Sequence[dict[tuple[str, str], RankValue]],
                     root: str) -> list[CheckRow]:
    """One row per (budget, rank_imbalance metric), over the per-profile values of every profile."""
    rows = []
    for budget in budgets:
        for metric in budget.rank_imbalance:
            check = f"{CROSS_RANK}[{metric}]"
            per_rank = [v[(budget.name, metric)] for v in values if (budget.name, metric) in v]
            try:
                rows.append(judge_rank_imbalance(budget, metric, per_rank, root))
            except MemgateError as exc:
                rows.append(CheckRow.unjudged(None, root, budget, check, exc))
    return rows

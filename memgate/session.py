"""The core the CLI and the pytest plugin share: discover, load, measure, judge (:mod:`memgate.judge`). No pytest here.

Each profile is processed on its own (:func:`process_profile`), so many ranks can be spread over
processes (``--jobs``): what comes back is plain JSON, small next to the profile itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memgate.budgets import LIMITS, Budget
from memgate.discover import Found, discover, load
from memgate.errors import MemgateError, NotMeasurable
from memgate.judge import RankValue, judge_profile, rank_values
from memgate.metric_cache import MetricCache
from memgate.metric_specs import SPEC_OF
from memgate.metrics import METRIC_KEYS, DeviceMetrics, MetricOptions, profile_metrics
from memgate.model import Profile
from memgate.progress import describe, progress
from memgate.report import profile_entry
from memgate.rows import CheckRow, ErrorRow

if TYPE_CHECKING:
    from memgate.cache import ProfileCache


@dataclass
class ProfileResult:
    """What one profile gives: its report entry and rows, or the error that stopped it."""

    path: str
    format: str
    entry: dict[str, Any] | None
    outcomes: list[CheckRow] = field(default_factory=list)
    error: MemgateError | None = None
    # (budget name, metric) → this profile's value, for the budgets' rank_imbalance (judged over all profiles)
    rank_values: dict[tuple[str, str], RankValue] = field(default_factory=dict)

    def error_row(self) -> ErrorRow:
        assert self.error is not None
        return ErrorRow(self.path, self.error.one_line())


def process_profile(
    found: Found,
    budgets: Sequence[Budget] = (),
    options: MetricOptions | None = None,
    cache: ProfileCache | None = None,
    thorough: bool = False,
) -> ProfileResult:
    """``thorough``: every part of the files checked (``memgate validate``), so no cached load stands in."""
    try:
        if cache is None or thorough:
            metrics = MetricCache(load(found, thorough=thorough))
        else:
            from memgate.cache import open_profile  # only with a cache: its store (xxhash, Arrow IPC) costs imports

            metrics = open_profile(found, cache)
        entry = profile_entry(metrics.info, metrics.get(options))
    except MemgateError as exc:
        return ProfileResult(str(found.path), found.format.name, None, error=exc)
    result = ProfileResult(metrics.info.path, metrics.info.format, entry, judge_profile(metrics, budgets))
    result.rank_values = rank_values(metrics, budgets)
    return result


def run_profiles(
    root: str | Path,
    budgets: Sequence[Budget] = (),
    *,
    options: MetricOptions | None = None,
    jobs: int = 1,
    cache: ProfileCache | None = None,
    write_progress: Callable[[str], None] | None = None,
    thorough: bool = False,
) -> list[ProfileResult]:
    """Every profile under ``root``, in discovery order; a bad one carries its error (``thorough``:
    :func:`process_profile`'s)."""
    found = discover(root)
    if jobs > 1 and len(found) > 1:
        from concurrent.futures import ProcessPoolExecutor  # multiprocessing: ~20 ms a one-process run skips

        with (progress(f"{len(found)} profiles on {jobs} processes", write_progress),
              ProcessPoolExecutor(max_workers=min(jobs, len(found))) as pool):
            futures = [pool.submit(process_profile, f, tuple(budgets), options, cache, thorough) for f in found]
            return [future.result() for future in futures]
    results = []
    for entry in found:
        label = functools.partial(describe, entry.path)  # computed only if the progress line shows
        with progress(label, write_progress):
            results.append(process_profile(entry, budgets, options, cache, thorough))
    return results


# ---- metrics for a test's own assertions ----------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    """One profile and its metrics, for assertions of your own (the ``memgate_load`` fixture).

    ``m["peak_allocated"]`` (a budget key) or ``m["peak_allocated_bytes"]`` (a JSON report key) is
    the profile's value, its worst device, as budgets judge it; a metric the profile cannot support
    raises :class:`memgate.errors.NotMeasurable` saying what is missing. ``metrics`` holds every
    value (None where not measurable), ``devices`` the per-device :class:`DeviceMetrics`, and
    ``profile`` the normalized model.
    """

    path: str
    format: str
    rank: str
    profile: Profile
    devices: tuple[DeviceMetrics, ...]

    @staticmethod
    def metric_key(key: str) -> str:
        """The JSON report key of a budget key (``peak_allocated`` → ``peak_allocated_bytes``)."""
        if key in LIMITS:
            return LIMITS[key][0]
        if key in METRIC_KEYS:
            return key
        raise KeyError(f"unknown metric {key!r}; one of {', '.join([*LIMITS, *METRIC_KEYS])}")

    @property
    def metrics(self) -> dict[str, Any]:
        """Every metric key → the worst device's value; op_max_block_bytes merged (largest per op);
        top_at_peak and the bytes at the peak by op, owner and category of the device with the largest peak_allocated."""
        values: dict[str, Any] = {}
        for key in METRIC_KEYS:
            measured = [m.values[key] for m in self.devices if m.values.get(key) is not None]
            if key == "op_max_block_bytes":
                merged: dict[str, int] = {}
                for ops in measured:
                    for op, size in ops.items():
                        merged[op] = max(size, merged.get(op, size))
                values[key] = merged
            elif key == "top_at_peak":
                peaks = [m for m in self.devices if m.values.get("peak_allocated_bytes") is not None]
                worst = max(peaks, key=lambda m: m.values["peak_allocated_bytes"]) if peaks else None
                values[key] = list(worst.values.get("top_at_peak") or []) if worst is not None else []
            elif SPEC_OF[key].at_peak and SPEC_OF[key].shape == "by name":  # bytes at the peak by name: the largest peak's
                peaks = [m for m in self.devices if m.values.get("peak_allocated_bytes") is not None]
                worst = max(peaks, key=lambda m: m.values["peak_allocated_bytes"]) if peaks else None
                values[key] = dict(worst.values.get(key) or {}) if worst is not None else {}
            else:
                values[key] = max(measured) if measured else None
        return values

    @property
    def not_measurable(self) -> dict[str, str]:
        """Metric key → why no device measured it."""
        out = {}
        for key in METRIC_KEYS:
            if all(m.values.get(key) is None for m in self.devices):
                reasons = [f"{m.device}: {m.missing[key]}" for m in self.devices if key in m.missing]
                out[key] = "; ".join(reasons) or "no device"
        return out

    def __getitem__(self, key: str) -> Any:
        metric = self.metric_key(key)
        value = self.metrics[metric]
        if value is None:
            raise NotMeasurable(f"{key} is not measurable: {self.not_measurable.get(metric, 'no device')}",
                                file=self.path)
        return value


def measure(path: str | Path, *, warmup_steps: int = 1, leak_horizon_steps: int = 1,
            component: str | None = None) -> list[Measured]:
    """Every profile under ``path``, loaded and measured (:class:`Measured`), in discovery order.

    The options are a budget's (``warmup_steps``, ``leak_horizon_steps``, ``component``). Bad input
    raises the memgate error that names the file.
    """
    options = MetricOptions(component, warmup_steps, leak_horizon_steps)
    measured = []
    for found in discover(path):
        profile = load(found)
        measured.append(Measured(profile.path, profile.format, profile.rank, profile,
                                 tuple(profile_metrics(profile, options))))
    return measured

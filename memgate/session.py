"""The core the CLI and the pytest plugin share: discover, load, measure, judge. No pytest here.

Each profile is processed on its own (:func:`process_profile`), so many ranks can be spread over
processes (``--jobs``): what comes back is plain JSON, small next to the profile itself.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgate.budgets import Budget, MetricCache, judge
from memgate.cache import ProfileCache, open_profile
from memgate.discover import Found, discover
from memgate.errors import MemgateError
from memgate.metrics import MetricOptions
from memgate.model import ProfileInfo
from memgate.progress import describe, progress
from memgate.report import outcome_entry, profile_entry


@dataclass
class ProfileResult:
    """What one profile gives: its report entry and verdicts, or the error that stopped it."""

    path: str
    format: str
    entry: dict[str, Any] | None
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    error: MemgateError | None = None

    def error_entry(self) -> dict[str, Any]:
        assert self.error is not None
        return {"profile": self.path, "error": self.error.one_line()}


def error_outcome(profile: ProfileInfo | None, path: str, budget: Budget, metric: str, error: MemgateError) -> dict[str, Any]:
    """The report entry of a (profile, budget, metric) that could not be judged."""
    limit = budget.limits.get(metric, budget.op_caps.get(metric[len("op_caps["):-1], 0))
    return {
        "profile": profile.path if profile else path, "rank": profile.rank if profile else "?",
        "budget": budget.name, "metric": metric, "limit": limit, "value": None, "passed": None,
        "device": None, "error": error.one_line(), "message": error.one_line(),
    }


def judge_profile(cache: MetricCache, budgets: Sequence[Budget]) -> list[dict[str, Any]]:
    """Verdicts of every budget that selects this profile's rank."""
    profile = cache.info
    outcomes = []
    for budget in budgets:
        if not budget.selects_rank(profile.rank):
            continue
        for metric in budget.checks():
            try:
                outcomes.append(outcome_entry(judge(cache, budget, metric)))
            except MemgateError as exc:
                outcomes.append(error_outcome(profile, profile.path, budget, metric, exc))
    return outcomes


def process_profile(
    found: Found,
    budgets: Sequence[Budget] = (),
    options: MetricOptions | None = None,
    cache: ProfileCache | None = None,
) -> ProfileResult:
    try:
        metrics = open_profile(found, cache)
        entry = profile_entry(metrics.info, metrics.get(options))
    except MemgateError as exc:
        return ProfileResult(str(found.path), found.format.name, None, error=exc)
    return ProfileResult(metrics.info.path, metrics.info.format, entry, judge_profile(metrics, budgets))


def run_profiles(
    root: str | Path,
    budgets: Sequence[Budget] = (),
    *,
    options: MetricOptions | None = None,
    jobs: int = 1,
    cache: ProfileCache | None = None,
    write_progress: Callable[[str], None] | None = None,
) -> list[ProfileResult]:
    """Every profile under ``root``, in discovery order; a bad one carries its error."""
    found = discover(root)
    if jobs > 1 and len(found) > 1:
        with (progress(f"{len(found)} profiles on {jobs} processes", write_progress),
              ProcessPoolExecutor(max_workers=min(jobs, len(found))) as pool):
            futures = [pool.submit(process_profile, f, tuple(budgets), options, cache) for f in found]
            return [future.result() for future in futures]
    results = []
    for entry in found:
        label = functools.partial(describe, entry.path)  # computed only if the progress line shows
        with progress(label, write_progress):
            results.append(process_profile(entry, budgets, options, cache))
    return results

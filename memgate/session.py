"""The core the CLI and the pytest plugin share: discover, load, measure, judge. No pytest here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from memgate.budgets import Budget, MetricCache, Outcome, judge
from memgate.discover import Found, discover, load
from memgate.errors import MemgateError
from memgate.model import Profile
from memgate.report import outcome_entry, profile_entry


@dataclass
class LoadedProfile:
    found: Found
    profile: Profile | None
    error: MemgateError | None
    cache: MetricCache | None = None

    @property
    def label(self) -> str:
        return self.profile.rank if self.profile else self.found.path.name


def load_all(root: str | Path) -> list[LoadedProfile]:
    """Every profile under ``root``; a bad one carries its error instead of stopping the rest."""
    result = []
    for found in discover(root):
        try:
            profile = load(found)
        except MemgateError as exc:
            result.append(LoadedProfile(found, None, exc))
            continue
        result.append(LoadedProfile(found, profile, None, MetricCache(profile)))
    return result


def judge_all(loaded: list[LoadedProfile], budgets: list[Budget] | tuple[Budget, ...]) -> tuple[list[dict], list[dict]]:
    """(outcome entries, error entries) for every (profile, budget, metric)."""
    outcomes: list[dict] = []
    errors: list[dict] = []
    for item in loaded:
        if item.error is not None:
            errors.append({"profile": str(item.found.path), "error": item.error.one_line()})
            continue
        assert item.profile is not None and item.cache is not None
        for budget in budgets:
            if not budget.selects_rank(item.profile.rank):
                continue
            for metric in budget.checks():
                try:
                    outcomes.append(outcome_entry(judge(item.cache, budget, metric)))
                except MemgateError as exc:
                    outcomes.append({
                        "profile": item.profile.path, "rank": item.profile.rank, "budget": budget.name,
                        "metric": metric, "limit": budget.limits.get(metric, budget.op_caps.get(metric[8:-1], 0)),
                        "value": None, "passed": None, "device": None, "error": exc.one_line(),
                        "message": exc.one_line(),
                    })
    return outcomes, errors


def profile_entries(loaded: list[LoadedProfile], warmup_steps: int = 1) -> list[dict]:
    return [
        profile_entry(item.profile, item.cache.get(None, warmup_steps))
        for item in loaded
        if item.profile is not None and item.cache is not None
    ]


def outcome_of(item: LoadedProfile, budget: Budget, metric: str) -> Outcome:
    if item.error is not None:
        raise item.error
    assert item.cache is not None
    return judge(item.cache, budget, metric)

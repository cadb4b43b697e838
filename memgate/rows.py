"""The rows of a run's report, typed: a :class:`CheckRow` per judged (profile, budget, metric) or
compare rule, an :class:`ErrorRow` for what stopped a profile or a test before any check, and the
:class:`ReportPayload` a test's report carries to the process that writes the outputs.

They become JSON (``as_json``) only at the edges: the JSON report, the payload a test report carries
(it travels through pytest-xdist as plain JSON), and the text and CI outputs that read the report's
form. ``as_json`` writes the keys in the order the JSON report always had them.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from memgate.errors import NotSelected

if TYPE_CHECKING:
    from memgate.budgets import Budget
    from memgate.compare import Regression
    from memgate.errors import MemgateError
    from memgate.model import ProfileInfo
    from memgate.verdict import Outcome


@dataclass(frozen=True)
class Declared:
    """Where a check is declared: a test's file, or the budget file, and the 1-based line."""

    file: str
    line: int | None

    def as_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Declared:
        return cls(data["file"], data["line"])


@dataclass(frozen=True)
class RankSpread:
    """A rank_imbalance row's two ends: the ranks with the largest and the smallest value."""

    worst_rank: str
    best_rank: str
    worst_value: int | float
    best_value: int | float
    worst_profile: str
    best_profile: str

    def as_json(self) -> dict[str, Any]:
        return {"worst_rank": self.worst_rank, "best_rank": self.best_rank, "worst_value": self.worst_value,
                "best_value": self.best_value, "worst_profile": self.worst_profile, "best_profile": self.best_profile}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankSpread:
        return cls(data["worst_rank"], data["best_rank"], data["worst_value"], data["best_value"],
                   data["worst_profile"], data["best_profile"])


@dataclass(frozen=True)
class AgainstBaseline:
    """A compare rule's row: the baseline value it was judged against, where that baseline is, what
    grew at the peak (:attr:`memgate.compare.Regression.attribution`) and the baseline's commit."""

    baseline_value: int | float | None
    baseline: str
    attribution: dict[str, list[dict[str, Any]]] | None
    baseline_commit: str | None

    def as_json(self) -> dict[str, Any]:
        return {"baseline_value": self.baseline_value, "baseline": self.baseline, "attribution": self.attribution,
                "baseline_commit": self.baseline_commit}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AgainstBaseline:
        return cls(data["baseline_value"], data["baseline"], data["attribution"], data["baseline_commit"])


@dataclass(frozen=True)
class CheckRow:
    """One row of the verdict table: a judged check, or one memgate could not judge (``error``) or
    that does not apply (``skipped``: a budget whose devices glob selects none of the profile's)."""

    profile: str
    rank: str
    budget: str
    metric: str
    limit: int | float
    value: int | float | None
    passed: bool | None  # None: not judged
    device: str | None
    message: str
    error: str | None = None
    skipped: str | None = None
    limit_share: float | None = None  # the limit as a share of the device's capacity, where written so
    limit_text: str | None = None  # a share of the capacity that could not be resolved, as written
    spread: RankSpread | None = None  # rank_imbalance rows
    against: AgainstBaseline | None = None  # compare-rule rows
    test: str | None = None  # the pytest item or marked test that judged it
    declared_in: Declared | None = None

    @classmethod
    def judged(cls, outcome: Outcome) -> CheckRow:
        return cls(outcome.profile_path, outcome.rank, outcome.budget, outcome.metric, outcome.limit, outcome.value,
                   outcome.passed, outcome.device, outcome.message, limit_share=outcome.share)

    @classmethod
    def unjudged(cls, profile: ProfileInfo | None, path: str, budget: Budget, metric: str,
                 error: MemgateError) -> CheckRow:
        """The row of a (profile, budget, metric) that could not be judged."""
        declared = budget.declared_limit(metric)
        text = error.one_line()
        skipped = isinstance(error, NotSelected)  # a budget for other devices: not an error
        return cls(
            profile.path if profile else path, profile.rank if profile else "", budget.name, metric,
            0 if isinstance(declared, str) else declared,  # a share of the capacity not resolved: limit_text says it
            None, None, None, text, error=None if skipped else text, skipped=text if skipped else None,
            limit_text=declared if isinstance(declared, str) else None)

    @classmethod
    def compared(cls, regression: Regression, profile: str, baseline: str, budget: str = "baseline") -> CheckRow:
        """A compare rule's verdict on ``profile`` against the baseline at ``baseline``; ``budget``: the
        row's name (a marked test's comparisons are named after the test)."""
        assert regression.allowed is not None  # a judged regression always has its allowance
        return cls(profile, regression.rank, budget, regression.metric, regression.allowed,
                   regression.value, regression.passed, regression.device, regression.message,
                   against=AgainstBaseline(regression.base, baseline, regression.attribution,
                                           regression.baseline_commit))

    @property
    def property_prefix(self) -> str:
        """The JUnit properties' prefix of this row: a comparison's are apart from a budget's of the same metric."""
        return f"memgate.baseline.{self.metric}" if self.against is not None else f"memgate.{self.metric}"

    def of_test(self, test: str, declared: Declared | None) -> CheckRow:
        """The row as the pytest item or marked test that judged it reports it."""
        return replace(self, test=test, declared_in=declared if declared is not None else self.declared_in)

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"profile": self.profile, "rank": self.rank, "budget": self.budget,
                               "metric": self.metric, "limit": self.limit, "value": self.value,
                               "passed": self.passed, "device": self.device}
        if self.skipped is not None:
            row["skipped"] = self.skipped
        if self.error is not None:
            row["error"] = self.error
        row["message"] = self.message
        if self.limit_share is not None:
            row["limit_share"] = self.limit_share
        if self.limit_text is not None:
            row["limit_text"] = self.limit_text
        if self.spread is not None:
            row.update(self.spread.as_json())
        if self.against is not None:
            row.update(self.against.as_json())
        if self.test is not None:
            row["test"] = self.test
        if self.declared_in is not None:
            row["declared_in"] = self.declared_in.as_json()
        return row

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckRow:
        return cls(
            data["profile"], data["rank"], data["budget"], data["metric"], data["limit"], data["value"],
            data["passed"], data["device"], data["message"], error=data.get("error"), skipped=data.get("skipped"),
            limit_share=data.get("limit_share"), limit_text=data.get("limit_text"),
            spread=RankSpread.from_json(data) if "worst_rank" in data else None,
            against=AgainstBaseline.from_json(data) if "baseline_value" in data else None,
            test=data.get("test"),
            declared_in=Declared.from_json(data["declared_in"]) if data.get("declared_in") is not None else None)


@dataclass(frozen=True)
class ErrorRow:
    """What stopped a profile (it could not be read) or a test (a bad marker, a profile root with no
    readable profile) before any check: the report's ``errors``."""

    profile: str | None
    error: str  # the one-line message
    test: str | None = None  # the pytest item or test it stopped
    declared_in: Declared | None = None

    def as_json(self) -> dict[str, Any]:
        if self.test is None:
            return {"profile": self.profile, "error": self.error}
        return {"item": self.test, "test": self.test, "profile": self.profile, "error": self.error,
                "declared_in": self.declared_in.as_json() if self.declared_in is not None else None}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ErrorRow:
        declared = data.get("declared_in")
        return cls(data.get("profile"), data["error"], data.get("test"),
                   Declared.from_json(declared) if declared is not None else None)


@dataclass
class ReportPayload:
    """What one pytest report carries to the process that writes the outputs: the test, its rows or
    its error, the profiles it measured (report entries: JSON already), where its recording was kept and
    what it left allocated. Only memgate's own items and marked tests have a ``test``; an unmarked
    test's only ``kept`` and ``left``."""

    test: str | None = None
    rows: list[CheckRow] = field(default_factory=list)
    error: ErrorRow | None = None
    marker_profiles: list[dict[str, Any]] = field(default_factory=list)
    kept: str | None = None
    profile: dict[str, Any] | None = None  # a --memgate profile's entry, attached to one report
    # --memgate-report-left: what a recorded test left allocated, per device (memgate.leftover.LeftOn.summary)
    left: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        if self.test is not None:
            payload["test"] = self.test
        if self.error is not None:
            payload["error"] = self.error.as_json()
        if self.rows:
            payload["outcomes"] = [row.as_json() for row in self.rows]
        if self.marker_profiles:
            payload["marker_profiles"] = self.marker_profiles
        if self.kept is not None:
            payload["kept"] = self.kept
        if self.profile is not None:
            payload["profile"] = self.profile
        if self.left:
            payload["left"] = self.left
        return payload

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReportPayload:
        return cls(data.get("test"), [CheckRow.from_json(o) for o in data.get("outcomes", [])],
                   ErrorRow.from_json(data["error"]) if "error" in data else None,
                   list(data.get("marker_profiles", [])), data.get("kept"), data.get("profile"),
                   list(data.get("left", [])))

"""The pytest plugin: a thin shell over :mod:`memgate.session`. The only module importing pytest.

- ``--memgate=PATH`` generates one item per (profile, budget, metric).
- ``@pytest.mark.memgate(...)`` gates a test's own profile after its body.
- Results travel on reports (``report.memgate``), so under pytest-xdist the controller alone prints
  the summary table and writes ``--memgate-json``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest
from _pytest._code.code import ExceptionChainRepr, ReprEntryNative, ReprFileLocation, ReprTraceback

from memgate.budgets import Budget, BudgetFile, MetricCache, Outcome, budget_from_mapping, find_budget_file, judge, load_budget_file
from memgate.discover import Found, discover, load
from memgate.errors import ConfigError, MemgateError
from memgate.model import Profile
from memgate.report import build_report, outcome_entry, profile_entry, summary_table, write_json_atomic

OPTIONS = {  # option dest → (ini name, help)
    "memgate": ("memgate", "profile root to gate: every profile under it is judged against the budgets"),
    "memgate_budgets": ("memgate_budgets", "budget file (memgate.toml or pyproject.toml); default: rootdir's"),
    "memgate_json": ("memgate_json", "write the JSON report (schemas/report.schema.json) to this file"),
}


class BudgetExceeded(Exception):
    """A measured value is over its limit; carries the failure line and detail section."""

    def __init__(self, line: str, detail: str) -> None:
        super().__init__(line)
        self.line = line
        self.detail = detail


class _State:
    """Per-session state, kept in ``config.stash``."""

    def __init__(self) -> None:
        self.root: Path | None = None
        self.budget_file: BudgetFile | None = None
        self.json_path: Path | None = None
        self.profiles: dict[str, tuple[Profile | None, MemgateError | None, MetricCache | None]] = {}
        self.outcomes: list[dict[str, Any]] = []
        self.profile_entries: dict[str, dict[str, Any]] = {}
        self.errors: list[dict[str, Any]] = []
        self.reported_profiles: set[str] = set()  # per process: attach each profile entry once

    def load(self, path: Path, loader: Callable[[], Profile]) -> tuple[Profile, MetricCache]:
        key = str(path)
        if key not in self.profiles:
            try:
                profile = loader()
                self.profiles[key] = (profile, None, MetricCache(profile))
            except MemgateError as exc:
                self.profiles[key] = (None, exc, None)
        profile_, error, cache = self.profiles[key]
        if error is not None:
            raise error
        assert profile_ is not None and cache is not None
        return profile_, cache


STATE = pytest.StashKey[_State]()
OUTCOME = pytest.StashKey[Outcome]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memgate", "memory budgets from profiler output")
    group.addoption("--memgate", action="store", nargs="?", const="", default=None, metavar="PATH",
                    dest="memgate", help=OPTIONS["memgate"][1] + " (bare --memgate: 'profiles' from the budget file)")
    group.addoption("--memgate-budgets", action="store", default=None, metavar="FILE", dest="memgate_budgets",
                    help=OPTIONS["memgate_budgets"][1])
    group.addoption("--memgate-json", action="store", default=None, metavar="FILE", dest="memgate_json",
                    help=OPTIONS["memgate_json"][1])
    for ini, help_text in OPTIONS.values():
        parser.addini(ini, help=f"{help_text} (ini twin of --{ini.replace('_', '-')})", default=None)


def _setting(config: pytest.Config, dest: str) -> tuple[str | None, Path]:
    """(value, base directory for a relative path): the command line wins over the ini file."""
    value = config.getoption(dest)
    if value is not None:
        return value, Path(config.invocation_params.dir)
    ini = config.getini(OPTIONS[dest][0])
    base = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
    return (str(ini) if ini else None), base


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "memgate(**limits): memory budget for this test's profile, e.g. peak_allocated='2 GiB', "
        "op_caps={'aten::matmul*': '512 MiB'}; the profile comes from the memgate_profile_dir fixture "
        "or profile='path'",
    )
    state = _State()
    config.stash[STATE] = state
    try:
        budgets, base = _setting(config, "memgate_budgets")
        if budgets is not None:
            state.budget_file = load_budget_file(base / budgets)
        else:
            for folder in dict.fromkeys([Path(config.invocation_params.dir), Path(config.rootpath)]):
                state.budget_file = find_budget_file(folder)
                if state.budget_file is not None:
                    break
        root, base = _setting(config, "memgate")
        if root is not None:
            if root == "":
                if state.budget_file is None or not state.budget_file.profiles:
                    raise ConfigError("--memgate has no PATH and the budget file sets no 'profiles'")
                assert state.budget_file.path is not None
                root, base = state.budget_file.profiles, Path(state.budget_file.path).parent
            state.root = base / root
        json_path, base = _setting(config, "memgate_json")
        if json_path:
            state.json_path = base / json_path
    except MemgateError as exc:
        raise pytest.UsageError(f"memgate: {exc.one_line()}") from None
    if not _is_worker(config):  # side effects on the controller only
        config.pluginmanager.register(_Reporter(config, state), "memgate-reporter")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("memgate")
        if marker is not None:
            _marker_budget(item, marker)  # reject bad sizes and unknown keywords now, not after the run
    state = config.stash[STATE]
    if state.root is None:
        return
    if state.budget_file is None or not state.budget_file.budgets:
        raise pytest.UsageError(
            "memgate: --memgate is set but no budgets are declared "
            "(--memgate-budgets=FILE, memgate.toml or [tool.memgate] in pyproject.toml)"
        )
    collector = MemgateCollector.from_parent(session, name="memgate")
    try:
        found = discover(state.root)
    except MemgateError as exc:
        error_item = MemgateErrorItem.from_parent(collector, name=str(state.root), error=exc)
        items.append(error_item)
        session.ihook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, [error_item]))
        return
    labels = _profile_labels(found, state.root)
    generated: list[pytest.Item] = [
        MemgateItem.from_parent(collector, name=f"{label}::{budget.name}::{metric}", found=entry, budget=budget, metric=metric)
        for entry, label in zip(found, labels)
        for budget in state.budget_file.budgets
        for metric in budget.checks()
    ]
    items.extend(generated)
    # Announce them like any collected items, so "collected N items" and collect-only count them.
    session.ihook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, generated))


def _profile_labels(found: list[Found], root: Path) -> list[str]:
    """Item-id labels: each profile's path from the --memgate root's parent (unique, readable in JUnit)."""
    base = root.resolve().parent
    labels = []
    for entry in found:
        try:
            labels.append(entry.path.resolve().relative_to(base).as_posix())
        except ValueError:
            labels.append(entry.path.as_posix())
    return labels


def _marker_budget(item: pytest.Item, marker: pytest.Mark) -> Budget:
    if marker.args:
        raise pytest.UsageError(f"memgate: {item.nodeid}: the memgate marker takes keywords only, got {marker.args!r}")
    kwargs = dict(marker.kwargs)
    kwargs.pop("profile", None)
    try:
        return budget_from_mapping(kwargs, origin=item.nodeid, default_name="marker")
    except ConfigError as exc:
        raise pytest.UsageError(f"memgate: marker on {exc.one_line()}") from None


class MemgateCollector(pytest.Collector):
    def collect(self) -> Iterator[pytest.Item]:  # items are created in pytest_collection_modifyitems
        return iter(())


class MemgateErrorItem(pytest.Item):
    """Stands for a --memgate root that holds no readable profile, so the run shows an error."""

    def __init__(self, *, error: MemgateError, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error

    def setup(self) -> None:
        raise self.error

    def runtest(self) -> None:  # pragma: no cover - setup always raises
        raise self.error

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        return _short_repr(self, excinfo)

    def reportinfo(self) -> tuple[Path | str, int | None, str]:
        return self.name, None, f"memgate: {self.name}"


class MemgateItem(pytest.Item):
    def __init__(self, *, found: Found, budget: Budget, metric: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.found = found
        self.budget = budget
        self.metric = metric

    def setup(self) -> None:
        state = self.config.stash[STATE]
        profile, cache = state.load(self.found.path, lambda: load(self.found))
        self.stash[OUTCOME] = judge(cache, self.budget, self.metric)
        self._profile = profile

    def runtest(self) -> None:
        outcome = self.stash[OUTCOME]
        if not outcome.passed:
            raise BudgetExceeded(outcome.message, outcome.detail)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        return _short_repr(self, excinfo)

    def reportinfo(self) -> tuple[Path | str, int | None, str]:
        return self.found.path, None, f"memgate: {self.name}"


def _short_repr(item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:
    """The failure line as the crash message (JUnit ``message=``), then the detail section."""
    exc = excinfo.value
    if isinstance(exc, BudgetExceeded):
        line, detail = exc.line, exc.detail
        verbosity = item.config.get_verbosity()
        if verbosity <= 0:
            detail = "\n".join(detail.splitlines()[:8])
    elif isinstance(exc, MemgateError):
        line, detail = f"memgate: error: {exc.one_line()}", ""
    else:
        return item._repr_failure_py(excinfo, style="short")  # type: ignore[attr-defined]
    lines = [line] + ([""] + detail.splitlines() if detail else [])
    path = str(getattr(item, "found", None).path if getattr(item, "found", None) else item.name)
    return ExceptionChainRepr(
        [(ReprTraceback([ReprEntryNative(["\n".join(lines) + "\n"])], None, "native"), ReprFileLocation(path, 0, line), None)]
    )


# ---- the marker and the fixtures -------------------------------------------------------------


@pytest.fixture
def memgate_profile_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Path:
    """An empty directory for this test's profile; with a memgate marker it is gated after the body."""
    return tmp_path_factory.mktemp("memgate_profile")


@pytest.fixture
def memgate_load() -> Callable[[str | Path], list[Profile]]:
    """Load every profile under a path into the normalized model (``memgate.model.Profile``)."""

    def _load(path: str | Path) -> list[Profile]:
        return [load(found) for found in discover(path)]

    return _load


def _marker_profile_path(item: pytest.Item, marker: pytest.Mark) -> Path:
    if "profile" in marker.kwargs:
        path = Path(str(marker.kwargs["profile"]))
        return path if path.is_absolute() else Path(str(item.path)).parent / path
    funcargs = getattr(item, "funcargs", {})
    if "memgate_profile_dir" in funcargs:
        return Path(funcargs["memgate_profile_dir"])
    raise ConfigError(
        f"{item.nodeid}: the memgate marker needs a profile: use the memgate_profile_dir fixture "
        "(or memgate_record) or pass profile='path'"
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    result = yield  # re-raises when the test body failed: no gating then
    marker = item.get_closest_marker("memgate")
    if marker is None or isinstance(item, MemgateItem):
        return result
    budget = _marker_budget(item, marker)
    path = _marker_profile_path(item, marker)
    profiles = [load(found) for found in discover(path)]
    outcomes = [judge(MetricCache(p), budget, metric) for p in profiles for metric in budget.checks()]
    item.stash[MARKER_OUTCOMES] = outcomes
    failed = [o for o in outcomes if not o.passed]
    if failed:
        others = [o.message for o in failed[1:]]
        detail = "\n".join(others + [failed[0].detail])
        raise BudgetExceeded(failed[0].message, detail)
    return result


MARKER_OUTCOMES = pytest.StashKey[list[Outcome]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    state = item.config.stash[STATE]
    if call.excinfo is not None and isinstance(call.excinfo.value, (BudgetExceeded, MemgateError)):
        # pytest renders setup errors with the traceback renderer, not repr_failure: replace both.
        report.longrepr = _short_repr(item, call.excinfo)
    outcomes: list[Outcome] = []
    if isinstance(item, MemgateItem) and call.when == "call" and OUTCOME in item.stash:
        outcomes = [item.stash[OUTCOME]]
    elif call.when == "call" and MARKER_OUTCOMES in item.stash:
        outcomes = item.stash[MARKER_OUTCOMES]
    payload: dict[str, Any] = {}
    if outcomes:
        payload["outcomes"] = [outcome_entry(o) for o in outcomes]
        for o in outcomes:
            unit = "ratio" if o.metric == "fragmentation" else "bytes"
            # JUnit writes the teardown report's properties, which pytest copies from the item.
            item.user_properties.extend([
                (f"memgate.{o.metric}.measured", o.value), (f"memgate.{o.metric}.limit", o.limit),
                (f"memgate.{o.metric}.unit", unit),
            ])
        if isinstance(item, MemgateItem) and state.json_path is not None:
            key = str(item.found.path)
            if key not in state.reported_profiles:
                state.reported_profiles.add(key)
                profile, _, cache = state.profiles[key]
                assert profile is not None and cache is not None
                payload["profile"] = profile_entry(profile, cache.get(None, 1))
    elif isinstance(item, (MemgateItem, MemgateErrorItem)) and call.excinfo is not None \
            and isinstance(call.excinfo.value, MemgateError):
        err = call.excinfo.value
        payload["error"] = {"item": item.nodeid, "profile": str(getattr(item, "found", item).path) if hasattr(item, "found") else item.name,
                            "error": err.one_line()}
        if isinstance(item, MemgateItem):
            payload["outcomes"] = [{
                "profile": str(item.found.path), "rank": "?", "budget": item.budget.name, "metric": item.metric,
                "limit": item.budget.limits.get(item.metric, item.budget.op_caps.get(item.metric[8:-1], 0)),
                "value": None, "passed": None, "device": None, "message": err.one_line(), "error": err.one_line(),
            }]
    if payload:
        report.memgate = payload  # type: ignore[attr-defined]  # plain JSON: travels through xdist
    return report


class _Reporter:
    """Collects results from reports (also those xdist workers send) and writes the summary and JSON."""

    def __init__(self, config: pytest.Config, state: _State) -> None:
        self.config = config
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, "memgate", None)
        if not payload:
            return
        self.state.outcomes.extend(payload.get("outcomes", []))
        if "profile" in payload:
            self.state.profile_entries.setdefault(payload["profile"]["path"], payload["profile"])
        if "error" in payload:
            self.state.errors.append(payload["error"])

    def _sorted_outcomes(self) -> list[dict[str, Any]]:
        return sorted(self.state.outcomes, key=lambda o: (o["profile"], o["budget"], o["metric"]))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.state.outcomes:
            return
        terminalreporter.section("memgate")
        for line in summary_table(self._sorted_outcomes()):
            terminalreporter.write_line(line)

    def pytest_sessionfinish(self) -> None:
        if self.state.json_path is None:
            return
        profiles = [self.state.profile_entries[k] for k in sorted(self.state.profile_entries)]
        write_json_atomic(self.state.json_path, build_report(profiles, self._sorted_outcomes(), self.state.errors))


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")

"""The pytest plugin: a thin shell over the pure core. The only module importing pytest.

- ``--memgate=PATH`` generates one item per (profile, budget, metric), and with
  ``--memgate-baseline`` one item per (profile, compare rule).
- ``@pytest.mark.memgate(...)`` gates a test's own profile after its body.
- Results travel on reports (``report.memgate``, plain JSON), so under pytest-xdist the controller
  alone prints the summary table and writes the JSON report, baseline and CI outputs.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _pytest._code.code import ExceptionChainRepr, ReprEntryNative, ReprFileLocation, ReprTraceback

from memgate.budgets import (
    Budget,
    BudgetFile,
    MetricCache,
    Outcome,
    budget_from_mapping,
    find_budget_file,
    judge,
    load_budget_file,
)
from memgate.cache import ProfileCache, open_profile
from memgate.ci import benchmark_export, github_annotations, step_summary_markdown, unit_of
from memgate.compare import (
    CompareRule,
    Regression,
    baseline_from_entries,
    compare_entry,
    load_baseline,
    parse_rule,
    ratchet,
)
from memgate.discover import Found, discover, load, rank_hint
from memgate.errors import ConfigError, MemgateError
from memgate.model import Profile
from memgate.report import (
    build_report,
    outcome_entry,
    profile_entry,
    summary_table,
    write_json_atomic,
    write_text_atomic,
)
from memgate.session import error_outcome

# option dest → (ini name, ini type, help); every option has an ini twin of the same name.
OPTIONS: dict[str, tuple[str, str, str]] = {
    "memgate": ("memgate", "string", "profile root to gate: every profile under it is judged against the budgets"),
    "memgate_budgets": ("memgate_budgets", "string", "budget file (memgate.toml or pyproject.toml)"),
    "memgate_json": ("memgate_json", "string", "write the JSON report (schemas/report.schema.json) to this file"),
    "memgate_baseline": ("memgate_baseline", "string", "compare each profile with this baseline (or JSON report)"),
    "memgate_save_baseline": ("memgate_save_baseline", "string", "save this run's metrics as a baseline file"),
    "memgate_compare_fail": ("memgate_compare_fail", "linelist",
                             ("regression rule, repeatable: peak_allocated:5%, peak_allocated:+256MiB, "
                              "peak_allocated:2.5%+256MiB (fails only when both are exceeded)")),
    "memgate_baseline_missing": ("memgate_baseline_missing", "string",
                                 "when the baseline or a rank in it is missing: skip, warn (default) or fail"),
    "memgate_ratchet": ("memgate_ratchet", "bool",
                        "with --memgate-save-baseline: keep the smaller of the old and new value per metric"),
    "memgate_benchmark_json": ("memgate_benchmark_json", "string",
                               "write github-action-benchmark customSmallerIsBetter JSON to this file"),
    "memgate_html": ("memgate_html", "string", "write the self-contained HTML report to this file"),
    "memgate_cache_dir": ("memgate_cache_dir", "string",
                          "cache of loaded profiles keyed on file content (default: pytest's cache dir)"),
    "memgate_leak_horizon_steps": ("memgate_leak_horizon_steps", "string",
                                   ("default leak_horizon_steps of budgets and markers: the last N counted steps "
                                    "whose live blocks may still be freed later (default 1)")),
}
MISSING_POLICIES = ("skip", "warn", "fail")
DETAIL_TOP = 5  # holders shown under a failure line; each -v adds as many again


class BudgetExceeded(Exception):
    """A measured value is over its limit; carries the failure line and the detail section."""

    def __init__(self, line: str, detail: str) -> None:
        super().__init__(line)
        self.line = line
        self.detail = detail


@dataclass
class _Settings:
    root: Path | None = None
    budget_file: BudgetFile | None = None
    json_path: Path | None = None
    baseline_path: Path | None = None
    save_baseline: Path | None = None
    rules: list[CompareRule] = field(default_factory=list)
    missing_policy: str = "warn"
    leak_horizon_steps: int = 1
    ratchet: bool = False
    benchmark_json: Path | None = None
    html_path: Path | None = None
    cache_dir: Path | None = None

    @property
    def wants_profiles(self) -> bool:
        """Whether the controller needs every profile's metrics (not only the verdicts)."""
        return any(p is not None for p in (self.json_path, self.save_baseline, self.benchmark_json, self.html_path))


class _State:
    """Per-process session state, kept in ``config.stash``."""

    def __init__(self, settings: _Settings) -> None:
        self.settings = settings
        self.profiles: dict[str, MetricCache | MemgateError] = {}
        self.reported_profiles: set[str] = set()  # attach each profile entry to one report per process
        self._baseline: dict[str, Any] | None = None
        self._baseline_error: MemgateError | None = None
        self.cache = ProfileCache(settings.cache_dir) if settings.cache_dir is not None else None

    def load(self, found: Found) -> MetricCache:
        """The profile of ``found``, ready to judge (loaded once per process; its error kept too)."""
        key = str(found.path)
        if key not in self.profiles:
            try:
                self.profiles[key] = open_profile(found, self.cache)
            except MemgateError as exc:
                self.profiles[key] = exc
        loaded = self.profiles[key]
        if isinstance(loaded, MemgateError):
            raise loaded
        return loaded

    def baseline(self) -> dict[str, Any] | None:
        """The baseline, or None when its file is missing (the missing-baseline policy decides)."""
        path = self.settings.baseline_path
        if path is None or (self._baseline is None and self._baseline_error is None and not path.exists()):
            return None
        if self._baseline is None and self._baseline_error is None:
            try:
                self._baseline = load_baseline(path)
            except MemgateError as exc:
                self._baseline_error = exc
        if self._baseline_error is not None:
            raise self._baseline_error
        return self._baseline


STATE = pytest.StashKey[_State]()
OUTCOME = pytest.StashKey[Outcome]()
REGRESSION = pytest.StashKey[Regression]()
MARKER_OUTCOMES = pytest.StashKey[list[Outcome]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memgate", "memory budgets from profiler output")
    group.addoption("--memgate", action="store", nargs="?", const="", default=None, metavar="PATH", dest="memgate",
                    help=OPTIONS["memgate"][2] + " (a bare --memgate uses 'profiles' from the budget file)")
    for dest, (ini, kind, help_text) in OPTIONS.items():
        flag = "--" + dest.replace("_", "-")
        if dest == "memgate":
            pass
        elif kind == "bool":
            group.addoption(flag, action="store_true", default=None, dest=dest, help=help_text)
        elif kind == "linelist":
            group.addoption(flag, action="append", default=None, metavar="EXPR", dest=dest, help=help_text)
        else:
            group.addoption(flag, action="store", default=None, metavar="VALUE", dest=dest, help=help_text)
        parser.addini(ini, help=f"{help_text} (ini twin of {flag})", type=kind,  # type: ignore[arg-type]
                      default=None if kind == "string" else ([] if kind == "linelist" else False))


def _setting(config: pytest.Config, dest: str) -> tuple[Any, Path]:
    """(value, base directory for a relative path): the command line wins over the ini file."""
    value = config.getoption(dest)
    if value is not None:
        return value, Path(config.invocation_params.dir)
    ini = config.getini(OPTIONS[dest][0])
    base = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
    return (ini if ini not in ("", None, []) else None), base


def _path_setting(config: pytest.Config, dest: str) -> Path | None:
    value, base = _setting(config, dest)
    return base / str(value) if value else None


def _read_settings(config: pytest.Config) -> _Settings:
    settings = _Settings()
    horizon, _ = _setting(config, "memgate_leak_horizon_steps")
    if horizon is not None:
        if not str(horizon).strip().isascii() or not str(horizon).strip().isdigit() or int(horizon) < 1:
            raise ConfigError(f"invalid --memgate-leak-horizon-steps {horizon!r}", expected="an integer >= 1")
        settings.leak_horizon_steps = int(horizon)
    budgets, base = _setting(config, "memgate_budgets")
    if budgets is not None:
        settings.budget_file = load_budget_file(base / budgets, default_leak_horizon=settings.leak_horizon_steps)
    else:
        for folder in dict.fromkeys([Path(config.invocation_params.dir), Path(config.rootpath)]):
            settings.budget_file = find_budget_file(folder, default_leak_horizon=settings.leak_horizon_steps)
            if settings.budget_file is not None:
                break
    root, base = _setting(config, "memgate")
    if root is not None:
        if root == "":
            if settings.budget_file is None or not settings.budget_file.profiles:
                raise ConfigError("--memgate has no PATH and the budget file sets no 'profiles'")
            assert settings.budget_file.path is not None
            root, base = settings.budget_file.profiles, Path(settings.budget_file.path).parent
        settings.root = base / root
    settings.json_path = _path_setting(config, "memgate_json")
    settings.baseline_path = _path_setting(config, "memgate_baseline")
    settings.save_baseline = _path_setting(config, "memgate_save_baseline")
    settings.benchmark_json = _path_setting(config, "memgate_benchmark_json")
    settings.html_path = _path_setting(config, "memgate_html")
    settings.cache_dir = _path_setting(config, "memgate_cache_dir")
    if settings.cache_dir is None and config.pluginmanager.has_plugin("cacheprovider") and config.cache is not None:
        settings.cache_dir = config.cache.mkdir("memgate")  # shared by xdist workers; never the profile dir
    rules, _ = _setting(config, "memgate_compare_fail")
    settings.rules = [parse_rule(r) for r in (rules or [])]
    policy, _ = _setting(config, "memgate_baseline_missing")
    if policy is not None:
        if policy not in MISSING_POLICIES:
            raise ConfigError(f"invalid --memgate-baseline-missing {policy!r}", expected=" or ".join(MISSING_POLICIES))
        settings.missing_policy = policy
    ratchet_flag, _ = _setting(config, "memgate_ratchet")
    settings.ratchet = bool(ratchet_flag)
    if settings.rules and settings.baseline_path is None:
        raise ConfigError("--memgate-compare-fail needs --memgate-baseline=PATH")
    if settings.ratchet and settings.save_baseline is None:
        raise ConfigError("--memgate-ratchet needs --memgate-save-baseline=PATH")
    return settings


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "memgate(**limits): memory budget for this test's profile, e.g. peak_allocated='2 GiB', "
        "op_caps={'aten::matmul*': '512 MiB'}; the profile comes from the memgate_profile_dir fixture "
        "(memgate_record fills it) or profile='path'",
    )
    try:
        settings = _read_settings(config)
    except MemgateError as exc:
        raise pytest.UsageError(f"memgate: {exc.one_line()}") from None
    config.stash[STATE] = _State(settings)
    if not _is_worker(config):  # side effects on the controller only
        config.pluginmanager.register(_Reporter(config, settings), "memgate-reporter")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


# ---- collection ----------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker("memgate")
        if marker is not None:
            _marker_budget(item, marker)  # reject bad sizes and unknown keywords now, not after the run
    settings = config.stash[STATE].settings
    if settings.root is None:
        return
    budgets = settings.budget_file.budgets if settings.budget_file else ()
    if not budgets and not settings.rules and settings.save_baseline is None:
        raise pytest.UsageError(
            "memgate: --memgate is set but no budgets are declared "
            "(--memgate-budgets=FILE, memgate.toml or [tool.memgate] in pyproject.toml)"
        )
    collector = MemgateCollector.from_parent(session, name="memgate", nodeid="memgate")
    generated: list[pytest.Item] = []
    try:
        found = discover(settings.root)
    except MemgateError as exc:
        generated.append(MemgateErrorItem.from_parent(collector, name=str(settings.root), error=exc))
        found = []
    for entry, label in zip(found, _profile_labels(found, settings.root)):
        rank = rank_hint(entry)
        for budget in budgets:
            if rank is not None and not budget.selects_rank(rank):
                continue  # when only a load can tell the rank, the item skips itself in setup
            for metric in budget.checks():
                generated.append(MemgateItem.from_parent(
                    collector, name=f"{label}::{budget.name}::{metric}", found=entry, budget=budget, metric=metric))
        for rule in settings.rules:
            generated.append(MemgateCompareItem.from_parent(
                collector, name=f"{label}::baseline::{rule.metric}", found=entry, rule=rule))
        if not budgets and not settings.rules:
            generated.append(MemgateProfileItem.from_parent(collector, name=f"{label}::profile", found=entry))
    items.extend(generated)
    # Announce them like any collected items, so "collected N items" and --collect-only count them.
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
        return budget_from_mapping(kwargs, origin=item.nodeid, default_name="marker",
                                   default_leak_horizon=item.config.stash[STATE].settings.leak_horizon_steps)
    except ConfigError as exc:
        raise pytest.UsageError(f"memgate: marker on {exc.one_line()}") from None


class MemgateCollector(pytest.Collector):
    def collect(self) -> Iterator[pytest.Item]:  # items are created in pytest_collection_modifyitems
        return iter(())


class _GateItem(pytest.Item):
    """Shared by the generated items: short failure output and a file location for reports."""

    found: Found | None = None

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        return _short_repr(self, excinfo)

    def reportinfo(self) -> tuple[Path | str, int | None, str]:
        return (self.found.path if self.found else self.name), None, f"memgate: {self.name}"


class MemgateErrorItem(_GateItem):
    """Stands for a --memgate root that holds no readable profile, so the run shows an error."""

    def __init__(self, *, error: MemgateError, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.error = error

    def setup(self) -> None:
        raise self.error

    def runtest(self) -> None:  # pragma: no cover - setup always raises
        raise self.error


class MemgateProfileItem(_GateItem):
    """Loads and validates one profile (generated when no budget or rule asks anything of it)."""

    def __init__(self, *, found: Found, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.found = found

    def runtest(self) -> None:
        assert self.found is not None
        self.config.stash[STATE].load(self.found)


class MemgateItem(_GateItem):
    """One (profile, budget, metric)."""

    def __init__(self, *, found: Found, budget: Budget, metric: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.found = found
        self.budget = budget
        self.metric = metric

    def setup(self) -> None:
        assert self.found is not None
        cache = self.config.stash[STATE].load(self.found)
        if not self.budget.selects_rank(cache.info.rank):
            pytest.skip(f"budget {self.budget.name!r} selects ranks {self.budget.ranks!r}; this is rank {cache.info.rank}")
        self.stash[OUTCOME] = judge(cache, self.budget, self.metric)

    def runtest(self) -> None:
        outcome = self.stash[OUTCOME]
        if not outcome.passed:
            raise BudgetExceeded(outcome.message, outcome.detail(_detail_top(self.config)))


class MemgateCompareItem(_GateItem):
    """One (profile, compare rule) against the baseline: a regression is a failed item."""

    def __init__(self, *, found: Found, rule: CompareRule, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.found = found
        self.rule = rule

    def setup(self) -> None:
        assert self.found is not None
        state = self.config.stash[STATE]
        cache = state.load(self.found)
        baseline = state.baseline()
        if baseline is None:
            self._missing(f"baseline {state.settings.baseline_path} does not exist")
            return
        try:
            self.stash[REGRESSION] = compare_entry(profile_entry(cache.info, cache.get()), baseline, self.rule)
        except KeyError as exc:
            self._missing(exc.one_line() if isinstance(exc, MemgateError)
                          else f"rank {cache.info.rank} is not in baseline {state.settings.baseline_path}")

    def _missing(self, why: str) -> None:
        policy = self.config.stash[STATE].settings.missing_policy
        if policy == "fail":
            raise ConfigError(f"{why} (--memgate-baseline-missing=fail)")
        if policy == "skip":
            pytest.skip(why)
        warnings.warn(pytest.PytestWarning(f"memgate: {why}; nothing compared"), stacklevel=1)

    def runtest(self) -> None:
        regression = self.stash.get(REGRESSION, None)
        if regression is not None and not regression.passed:
            raise BudgetExceeded(regression.message, f"baseline: {self.config.stash[STATE].settings.baseline_path}")


def _detail_top(config: pytest.Config) -> int:
    return DETAIL_TOP * (1 + max(0, config.get_verbosity()))


def _short_repr(item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:
    """The failure line as the crash message (JUnit ``message=``), then the detail section."""
    exc = excinfo.value
    if isinstance(exc, BudgetExceeded):
        line, detail = exc.line, exc.detail
    elif isinstance(exc, MemgateError):
        line, detail = f"memgate: error: {exc.one_line()}", ""
    else:
        return item._repr_failure_py(excinfo, style="short")  # type: ignore[attr-defined]
    text = "\n".join([line] + ([""] + detail.splitlines() if detail else []))
    found = getattr(item, "found", None)
    path = str(found.path) if found is not None else item.nodeid
    entry = ReprEntryNative([text + "\n"])
    return ExceptionChainRepr([(ReprTraceback([entry], None, "native"), ReprFileLocation(path, 0, line), None)])


# ---- the marker and the fixtures -----------------------------------------------------------------


@pytest.fixture
def memgate_profile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty directory for this test's profile; with a memgate marker it is gated after the body."""
    return tmp_path_factory.mktemp("memgate_profile")


@pytest.fixture
def memgate_load() -> Callable[[str | Path], list[Profile]]:
    """Load every profile under a path into the normalized model (``memgate.model.Profile``)."""

    def _load(path: str | Path) -> list[Profile]:
        return [load(found) for found in discover(path)]

    return _load


@pytest.fixture
def memgate_record(memgate_profile_dir: Path) -> Iterator[Any]:
    """A started recorder (torch.profiler with profile_memory, CUDA/NPU snapshots where present)
    writing into ``memgate_profile_dir``; call ``.step()`` once per training step. With
    ``@pytest.mark.memgate(...)`` the recording is gated right after the test body.
    """
    pytest.importorskip("torch", reason="memgate_record records a torch run: pip install 'memgate[torch]'")
    from memgate.record import Recorder

    recorder = Recorder(memgate_profile_dir).start()
    try:
        yield recorder
    finally:
        recorder.stop()


def _finish_recording(item: pytest.Item) -> None:
    """Stop the test's recorder, if it has one, so its files exist before gating."""
    recorder = getattr(item, "funcargs", {}).get("memgate_record")
    if recorder is not None:
        recorder.stop()


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
    try:
        result = yield  # re-raises when the test body failed: no gating then
    finally:
        _finish_recording(item)
    marker = item.get_closest_marker("memgate")
    if marker is None or isinstance(item, _GateItem):
        return result
    budget = _marker_budget(item, marker)
    path = _marker_profile_path(item, marker)
    profiles = [load(found) for found in discover(path)]
    outcomes = [judge(MetricCache(p), budget, metric) for p in profiles for metric in budget.checks()]
    item.stash[MARKER_OUTCOMES] = outcomes
    failed = [o for o in outcomes if not o.passed]
    if failed:
        detail = "\n".join([o.message for o in failed[1:]] + [failed[0].detail(_detail_top(item.config))])
        raise BudgetExceeded(failed[0].message, detail)
    return result


# ---- reports -------------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if call.excinfo is not None and isinstance(call.excinfo.value, (BudgetExceeded, MemgateError)):
        # pytest renders setup errors with the traceback renderer, not repr_failure: replace both.
        report.longrepr = _short_repr(item, call.excinfo)
    payload = _payload(item, call)
    if payload:
        report.memgate = payload  # type: ignore[attr-defined]  # plain JSON: travels through xdist
    return report


def _payload(item: pytest.Item, call: pytest.CallInfo[None]) -> dict[str, Any]:
    """What the controller needs from this report: verdicts, errors, and once the profile's metrics."""
    state = item.config.stash[STATE]
    payload: dict[str, Any] = {}
    outcomes: list[dict[str, Any]] = []
    if call.when == "call":
        if OUTCOME in item.stash:
            outcomes = [outcome_entry(item.stash[OUTCOME])]
        elif MARKER_OUTCOMES in item.stash:
            outcomes = [outcome_entry(o) for o in item.stash[MARKER_OUTCOMES]]
        elif REGRESSION in item.stash:
            r = item.stash[REGRESSION]
            outcomes = [{"profile": str(item.found.path), "rank": r.rank, "budget": "baseline",
                         "metric": r.metric, "limit": r.allowed, "value": r.value, "passed": r.passed,
                         "device": r.device, "message": r.message, "baseline_value": r.base}]
    if outcomes:
        payload["outcomes"] = outcomes
        for o in outcomes:
            unit = unit_of(o["metric"])  # LIMITS' kind: "ratio" or "bytes" (op_caps: bytes)
            # JUnit writes the teardown report's properties, which pytest copies from the item.
            item.user_properties.extend([
                (f"memgate.{o['metric']}.measured", o["value"]),
                (f"memgate.{o['metric']}.limit", o["limit"]),
                (f"memgate.{o['metric']}.unit", unit),
            ])
    elif isinstance(item, _GateItem) and call.excinfo is not None and isinstance(call.excinfo.value, MemgateError):
        error = call.excinfo.value.one_line()
        found = item.found
        payload["error"] = {"item": item.nodeid, "profile": str(found.path) if found else item.name, "error": error}
        if isinstance(item, MemgateItem):
            path = str(item.found.path) if item.found else ""
            payload["outcomes"] = [error_outcome(None, path, item.budget, item.metric, call.excinfo.value)]
    found = getattr(item, "found", None)
    if state.settings.wants_profiles and found is not None and call.when == "call":
        key = str(found.path)
        loaded = state.profiles.get(key)
        if key not in state.reported_profiles and isinstance(loaded, MetricCache):
            state.reported_profiles.add(key)
            payload["profile"] = profile_entry(loaded.info, loaded.get())
    return payload


class _Reporter:
    """On the controller: collects results from reports (also those xdist workers send), writes outputs."""

    def __init__(self, config: pytest.Config, settings: _Settings) -> None:
        self.config = config
        self.settings = settings
        self.outcomes: list[dict[str, Any]] = []
        self.entries: dict[str, dict[str, Any]] = {}
        self.errors: list[dict[str, Any]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, "memgate", None)
        if not payload:
            return
        self.outcomes.extend(payload.get("outcomes", []))
        if "profile" in payload:
            self.entries.setdefault(payload["profile"]["path"], payload["profile"])
        if "error" in payload:
            self.errors.append(payload["error"])

    def _sorted_outcomes(self) -> list[dict[str, Any]]:
        return sorted(self.outcomes, key=lambda o: (o["profile"], o["budget"], o["metric"]))

    def _entries(self) -> list[dict[str, Any]]:
        return [self.entries[k] for k in sorted(self.entries)]

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.outcomes:
            terminalreporter.section("memgate")
            for line in summary_table(self._sorted_outcomes()):
                terminalreporter.write_line(line)
        if os.environ.get("GITHUB_ACTIONS") == "true":
            for line in github_annotations(self._sorted_outcomes()):
                terminalreporter.write_line(line)
        for what, path in (("JSON report", self.settings.json_path), ("baseline", self.settings.save_baseline),
                           ("benchmark JSON", self.settings.benchmark_json), ("HTML report", self.settings.html_path)):
            if path is not None and path.exists():
                terminalreporter.write_line(f"memgate: {what} written to {path}")

    def pytest_sessionfinish(self) -> None:
        s = self.settings
        outcomes, entries = self._sorted_outcomes(), self._entries()
        if s.json_path is not None:
            write_json_atomic(s.json_path, build_report(entries, outcomes, self.errors))
        if s.save_baseline is not None and entries:
            baseline = baseline_from_entries(entries)
            if s.ratchet and s.save_baseline.exists():
                baseline = ratchet(load_baseline(s.save_baseline), baseline)
            write_json_atomic(s.save_baseline, baseline)
        if s.benchmark_json is not None:
            write_json_atomic(s.benchmark_json, benchmark_export(entries))
        if s.html_path is not None:
            _write_html(s.html_path, entries, outcomes)
        summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary_file and outcomes:
            with open(summary_file, "a", encoding="utf-8") as fh:
                fh.write(step_summary_markdown(outcomes))


def _write_html(path: Path, entries: list[dict[str, Any]], outcomes: list[dict[str, Any]]) -> None:
    from memgate.html_report import render_html  # drawing code loads only when asked for

    profiles = []
    for entry in entries:
        try:
            profiles.extend(load(found) for found in discover(entry["path"]))
        except MemgateError:
            continue
    write_text_atomic(path, render_html(entries, outcomes, profiles))

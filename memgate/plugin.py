"""The pytest plugin: a thin shell over the pure core. The only module importing pytest.

- ``--memgate=PATH`` generates one item per (profile, budget, metric), and with
  ``--memgate-baseline`` one item per (profile, compare rule).
- ``@pytest.mark.memgate(...)`` gates a test's own profile after its body (:mod:`memgate.marks`); its
  checks are named after the test everywhere (rows, JSON, JUnit, HTML, step summary, annotations). A
  bad marker is found at collection and fails that test alone, at setup.
- ``--memgate-autosave`` / ``--memgate-compare[=ID]`` keep and compare runs under ``.memgate/``
  (:mod:`memgate.autosave`); ``memgate_load`` returns metrics for a test's own assertions.
- Options resolve in :mod:`memgate.settings`. Results travel on reports (``report.memgate``: a
  :class:`~memgate.rows.ReportPayload` as plain JSON), so under pytest-xdist the controller alone
  writes the outputs (:class:`memgate.outputs.RunOutputs`, kept in the stash).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _pytest._code.code import ExceptionChainRepr, ReprEntryNative, ReprFileLocation, ReprTraceback

from memgate.autosave import BaselineFinder
from memgate.budgets import Budget
from memgate.cache import ProfileCache, open_profile
from memgate.ci import unit_of
from memgate.compare import CompareRule, MetricNotInBaseline, NotInBaseline, Regression, compare_entry
from memgate.discover import Found, discover, rank_hint
from memgate.errors import ConfigError, MemgateError, NotSelected, SelectsNothing, printable, remembered
from memgate.identity import labels_under_root
from memgate.judge import Offered, judge, judge_rank_imbalance, rank_values, selects_any, selects_nothing
from memgate.marks import (
    MARKER,
    compare_with_history,
    judge_marked_test,
    keep_recording,
    left_by_test,
    marker_budget,
)
from memgate.metric_cache import MetricCache
from memgate.outputs import RunOutputs
from memgate.report import profile_entry
from memgate.rows import CheckRow, Declared, ErrorRow, ReportPayload
from memgate.session import Measured, measure
from memgate.settings import Settings, Where, read_settings
from memgate.verdict import Outcome, oom_cause, oom_sentence


@dataclass(frozen=True)
class _Option:
    """A command-line option and its ini twin of the same name (``dest``)."""

    dest: str
    kind: str  # the ini type: string, linelist (repeatable), bool (a flag, no value)
    metavar: str | None
    help: str
    optional_value: bool = False  # --memgate[=PATH], --memgate-compare[=ID]

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


OPTIONS: tuple[_Option, ...] = (
    _Option("memgate", "string", "PATH", "profile root to gate: every profile under it is judged against the "
            "budgets (a bare --memgate uses 'profiles' from the budget file)", optional_value=True),
    _Option("memgate_budgets", "string", "FILE", "budget file (memgate.toml or pyproject.toml)"),
    _Option("memgate_json", "string", "FILE", "write the JSON report (schemas/report.schema.json) to this file"),
    _Option("memgate_baseline", "string", "FILE", "compare each profile with this baseline (or JSON report)"),
    _Option("memgate_save_baseline", "string", "FILE", "save this run's metrics as a baseline file"),
    _Option("memgate_autosave", "bool", None, "save this run's metrics under the storage folder "
            "(.memgate/v1/<configuration>/<NNNN>_<commit>.json)"),
    _Option("memgate_compare", "string", "ID", "compare each profile with a saved run of its configuration: "
            "the latest (no ID), run number ID, or the latest run of a git commit prefix", optional_value=True),
    _Option("memgate_storage", "string", "DIR", "where --memgate-autosave saves runs and --memgate-compare finds "
            "them (default: .memgate in the rootdir)"),
    _Option("memgate_compare_fail", "linelist", "RULE",
            "regression rule, repeatable: peak_allocated:5%, peak_allocated:+256MiB, peak_allocated:2.5%+256MiB "
            "(fails only when both are exceeded)"),
    _Option("memgate_baseline_missing", "string", "skip|warn|fail",
            "when the baseline or a rank in it is missing: skip, warn (default) or fail"),
    _Option("memgate_compare_platform", "string", "same|any",
            "whose history a comparison uses: the same platform's only (default: device, memory, framework "
            "release and allocator settings match), or any platform's"),
    _Option("memgate_ratchet", "bool", None,
            "with --memgate-save-baseline: keep the smaller of the old and new value per metric"),
    _Option("memgate_benchmark_json", "string", "FILE",
            "write github-action-benchmark customSmallerIsBetter JSON to this file"),
    _Option("memgate_html", "string", "FILE", "write the self-contained HTML report to this file"),
    _Option("memgate_keep_traces", "string", "DIR",
            "copy what memgate_record recorded to DIR/<test> (a CI artifact); with --memgate-html or "
            "--memgate-json the default is memgate-recordings beside the report, whose paths point there"),
    _Option("memgate_cache_dir", "string", "DIR",
            "cache of loaded profiles keyed on file content (default: pytest's cache dir)"),
    _Option("memgate_report_left", "bool", None,
            "list in the summary, per test memgate_record recorded, the device memory it left allocated when its "
            "body ended (largest first): the test that makes a later one run out of memory is named"),
    _Option("memgate_estimate", "string", "TARGET",
            "memgate_record estimates, on a machine without the GPU, what the test would record on a CUDA device: "
            "TARGET is cuda (NVIDIA H200) or cuda:DEVICE NAME; CUDA tensors become meta tensors and the caching "
            "allocator is modelled; every row says it is an estimate"),
    _Option("memgate_allow_unselected", "bool", None,
            "a budget or marker whose ranks/devices select no device of any profile of the run is skipped, not an "
            "error (for runs whose devices are optional)"),
    _Option("memgate_leak_horizon_steps", "string", "N",
            "default leak_horizon_steps of budgets and markers: the last N counted steps whose live blocks may "
            "still be freed later (default 1)"),
)
OPTION = {o.dest: o for o in OPTIONS}
DETAIL_TOP = 5  # holders shown under a failure line; each -v adds as many again


class BudgetExceeded(Exception):
    """A measured value is over its limit; carries the failure line and the detail section."""

    def __init__(self, line: str, detail: str) -> None:
        super().__init__(line)
        self.line = line
        self.detail = detail


class OutOfMemoryFailure(BudgetExceeded):
    """A CUDA or NPU out-of-memory error inside a recorded test: the failure line names the request, the
    device's memory then and the step; the detail the holders at the error and where the recording is kept.
    Raised from the error itself (its cause), which pytest shows with it."""


class _State:
    """Per-process session state, kept in ``config.stash``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.profiles: dict[str, MetricCache | MemgateError] = {}
        self.reported_profiles: set[str] = set()  # attach each profile entry to one report per process
        self.baselines = (BaselineFinder(settings.baseline_path, settings.compare_id, settings.storage,
                                          settings.compare_platform)
                          if settings.compares else None)
        self.cache = ProfileCache(settings.cache_dir) if settings.cache_dir is not None else None
        self.found: list[Found] = []  # the --memgate root's profiles (each process collects them)
        self.selection: dict[str, SelectsNothing | None] = {}  # budget name → selects_nothing, once per process

    def load(self, found: Found) -> MetricCache:
        """The profile of ``found``, ready to judge (loaded once per process; its error kept too)."""
        return remembered(self.profiles, str(found.path), lambda: open_profile(found, self.cache))

    def selects_nothing(self, budget: Budget) -> SelectsNothing | None:
        """The error where ``budget`` selects no device of any profile under the root (None with
        --memgate-allow-unselected). Profiles are loaded until one is selected; a rank the file name
        states and the budget does not select needs no load; one that cannot be read has its own error."""
        if self.settings.allow_unselected:
            return None
        if budget.name not in self.selection:
            offered = []
            for entry in self.found:
                rank = rank_hint(entry)
                if rank is not None and not budget.selects_rank(rank):
                    offered.append(Offered(rank, ()))
                    continue
                try:
                    cache = self.load(entry)
                    offered.append(Offered(cache.info.rank, tuple(m.device for m in cache.get(budget.options))))
                except MemgateError:
                    continue
                if selects_any(budget, offered[-1]):
                    break
            self.selection[budget.name] = selects_nothing(budget, offered)
        return self.selection[budget.name]


STATE = pytest.StashKey[_State]()
OUTCOME = pytest.StashKey[Outcome]()  # a budget item's verdict, for its failure's detail
REGRESSION = pytest.StashKey[tuple[Regression, str]]()  # a compare item's, and where the baseline is
OUTPUTS = pytest.StashKey[RunOutputs]()  # on the controller only
ROWS = pytest.StashKey[list[CheckRow]]()  # what an item or a marked test judged
MARKER_BUDGET = pytest.StashKey[Budget]()
MARKER_ERROR = pytest.StashKey[ConfigError]()
MARKER_PROFILES = pytest.StashKey[list[dict[str, Any]]]()
KEPT_TRACES = pytest.StashKey[str]()
LEFT_BEHIND = pytest.StashKey[list[dict[str, Any]]]()  # --memgate-report-left: what the test left, per device


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memgate", "memory budgets from profiler output")
    for opt in OPTIONS:
        # argparse %-formats help text: a literal % (5%) must be doubled there, not in the ini help.
        kwargs: dict[str, Any] = {"dest": opt.dest, "default": None, "help": opt.help.replace("%", "%%")}
        if opt.kind == "bool":
            group.addoption(opt.flag, action="store_true", **kwargs)
        elif opt.kind == "linelist":
            group.addoption(opt.flag, action="append", metavar=opt.metavar, **kwargs)
        elif opt.optional_value:
            group.addoption(opt.flag, action="store", nargs="?", const="", metavar=opt.metavar, **kwargs)
        else:
            group.addoption(opt.flag, action="store", metavar=opt.metavar, **kwargs)
        parser.addini(opt.dest, help=f"{opt.help} (ini twin of {opt.flag})", type=opt.kind,  # type: ignore[arg-type]
                      default=None if opt.kind == "string" else ([] if opt.kind == "linelist" else False))


def _setting(config: pytest.Config, dest: str) -> tuple[Any, Path]:
    """(value, base directory for a relative path): the command line wins over the ini file."""
    value = config.getoption(dest)
    if value is not None:
        return value, Path(config.invocation_params.dir)
    ini = config.getini(OPTION[dest].dest)
    base = Path(config.inipath).parent if config.inipath else Path(config.rootpath)
    return (ini if ini not in ("", None, []) else None), base


def _refuse_test_path(config: pytest.Config, value: str, path: Path) -> None:
    """A ConfigError when ``--memgate``'s value names tests, not profiles: ``pytest --memgate
    test_train.py`` gives the test file to ``--memgate`` (its PATH is optional, so it takes the next
    argument) and would gate the file as a profile while every test ran."""
    patterns = [str(p) for p in config.getini("python_files")]
    if "::" in value:
        what = "a test node id"
    elif path.suffix == ".py":
        what = "a test file" if any(path.match(p) for p in patterns) else "a Python file"
    elif path.is_dir() and _holds_test_files(config, path, patterns) and not _holds_profiles(path):
        what = "a directory of tests with no profile"
    else:
        return
    expected = "a profile directory or file"
    flag = "--memgate"
    if config.getoption("memgate") is None:  # from the ini file
        flag = "memgate (ini)"
    elif f"--memgate={value}" not in config.invocation_params.args:  # `--memgate VALUE`: the trap
        expected += ("; --memgate takes the next argument as its PATH: write --memgate=PATH "
                     "(or put the test path first)")
    raise ConfigError(f"invalid {flag} {value!r}: {what}, not a profile", expected=expected)


def _holds_test_files(config: pytest.Config, folder: Path, patterns: list[str], depth: int = 2) -> bool:
    """Whether pytest would collect a test file in ``folder`` or ``depth`` levels below it (a glance,
    not a walk of a whole profile tree)."""
    skip = [str(p) for p in config.getini("norecursedirs")]
    try:
        children = sorted(folder.iterdir())
    except OSError:
        return False
    for child in children:
        if child.is_file() and any(child.match(p) for p in patterns):
            return True
    return depth > 0 and any(
        _holds_test_files(config, child, patterns, depth - 1) for child in children
        if child.is_dir() and not child.name.startswith(".") and child.name != "__pycache__"
        and not any(child.match(p) for p in skip))


def _holds_profiles(folder: Path) -> bool:
    try:
        return bool(discover(folder))
    except MemgateError:  # none (or unreadable): the normal path reports what is wrong with a real root
        return False


def _read_settings(config: pytest.Config) -> Settings:
    def default_cache_dir() -> Path | None:
        if config.pluginmanager.has_plugin("cacheprovider") and config.cache is not None:
            return config.cache.mkdir("memgate")  # shared by xdist workers; never the profile dir
        return None

    where = Where(search=(Path(config.invocation_params.dir), Path(config.rootpath)), rootdir=Path(config.rootpath),
                  check_root=lambda value, path: _refuse_test_path(config, value, path),
                  default_cache_dir=default_cache_dir)
    return read_settings(lambda dest: _setting(config, dest), where)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "memgate(**limits): memory budget for this test's profile, e.g. peak_allocated='2 GiB', "
        "op_caps={'aten::matmul*': '512 MiB'}; the profile comes from the memgate_record fixture "
        "(or memgate_profile_dir) or profile='path'; gated after the test body",
    )
    try:
        settings = _read_settings(config)
        if settings.estimate is not None:  # the device named is one memgate models: said before any test runs
            from memgate.estimation.api import Target

            Target.parse(settings.estimate)
    except MemgateError as exc:  # a budget file's every error, one a line in file order
        raise pytest.UsageError("\n".join(f"memgate: {line}" for line in exc.lines())) from None
    config.stash[STATE] = _State(settings)
    if not _is_worker(config):  # side effects on the controller only
        config.stash[OUTPUTS] = RunOutputs(settings, Path(config.rootpath))
        config.pluginmanager.register(_Reporter(config.stash[OUTPUTS]), "memgate-reporter")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


# ---- collection ----------------------------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        marker = item.get_closest_marker(MARKER)
        if marker is not None and not isinstance(item, _GateItem):
            # Checked now, reported as an error of this test alone: the other tests still run.
            try:
                item.stash[MARKER_BUDGET] = marker_budget(
                    item.nodeid, marker.args, marker.kwargs, _declared_at(item),
                    has_profile_dir="memgate_profile_dir" in getattr(item, "fixturenames", ()),
                    leak_horizon_steps=config.stash[STATE].settings.leak_horizon_steps)
            except ConfigError as exc:
                item.stash[MARKER_ERROR] = exc
    settings = config.stash[STATE].settings
    if settings.root is None:
        return
    budgets = settings.budget_file.budgets if settings.budget_file else ()
    if not budgets and not settings.rules and settings.save_baseline is None and not settings.autosave:
        raise pytest.UsageError(
            "memgate: --memgate is set but no budgets are declared "
            "(--memgate-budgets=FILE, memgate.toml or [tool.memgate] in pyproject.toml)"
        )
    collector = MemgateCollector.from_parent(session, name="memgate", nodeid="memgate")
    generated = _generated_items(collector, settings, budgets)
    items.extend(generated)
    # Announce them like any collected items, so "collected N items" and --collect-only count them.
    session.ihook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, list(generated)))


def _generated_items(collector: pytest.Collector, settings: Settings, budgets: tuple[Budget, ...]) -> list[pytest.Item]:
    """One item per (profile, budget, metric) and per (profile, compare rule); one per profile where
    nothing is asked of it; one per (budget, rank_imbalance metric); an error item for a bad root."""
    assert settings.root is not None
    generated: list[pytest.Item] = []
    try:
        found = discover(settings.root)
    except MemgateError as exc:
        generated.append(MemgateErrorItem.from_parent(collector, name=str(settings.root), error=exc))
        found = []
    collector.config.stash[STATE].found = found
    generated += _selecting_no_rank(collector, settings, budgets, found)
    for entry, label in zip(found, labels_under_root([f.path for f in found], settings.root)):
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
    if found:  # one item per (budget, metric), judged over every profile it selects
        root_label = settings.root.resolve().name or str(settings.root)
        for budget in budgets:
            for metric in budget.rank_imbalance:
                generated.append(MemgateRankImbalanceItem.from_parent(
                    collector, name=f"{root_label}::{budget.name}::rank_imbalance[{metric}]", profiles=found,
                    budget=budget, metric=metric))
    return generated


def _selecting_no_rank(collector: pytest.Collector, settings: Settings, budgets: tuple[Budget, ...],
                       found: list[Found]) -> list[pytest.Item]:
    """An error item for each budget whose ``ranks`` select none of the ranks the profiles' names state (no
    item of its own is generated then); a profile whose rank only a load tells gets its items, which find out."""
    ranks = [rank_hint(entry) for entry in found]
    if settings.allow_unselected or not ranks or any(rank is None for rank in ranks):
        return []
    assert settings.root is not None
    root_label = settings.root.resolve().name or str(settings.root)
    offered = [Offered(rank, ()) for rank in ranks if rank is not None]
    items: list[pytest.Item] = []
    for budget in budgets:  # one of rank_imbalance only: its own item says it has no ranks to compare
        if budget.checks() and not any(budget.selects_rank(o.rank) for o in offered):
            error = selects_nothing(budget, offered)
            assert error is not None
            items.append(MemgateErrorItem.from_parent(collector, name=f"{root_label}::{budget.name}::ranks",
                                                      error=error))
    return items


def _declared_at(item: pytest.Item) -> Declared:
    """Where a test is written: its file (relative to the rootdir) and 1-based line."""
    path, line, _ = item.location
    return Declared(path, line + 1 if line is not None else None)


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

    def declared_in(self) -> Declared | None:
        """Where what this item checks is declared (a budget's key in its file), for annotations."""
        return None


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

    def declared_in(self) -> Declared | None:
        return _declared_in_budget_file(self.config, self.budget, self.metric)

    def setup(self) -> None:
        assert self.found is not None
        state = self.config.stash[STATE]
        cache = state.load(self.found)
        if not self.budget.selects_rank(cache.info.rank):
            self._unless_nothing_selected()
            pytest.skip(printable(f"budget {self.budget.name!r} selects ranks {self.budget.ranks!r}; "
                                  f"this is rank {cache.info.rank}"))
        try:
            outcome = judge(cache, self.budget, self.metric)
        except NotSelected as exc:
            self._unless_nothing_selected()
            pytest.skip(printable(exc.message))  # a budget for other devices: the check does not apply
        self.stash[OUTCOME] = outcome
        self.stash[ROWS] = [CheckRow.judged(outcome)]

    def _unless_nothing_selected(self) -> None:
        """Raise where the budget selects no device of the whole run: its checks skipping everywhere would pass
        what nothing judged (a relabelled device, a renamed rank)."""
        error = self.config.stash[STATE].selects_nothing(self.budget)
        if error is not None:
            raise error

    def runtest(self) -> None:
        outcome = self.stash[OUTCOME]
        if not outcome.passed:
            raise BudgetExceeded(outcome.message, outcome.detail(_detail_top(self.config)))


class MemgateRankImbalanceItem(_GateItem):
    """One (budget, rank_imbalance metric): loads every profile the budget selects (wherever it runs,
    so under xdist one process holds all the per-rank values) and judges ``1 - min/max`` over them."""

    def __init__(self, *, profiles: list[Found], budget: Budget, metric: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.profiles = profiles
        self.budget = budget
        self.metric = metric

    def reportinfo(self) -> tuple[Path | str, int | None, str]:
        return self.config.stash[STATE].settings.root or self.name, None, f"memgate: {self.name}"

    def declared_in(self) -> Declared | None:
        return _declared_in_budget_file(self.config, self.budget, f"rank_imbalance[{self.metric}]")

    def setup(self) -> None:
        state = self.config.stash[STATE]
        values = []
        for entry in self.profiles:
            rank = rank_hint(entry)
            if rank is not None and not self.budget.selects_rank(rank):
                continue
            value = rank_values(state.load(entry), (self.budget,)).get((self.budget.name, self.metric))
            if value is not None:
                values.append(value)
        self.stash[ROWS] = [judge_rank_imbalance(self.budget, self.metric, values, str(state.settings.root or ""))]

    def runtest(self) -> None:
        [row] = self.stash[ROWS]
        if not row.passed:
            assert row.spread is not None
            lines = [f"rank {row.spread.worst_rank}: {row.spread.worst_profile}",
                     f"rank {row.spread.best_rank}: {row.spread.best_profile}"]
            raise BudgetExceeded(row.message, "\n".join(map(printable, lines)))  # one line per profile, whatever its name


class MemgateCompareItem(_GateItem):
    """One (profile, compare rule) against the baseline: a regression is a failed item."""

    def __init__(self, *, found: Found, rule: CompareRule, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.found = found
        self.rule = rule

    def setup(self) -> None:
        assert self.found is not None
        state = self.config.stash[STATE]
        assert state.baselines is not None
        cache = state.load(self.found)
        entry = profile_entry(cache.info, cache.get())
        baseline, where = state.baselines.for_entry(entry)
        if baseline is None:
            _baseline_missing(self.config, where)
            return
        try:
            regression = compare_entry(entry, baseline, self.rule)
        except (NotInBaseline, MetricNotInBaseline) as exc:  # the missing-baseline policy applies
            _baseline_missing(self.config, exc.one_line())
            return
        self.stash[REGRESSION] = (regression, where)
        self.stash[ROWS] = [CheckRow.compared(regression, str(self.found.path), where)]

    def runtest(self) -> None:
        if REGRESSION in self.stash:
            regression, where = self.stash[REGRESSION]
            if not regression.passed:
                raise BudgetExceeded(regression.message, "\n".join(filter(None, [regression.detail,
                                                                                  printable(f"baseline: {where}")])))


def _declared_in_budget_file(config: pytest.Config, budget: Budget, check: str) -> Declared | None:
    """Where a check of the budget file is declared: its key's line in the file."""
    budget_file = config.stash[STATE].settings.budget_file
    if budget_file is None or budget_file.path is None:
        return None
    return Declared(budget_file.path, budget_file.line_of(budget.name, check))


def _baseline_missing(config: pytest.Config, why: str, test: str | None = None) -> None:
    """The missing-baseline policy (``--memgate-baseline-missing``), for a compare item and a marked
    test (``test``) alike: fail raises, warn warns that nothing was compared, skip skips a compare
    item (a marked test, whose body passed, keeps its verdict)."""
    policy = config.stash[STATE].settings.missing_policy
    if policy == "fail":
        raise ConfigError(f"{why} (--memgate-baseline-missing=fail)")
    if policy == "warn":
        warnings.warn(pytest.PytestWarning(printable(f"memgate: {why}; nothing compared" + (f" for {test}" if test else ""))),
                      stacklevel=1)
    elif test is None:
        pytest.skip(printable(why))


def _detail_top(config: pytest.Config) -> int:
    return DETAIL_TOP * (1 + max(0, config.get_verbosity()))


def _short_repr(item: pytest.Item, excinfo: pytest.ExceptionInfo[BaseException]) -> Any:
    """The failure line as the crash message (JUnit ``message=``), then the detail section."""
    exc = excinfo.value
    if isinstance(exc, BudgetExceeded):
        line, detail = exc.line, exc.detail
    elif isinstance(exc, MemgateError):  # a bad marker's every keyword: the first, then the others
        line, detail = f"memgate: error: {exc.one_line()}", "\n".join(f"memgate: error: {x}" for x in exc.lines()[1:])
    else:
        return item._repr_failure_py(excinfo, style="short")
    line = printable(line)  # the crash message pytest's summary shows too
    text = "\n".join([line, *(["", *map(printable, detail.splitlines())] if detail else [])])
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
def memgate_load(request: pytest.FixtureRequest) -> Callable[..., list[Measured]]:
    """``memgate_load(path, warmup_steps=1, leak_horizon_steps=..., component=None)``: every profile
    under ``path`` with its metrics (:class:`memgate.session.Measured`): ``m["peak_allocated"]``,
    ``m.metrics``, ``m.devices``, ``m.profile`` — for assertions of your own."""
    default_horizon = request.config.stash[STATE].settings.leak_horizon_steps

    def _load(path: str | os.PathLike[str], *, warmup_steps: int = 1, leak_horizon_steps: int | None = None,
              component: str | None = None) -> list[Measured]:
        return measure(Path(path), warmup_steps=warmup_steps, component=component,
                       leak_horizon_steps=default_horizon if leak_horizon_steps is None else leak_horizon_steps)

    return _load


@pytest.fixture
def memgate_record(memgate_profile_dir: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A started recorder (torch.profiler with profile_memory and Python stacks, CUDA/NPU snapshots
    where present) writing into ``memgate_profile_dir``; call ``.step()`` once per training step.
    With ``@pytest.mark.memgate(...)`` the recording is gated right after the test body.
    Under ``--memgate-estimate=cuda[:DEVICE]``: an estimator (:mod:`memgate.estimation`) with the same calls,
    which runs the test's CUDA code on meta tensors and writes the estimate of what the device would record.
    """
    pytest.importorskip("torch", reason="memgate_record records a torch run: pip install 'pytest-memgate[torch]'")
    target = request.config.stash[STATE].settings.estimate
    recorder: Any
    if target is not None:
        from memgate.estimation.api import Estimator, Target

        recorder = Estimator(memgate_profile_dir, device=Target.parse(target).device.name).start()
    else:
        from memgate.record import Recorder

        recorder = Recorder(memgate_profile_dir).start()
    try:
        yield recorder
    finally:
        recorder.stop()


def _recorder(item: pytest.Item) -> Any:
    return getattr(item, "funcargs", {}).get("memgate_record")


def _finish_recording(item: pytest.Item) -> None:
    """Stop the test's recorder, if it has one, so its files exist before gating; keep them."""
    recorder = _recorder(item)
    if recorder is None:
        return
    files = recorder.stop()
    settings = item.config.stash[STATE].settings
    keep = settings.keep_traces
    if keep is not None and files and KEPT_TRACES not in item.stash:
        item.stash[KEPT_TRACES] = keep_recording(files, keep, item.nodeid)
    if (settings.report_left or settings.html_path is not None) and LEFT_BEHIND not in item.stash:  # the HTML shows it
        item.stash[LEFT_BEHIND] = left_by_test(recorder, item.nodeid)


def _marker_profile_path(item: pytest.Item, marker: pytest.Mark) -> Path:
    if "profile" in marker.kwargs:
        path = Path(marker.kwargs["profile"])
        return path if path.is_absolute() else Path(str(item.path)).parent / path
    return Path(getattr(item, "funcargs", {})["memgate_profile_dir"])


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if MARKER_ERROR in item.stash:
        raise item.stash[MARKER_ERROR]  # before any fixture: a bad marker records nothing


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    try:
        result = yield  # re-raises when the test body failed: no gating then
    except BaseException as exc:
        recorder = _recorder(item)
        from memgate.record import is_out_of_memory

        if recorder is None or not is_out_of_memory(exc):
            raise
        recorder.note_out_of_memory(exc)  # before the stop: the step, the levels, the snapshot stays
        _finish_recording(item)
        raise _out_of_memory_failure(item, recorder, exc) from exc
    finally:
        _finish_recording(item)
    marker = item.get_closest_marker(MARKER)
    if marker is None or isinstance(item, _GateItem) or MARKER_BUDGET not in item.stash:
        return result
    _gate_marked_test(item, marker, item.stash[MARKER_BUDGET])
    return result


def _out_of_memory_failure(item: pytest.Item, recorder: Any, exc: BaseException) -> OutOfMemoryFailure:
    """The failure of a recorded test an out-of-memory error stopped: the error in words (from the recording:
    the snapshot's oom entry, else what the recorder noted), the holders at it, where the recording is kept;
    its row (``oom``, limit 0) goes into the report."""
    kept = item.stash.get(KEPT_TRACES, None) or str(recorder.directory)
    oom: dict[str, Any] = {**(recorder.out_of_memory or {}), "size": (recorder.out_of_memory or {}).get("requested")}
    device: str | None = oom.get("device")
    count, rank, profile = 1, "", str(recorder.directory)
    try:
        for measured in measure(Path(recorder.directory)):
            for metrics in measured.devices:
                if metrics.values.get("ooms"):
                    oom, device, count = metrics.values["ooms"][-1], metrics.device, int(metrics.values["oom_count"])
                    rank, profile = measured.rank, measured.path
    except MemgateError as error:  # a recording memgate cannot read: the error's own words stand
        oom = {**oom, "unread": error.one_line()}
    line = oom_sentence(oom, device)
    cause = oom_cause(oom, device)
    detail = cause.lines(_detail_top(item.config))[1:]
    if oom.get("unread"):
        detail.append(f"(the recording could not be read: {oom['unread']})")
    detail.append(f"recording kept in {kept}")
    detail.append(f"the error: {_one_line(exc)}")
    item.stash[ROWS] = [CheckRow(profile, rank, "memgate_record", "oom", 0, count, False, device, line)]
    return OutOfMemoryFailure(line, "\n".join(detail))


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return printable(f"{type(exc).__name__}: {text[0] if text else ''}")


def _gate_marked_test(item: pytest.Item, marker: pytest.Mark, budget: Budget) -> None:
    """Judge the test's profile(s) against its marker (:func:`memgate.marks.judge_marked_test`): every
    check becomes a row; the first failure (else the first error) fails the test."""
    settings = item.config.stash[STATE].settings
    verdict = judge_marked_test(
        _marker_profile_path(item, marker), budget, _recorder(item) if "profile" not in marker.kwargs else None,
        test=item.nodeid, kept=item.stash.get(KEPT_TRACES, None), keep_profiles=settings.wants_profiles,
        compare=(lambda entry: _compare_marked(item, entry)) if settings.rules else None,
        allow_unselected=settings.allow_unselected)
    item.stash[ROWS] = verdict.rows
    item.stash[MARKER_PROFILES] = verdict.profiles
    failure = verdict.failure(_detail_top(item.config))
    if failure is not None:
        raise BudgetExceeded(*failure)
    if verdict.errors:
        raise verdict.errors[0]


def _compare_marked(item: pytest.Item, entry: dict[str, Any]) -> tuple[list[tuple[Regression, str]], list[MemgateError]]:
    """``--memgate-compare-fail`` rules on a marked test's history entry, against its saved run or baseline."""
    state = item.config.stash[STATE]
    assert state.baselines is not None
    try:
        baseline, where = state.baselines.for_entry(entry)
    except MemgateError as exc:
        return [], [exc]
    return compare_with_history(entry, state.settings.rules, baseline, where, test=item.nodeid,
                                missing=lambda why: _baseline_missing(item.config, why, test=item.nodeid))


# ---- reports -------------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if (call.excinfo is not None and isinstance(call.excinfo.value, (BudgetExceeded, MemgateError))
            and (isinstance(item, _GateItem) or _is_marked(item) or isinstance(call.excinfo.value, OutOfMemoryFailure))):
        # pytest renders setup errors with the traceback renderer, not repr_failure: replace both.
        report.longrepr = _short_repr(item, call.excinfo)
        if call.when == "call" and not isinstance(call.excinfo.value, BudgetExceeded):
            # memgate could not judge the test (not measurable, bad input): an error, as the same check
            # of a budget file is (judged in setup there) and as the table says, not a failed budget
            report.memgate_error = True  # type: ignore[attr-defined]  # plain JSON: travels through xdist
    payload = _payload(item, call)
    if payload is not None:
        report.memgate = payload.as_json()  # type: ignore[attr-defined]  # plain JSON: travels through xdist
    return report


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, Any] | None:
    """A marked test memgate could not judge reads ERROR (and counts among the errors), like its row."""
    if report.when == "call" and report.failed and getattr(report, "memgate_error", False):
        return "error", "E", ("ERROR", {"red": True})
    return None


def _is_marked(item: pytest.Item) -> bool:
    return item.get_closest_marker(MARKER) is not None


def _payload(item: pytest.Item, call: pytest.CallInfo[None]) -> ReportPayload | None:
    """What the controller needs from this report: the test, its rows or its error, and once the
    metrics of each profile. Only memgate's own items and marked tests carry one (an unmarked test
    whose recording was kept: where)."""
    if not isinstance(item, _GateItem) and not _is_marked(item):
        oom_rows = item.stash.get(ROWS, []) if call.when == "call" else []  # an out-of-memory error's row
        if call.when != "call" or (KEPT_TRACES not in item.stash and LEFT_BEHIND not in item.stash and not oom_rows):
            return None
        return ReportPayload(test=item.nodeid if oom_rows else None,
                             rows=[row.of_test(item.nodeid, _declared_at(item)) for row in oom_rows],
                             kept=item.stash.get(KEPT_TRACES, None), left=item.stash.get(LEFT_BEHIND, []))
    state = item.config.stash[STATE]
    payload = ReportPayload(test=item.nodeid)
    declared = item.declared_in() if isinstance(item, _GateItem) else _declared_at(item)
    found = getattr(item, "found", None)
    rows: list[CheckRow] = item.stash.get(ROWS, []) if call.when == "call" else []
    error = call.excinfo.value if call.excinfo is not None and isinstance(call.excinfo.value, MemgateError) else None
    if not rows and error is not None:
        if isinstance(item, MemgateItem):  # the row says it
            rows = [CheckRow.unjudged(None, str(found.path) if found else "", item.budget, item.metric, error)]
        else:
            payload.error = ErrorRow(str(found.path) if found else "", error.one_line(), item.nodeid, declared)
    payload.rows = [row.of_test(item.nodeid, declared) for row in rows]
    for row in payload.rows:
        if row.value is not None:
            # JUnit writes the teardown report's properties, which pytest copies from the item.
            item.user_properties.extend([
                (f"{row.property_prefix}.measured", row.value),
                (f"{row.property_prefix}.limit", row.limit),
                (f"{row.property_prefix}.unit", unit_of(row.metric)),  # LIMITS' kind: "ratio" or "bytes"
                (f"{row.property_prefix}.result", "pass" if row.passed else "FAIL"),
            ])
    if call.when == "call":
        payload.marker_profiles = item.stash.get(MARKER_PROFILES, [])
        payload.kept = item.stash.get(KEPT_TRACES, None)
        payload.left = item.stash.get(LEFT_BEHIND, [])
    if state.settings.wants_profiles and found is not None and call.when == "call":
        key = str(found.path)
        loaded = state.profiles.get(key)
        if key not in state.reported_profiles and isinstance(loaded, MetricCache):
            state.reported_profiles.add(key)
            payload.profile = profile_entry(loaded.info, loaded.get())
    return payload


class _Reporter:
    """On the controller: hands each report's payload (also those xdist workers send) to the run's
    outputs, writes them when the session ends and says so in the terminal summary."""

    def __init__(self, outputs: RunOutputs) -> None:
        self.outputs = outputs

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, "memgate", None)
        if payload:
            self.outputs.add(ReportPayload.from_json(payload), _pytest_word(report))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for kind, text in self.outputs.summary():
            if kind == "section":
                terminalreporter.section(text)
            elif kind == "error":
                terminalreporter.write_line(text, red=True)
            else:
                terminalreporter.write_line(text)

    @pytest.hookimpl(tryfirst=True)  # before pytest may remove the temporary folders recordings are in
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if not self.outputs.write() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.USAGE_ERROR


def _pytest_word(report: pytest.TestReport) -> str | None:
    """The word pytest's summary counts this report under (None: a phase pytest does not count)."""
    if hasattr(report, "wasxfail"):
        return "xpassed" if report.passed and report.when == "call" else ("xfailed" if report.skipped else None)
    if report.failed:
        return "failed" if report.when == "call" and not getattr(report, "memgate_error", False) else "error"
    if report.skipped:
        return "skipped"
    return "passed" if report.when == "call" else None

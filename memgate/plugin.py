"""The pytest plugin: a thin shell over the pure core. The only module importing pytest.

- ``--memgate=PATH`` generates one item per (profile, budget, metric), and with
  ``--memgate-baseline`` one item per (profile, compare rule).
- ``@pytest.mark.memgate(...)`` gates a test's own profile after its body; its checks are named
  after the test everywhere (rows, JSON, JUnit, HTML, step summary, annotations). A bad marker is
  found at collection and fails that test alone, at setup.
- ``--memgate-autosave`` / ``--memgate-compare[=ID]`` keep and compare runs under ``.memgate/``
  (:mod:`memgate.autosave`); ``memgate_load`` returns metrics for a test's own assertions.
- Results travel on reports (``report.memgate``, plain JSON), so under pytest-xdist the controller
  alone prints the summary table and writes the JSON report, baseline and CI outputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import warnings
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from _pytest._code.code import ExceptionChainRepr, ReprEntryNative, ReprFileLocation, ReprTraceback

from memgate.autosave import check_run_id, find_run, git_commit, missing_run, save_run
from memgate.budgets import (
    Budget,
    BudgetFile,
    MetricCache,
    Outcome,
    budget_from_mapping,
    find_budget_file,
    judge,
    judge_rank_imbalance,
    load_budget_file,
)
from memgate.cache import ProfileCache, open_profile
from memgate.ci import benchmark_export, github_annotations, step_summary_markdown, unit_of
from memgate.compare import (
    CompareRule,
    Regression,
    baseline_entries,
    baseline_from_entries,
    comparable_key,
    compare_entry,
    compare_pair,
    diff_entries,
    diff_text,
    load_baseline,
    parse_rule,
    ratchet,
)
from memgate.discover import Found, discover, load, rank_hint
from memgate.errors import ConfigError, MemgateError, NotMeasurable, NotSelected, printable
from memgate.hints import RECORDED_BY_FIXTURE
from memgate.identity import NO_TIMESTAMP, RAW, stable_name
from memgate.metrics import MetricOptions
from memgate.model import Profile
from memgate.report import (
    build_report,
    outcome_entry,
    profile_entry,
    summary_table,
    write_json_atomic,
    write_text_atomic,
)
from memgate.session import Measured, error_outcome, measure, rank_values


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
    _Option("memgate_leak_horizon_steps", "string", "N",
            "default leak_horizon_steps of budgets and markers: the last N counted steps whose live blocks may "
            "still be freed later (default 1)"),
)
OPTION = {o.dest: o for o in OPTIONS}
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
    autosave: bool = False
    compare_id: str | None = None  # None: no --memgate-compare; "": the latest saved run
    storage: Path = Path(".memgate")
    rules: list[CompareRule] = field(default_factory=list)
    missing_policy: str = "warn"
    leak_horizon_steps: int = 1
    ratchet: bool = False
    benchmark_json: Path | None = None
    html_path: Path | None = None
    keep_traces: Path | None = None
    cache_dir: Path | None = None

    @property
    def compares(self) -> bool:
        return self.baseline_path is not None or self.compare_id is not None

    @property
    def wants_profiles(self) -> bool:
        """Whether the controller needs every profile's metrics (not only the verdicts)."""
        return self.autosave or self.compares or any(
            p is not None for p in (self.json_path, self.save_baseline, self.benchmark_json, self.html_path))


class _State:
    """Per-process session state, kept in ``config.stash``."""

    def __init__(self, settings: _Settings) -> None:
        self.settings = settings
        self.profiles: dict[str, MetricCache | MemgateError] = {}
        self.reported_profiles: set[str] = set()  # attach each profile entry to one report per process
        self._baselines: dict[Path, dict[str, Any] | MemgateError] = {}
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

    def _read_baseline(self, path: Path) -> dict[str, Any]:
        if path not in self._baselines:
            try:
                self._baselines[path] = load_baseline(path)
            except MemgateError as exc:
                self._baselines[path] = exc
        loaded = self._baselines[path]
        if isinstance(loaded, MemgateError):
            raise loaded
        return loaded

    def baseline_for(self, entry: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """(the baseline to compare ``entry`` with, where it is) — (None, why) when there is none,
        for the missing-baseline policy: ``--memgate-baseline=FILE``, else the saved run
        ``--memgate-compare`` picks for the profile's configuration."""
        s = self.settings
        if s.baseline_path is not None:
            if not s.baseline_path.exists():
                return None, f"baseline {s.baseline_path} does not exist"
            return self._read_baseline(s.baseline_path), str(s.baseline_path)
        assert s.compare_id is not None
        key = comparable_key(entry)
        run = find_run(s.storage, key, s.compare_id)
        if run is None:
            return None, missing_run(s.storage, key, s.compare_id)
        return self._read_baseline(run.path), str(run.path)


STATE = pytest.StashKey[_State]()
OUTCOME = pytest.StashKey[Outcome]()
REGRESSION = pytest.StashKey[tuple[Regression, str]]()
MARKER_OUTCOMES = pytest.StashKey[list[dict[str, Any]]]()
CROSS_OUTCOME = pytest.StashKey[dict[str, Any]]()  # a rank_imbalance verdict, over every profile
MARKER_BUDGET = pytest.StashKey[Budget]()
MARKER_ERROR = pytest.StashKey[ConfigError]()
MARKER_PROFILES = pytest.StashKey[list[dict[str, Any]]]()
KEPT_TRACES = pytest.StashKey[str]()
KEPT_BESIDE_REPORT = "memgate-recordings"  # --memgate-keep-traces' default with --memgate-html/--memgate-json


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


def _path_setting(config: pytest.Config, dest: str) -> Path | None:
    value, base = _setting(config, dest)
    return base / str(value) if value else None


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
        else:
            _refuse_test_path(config, str(root), base / root)
        settings.root = base / root
    settings.json_path = _path_setting(config, "memgate_json")
    settings.baseline_path = _path_setting(config, "memgate_baseline")
    settings.save_baseline = _path_setting(config, "memgate_save_baseline")
    settings.autosave = bool(_setting(config, "memgate_autosave")[0])
    compare_id, _ = _setting(config, "memgate_compare")
    settings.compare_id = None if compare_id is None else check_run_id(str(compare_id))
    settings.storage = _path_setting(config, "memgate_storage") or Path(config.rootpath) / ".memgate"
    settings.benchmark_json = _path_setting(config, "memgate_benchmark_json")
    settings.html_path = _path_setting(config, "memgate_html")
    settings.keep_traces = _path_setting(config, "memgate_keep_traces")
    report = settings.html_path or settings.json_path
    if settings.keep_traces is None and report is not None:
        # a report's paths must outlive pytest's temporary folders (it removes all but the last three)
        settings.keep_traces = report.parent / KEPT_BESIDE_REPORT
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
    settings.ratchet = bool(_setting(config, "memgate_ratchet")[0])
    if settings.baseline_path is not None and settings.compare_id is not None:
        raise ConfigError("--memgate-baseline and --memgate-compare both name what to compare with; give one")
    if settings.rules and not settings.compares:
        raise ConfigError("--memgate-compare-fail needs --memgate-baseline=FILE or --memgate-compare[=ID]")
    if settings.ratchet and settings.save_baseline is None:
        raise ConfigError("--memgate-ratchet needs --memgate-save-baseline=PATH")
    return settings


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "memgate(**limits): memory budget for this test's profile, e.g. peak_allocated='2 GiB', "
        "op_caps={'aten::matmul*': '512 MiB'}; the profile comes from the memgate_record fixture "
        "(or memgate_profile_dir) or profile='path'; gated after the test body",
    )
    try:
        settings = _read_settings(config)
    except MemgateError as exc:  # a budget file's every error, one a line in file order
        raise pytest.UsageError("\n".join(f"memgate: {line}" for line in exc.lines())) from None
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
        if marker is not None and not isinstance(item, _GateItem):
            # Checked now, reported as an error of this test alone: the other tests still run.
            try:
                item.stash[MARKER_BUDGET] = _marker_budget(item, marker)
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
    if found:  # one item per (budget, metric), judged over every profile it selects
        root_label = settings.root.resolve().name or str(settings.root)
        for budget in budgets:
            for metric in budget.rank_imbalance:
                generated.append(MemgateRankImbalanceItem.from_parent(
                    collector, name=f"{root_label}::{budget.name}::rank_imbalance[{metric}]", profiles=found,
                    budget=budget, metric=metric))
    items.extend(generated)
    # Announce them like any collected items, so "collected N items" and --collect-only count them.
    session.ihook.pytest_collectreport(report=pytest.CollectReport(collector.nodeid, "passed", None, list(generated)))


def _profile_labels(found: list[Found], root: Path) -> list[str]:
    """Item-id labels: each profile's path from the --memgate root's parent (unique, readable in JUnit),
    the run-varying parts of the writers' names starred as pairing stars them (``host_*.*.pt.trace.json``),
    so a test keeps its id from run to run; profiles whose starred labels clash keep more of their names
    (the pid, then everything)."""
    base = root.resolve().parent
    raw = []
    for entry in found:
        try:
            raw.append(entry.path.resolve().relative_to(base).as_posix())
        except ValueError:
            raw.append(entry.path.as_posix())
    labels = ["/".join(stable_name(part) for part in label.split("/")) for label in raw]
    for level in (NO_TIMESTAMP, RAW):
        clashing = {label for label in labels if labels.count(label) > 1}
        labels = ["/".join(stable_name(part, level) for part in r.split("/")) if label in clashing else label
                  for r, label in zip(raw, labels)]
    return labels if len(set(labels)) == len(labels) else raw


def _declared_at(item: pytest.Item) -> dict[str, Any]:
    """Where a test is written: its file (relative to the rootdir) and 1-based line."""
    path, line, _ = item.location
    return {"file": path, "line": line + 1 if line is not None else None}


def _marker_budget(item: pytest.Item, marker: pytest.Mark) -> Budget:
    """The marker's budget, named after its test; a ConfigError naming the test, the file and line,
    and the key (with the closest valid key for a misspelling)."""
    where = _declared_at(item)

    def error(message: str, cause: MemgateError | None = None) -> ConfigError:
        return ConfigError(f"memgate marker of {item.nodeid}: {message}", file=where["file"], line=where["line"],
                           expected=cause.expected if cause else None, found=cause.found if cause else None)

    if marker.args:
        raise error(f"takes keywords only, got {marker.args!r}")
    kwargs = dict(marker.kwargs)
    profile = kwargs.get("profile")
    if profile is not None and not isinstance(profile, (str, os.PathLike)):
        raise error(f"invalid profile {profile!r}", ConfigError("", expected="a path (str or pathlib.Path)"))
    try:
        budget = budget_from_mapping(kwargs, origin=item.nodeid, default_name="marker", extra_keys=("profile",),
                                     default_leak_horizon=item.config.stash[STATE].settings.leak_horizon_steps)
    except ConfigError as exc:
        raise error(exc.message, exc) from None
    if budget.rank_imbalance:
        raise error("rank_imbalance compares the ranks of a run: declare it in a budget file, not a marker")
    if profile is None and "memgate_profile_dir" not in getattr(item, "fixturenames", ()):
        raise error("needs a profile: use the memgate_record fixture (or memgate_profile_dir) or pass profile='path'")
    # Named after its test, so two marked tests are two rows in every table, report and annotation.
    return dataclasses.replace(budget, name=item.nodeid if "name" not in kwargs else f"{item.nodeid} ({budget.name})")


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

    def declared_in(self) -> dict[str, Any] | None:
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

    def declared_in(self) -> dict[str, Any] | None:
        budget_file = self.config.stash[STATE].settings.budget_file
        if budget_file is None or budget_file.path is None:
            return None
        return {"file": budget_file.path, "line": budget_file.line_of(self.budget.name, self.metric)}

    def setup(self) -> None:
        assert self.found is not None
        cache = self.config.stash[STATE].load(self.found)
        if not self.budget.selects_rank(cache.info.rank):
            pytest.skip(f"budget {self.budget.name!r} selects ranks {self.budget.ranks!r}; this is rank {cache.info.rank}")
        try:
            self.stash[OUTCOME] = judge(cache, self.budget, self.metric)
        except NotSelected as exc:
            pytest.skip(exc.message)  # a budget for other devices: the check does not apply

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

    def declared_in(self) -> dict[str, Any] | None:
        budget_file = self.config.stash[STATE].settings.budget_file
        if budget_file is None or budget_file.path is None:
            return None
        return {"file": budget_file.path, "line": budget_file.line_of(self.budget.name, f"rank_imbalance[{self.metric}]")}

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
        self.stash[CROSS_OUTCOME] = judge_rank_imbalance(self.budget, self.metric, values,
                                                         str(state.settings.root or ""))

    def runtest(self) -> None:
        outcome = self.stash[CROSS_OUTCOME]
        if not outcome["passed"]:
            lines = [f"rank {outcome['worst_rank']}: {outcome['worst_profile']}",
                     f"rank {outcome['best_rank']}: {outcome['best_profile']}"]
            raise BudgetExceeded(outcome["message"], "\n".join(lines))


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
        entry = profile_entry(cache.info, cache.get())
        baseline, where = state.baseline_for(entry)
        if baseline is None:
            self._missing(where)
            return
        try:
            self.stash[REGRESSION] = (compare_entry(entry, baseline, self.rule), where)
        except KeyError as exc:
            self._missing(exc.one_line() if isinstance(exc, MemgateError) else f"rank {cache.info.rank} is not in baseline {where}")

    def _missing(self, why: str) -> None:
        policy = self.config.stash[STATE].settings.missing_policy
        if policy == "fail":
            raise ConfigError(f"{why} (--memgate-baseline-missing=fail)")
        if policy == "skip":
            pytest.skip(why)
        warnings.warn(pytest.PytestWarning(f"memgate: {why}; nothing compared"), stacklevel=1)

    def runtest(self) -> None:
        if REGRESSION in self.stash:
            regression, where = self.stash[REGRESSION]
            if not regression.passed:
                raise BudgetExceeded(regression.message, "\n".join(filter(None, [regression.detail, f"baseline: {where}"])))


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
def memgate_record(memgate_profile_dir: Path) -> Iterator[Any]:
    """A started recorder (torch.profiler with profile_memory and Python stacks, CUDA/NPU snapshots
    where present) writing into ``memgate_profile_dir``; call ``.step()`` once per training step.
    With ``@pytest.mark.memgate(...)`` the recording is gated right after the test body.
    """
    pytest.importorskip("torch", reason="memgate_record records a torch run: pip install 'memgate[torch]'")
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
    keep = item.config.stash[STATE].settings.keep_traces
    if keep is not None and files and KEPT_TRACES not in item.stash:
        target = keep / _artifact_name(item.nodeid)
        target.mkdir(parents=True, exist_ok=True)
        for path in files:
            shutil.copy2(path, target / path.name)
        item.stash[KEPT_TRACES] = str(target)


def _kept_path(item: pytest.Item, recorder: Any, path: str | Path) -> str:
    """Where a recorded profile's kept copy lies (the path reports and saved runs give), else ``path``."""
    kept = item.stash.get(KEPT_TRACES, None)
    if kept is None or recorder is None:
        return str(path)
    try:
        inside = Path(path).relative_to(recorder.directory)
    except ValueError:
        return str(path)
    return str(Path(kept) / inside) if inside.parts else kept


def _artifact_name(nodeid: str) -> str:
    """A folder name for a test: its id with path separators and odd characters replaced, and a
    short hash of the exact id (two ids that read alike never share a folder)."""
    readable = re.sub(r"[^A-Za-z0-9._=+-]+", "_", nodeid.replace("::", ".")).strip("._")[:120]
    return f"{readable}-{hashlib.sha256(nodeid.encode()).hexdigest()[:8]}"


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
    finally:
        _finish_recording(item)
    marker = item.get_closest_marker("memgate")
    if marker is None or isinstance(item, _GateItem) or MARKER_BUDGET not in item.stash:
        return result
    _gate_marked_test(item, marker, item.stash[MARKER_BUDGET])
    return result


def _gate_marked_test(item: pytest.Item, marker: pytest.Mark, budget: Budget) -> None:
    """Judge the test's profile(s) against its marker: every check becomes a row (its verdict or its
    error); the first failure (else the first error) fails the test."""
    state = item.config.stash[STATE]
    path = _marker_profile_path(item, marker)
    recorder = _recorder(item) if "profile" not in marker.kwargs else None
    rows: list[dict[str, Any]] = []
    item.stash[MARKER_OUTCOMES] = rows
    item.stash[MARKER_PROFILES] = []
    failed: list[Outcome] = []
    regressions: list[tuple[Regression, str]] = []  # --memgate-compare-fail against the test's history
    errors: list[MemgateError] = []
    try:
        if recorder is not None and recorder.memory_events == 0:
            raise NotMeasurable("memgate_record recorded no tensor allocation: the test body allocated no torch "
                                "memory while it recorded (the fixture records with profile_memory=True)",
                                file=path, expected="a test body that allocates tensors, or no memgate marker")
        profiles = [_made_by(load(found), recorder) for found in discover(path)]
    except MemgateError as exc:
        rows.extend(error_outcome(None, str(path), budget, metric, exc) for metric in budget.checks())
        raise
    for profile in profiles:
        cache = MetricCache(profile)
        outcomes: list[Outcome | MemgateError] = [_judged(cache, budget, metric) for metric in budget.checks()]
        if recorder is not None and (state.settings.wants_profiles or any(
                isinstance(o, Outcome) and not o.passed for o in outcomes)):
            _add_allocation_stacks(cache, budget, profile)
            outcomes = [_judged(cache, budget, metric) for metric in budget.checks()]
        for metric, outcome in zip(budget.checks(), outcomes):
            if isinstance(outcome, MemgateError):
                if not isinstance(outcome, NotSelected):  # not selected: a skipped row, no error
                    errors.append(outcome)
                rows.append(error_outcome(cache.info, profile.path, budget, metric, outcome))
            else:
                rows.append(outcome_entry(outcome))
                if not outcome.passed:
                    failed.append(outcome)
        if state.settings.wants_profiles:
            entry = profile_entry(cache.info, cache.get())
            entry["path"] = _kept_path(item, recorder, profile.path)
            entry["metadata"] = {**entry.get("metadata", {}), "test": item.nodeid}
            item.stash[MARKER_PROFILES].append(entry)
            if state.settings.rules:
                regressions.extend(_compared(item, test_history_entry(entry, len(profiles)), errors))
    if failed or regressions:
        messages = [o.message for o in failed] + [r.message for r, _ in regressions]
        first = failed[0].detail(_detail_top(item.config)) if failed else "\n".join(
            filter(None, [regressions[0][0].detail, f"baseline: {regressions[0][1]}"]))
        detail = "\n".join(messages[1:] + [f"memgate: error: {e.one_line()}" for e in errors] + [first])
        raise BudgetExceeded(messages[0], detail)
    if errors:
        raise errors[0]


def test_history_entry(entry: dict[str, Any], profiles_of_test: int = 1) -> dict[str, Any]:
    """A marked test's profile entry as its history keys it: by the test's node id (its recording lives
    in a temporary folder whose name changes every run); several profiles of one test by their folder too."""
    meta = entry.get("metadata") or {}
    test = str(meta.get("test") or entry["path"])
    path = test if profiles_of_test <= 1 else f"{test}/{Path(str(entry['path'])).name}"
    return {**entry, "path": path, "metadata": {**meta, "profile_dir": entry["path"]}}


def _compared(item: pytest.Item, entry: dict[str, Any], errors: list[MemgateError]) -> list[tuple[Regression, str]]:
    """``--memgate-compare-fail`` rules judged on a marked test's profile against its saved run or baseline."""
    state = item.config.stash[STATE]
    try:
        baseline, where = state.baseline_for(entry)
    except MemgateError as exc:
        errors.append(exc)
        return []
    found: list[tuple[Regression, str]] = []
    for rule in state.settings.rules:
        why = where
        # a test is compared with itself only: by its node id, never with another test of the same rank
        same = [b for b in baseline_entries(baseline) if b.get("path") == entry["path"]] if baseline is not None else []
        if same:
            try:
                regression = compare_pair(same[0], entry, rule)
            except MemgateError as exc:
                errors.append(exc)
                continue
            if not regression.passed:
                found.append((regression, where))
            continue
        if baseline is not None:  # the test is new since that run
            why = f"{item.nodeid} is not in {where}"
        policy = state.settings.missing_policy
        if policy == "fail":
            errors.append(ConfigError(f"{why} (--memgate-baseline-missing=fail)"))
        elif policy == "warn":
            warnings.warn(pytest.PytestWarning(f"memgate: {why}; nothing compared for {item.nodeid}"), stacklevel=1)
        break  # one word per test about a missing baseline, not one per rule
    return found


def _judged(cache: MetricCache, budget: Budget, metric: str) -> Outcome | MemgateError:
    try:
        return judge(cache, budget, metric)
    except MemgateError as exc:
        return exc


def _made_by(profile: Profile, recorder: Any) -> Profile:
    """A profile memgate_record wrote says so, so its hints speak of the fixture, not of torch.profiler."""
    if recorder is None:
        return profile
    return dataclasses.replace(profile, metadata={**profile.metadata, "recorded_by": RECORDED_BY_FIXTURE,
                                                  "recorded_steps": recorder.steps})


def _add_allocation_stacks(cache: MetricCache, budget: Budget, profile: Profile) -> None:
    """Give the holders at the peak the Python functions that allocated them (the recorded trace)."""
    from memgate.record import with_allocation_stacks

    if profile.format == "kineto":
        trace = Path(profile.path)
    elif profile.format == "torch_recording":  # the trace beside the snapshot (whose blocks carry frames)
        trace = Path(profile.path) / str((profile.metadata.get("files") or {}).get("trace"))
    else:
        return  # a snapshot: its blocks carry their own frames
    for options in {budget.options, MetricOptions()}:
        for metrics in cache.get(options):
            holders = metrics.values.get("top_at_peak") or []
            if holders and not any("stack" in h for h in holders):
                metrics.values["top_at_peak"] = with_allocation_stacks(trace, holders)


# ---- reports -------------------------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if (call.excinfo is not None and isinstance(call.excinfo.value, (BudgetExceeded, MemgateError))
            and (isinstance(item, _GateItem) or _is_marked(item))):
        # pytest renders setup errors with the traceback renderer, not repr_failure: replace both.
        report.longrepr = _short_repr(item, call.excinfo)
        if call.when == "call" and not isinstance(call.excinfo.value, BudgetExceeded):
            # memgate could not judge the test (not measurable, bad input): an error, as the same check
            # of a budget file is (judged in setup there) and as the table says, not a failed budget
            report.memgate_error = True  # type: ignore[attr-defined]  # plain JSON: travels through xdist
    payload = _payload(item, call)
    if payload:
        report.memgate = payload  # type: ignore[attr-defined]  # plain JSON: travels through xdist
    return report


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, Any] | None:
    """A marked test memgate could not judge reads ERROR (and counts among the errors), like its row."""
    if report.when == "call" and report.failed and getattr(report, "memgate_error", False):
        return "error", "E", ("ERROR", {"red": True})
    return None


def _is_marked(item: pytest.Item) -> bool:
    return item.get_closest_marker("memgate") is not None


def _payload(item: pytest.Item, call: pytest.CallInfo[None]) -> dict[str, Any]:
    """What the controller needs from this report: the test, verdicts, errors, and once the metrics
    of each profile. Only memgate's own items and marked tests carry one."""
    if not isinstance(item, _GateItem) and not _is_marked(item):
        # a recording without a marker: only where it was kept
        return {"kept": item.stash[KEPT_TRACES]} if call.when == "call" and KEPT_TRACES in item.stash else {}
    state = item.config.stash[STATE]
    payload: dict[str, Any] = {"test": item.nodeid}
    declared = item.declared_in() if isinstance(item, _GateItem) else _declared_at(item)
    outcomes: list[dict[str, Any]] = []
    if call.when == "call":
        if OUTCOME in item.stash:
            outcomes = [outcome_entry(item.stash[OUTCOME])]
        elif CROSS_OUTCOME in item.stash:
            outcomes = [item.stash[CROSS_OUTCOME].copy()]
        elif MARKER_OUTCOMES in item.stash:
            outcomes = item.stash[MARKER_OUTCOMES].copy()
        elif REGRESSION in item.stash:
            r, where = item.stash[REGRESSION]
            found = getattr(item, "found", None)
            outcomes = [{"profile": str(found.path) if found else "", "rank": r.rank, "budget": "baseline",
                         "metric": r.metric, "limit": r.allowed, "value": r.value, "passed": r.passed,
                         "device": r.device, "message": r.message, "baseline_value": r.base, "baseline": where,
                         "attribution": r.attribution, "baseline_commit": r.baseline_commit}]
    error = call.excinfo.value if call.excinfo is not None and isinstance(call.excinfo.value, MemgateError) else None
    if not outcomes and error is not None:
        found = getattr(item, "found", None)
        payload["error"] = {"item": item.nodeid, "test": item.nodeid, "profile": str(found.path) if found else "",
                            "error": error.one_line(), "declared_in": declared}
        if isinstance(item, MemgateItem):
            path = str(item.found.path) if item.found else ""
            outcomes = [error_outcome(None, path, item.budget, item.metric, error)]
            del payload["error"]  # the row says it
    if outcomes:
        for o in outcomes:
            o["test"] = item.nodeid
            if declared is not None:
                o["declared_in"] = declared
        payload["outcomes"] = outcomes
        for o in outcomes:
            if o.get("value") is None:
                continue
            unit = unit_of(o["metric"])  # LIMITS' kind: "ratio" or "bytes" (op_caps: bytes)
            # JUnit writes the teardown report's properties, which pytest copies from the item.
            item.user_properties.extend([
                (f"memgate.{o['metric']}.measured", o["value"]),
                (f"memgate.{o['metric']}.limit", o["limit"]),
                (f"memgate.{o['metric']}.unit", unit),
            ])
    if call.when == "call" and MARKER_PROFILES in item.stash:
        payload["marker_profiles"] = item.stash[MARKER_PROFILES]
    if call.when == "call" and KEPT_TRACES in item.stash:
        payload["kept"] = item.stash[KEPT_TRACES]
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
        self.entries: dict[str, dict[str, Any]] = {}  # --memgate profiles, by path
        self.marker_entries: dict[str, dict[str, Any]] = {}  # marked tests' profiles, by path
        self.errors: list[dict[str, Any]] = []
        self.late_errors: list[str] = []  # found at the session's end (an unreadable baseline to ratchet)
        self.counts: dict[str, int] = {}  # memgate's tests, counted as pytest counts them
        self.kept: list[str] = []
        self.saved: list[Path] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        payload = getattr(report, "memgate", None)
        if not payload:
            return
        word = _pytest_word(report)
        if word is not None and "test" in payload:  # memgate's own items and marked tests
            self.counts[word] = self.counts.get(word, 0) + 1
        self.outcomes.extend(payload.get("outcomes", []))
        if "profile" in payload:
            self.entries.setdefault(payload["profile"]["path"], payload["profile"])
        for entry in payload.get("marker_profiles", []):
            self.marker_entries.setdefault(entry["path"], entry)
        if "error" in payload:
            self.errors.append(payload["error"])
        if "kept" in payload:
            self.kept.append(payload["kept"])

    def _sorted_outcomes(self) -> list[dict[str, Any]]:
        return sorted(self.outcomes, key=lambda o: (o["profile"], o["budget"], o["metric"]))

    def _entries(self) -> list[dict[str, Any]]:
        return [self.entries[k] for k in sorted(self.entries)]

    def _all_entries(self) -> list[dict[str, Any]]:
        return self._entries() + [self.marker_entries[k] for k in sorted(self.marker_entries)]

    def _history_entries(self) -> list[dict[str, Any]]:
        """What baselines, saved runs, comparisons and benchmark JSON keep: the --memgate profiles and
        every marked test's profile, keyed by its node id."""
        per_test: dict[str, int] = {}
        for entry in self.marker_entries.values():
            test = str((entry.get("metadata") or {}).get("test"))
            per_test[test] = per_test.get(test, 0) + 1
        tests = [test_history_entry(e, per_test[str((e.get("metadata") or {}).get("test"))])
                 for e in self.marker_entries.values()]
        return self._entries() + sorted(tests, key=lambda e: str(e["path"]))

    def _repository_path(self, file: str) -> str:
        """A declared file relative to the GitHub workspace (else the rootdir), as annotations need."""
        path = Path(file)
        absolute = path if path.is_absolute() else Path(self.config.rootpath) / path
        for base in (os.environ.get("GITHUB_WORKSPACE"), str(self.config.rootpath)):
            if base:
                try:
                    return absolute.resolve().relative_to(Path(base).resolve()).as_posix()
                except ValueError:
                    continue
        return path.as_posix()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for line in self.late_errors:
            terminalreporter.write_line(printable(line), red=True)
        if self.outcomes:
            terminalreporter.section("memgate")
            for line in summary_table(self._sorted_outcomes()):
                terminalreporter.write_line(printable(line))
        if self.settings.compare_id is not None and (self.entries or self.marker_entries):
            self._write_comparison(terminalreporter)
        if os.environ.get("GITHUB_ACTIONS") == "true":
            for line in github_annotations(self._sorted_outcomes(), self.errors, self._repository_path):
                terminalreporter.write_line(printable(line))
        for what, path in (("JSON report", self.settings.json_path), ("baseline", self.settings.save_baseline),
                           ("benchmark JSON", self.settings.benchmark_json), ("HTML report", self.settings.html_path)):
            if path is not None and path.exists():
                terminalreporter.write_line(f"memgate: {what} written to {path}")
        if self.kept:
            terminalreporter.write_line(f"memgate: recordings of {len(self.kept)} test(s) kept in "
                                        f"{self.settings.keep_traces}")
        if self.settings.autosave:  # pytest_sessionfinish (which saves) runs before this summary
            terminalreporter.write_line(
                f"memgate: run saved to {', '.join(str(p) for p in self.saved)}" if self.saved
                else "memgate: --memgate-autosave saved nothing: no --memgate=PATH profile and no marked test "
                     "was measured in this run")

    def _write_comparison(self, terminalreporter: Any) -> None:
        """Every metric's change against the saved run each profile is compared with."""
        groups: dict[str, list[dict[str, Any]]] = {}
        missing = []
        for entry in self._history_entries():
            run = find_run(self.settings.storage, comparable_key(entry), self.settings.compare_id or "")
            if run is None:
                missing.append(missing_run(self.settings.storage, comparable_key(entry), self.settings.compare_id or ""))
            else:
                groups.setdefault(str(run.path), []).append(entry)
        terminalreporter.section("memgate compare")
        for line in dict.fromkeys(missing):
            terminalreporter.write_line(f"memgate: {line}")
        for path, entries in sorted(groups.items()):
            terminalreporter.write_line(f"compared with {path}:")
            try:
                base = baseline_entries(load_baseline(path))
            except MemgateError as exc:
                terminalreporter.write_line(f"memgate: error: {exc.one_line()}")
                continue
            for line in diff_text(diff_entries(base, entries)):
                terminalreporter.write_line(printable(line))

    @pytest.hookimpl(tryfirst=True)  # before pytest may remove the temporary folders recordings are in
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        s = self.settings
        outcomes, entries = self._sorted_outcomes(), self._history_entries()
        if s.json_path is not None:
            write_json_atomic(s.json_path, build_report(self._all_entries(), outcomes, self.errors))
        if s.save_baseline is not None and not entries:
            self.late_errors.append(f"memgate: warning: --memgate-save-baseline={s.save_baseline} wrote nothing: no "
                                    "--memgate=PATH profile and no marked test was measured in this run")
        if s.save_baseline is not None and entries:
            commit, dirty = git_commit(Path(self.config.rootpath))
            baseline = baseline_from_entries(entries, commit=commit, dirty=dirty)
            try:
                if s.ratchet and s.save_baseline.exists():
                    baseline = ratchet(load_baseline(s.save_baseline), baseline)
                write_json_atomic(s.save_baseline, baseline)
            except MemgateError as exc:  # a baseline that cannot be read is kept as it is, and said
                self.late_errors.append(f"memgate: error: {exc.one_line()} (the baseline was not rewritten)")
                if session.exitstatus == pytest.ExitCode.OK:
                    session.exitstatus = pytest.ExitCode.USAGE_ERROR
        if s.autosave and entries:
            commit, dirty = git_commit(Path(self.config.rootpath))
            self.saved = save_run(s.storage, entries, commit=commit, dirty=dirty)
        if s.benchmark_json is not None:
            write_json_atomic(s.benchmark_json, benchmark_export(entries))
        if s.html_path is not None:
            _write_html(s.html_path, self._all_entries(), outcomes, self.errors)
        summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary_file and (outcomes or self.errors):
            with open(summary_file, "a", encoding="utf-8", errors="backslashreplace") as fh:
                fh.write(step_summary_markdown(outcomes, self.errors, self.counts))


def _pytest_word(report: pytest.TestReport) -> str | None:
    """The word pytest's summary counts this report under (None: a phase pytest does not count)."""
    if hasattr(report, "wasxfail"):
        return "xpassed" if report.passed and report.when == "call" else ("xfailed" if report.skipped else None)
    if report.failed:
        return "failed" if report.when == "call" and not getattr(report, "memgate_error", False) else "error"
    if report.skipped:
        return "skipped"
    return "passed" if report.when == "call" else None


def _write_html(path: Path, entries: list[dict[str, Any]], outcomes: list[dict[str, Any]],
                errors: list[dict[str, Any]]) -> None:
    from memgate.html_report import render_html  # drawing code loads only when asked for

    profiles: list[Profile] = []
    for entry in entries:
        try:
            profiles.extend(load(found) for found in discover(entry["path"]))
        except MemgateError:
            continue  # its tables still show; a recording's temporary folder may be gone
    write_text_atomic(path, render_html(entries, outcomes, profiles, errors=errors))

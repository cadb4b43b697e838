"""What a run is asked to do, resolved once for both shells: the budget file, the profile root, and
the pytest plugin's options. No pytest here: the plugin reads its options (command line, else ini)
and hands them over as a lookup; the CLI passes its arguments.

Relative paths are taken from where they were written: a command-line value from the folder pytest
was started in, an ini value from the ini file's folder, a budget file's ``profiles`` from that file's
folder.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgate.autosave import check_run_id, check_storage
from memgate.budgets import BudgetFile, find_budget_file, load_budget_file
from memgate.compare import CompareRule, parse_rule
from memgate.errors import ConfigError, show
from memgate.platforms import COMPARE_MODES
from memgate.sizes import int_text

MISSING_POLICIES = ("skip", "warn", "fail")
KEPT_BESIDE_REPORT = "memgate-recordings"  # --memgate-keep-traces' default with --memgate-html/--memgate-json


def find_budgets(given: str | Path | None, folders: Iterable[Path], *,
                 default_leak_horizon: int = 1) -> BudgetFile | None:
    """The budget file ``given`` (``--memgate-budgets``, ``--budgets``), else the first of ``folders``
    holding one (``memgate.toml`` beside it wins over ``[tool.memgate]`` in its pyproject.toml)."""
    if given is not None:
        return load_budget_file(given, default_leak_horizon=default_leak_horizon)
    for folder in dict.fromkeys(folders):
        found = find_budget_file(folder, default_leak_horizon=default_leak_horizon)
        if found is not None:
            return found
    return None


def declared_root(budget_file: BudgetFile | None) -> Path | None:
    """The profile root a budget file declares (``profiles = "DIR"``), relative to the file's folder;
    None when it declares none."""
    if budget_file is None or not budget_file.profiles:
        return None
    if budget_file.path is None:
        return Path(budget_file.profiles)
    return Path(budget_file.path).parent / budget_file.profiles


def leak_horizon(value: Any) -> int:
    """``--memgate-leak-horizon-steps``: an integer >= 1 (ASCII digits only)."""
    number = int_text(str(value))
    if number is None or number < 1:
        raise ConfigError(f"invalid --memgate-leak-horizon-steps {show(value)}", expected="an integer >= 1")
    return number


@dataclass
class Settings:
    """The pytest plugin's options, resolved (paths absolute where they were given relative)."""

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
    compare_platform: str = "same"  # --memgate-compare-platform: history of the run's own platform only, or any
    leak_horizon_steps: int = 1
    ratchet: bool = False
    benchmark_json: Path | None = None
    html_path: Path | None = None
    keep_traces: Path | None = None
    cache_dir: Path | None = None
    report_left: bool = False  # --memgate-report-left: what each recorded test left allocated, in the summary
    estimate: str | None = None  # --memgate-estimate: memgate_record estimates this CUDA device ("cuda[:NAME]")
    # --memgate-allow-unselected: a budget or marker that selects no device of the run is skipped, not an error
    allow_unselected: bool = False

    @property
    def compares(self) -> bool:
        return self.baseline_path is not None or self.compare_id is not None

    @property
    def wants_profiles(self) -> bool:
        """Whether the controller needs every profile's metrics (not only the verdicts)."""
        return self.autosave or self.compares or any(
            p is not None for p in (self.json_path, self.save_baseline, self.benchmark_json, self.html_path))


# An option's name (its ``dest``) → (its value, None when not given; the folder a relative path is from)
Lookup = Callable[[str], tuple[Any, Path]]


@dataclass(frozen=True)
class Where:
    """What the plugin's options are resolved against."""

    search: tuple[Path, ...]  # folders to find a budget file in, in order (the invocation dir, the rootdir)
    rootdir: Path  # default storage: rootdir/.memgate
    check_root: Callable[[str, Path], None]  # refuses a --memgate value that names tests, not profiles
    default_cache_dir: Callable[[], Path | None]  # asked only when no cache dir is given


def read_settings(lookup: Lookup, where: Where) -> Settings:
    """Every option, checked in a fixed order (the first problem is the one said), then the options
    that need or exclude one another."""
    settings = Settings()
    horizon, _ = lookup("memgate_leak_horizon_steps")
    if horizon is not None:
        settings.leak_horizon_steps = leak_horizon(horizon)
    budgets, base = lookup("memgate_budgets")
    settings.budget_file = find_budgets(base / budgets if budgets is not None else None, where.search,
                                        default_leak_horizon=settings.leak_horizon_steps)
    settings.root = _root(lookup, settings.budget_file, where)
    _read_outputs(settings, lookup, where)
    _read_comparison(settings, lookup)
    _check_combinations(settings)
    return settings


def _path(lookup: Lookup, dest: str) -> Path | None:
    value, base = lookup(dest)
    return base / str(value) if value else None


def _root(lookup: Lookup, budget_file: BudgetFile | None, where: Where) -> Path | None:
    """``--memgate=PATH``; a bare ``--memgate``: the budget file's ``profiles``."""
    root, base = lookup("memgate")
    if root is None:
        return None
    root = str(root)
    if root == "":
        declared = declared_root(budget_file)
        if declared is None:
            raise ConfigError("--memgate has no PATH and the budget file sets no 'profiles'")
        return declared
    where.check_root(root, base / root)
    return base / root


def _read_outputs(settings: Settings, lookup: Lookup, where: Where) -> None:
    settings.json_path = _path(lookup, "memgate_json")
    settings.baseline_path = _path(lookup, "memgate_baseline")
    settings.save_baseline = _path(lookup, "memgate_save_baseline")
    settings.autosave = bool(lookup("memgate_autosave")[0])
    compare_id, _ = lookup("memgate_compare")
    settings.compare_id = None if compare_id is None else check_run_id(str(compare_id))
    settings.storage = _path(lookup, "memgate_storage") or where.rootdir / ".memgate"
    if settings.autosave or settings.compare_id is not None:  # said now, not as a crash when the session ends
        check_storage(settings.storage)
    settings.benchmark_json = _path(lookup, "memgate_benchmark_json")
    settings.html_path = _path(lookup, "memgate_html")
    settings.keep_traces = _path(lookup, "memgate_keep_traces")
    settings.report_left = bool(lookup("memgate_report_left")[0])
    settings.estimate = _estimate(lookup("memgate_estimate")[0])
    report = settings.html_path or settings.json_path
    if settings.keep_traces is None and report is not None:
        # a report's paths must outlive pytest's temporary folders (it removes all but the last three)
        settings.keep_traces = report.parent / KEPT_BESIDE_REPORT
    settings.cache_dir = _path(lookup, "memgate_cache_dir")
    if settings.cache_dir is None:
        settings.cache_dir = where.default_cache_dir()


def _estimate(value: Any) -> str | None:
    """``--memgate-estimate``: ``cuda`` or ``cuda:DEVICE NAME`` (the device is checked against the models
    memgate has when the plugin starts)."""
    if value is None or value is False:
        return None
    text = str(value).strip()
    if text != "cuda" and not text.startswith("cuda:"):
        raise ConfigError(f"invalid --memgate-estimate {show(value)}", expected="cuda or cuda:DEVICE NAME")
    return text


def _read_comparison(settings: Settings, lookup: Lookup) -> None:
    rules, _ = lookup("memgate_compare_fail")
    settings.rules = [parse_rule(r) for r in (rules or [])]
    policy, _ = lookup("memgate_baseline_missing")
    if policy is not None:
        if policy not in MISSING_POLICIES:
            raise ConfigError(f"invalid --memgate-baseline-missing {show(policy)}", expected=" or ".join(MISSING_POLICIES))
        settings.missing_policy = policy
    platform, _ = lookup("memgate_compare_platform")
    if platform is not None:
        if platform not in COMPARE_MODES:
            raise ConfigError(f"invalid --memgate-compare-platform {show(platform)}", expected=" or ".join(COMPARE_MODES))
        settings.compare_platform = platform
    settings.ratchet = bool(lookup("memgate_ratchet")[0])
    settings.allow_unselected = bool(lookup("memgate_allow_unselected")[0])


def _check_combinations(settings: Settings) -> None:
    if settings.baseline_path is not None and settings.compare_id is not None:
        raise ConfigError("--memgate-baseline and --memgate-compare both name what to compare with; give one")
    if settings.rules and not settings.compares:
        raise ConfigError("--memgate-compare-fail needs --memgate-baseline=FILE or --memgate-compare[=ID]")
    if settings.ratchet and settings.save_baseline is None:
        raise ConfigError("--memgate-ratchet needs --memgate-save-baseline=PATH")

"""Budgets: where they are declared, what they mean, and how a profile is judged against them. Pure."""

from __future__ import annotations

import fnmatch
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import jsonschema

from memgate.errors import ConfigError, NotMeasurable
from memgate.metrics import DeviceMetrics, MetricOptions, profile_metrics
from memgate.model import Profile, ProfileInfo
from memgate.schemas import load_schema
from memgate.sizes import format_size, parse_size

# Budget key → (metric key in the report, kind)
LIMITS: dict[str, tuple[str, str]] = {
    "peak_allocated": ("peak_allocated_bytes", "size"),
    "peak_reserved": ("peak_reserved_bytes", "size"),
    "peak_app_reserved": ("peak_app_reserved_bytes", "size"),
    "fragmentation": ("fragmentation", "ratio"),
    "external_fragmentation": ("external_fragmentation", "ratio"),
    "step_growth": ("step_growth_bytes", "size"),
    "leaked": ("leaked_bytes", "size"),
    "leak_undetermined": ("leak_undetermined_bytes", "size"),
    "allocated_at_dump": ("allocated_at_dump_bytes", "size"),
    "reserved_at_dump": ("reserved_at_dump_bytes", "size"),
    "largest_free_block": ("largest_free_block_bytes", "size"),
    "free_block_fragmentation": ("free_block_fragmentation", "ratio"),
}
SELECTORS = ("name", "ranks", "devices", "component", "warmup_steps", "leak_horizon_steps")
MARKER_KEYS = frozenset(LIMITS) | {"op_caps", *SELECTORS}


@dataclass(frozen=True)
class Budget:
    name: str
    limits: dict[str, int | float]  # budget key (LIMITS) → bytes or ratio
    op_caps: dict[str, int] = field(default_factory=dict)  # op-name glob → bytes
    ranks: str = "*"
    devices: str = "*"
    component: str | None = None
    warmup_steps: int = 1
    origin: str = ""  # where it was declared
    leak_horizon_steps: int = 1

    @property
    def options(self) -> MetricOptions:
        return MetricOptions(self.component, self.warmup_steps, self.leak_horizon_steps)

    def checks(self) -> list[str]:
        """The metric names this budget produces items for, in a stable order."""
        return [k for k in LIMITS if k in self.limits] + [f"op_caps[{g}]" for g in self.op_caps]

    def selects_rank(self, rank: str) -> bool:
        return any(fnmatch.fnmatchcase(rank, g.strip()) or fnmatch.fnmatchcase(f"rank{rank}", g.strip())
                   for g in self.ranks.split(","))


def budget_from_mapping(raw: dict[str, Any], *, origin: str, default_name: str | None = None,
                        default_leak_horizon: int = 1) -> Budget:
    """Build a Budget from a budget-file entry or marker keywords, validating every value."""
    unknown = sorted(set(raw) - MARKER_KEYS)
    if unknown:
        raise ConfigError(f"unknown budget key(s) {', '.join(map(repr, unknown))}", file=origin,
                          expected="one of " + ", ".join(sorted(MARKER_KEYS)))
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name:
        raise ConfigError("a budget needs a non-empty 'name'", file=origin)
    limits: dict[str, int | float] = {}
    for key, (_, kind) in LIMITS.items():
        if key not in raw:
            continue
        value = raw[key]
        if kind == "size":
            limits[key] = parse_size(value, what=f"{name}.{key}")
        else:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ConfigError(f"invalid {name}.{key} {value!r}", file=origin, expected="a ratio between 0 and 1")
            limits[key] = float(value)
    caps_raw = raw.get("op_caps", {})
    if not isinstance(caps_raw, dict):
        raise ConfigError(f"invalid {name}.op_caps", file=origin, expected="a table of op-name glob = size")
    caps = {str(glob): parse_size(size, what=f"{name}.op_caps[{glob!r}]") for glob, size in caps_raw.items()}
    warmup = _steps_count(raw, "warmup_steps", name, origin, default=1, least=0)
    horizon = _steps_count(raw, "leak_horizon_steps", name, origin, default=default_leak_horizon, least=1)
    for key in ("ranks", "devices", "component"):
        if key in raw and not isinstance(raw[key], str):
            raise ConfigError(f"invalid {name}.{key} {raw[key]!r}", file=origin, expected="a string")
    if not limits and not caps:
        raise ConfigError(f"budget {name!r} sets no limit", file=origin,
                          expected="at least one of " + ", ".join([*LIMITS, "op_caps"]))
    return Budget(
        name=name,
        limits=limits,
        op_caps=caps,
        ranks=raw.get("ranks", "*"),
        devices=raw.get("devices", "*"),
        component=raw.get("component"),
        warmup_steps=warmup,
        origin=origin,
        leak_horizon_steps=horizon,
    )


def _steps_count(raw: dict[str, Any], key: str, name: str, origin: str, *, default: int, least: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"invalid {name}.{key} {value!r}", file=origin, expected=f"an integer >= {least}")
    return value


def _parse_size_in(origin: str, value: object, what: str) -> int:
    try:
        return parse_size(value, what=what)
    except ConfigError as exc:
        raise ConfigError(exc.message, file=origin, expected=exc.expected, found=exc.found) from None


@dataclass(frozen=True)
class BudgetFile:
    path: str | None
    profiles: str | None
    budgets: tuple[Budget, ...]


def parse_budget_table(table: dict[str, Any], origin: str, *, default_leak_horizon: int = 1) -> BudgetFile:
    # Sizes first: parse_size's message lists the accepted units, the schema's regex would not.
    for raw in table.get("budgets", []) if isinstance(table.get("budgets"), list) else []:
        if isinstance(raw, dict):
            name = raw.get("name", "budget")
            for key, (_, kind) in LIMITS.items():
                if kind == "size" and key in raw:
                    _parse_size_in(origin, raw[key], f"{name}.{key}")
            if isinstance(raw.get("op_caps"), dict):
                for glob, size in raw["op_caps"].items():
                    _parse_size_in(origin, size, f"{name}.op_caps[{glob!r}]")
    validator = jsonschema.Draft202012Validator(load_schema("budgets"))
    error = jsonschema.exceptions.best_match(validator.iter_errors(table))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise ConfigError(f"invalid budget file at {where}: {error.message}", file=origin)
    budgets = tuple(budget_from_mapping(raw, origin=origin, default_leak_horizon=default_leak_horizon)
                    for raw in table.get("budgets", []))
    names = [b.name for b in budgets]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"duplicate budget name(s) {', '.join(map(repr, duplicates))}", file=origin,
                          expected="unique names")
    return BudgetFile(path=origin, profiles=table.get("profiles"), budgets=budgets)


def load_budget_file(path: str | os.PathLike[str], *, pyproject_table: bool | None = None,
                     default_leak_horizon: int = 1) -> BudgetFile:
    """Read budgets from a TOML file: ``[tool.memgate]`` in a pyproject.toml, else the top level."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("budget file not found", file=path)
    try:
        data = tomllib.loads(path.read_text("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", file=path) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read budget file: {exc}", file=path) from None
    is_pyproject = path.name == "pyproject.toml" if pyproject_table is None else pyproject_table
    table = data.get("tool", {}).get("memgate", {}) if is_pyproject else data
    return parse_budget_table(table, str(path), default_leak_horizon=default_leak_horizon)


def find_budget_file(rootdir: Path, *, default_leak_horizon: int = 1) -> BudgetFile | None:
    """``memgate.toml`` beside the rootdir wins over ``[tool.memgate]`` in its pyproject.toml."""
    for candidate in (rootdir / "memgate.toml", rootdir / "pyproject.toml"):
        if candidate.is_file():
            loaded = load_budget_file(candidate, default_leak_horizon=default_leak_horizon)
            if candidate.name == "memgate.toml" or loaded.budgets or loaded.profiles:
                return loaded
    return None


# ---- judging ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    profile_path: str
    rank: str
    budget: str
    metric: str  # budget key or op_caps[glob]
    limit: int | float
    value: int | float | None
    passed: bool
    device: str | None
    step: int | None
    message: str  # the one-line verdict
    holders: tuple[dict[str, Any], ...]  # the largest live blocks at the peak of the worst device
    where: str  # the series and file the value came from

    def detail(self, top: int = 5) -> str:
        """The section under the failure line: top ``top`` holders at the peak, then the source."""
        lines = []
        if self.holders:
            lines.append(f"top {min(top, len(self.holders))} of {len(self.holders)} live blocks at the peak ({self.device}):")
            for block in self.holders[:top]:
                what = block.get("op") or block.get("owner") or "(no op)"
                stream = f"  stream {block['stream']}" if block.get("stream") else ""
                lines.append(f"  {format_size(block['size']):>12}  {what}{stream}")
        lines.append(self.where)
        return "\n".join(lines)


class MetricStore(Protocol):
    """Where results of an earlier run are kept (:class:`memgate.cache.ResultStore`)."""

    def get(self, options: MetricOptions) -> list[DeviceMetrics] | None: ...

    def put(self, options: MetricOptions, metrics: list[DeviceMetrics]) -> None: ...


class MetricCache:
    """Device metrics of one profile per :class:`MetricOptions`, computed once.

    Built from a loaded ``profile``, or from a profile's ``info`` and a ``load`` that loads it only
    when a result is not in ``store`` (a warm run judges without reading the profile's frames).
    """

    def __init__(self, profile: Profile | None = None, *, info: ProfileInfo | None = None,
                 load: Callable[[], Profile] | None = None, store: MetricStore | None = None) -> None:
        if profile is None and (info is None or load is None):
            raise TypeError("MetricCache needs a profile, or its info and a load")
        self._profile = profile
        self._load = load
        self.info = info if info is not None else ProfileInfo.of(profile)  # type: ignore[arg-type]
        self._store = store
        self._cache: dict[MetricOptions, list[DeviceMetrics]] = {}

    @property
    def profile(self) -> Profile:
        if self._profile is None:
            assert self._load is not None
            self._profile = self._load()
        return self._profile

    def get(self, options: MetricOptions | None = None) -> list[DeviceMetrics]:
        key = options or MetricOptions()
        if key not in self._cache:
            stored = self._store.get(key) if self._store is not None else None
            if stored is None:
                stored = profile_metrics(self.profile, key)
                if self._store is not None:
                    self._store.put(key, stored)
            self._cache[key] = stored
        return self._cache[key]


def judge(cache: MetricCache, budget: Budget, metric: str) -> Outcome:
    """Judge one (profile, budget, metric); raise NotMeasurable when the profile lacks the data."""
    profile = cache.info
    devices = [m for m in cache.get(budget.options)
               if any(fnmatch.fnmatchcase(m.device, g.strip()) for g in budget.devices.split(","))]
    if not devices:
        raise NotMeasurable(f"no device matches devices={budget.devices!r} (has: "
                            f"{', '.join(d.device for d in cache.get(budget.options)) or 'none'})",
                            file=profile.path)
    if metric.startswith("op_caps["):
        glob = metric[len("op_caps["):-1]
        limit: int | float = budget.op_caps[glob]
        candidates = []
        for m in devices:
            ops = m.values.get("op_max_block_bytes") or {}
            matching = {op: size for op, size in ops.items() if fnmatch.fnmatchcase(op, glob)}
            if matching:
                op = max(matching, key=lambda o: (matching[o], o))
                candidates.append((matching[op], m, op))
        if not candidates:
            reasons = "; ".join(m.missing.get("op_max_block_bytes", "") for m in devices if m.missing.get("op_max_block_bytes"))
            raise NotMeasurable(f"{metric}: no operator name matches {glob!r}" + (f" ({reasons})" if reasons else ""),
                                file=profile.path)
        value, worst, op = max(candidates, key=lambda c: c[0])
        extra = f"op {op}"
        kind = "size"
    else:
        key, kind = LIMITS[metric]
        limit = budget.limits[metric]
        measured = [(m.values[key], m) for m in devices if m.values.get(key) is not None]
        if not measured:
            why = "; ".join(f"{m.device}: {m.missing.get(key, 'no data')}" for m in devices)
            raise NotMeasurable(f"{metric} is not measurable: {why}", file=profile.path)
        value, worst = max(measured, key=lambda c: c[0])
        extras = []
        if worst.peak_step is not None and metric == "peak_allocated":
            extras.append(f"step {worst.peak_step}")
        if key in worst.pool_of:
            extras.append(f"pool {worst.pool_of[key]}")
        if key in worst.notes:
            extras.append(worst.notes[key])
        extra = ", ".join(extras)
    passed = value <= limit
    where = f"rank {profile.rank} {worst.device}" + (f", {extra}" if extra else "")
    message = verdict_line(metric, kind, value, limit, where)
    return Outcome(
        profile_path=profile.path,
        rank=profile.rank,
        budget=budget.name,
        metric=metric,
        limit=limit,
        value=value,
        passed=passed,
        device=worst.device,
        step=worst.peak_step,
        message=message,
        holders=tuple(worst.values.get("top_at_peak") or ()),
        where=source_lines(worst, profile),
    )


def _fmt(value: float, kind: str) -> str:
    return format_size(value) if kind == "size" else f"{value:.3f}"


def verdict_line(metric: str, kind: str, value: float, limit: float, where: str) -> str:
    """``peak_allocated 25.10 GiB exceeds budget 24.00 GiB by 1.10 GiB (+4.6%) — rank 3 npu:3, step 120``."""
    if value <= limit:
        head = f"{metric} {_fmt(value, kind)} within budget {_fmt(limit, kind)}"
    else:
        over = value - limit
        pct = f" (+{over / limit * 100:.1f}%)" if limit else ""
        head = f"{metric} {_fmt(value, kind)} exceeds budget {_fmt(limit, kind)} by {_fmt(over, kind)}{pct}"
    return f"{head} — {where}"


def source_lines(metrics: DeviceMetrics, profile: ProfileInfo) -> str:
    lines = []
    if metrics.component:
        lines.append(f"series: {metrics.component} from {metrics.source}")
    lines.append(f"profile: {profile.path} ({profile.format}, rank {profile.rank})")
    return "\n".join(lines)

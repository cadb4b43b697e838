"""Budgets: where they are declared, what they mean, and how a profile is judged against them. Pure."""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from memgate.errors import ConfigError, NotMeasurable, NotSelected, printable
from memgate.metrics import DeviceMetrics, MetricOptions, profile_metrics
from memgate.model import Profile, ProfileInfo
from memgate.schemas import load_schema
from memgate.sizes import format_share, format_size, parse_share, parse_size
from memgate.toml_lines import key_lines, line_of

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
CROSS_RANK = "rank_imbalance"  # judged over every profile a budget selects, not per profile
MARKER_KEYS = frozenset(LIMITS) | {"op_caps", "owner_caps", "device_capacity", *SELECTORS}
BUDGET_KEYS = MARKER_KEYS | {CROSS_RANK}


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
    owner_caps: dict[str, int] = field(default_factory=dict)  # owner glob → bytes live at the peak
    rank_imbalance: dict[str, float] = field(default_factory=dict)  # budget key (LIMITS) → 1 - min/max
    device_capacity: int | None = None  # bytes; for limits written as a percentage
    shares: dict[str, float] = field(default_factory=dict)  # check → limit as a share of the capacity

    @property
    def options(self) -> MetricOptions:
        return MetricOptions(self.component, self.warmup_steps, self.leak_horizon_steps)

    def checks(self) -> list[str]:
        """The metric names this budget produces items for, in a stable order."""
        return ([k for k in LIMITS if k in self.limits or k in self.shares] + [f"op_caps[{g}]" for g in self.op_caps]
                + [f"owner_caps[{g}]" for g in self.owner_caps])

    def cross_rank_checks(self) -> list[str]:
        """``rank_imbalance[peak_allocated]``, …: one item each, judged over all the ranks it selects."""
        return [f"{CROSS_RANK}[{m}]" for m in self.rank_imbalance]

    def declared_limit(self, check: str) -> int | float | str:
        """The limit as written: bytes, a ratio, or a share of the capacity (``"92%"``)."""
        if check in self.shares:
            return format_share(self.shares[check])
        if check.startswith(f"{CROSS_RANK}["):
            return self.rank_imbalance[check[len(CROSS_RANK) + 1:-1]]
        for prefix, caps in (("op_caps[", self.op_caps), ("owner_caps[", self.owner_caps)):
            if check.startswith(prefix):
                return caps[check[len(prefix):-1]]
        return self.limits.get(check, 0)

    def selects_rank(self, rank: str) -> bool:
        return any(fnmatch.fnmatchcase(rank, g.strip()) or fnmatch.fnmatchcase(f"rank{rank}", g.strip())
                   for g in self.ranks.split(","))


class BudgetKeyError(ConfigError):
    """A ConfigError about one key of a budget entry or marker; ``key`` lets a caller point at its line."""

    def __init__(self, message: str, *, key: str | None = None, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.key = key


def closest_key(key: str, valid: Iterable[str]) -> str | None:
    """The valid key a misspelled ``key`` most likely means (difflib), or None."""
    match = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    return match[0] if match else None


def unknown_keys_message(unknown: Sequence[str], valid: Iterable[str], what: str = "budget key") -> str:
    """``unknown budget key 'peak_alocated' (did you mean 'peak_allocated'?)``, one clause per key."""
    valid = list(valid)
    parts = []
    for key in unknown:
        guess = closest_key(key, valid)
        parts.append(repr(key) + (f" (did you mean {guess!r}?)" if guess else ""))
    return f"unknown {what}{'s' if len(parts) > 1 else ''} {', '.join(parts)}"


def budget_from_mapping(raw: dict[str, Any], *, origin: str, default_name: str | None = None,
                        default_leak_horizon: int = 1, extra_keys: Iterable[str] = ()) -> Budget:
    """Build a Budget from a budget-file entry or marker keywords, validating every value.

    ``extra_keys``: keys the caller handles itself (a marker's ``profile``): accepted, ignored here.
    Errors are :class:`BudgetKeyError` naming ``origin`` and the offending key: every problem of
    ``raw`` is found, the first raised with the others in its ``also``.
    """
    problems: list[BudgetKeyError] = []
    known = BUDGET_KEYS | set(extra_keys)
    unknown = sorted(set(raw) - known)
    if unknown:
        guessed = all(closest_key(k, known) for k in unknown)  # "did you mean" says it; else list them all
        problems.append(BudgetKeyError(unknown_keys_message(unknown, known), key=unknown[0], file=origin,
                                       expected=None if guessed else "one of " + ", ".join(sorted(known))))
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name:
        problems.append(BudgetKeyError("a budget needs a non-empty 'name'", key="name", file=origin))
        name = "budget"
    limits: dict[str, int | float] = {}
    shares: dict[str, float] = {}
    for key, (_, kind) in LIMITS.items():
        if key not in raw:
            continue
        value = raw[key]
        try:
            if kind == "size":
                share = _parse_share_in(origin, value, f"{name}.{key}", key)
                if share is not None:
                    shares[key] = share
                else:
                    limits[key] = _parse_size_in(origin, value, f"{name}.{key}", key)
            else:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                    raise BudgetKeyError(f"invalid {name}.{key} {value!r}", key=key, file=origin,
                                         expected="a ratio between 0 and 1")
                limits[key] = float(value)
        except BudgetKeyError as exc:
            problems.append(exc)
    caps: dict[str, int] = {}
    owner_caps: dict[str, int] = {}
    for cap_key, parsed in (("op_caps", caps), ("owner_caps", owner_caps)):
        table = raw.get(cap_key, {})
        if not isinstance(table, dict):
            problems.append(BudgetKeyError(
                f"invalid {name}.{cap_key}", key=cap_key, file=origin,
                expected=f"a table of {'op-name' if cap_key == 'op_caps' else 'owner'} glob = size"))
            continue
        for glob, size in table.items():
            what = f"{name}.{cap_key}[{glob!r}]"
            try:
                share = _parse_share_in(origin, size, what, cap_key)
                if share is not None:
                    shares[f"{cap_key}[{glob}]"] = share
                    parsed[str(glob)] = 0
                else:
                    parsed[str(glob)] = _parse_size_in(origin, size, what, cap_key)
            except BudgetKeyError as exc:
                problems.append(exc)
    imbalance_raw = raw.get(CROSS_RANK, {})
    if not isinstance(imbalance_raw, dict):
        problems.append(BudgetKeyError(f"invalid {name}.{CROSS_RANK}", key=CROSS_RANK, file=origin,
                                       expected="a table of metric = ratio, e.g. { peak_allocated = 0.05 }"))
        imbalance_raw = {}
    imbalance: dict[str, float] = {}
    for metric, ratio in imbalance_raw.items():
        if metric not in LIMITS:
            problems.append(BudgetKeyError(
                f"invalid {name}.{CROSS_RANK}: {unknown_keys_message([metric], LIMITS, 'metric')}",
                key=CROSS_RANK, file=origin, expected="one of " + ", ".join(LIMITS)))
        elif isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
            problems.append(BudgetKeyError(
                f"invalid {name}.{CROSS_RANK}[{metric!r}] {ratio!r}", key=CROSS_RANK, file=origin,
                expected="a ratio between 0 and 1 (1 - min/max over the ranks)"))
        else:
            imbalance[metric] = float(ratio)
    capacity = None
    warmup, horizon = 1, default_leak_horizon
    try:
        capacity = (_parse_size_in(origin, raw["device_capacity"], f"{name}.device_capacity", "device_capacity")
                    if "device_capacity" in raw else None)
    except BudgetKeyError as exc:
        problems.append(exc)
    try:
        warmup = _steps_count(raw, "warmup_steps", name, origin, default=1, least=0)
    except BudgetKeyError as exc:
        problems.append(exc)
    try:
        horizon = _steps_count(raw, "leak_horizon_steps", name, origin, default=default_leak_horizon, least=1)
    except BudgetKeyError as exc:
        problems.append(exc)
    for key in ("ranks", "devices", "component"):
        if key in raw and not isinstance(raw[key], str):
            problems.append(BudgetKeyError(f"invalid {name}.{key} {raw[key]!r}", key=key, file=origin,
                                           expected="a string"))
    # Said of an entry that is otherwise valid: with another error, a limit may be what is misspelled.
    if not limits and not caps and not shares and not owner_caps and not imbalance and not problems:
        problems.append(BudgetKeyError(f"budget {name!r} sets no limit", file=origin,
                                       expected="at least one of " + ", ".join([*LIMITS, "op_caps", "owner_caps", CROSS_RANK])))
    if problems:
        problems[0].also = tuple(problems[1:])
        raise problems[0]
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
        owner_caps=owner_caps,
        rank_imbalance=imbalance,
        device_capacity=capacity,
        shares=shares,
    )


def _steps_count(raw: dict[str, Any], key: str, name: str, origin: str, *, default: int, least: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BudgetKeyError(f"invalid {name}.{key} {value!r}", key=key, file=origin,
                             expected=f"an integer >= {least}")
    return value


def _parse_share_in(origin: str, value: object, what: str, key: str | None = None) -> float | None:
    try:
        return parse_share(value, what=what)
    except ConfigError as exc:
        raise BudgetKeyError(exc.message, key=key, file=origin, expected=exc.expected) from None


def _parse_size_in(origin: str, value: object, what: str, key: str | None = None) -> int:
    try:
        return parse_size(value, what=what)
    except ConfigError as exc:
        raise BudgetKeyError(exc.message, key=key, file=origin, expected=exc.expected, found=exc.found) from None


@dataclass(frozen=True)
class BudgetFile:
    path: str | None
    profiles: str | None
    budgets: tuple[Budget, ...]
    # budget name → budget key (or "" for the entry itself) → 1-based line in the file, where known
    lines: dict[str, dict[str, int]] = field(default_factory=dict)

    def line_of(self, budget: str, key: str = "") -> int | None:
        """The line declaring ``key`` of budget ``budget`` (an op cap: its glob's line), else the entry's."""
        declared = self.lines.get(budget, {})
        return declared.get(key, declared.get(key.split("[")[0], declared.get("")))


Locate = Callable[[Sequence[str | int]], int | None]


def parse_budget_table(table: dict[str, Any], origin: str, *, default_leak_horizon: int = 1,
                       locate: Locate | None = None) -> BudgetFile:
    """Validate a budget table; ``locate`` maps a key path in ``table`` to its line for the errors."""
    def line(*path: str | int) -> int | None:
        return locate(path) if locate is not None else None

    entries = table.get("budgets", []) if isinstance(table.get("budgets"), list) else []
    # Every error of the file is found (key path, error), then all are raised at once in file order.
    found: list[tuple[tuple[str | int, ...], ConfigError]] = []
    # Sizes first: parse_size's message lists the accepted units, the schema's regex would not.
    for index, raw in enumerate(entries):
        if not isinstance(raw, dict):
            continue
        name = raw.get("name", "budget")
        sizes: list[tuple[tuple[str, ...], Any, str]] = [
            ((key,), raw[key], f"{name}.{key}") for key, (_, kind) in LIMITS.items() if kind == "size" and key in raw]
        for cap_key in ("op_caps", "owner_caps"):
            if isinstance(raw.get(cap_key), dict):
                sizes += [((cap_key, glob), size, f"{name}.{cap_key}[{glob!r}]") for glob, size in raw[cap_key].items()]
        if "device_capacity" in raw:
            sizes.append((("device_capacity",), raw["device_capacity"], f"{name}.device_capacity"))
        for keys, value, what in sizes:
            try:
                if keys[0] == "device_capacity" or parse_share(value, what=what) is None:
                    parse_size(value, what=what)
            except ConfigError as exc:
                found.append((("budgets", index, *keys), BudgetKeyError(
                    exc.message, key=str(keys[0]), file=origin, line=line("budgets", index, *keys),
                    expected=exc.expected, found=exc.found)))
    import jsonschema  # here, not at the top: a budget file is the only thing it checks (~40 ms to import)

    validator = jsonschema.Draft202012Validator(load_schema("budgets"))
    sized = {path for path, _ in found}
    for error in validator.iter_errors(table):
        error = jsonschema.exceptions.best_match([error]) or error  # into a oneOf's alternatives, as before
        path = list(error.absolute_path)
        message = error.message
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = set(error.schema.get("properties", {}))
            extra = sorted(k for k in error.instance if k not in allowed)
            if extra:
                path.append(extra[0])
                message = unknown_keys_message(extra, allowed, "key" if len(path) == 1 else "budget key")
        elif error.validator == "required" and isinstance(error.instance, dict):
            path += [k for k in error.validator_value if k not in error.instance][:1]  # the key it lacks
        if tuple(path) in sized:
            continue  # the size's own message says it, with the accepted units
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        found.append((tuple(path), ConfigError(f"invalid budget file at {where}: {message}", file=origin,
                                               line=line(*path))))
    reported = {path[:3] for path, _ in found}  # ("budgets", index, key): that key already has its error
    budgets = []
    for index, raw in enumerate(entries):
        if not isinstance(raw, dict):
            continue
        try:
            budgets.append(budget_from_mapping(raw, origin=origin, default_leak_horizon=default_leak_horizon))
        except BudgetKeyError as exc:
            for problem in (exc, *exc.also):
                assert isinstance(problem, BudgetKeyError)
                at: tuple[str | int, ...] = ("budgets", index) if problem.key is None else ("budgets", index, problem.key)
                if problem.key is not None and at in reported:
                    continue
                found.append((at, BudgetKeyError(problem.message, key=problem.key, file=origin, line=line(*at),
                                                 expected=problem.expected, found=problem.found)))
    first_named: dict[str, int] = {}
    for index, raw in enumerate(entries):
        name = raw.get("name") if isinstance(raw, dict) else None
        if not isinstance(name, str) or not name:
            continue
        if name not in first_named:
            first_named[name] = index
            continue
        first = line("budgets", first_named[name], "name")
        found.append((("budgets", index, "name"), ConfigError(
            f"duplicate budget name(s) {name!r}", file=origin, line=line("budgets", index, "name"),
            expected="unique names" + (f" (also at line {first})" if first is not None else ""))))
    if found:
        errors = sorted((error for _, error in found), key=lambda e: (e.line is None, e.line or 0))  # stable
        errors[0].also = tuple(errors[1:])
        raise errors[0]
    lines: dict[str, dict[str, int]] = {}
    for index, (budget, raw) in enumerate(zip(budgets, table.get("budgets", []))):
        declared = {"": line("budgets", index)}
        declared.update({key: line("budgets", index, key) for key in raw})
        declared.update({f"op_caps[{glob}]": line("budgets", index, "op_caps", glob) for glob in budget.op_caps})
        declared.update({f"owner_caps[{glob}]": line("budgets", index, "owner_caps", glob) for glob in budget.owner_caps})
        declared.update({f"{CROSS_RANK}[{m}]": line("budgets", index, CROSS_RANK, m) for m in budget.rank_imbalance})
        lines[budget.name] = {k: v for k, v in declared.items() if v is not None}
    return BudgetFile(path=origin, profiles=table.get("profiles"), budgets=tuple(budgets), lines=lines)


_TOML_POSITION = re.compile(r"\(at line (?P<line>[0-9]+), column (?P<column>[0-9]+)\)")


def load_budget_file(path: str | os.PathLike[str], *, pyproject_table: bool | None = None,
                     default_leak_horizon: int = 1) -> BudgetFile:
    """Read budgets from a TOML file: ``[tool.memgate]`` in a pyproject.toml, else the top level.

    Every error names the file and, where the offending key is written, its line.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError("budget file not found", file=path)
    try:
        text = path.read_text("utf-8")
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        at = _TOML_POSITION.search(str(exc))
        raise ConfigError(f"invalid TOML: {_TOML_POSITION.sub('', str(exc)).strip()}", file=path,
                          line=int(at.group("line")) if at else None,
                          column=f"char {at.group('column')}" if at else None) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read budget file: {exc}", file=path) from None
    is_pyproject = path.name == "pyproject.toml" if pyproject_table is None else pyproject_table
    table = data.get("tool", {}).get("memgate", {}) if is_pyproject else data
    prefix: tuple[str, ...] = ("tool", "memgate") if is_pyproject else ()
    declared = key_lines(text)
    return parse_budget_table(table, str(path), default_leak_horizon=default_leak_horizon,
                              locate=lambda keys: line_of(declared, (*prefix, *keys)))


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
    share: float | None = None  # the limit as a share of the device's capacity, where written so
    live_count: int | None = None  # blocks live at the peak (holders keeps only the largest)

    def detail(self, top: int = 5) -> str:
        """The section under the failure line: ``top`` lines of holders at the peak (identical holders
        grouped, :func:`holder_groups`), then the source."""
        lines = []
        if self.holders:
            groups = holder_groups(self.holders)[:top]
            shown = sum(len(g) for g in groups)
            live = max(self.live_count or 0, len(self.holders))
            lines.append(f"top {shown} of {live} live blocks at the peak ({self.device}):")
            for group in groups:
                block = group[0]
                what = block.get("op") or block.get("owner") or "(no op)"
                owner = f"  owner {block['owner']}" if block.get("op") and block.get("owner") else ""
                stream = f"  stream {block['stream']}" if block.get("stream") else ""
                sizes = [int(b["size"]) for b in group]
                if len(group) == 1:
                    amount = f"{format_size(sizes[0]):>12}"
                elif len(set(sizes)) == 1:
                    amount = f"{len(group)} × {format_size(sizes[0])} = {format_size(sum(sizes))}"
                else:
                    amount = f"{len(group)} blocks = {format_size(sum(sizes))} (largest {format_size(max(sizes))})"
                lines.append(f"  {amount}  {what}{owner}{stream}")
                if block.get("stack"):  # the Python functions running at the allocation, innermost first
                    lines.append(f"  {'':>12}  in {' <- '.join(str(f) for f in block['stack'])}")
        return "\n".join([*map(printable, lines), self.where])  # one line each, whatever a name holds


def holder_groups(holders: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The holders at the peak grouped by what they are (op, owner, stack, stream), the group holding
    the most bytes first (equal totals: the one with the larger block, as ``holders`` lists them, first):
    one line per group instead of identical lines."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for block in holders:
        key = (block.get("op"), block.get("owner"), tuple(str(f) for f in block.get("stack") or ()), block.get("stream"))
        groups.setdefault(key, []).append(block)
    return sorted(groups.values(), key=lambda g: -sum(int(b["size"]) for b in g))  # stable: ties keep their order


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


def capacity_of(info: ProfileInfo, device: str, budget: Budget) -> tuple[int | None, str]:
    """The device's capacity in bytes and where it came from: the profile, else the budget's ``device_capacity``."""
    recorded = (info.metadata.get("device_capacity_bytes") or {}).get(device)
    if isinstance(recorded, int) and not isinstance(recorded, bool) and recorded > 0:
        return recorded, "recorded in the profile"
    if budget.device_capacity is not None:
        return budget.device_capacity, f"device_capacity of budget {budget.name!r}"
    return None, ""


def resolve_limit(info: ProfileInfo, device: str, budget: Budget, metric: str) -> tuple[int | float, str]:
    """The limit of ``metric`` in bytes (or a ratio) on ``device``, and how a share of the capacity resolved."""
    if metric not in budget.shares:
        limit = budget.declared_limit(metric)
        assert not isinstance(limit, str)
        return limit, ""
    share = budget.shares[metric]
    capacity, source = capacity_of(info, device, budget)
    if capacity is None:
        raise ConfigError(f"{budget.name}.{metric} = {format_share(share)} needs the capacity of {device}, "
                          "which the profile does not record", file=info.path,
                          expected=f'device_capacity = "64 GiB" (the device\'s memory) in budget {budget.name!r}')
    limit = int(share * capacity)
    return limit, f"limit {format_share(share)} of {format_size(capacity)} ({source}) = {limit} bytes"


def _owner_cap(devices: list[DeviceMetrics], glob: str) -> list[tuple[int | float, DeviceMetrics, str]]:
    """Per device: the bytes at the peak of the owners matching ``glob``, summed, and the largest of them."""
    out = []
    for m in devices:
        owners = m.values.get("owner_bytes_at_peak")
        if not isinstance(owners, dict):
            continue
        matching = {o: size for o, size in owners.items() if fnmatch.fnmatchcase(o, glob)}
        if matching:
            top = max(matching, key=lambda o: (matching[o], o))
            out.append((sum(matching.values()), m, f"largest owner {top} {format_size(matching[top])}"))
    return out


def judge(cache: MetricCache, budget: Budget, metric: str) -> Outcome:
    """Judge one (profile, budget, metric); raise NotMeasurable when the profile lacks the data."""
    profile = cache.info
    devices = [m for m in cache.get(budget.options)
               if any(fnmatch.fnmatchcase(m.device, g.strip()) for g in budget.devices.split(","))]
    if not devices:
        raise NotSelected(f"not selected: budget {budget.name!r} selects devices={budget.devices!r}, the profile has "
                          f"{', '.join(d.device for d in cache.get(budget.options)) or 'none'}", file=profile.path)
    candidates: list[tuple[int | float, DeviceMetrics, str]] = []
    if metric.startswith("op_caps["):
        glob = metric[len("op_caps["):-1]
        for m in devices:
            ops = m.values.get("op_max_block_bytes") or {}
            matching = {op: size for op, size in ops.items() if fnmatch.fnmatchcase(op, glob)}
            if matching:
                op = max(matching, key=lambda o: (matching[o], o))
                candidates.append((matching[op], m, f"op {op}"))
        if not candidates:
            reasons = "; ".join(m.missing.get("op_max_block_bytes", "") for m in devices if m.missing.get("op_max_block_bytes"))
            raise NotMeasurable(f"{metric}: no operator name matches {glob!r}" + (f" ({reasons})" if reasons else ""),
                                file=profile.path)
        kind = "size"
    elif metric.startswith("owner_caps["):
        glob = metric[len("owner_caps["):-1]
        candidates = _owner_cap(devices, glob)
        if not candidates:
            known = sorted({o for m in devices for o in (m.values.get("owner_bytes_at_peak") or {})})
            raise NotMeasurable(f"{metric}: no owner of a block live at the peak matches {glob!r}"
                                + (f" (owners: {', '.join(known[:10])})" if known else " (the profile records no owners)"),
                                file=profile.path)
        kind = "size"
    else:
        key, kind = LIMITS[metric]
        measured = [(m.values[key], m) for m in devices if m.values.get(key) is not None]
        if not measured:
            why = "; ".join(f"{m.device}: {m.missing.get(key, 'no data')}" for m in devices)
            raise NotMeasurable(f"{metric} is not measurable: {why}", file=profile.path)
        for value, m in measured:
            extras = []
            if m.peak_step is not None and metric == "peak_allocated":
                extras.append(f"step {m.peak_step}")
            if key in m.pool_of:
                extras.append(f"pool {m.pool_of[key]}")
            if key in m.notes:
                extras.append(m.notes[key])
            candidates.append((value, m, ", ".join(extras)))
    # The worst device: the most over (or least under) its limit; with one limit for all, the largest value.
    judged = []
    for value, m, extra in candidates:
        limit, resolved = resolve_limit(profile, m.device, budget, metric)
        judged.append((value - limit, value, limit, m, ", ".join(x for x in (extra, resolved) if x)))
    _, value, limit, worst, extra = max(judged, key=lambda c: c[0])
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
        share=budget.shares.get(metric),
        live_count=worst.values.get("live_at_peak_count"),
    )


@dataclass(frozen=True)
class RankValue:
    """One profile's value of a metric, as a rank_imbalance judges it (its worst selected device)."""

    profile: str
    rank: str
    value: int | float | None
    device: str | None
    why: str = ""  # when value is None: why the profile could not be measured


def rank_value(cache: MetricCache, budget: Budget, metric: str) -> RankValue:
    """The value of budget key ``metric`` on this profile's worst device the budget selects."""
    info = cache.info
    key = LIMITS[metric][0]
    devices = [m for m in cache.get(budget.options)
               if any(fnmatch.fnmatchcase(m.device, g.strip()) for g in budget.devices.split(","))]
    measured = [(m.values[key], m.device) for m in devices if m.values.get(key) is not None]
    if not measured:
        why = "; ".join(f"{m.device}: {m.missing.get(key, 'no data')}" for m in devices) or "no device selected"
        return RankValue(info.path, info.rank, None, None, why)
    value, device = max(measured, key=lambda c: c[0])
    return RankValue(info.path, info.rank, value, device)


def judge_rank_imbalance(budget: Budget, metric: str, values: Sequence[RankValue], root: str = "") -> dict[str, Any]:
    """``rank_imbalance[metric]`` over the profiles the budget selects: ``1 - min/max``, as a report entry.

    Raises NotMeasurable when fewer than two selected profiles measure the metric.
    """
    check = f"{CROSS_RANK}[{metric}]"
    limit = budget.rank_imbalance[metric]
    selected = [v for v in values if budget.selects_rank(v.rank)]
    missing = [v for v in selected if v.value is None]
    if missing:
        raise NotMeasurable(f"{check}: {metric} is not measurable on rank {missing[0].rank}: {missing[0].why}",
                            file=missing[0].profile)
    if len(selected) < 2:
        raise NotMeasurable(f"{check} needs at least two ranks; budget {budget.name!r} selects "
                            f"{len(selected)} profile(s) under {root or 'the root'} (ranks={budget.ranks!r})",
                            file=root or None)
    kind = LIMITS[metric][1]
    best = min(selected, key=lambda v: (v.value, v.rank))
    worst = max(selected, key=lambda v: (v.value, v.rank))
    assert best.value is not None and worst.value is not None
    ratio = 0.0 if worst.value <= 0 else 1 - best.value / worst.value
    passed = ratio <= limit
    word = "within" if passed else "exceeds"
    message = (f"{check} {ratio:.4f} {word} budget {limit:.4f} over {len(selected)} ranks — "
               f"worst rank {worst.rank} {worst.device} {_fmt(worst.value, kind)}, "
               f"best rank {best.rank} {best.device} {_fmt(best.value, kind)}")
    return {
        "profile": root, "rank": ",".join(sorted({v.rank for v in selected})), "budget": budget.name,
        "metric": check, "limit": limit, "value": ratio, "passed": passed, "device": worst.device,
        "message": message, "worst_rank": worst.rank, "best_rank": best.rank,
        "worst_value": worst.value, "best_value": best.value,
        "worst_profile": worst.profile, "best_profile": best.profile,
    }


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
    return "\n".join(map(printable, lines))

"""Budgets: where they are declared and what they mean. Pure.

A budget comes from an entry of a budget file (``[tool.memgate]`` in pyproject.toml, a memgate.toml,
or ``--memgate-budgets=FILE``) or from a ``@pytest.mark.memgate(...)`` marker's keywords; every value
is validated when it is read, and every problem of a file is said at once, each on its line.
:mod:`memgate.judge` judges a profile against them.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memgate.categories import CATEGORIES
from memgate.errors import ConfigError
from memgate.metric_specs import LEFT_ALLOCATED, OOM, budget_limits
from memgate.metrics import MetricOptions
from memgate.schemas import load_schema
from memgate.sizes import format_share, parse_share, parse_size
from memgate.toml_lines import key_lines, line_of

# Budget key → (metric key in the report, kind), from the one table of metrics
LIMITS: dict[str, tuple[str, str]] = budget_limits()
SELECTORS = ("name", "ranks", "devices", "component", "warmup_steps", "leak_horizon_steps")
CROSS_RANK = "rank_imbalance"  # judged over every profile a budget selects, not per profile
CAP_KEYS = ("op_caps", "owner_caps", "category_caps")  # a table of name (glob, category) = size
LEFT = LEFT_ALLOCATED  # bytes allocated in the window and still allocated at its end (memgate.leftover)
MARKER_KEYS = frozenset(LIMITS) | {*CAP_KEYS, LEFT, OOM, "device_capacity", *SELECTORS}
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
    category_caps: dict[str, int] = field(default_factory=dict)  # category → bytes live at the peak
    left_allocated: int | None = None  # bytes left allocated at the end of the window, per device
    oom: int | None = None  # out-of-memory errors the window may hold, per device (oom_count)

    @property
    def options(self) -> MetricOptions:
        return MetricOptions(self.component, self.warmup_steps, self.leak_horizon_steps)

    def checks(self) -> list[str]:
        """The metric names this budget produces items for, in a stable order."""
        return ([k for k in LIMITS if k in self.limits or k in self.shares] + ([LEFT] if self.left_allocated is not None else [])
                + ([OOM] if self.oom is not None else [])
                + [f"op_caps[{g}]" for g in self.op_caps]
                + [f"owner_caps[{g}]" for g in self.owner_caps] + [f"category_caps[{c}]" for c in self.category_caps])

    def cross_rank_checks(self) -> list[str]:
        """``rank_imbalance[peak_allocated]``, …: one item each, judged over all the ranks it selects."""
        return [f"{CROSS_RANK}[{m}]" for m in self.rank_imbalance]

    def declared_limit(self, check: str) -> int | float | str:
        """The limit as written: bytes, a ratio, or a share of the capacity (``"92%"``)."""
        if check in self.shares:
            return format_share(self.shares[check])
        if check.startswith(f"{CROSS_RANK}["):
            return self.rank_imbalance[check[len(CROSS_RANK) + 1:-1]]
        if check == LEFT and self.left_allocated is not None:
            return self.left_allocated
        if check == OOM and self.oom is not None:
            return self.oom
        for prefix, caps in (("op_caps[", self.op_caps), ("owner_caps[", self.owner_caps),
                             ("category_caps[", self.category_caps)):
            if check.startswith(prefix):
                return caps[check[len(prefix):-1]]
        return self.limits.get(check, 0)

    def selects_rank(self, rank: str) -> bool:
        return any(fnmatch.fnmatchcase(rank, g.strip()) or fnmatch.fnmatchcase(f"rank{rank}", g.strip())
                   for g in self.ranks.split(","))


class BudgetKeyError(ConfigError):
    """A ConfigError about one key of a budget entry or marker; ``key`` (and ``sub``, the glob, category
    or metric inside that key's table) lets a caller point at its line."""

    def __init__(self, message: str, *, key: str | None = None, sub: str | None = None, **fields: Any) -> None:
        super().__init__(message, **fields)
        self.key = key
        self.sub = sub

    @property
    def keys(self) -> tuple[str, ...]:
        """The key path inside the entry: ``()``, ``(key,)`` or ``(key, sub)``."""
        return () if self.key is None else (self.key,) if self.sub is None else (self.key, self.sub)


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


class _Problems(list[BudgetKeyError]):
    """Every problem of one budget entry, in the order its keys are checked."""

    @contextmanager
    def kept(self) -> Iterator[None]:
        """Run a check; its BudgetKeyError is kept here instead of raised."""
        try:
            yield
        except BudgetKeyError as exc:
            self.append(exc)

    def raise_first(self) -> None:
        """Raise the first problem, the others in its ``also``; nothing when there is none."""
        if self:
            self[0].also = tuple(self[1:])
            raise self[0]


def budget_from_mapping(raw: dict[str, Any], *, origin: str, default_name: str | None = None,
                        default_leak_horizon: int = 1, extra_keys: Iterable[str] = ()) -> Budget:
    """Build a Budget from a budget-file entry or marker keywords, validating every value.

    ``extra_keys``: keys the caller handles itself (a marker's ``profile``): accepted, ignored here.
    Errors are :class:`BudgetKeyError` naming ``origin`` and the offending key: every problem of
    ``raw`` is found, the first raised with the others in its ``also``.
    """
    problems = _Problems()
    _check_keys(raw, BUDGET_KEYS | set(extra_keys), origin, problems)
    name = raw.get("name", default_name)
    if not isinstance(name, str) or not name:
        problems.append(BudgetKeyError("a budget needs a non-empty 'name'", key="name", file=origin))
        name = "budget"
    limits, shares = _limits(raw, name, origin, problems)
    caps = _caps(raw, "op_caps", name, origin, shares, problems)
    owner_caps = _caps(raw, "owner_caps", name, origin, shares, problems)
    category_caps = _caps(raw, "category_caps", name, origin, shares, problems)
    imbalance = _imbalance(raw, name, origin, problems)
    capacity = left = oom = None
    warmup, horizon = 1, default_leak_horizon
    if OOM in raw:
        if isinstance(raw[OOM], bool) or not isinstance(raw[OOM], int) or raw[OOM] < 0:
            problems.append(BudgetKeyError(f"invalid {name}.{OOM} {raw[OOM]!r}", key=OOM, file=origin,
                                           expected="a count of out-of-memory errors, an integer >= 0 (oom = 0)"))
        else:
            oom = raw[OOM]
    with problems.kept():
        left = _parse_size_in(origin, raw[LEFT], f"{name}.{LEFT}", LEFT) if LEFT in raw else None
    with problems.kept():
        capacity = (_parse_size_in(origin, raw["device_capacity"], f"{name}.device_capacity", "device_capacity")
                    if "device_capacity" in raw else None)
    with problems.kept():
        warmup = _steps_count(raw, "warmup_steps", name, origin, default=1, least=0)
    with problems.kept():
        horizon = _steps_count(raw, "leak_horizon_steps", name, origin, default=default_leak_horizon, least=1)
    for key in ("ranks", "devices", "component"):
        if key in raw and not isinstance(raw[key], str):
            problems.append(BudgetKeyError(f"invalid {name}.{key} {raw[key]!r}", key=key, file=origin,
                                           expected="a string"))
    # Said of an entry that is otherwise valid: with another error, a limit may be what is misspelled.
    if not (limits or caps or shares or owner_caps or category_caps or imbalance or left is not None or oom is not None
            or problems):
        problems.append(BudgetKeyError(f"budget {name!r} sets no limit", file=origin,
                                       expected="at least one of " + ", ".join([*LIMITS, LEFT, OOM, *CAP_KEYS,
                                                                                CROSS_RANK])))
    problems.raise_first()
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
        category_caps=category_caps,
        left_allocated=left,
        oom=oom,
    )


def _check_keys(raw: dict[str, Any], known: set[str] | frozenset[str], origin: str, problems: _Problems) -> None:
    """Keys no budget has, each its own error in the order written: with the key it most likely means,
    else the list of every key."""
    for key in raw:
        if key not in known:
            problems.append(BudgetKeyError(unknown_keys_message([key], known), key=key, file=origin,
                                           expected=_unguessed(key, known)))


def _unguessed(key: str, known: Iterable[str]) -> str | None:
    """For a key no valid key is close to: the list of every key (else "did you mean" says it)."""
    known = sorted(known)
    return None if closest_key(key, known) else "one of " + ", ".join(known)


def _limits(raw: dict[str, Any], name: str, origin: str,
            problems: _Problems) -> tuple[dict[str, int | float], dict[str, float]]:
    """The LIMITS keys: sizes in bytes (or a share of the capacity, ``"92%"``) and ratios."""
    limits: dict[str, int | float] = {}
    shares: dict[str, float] = {}
    for key, (_, kind) in LIMITS.items():
        if key not in raw:
            continue
        value = raw[key]
        with problems.kept():
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
    return limits, shares


_CAP_NAMES = {"op_caps": "op-name glob", "owner_caps": "owner glob", "category_caps": "category"}


def _caps(raw: dict[str, Any], cap_key: str, name: str, origin: str, shares: dict[str, float],
          problems: _Problems) -> dict[str, int]:
    """``op_caps`` / ``owner_caps``: glob → bytes; ``category_caps``: category → bytes; a cap written as a
    share of the capacity goes to ``shares``."""
    parsed: dict[str, int] = {}
    table = raw.get(cap_key, {})
    if not isinstance(table, dict):
        problems.append(BudgetKeyError(f"invalid {name}.{cap_key}", key=cap_key, file=origin,
                                       expected=f"a table of {_CAP_NAMES[cap_key]} = size"
                                       + (f" ({', '.join(CATEGORIES)})" if cap_key == "category_caps" else "")))
        return parsed
    for glob, size in table.items():
        what = f"{name}.{cap_key}[{glob!r}]"
        if cap_key == "category_caps" and glob not in CATEGORIES:
            unknown = unknown_keys_message([str(glob)], CATEGORIES, "category")
            problems.append(BudgetKeyError(f"invalid {name}.{cap_key}: {unknown}", key=cap_key, sub=str(glob),
                                           file=origin, expected="one of " + ", ".join(CATEGORIES)))
            continue
        with problems.kept():
            share = _parse_share_in(origin, size, what, cap_key, str(glob))
            if share is not None:
                shares[f"{cap_key}[{glob}]"] = share
                parsed[str(glob)] = 0
            else:
                parsed[str(glob)] = _parse_size_in(origin, size, what, cap_key, str(glob))
    return parsed


def _imbalance(raw: dict[str, Any], name: str, origin: str, problems: _Problems) -> dict[str, float]:
    """``rank_imbalance``: a LIMITS key → the largest ``1 - min/max`` over the ranks."""
    imbalance_raw = raw.get(CROSS_RANK, {})
    if not isinstance(imbalance_raw, dict):
        problems.append(BudgetKeyError(f"invalid {name}.{CROSS_RANK}", key=CROSS_RANK, file=origin,
                                       expected="a table of metric = ratio, e.g. { peak_allocated = 0.05 }"))
        return {}
    imbalance: dict[str, float] = {}
    for metric, ratio in imbalance_raw.items():
        if metric not in LIMITS:
            problems.append(BudgetKeyError(
                f"invalid {name}.{CROSS_RANK}: {unknown_keys_message([metric], LIMITS, 'metric')}",
                key=CROSS_RANK, sub=str(metric), file=origin, expected="one of " + ", ".join(LIMITS)))
        elif isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
            problems.append(BudgetKeyError(
                f"invalid {name}.{CROSS_RANK}[{metric!r}] {ratio!r}", key=CROSS_RANK, sub=str(metric), file=origin,
                expected="a ratio between 0 and 1 (1 - min/max over the ranks)"))
        else:
            imbalance[metric] = float(ratio)
    return imbalance


def _steps_count(raw: dict[str, Any], key: str, name: str, origin: str, *, default: int, least: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BudgetKeyError(f"invalid {name}.{key} {value!r}", key=key, file=origin,
                             expected=f"an integer >= {least}")
    return value


def _parse_share_in(origin: str, value: object, what: str, key: str, sub: str | None = None) -> float | None:
    try:
        return parse_share(value, what=what)
    except ConfigError as exc:
        raise BudgetKeyError(exc.message, key=key, sub=sub, file=origin, expected=exc.expected) from None


def _parse_size_in(origin: str, value: object, what: str, key: str, sub: str | None = None) -> int:
    try:
        return parse_size(value, what=what)
    except ConfigError as exc:
        raise BudgetKeyError(exc.message, key=key, sub=sub, file=origin, expected=exc.expected,
                             found=exc.found) from None


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
_Line = Callable[..., int | None]  # a key path in the table → its 1-based line, where known
_Found = list[tuple[tuple[str | int, ...], ConfigError]]  # (key path, its error)


def parse_budget_table(table: dict[str, Any], origin: str, *, default_leak_horizon: int = 1,
                       locate: Locate | None = None) -> BudgetFile:
    """Validate a budget table; ``locate`` maps a key path in ``table`` to its line for the errors.

    Every error of the file is found, then all are raised at once in file order, each its own error with
    the line of its key: the sizes first (parse_size, the one reader of a size, marker or file, decides
    every size; its message lists the accepted units), the schema, each entry's values, duplicate names.
    """
    def line(*path: str | int) -> int | None:
        return locate(path) if locate is not None else None

    entries = table.get("budgets", []) if isinstance(table.get("budgets"), list) else []
    sizes, found = _size_errors(entries, origin, line)
    found += _schema_errors(table, origin, line, sizes=sizes)
    budgets, problems = _entry_budgets(entries, origin, default_leak_horizon, line,
                                       reported={path for path, _ in found})
    found += problems
    found += _duplicate_names(entries, origin, line)
    if found:
        errors = sorted((error for _, error in found), key=lambda e: (e.line is None, e.line or 0))  # stable
        errors[0].also = tuple(errors[1:])
        raise errors[0]
    return BudgetFile(path=origin, profiles=table.get("profiles"), budgets=tuple(budgets),
                      lines=_declared_lines(table, budgets, line))


def _size_errors(entries: list[Any], origin: str, line: _Line) -> tuple[set[tuple[str | int, ...]], _Found]:
    """The key path of every size (limits, caps, device_capacity, left_allocated), and the error of each
    that does not parse, with the accepted units."""
    paths: set[tuple[str | int, ...]] = set()
    found: _Found = []
    for index, raw in enumerate(entries):
        if not isinstance(raw, dict):
            continue
        name = raw.get("name", "budget")
        sizes: list[tuple[tuple[str, ...], Any, str]] = [
            ((key,), raw[key], f"{name}.{key}") for key, (_, kind) in LIMITS.items() if kind == "size" and key in raw]
        for cap_key in CAP_KEYS:
            if isinstance(raw.get(cap_key), dict):
                sizes += [((cap_key, glob), size, f"{name}.{cap_key}[{glob!r}]") for glob, size in raw[cap_key].items()]
        for key in ("device_capacity", LEFT):
            if key in raw:
                sizes.append(((key,), raw[key], f"{name}.{key}"))
        for keys, value, what in sizes:
            paths.add(("budgets", index, *keys))
            try:
                if keys[0] in ("device_capacity", LEFT) or parse_share(value, what=what) is None:
                    parse_size(value, what=what)
            except ConfigError as exc:
                found.append((("budgets", index, *keys), BudgetKeyError(
                    exc.message, key=keys[0], sub=keys[1] if len(keys) > 1 else None, file=origin,
                    line=line("budgets", index, *keys), expected=exc.expected, found=exc.found)))
    return paths, found


def _schema_errors(table: dict[str, Any], origin: str, line: _Line, sizes: set[tuple[str | int, ...]]) -> _Found:
    """What schemas/budgets.schema.json refuses, one error per unknown key, but for the ``sizes``: the
    schema's size pattern is parse_size's (sizes.SIZE_PATTERN), but parse_size alone judges them."""
    import jsonschema  # here, not at the top: a budget file is the only thing it checks (~40 ms to import)

    validator = jsonschema.Draft202012Validator(load_schema("budgets"))
    found: _Found = []
    for error in validator.iter_errors(table):
        error = jsonschema.exceptions.best_match([error]) or error  # into a oneOf's alternatives, as before
        path = list(error.absolute_path)
        where = "/".join(str(p) for p in path) or "(top level)"
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = set(error.schema.get("properties", {}))
            what = "key" if not path else "budget key"
            for key in (k for k in error.instance if k not in allowed):  # each its own line, as written
                found.append(((*path, key), ConfigError(
                    f"invalid budget file at {where}: {unknown_keys_message([key], allowed, what)}", file=origin,
                    line=line(*path, key), expected=_unguessed(key, allowed))))
            continue
        if error.validator == "required" and isinstance(error.instance, dict):
            path += [k for k in error.validator_value if k not in error.instance][:1]  # the key it lacks
        if tuple(path) in sizes:
            continue  # parse_size said it, or found it a size
        found.append((tuple(path), ConfigError(f"invalid budget file at {where}: {error.message}", file=origin,
                                               line=line(*path))))
    return found


def _entry_budgets(entries: list[Any], origin: str, default_leak_horizon: int, line: _Line,
                   reported: set[tuple[str | int, ...]]) -> tuple[list[Budget], _Found]:
    """Each entry as a Budget, and the problems of those that are not, but for keys already ``reported``."""
    budgets = []
    found: _Found = []
    for index, raw in enumerate(entries):
        if not isinstance(raw, dict):
            continue
        try:
            budgets.append(budget_from_mapping(raw, origin=origin, default_leak_horizon=default_leak_horizon))
        except BudgetKeyError as exc:
            for problem in (exc, *exc.also):
                assert isinstance(problem, BudgetKeyError)
                at: tuple[str | int, ...] = ("budgets", index, *problem.keys)
                if problem.key is not None and at in reported:
                    continue  # the schema or parse_size said it
                found.append((at, BudgetKeyError(problem.message, key=problem.key, sub=problem.sub, file=origin,
                                                 line=line(*at), expected=problem.expected, found=problem.found)))
    return budgets, found


def _duplicate_names(entries: list[Any], origin: str, line: _Line) -> _Found:
    """A name given to two entries: named at the second, with the line of the first."""
    found: _Found = []
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
    return found


def _declared_lines(table: dict[str, Any], budgets: list[Budget], line: _Line) -> dict[str, dict[str, int]]:
    """Budget name → key (an op cap: ``op_caps[glob]``; the entry itself: ``""``) → its line."""
    lines: dict[str, dict[str, int]] = {}
    for index, (budget, raw) in enumerate(zip(budgets, table.get("budgets", []))):
        declared = {"": line("budgets", index)}
        declared.update({key: line("budgets", index, key) for key in raw})
        declared.update({f"op_caps[{glob}]": line("budgets", index, "op_caps", glob) for glob in budget.op_caps})
        declared.update({f"owner_caps[{glob}]": line("budgets", index, "owner_caps", glob) for glob in budget.owner_caps})
        declared.update({f"category_caps[{c}]": line("budgets", index, "category_caps", c) for c in budget.category_caps})
        declared.update({f"{CROSS_RANK}[{m}]": line("budgets", index, CROSS_RANK, m) for m in budget.rank_imbalance})
        lines[budget.name] = {k: v for k, v in declared.items() if v is not None}
    return lines


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


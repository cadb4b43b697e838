"""Budgets suggested from measured runs (``memgate suggest``): a ``[tool.memgate]`` block, a
memgate.toml, or ``@pytest.mark.memgate(...)`` lines, each limit the measured value plus headroom.

Peaks, caps and ratios come from the worst profile, growth and leaks from the cleanest (a leak
measured in one profile never becomes everyone's allowance); floors and a cap keep every limit one
that can fail and none that fails on noise.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal
from typing import Any

from memgate.budgets import LIMITS
from memgate.categories import CATEGORIES
from memgate.compare import RATIO_DECIMALS, format_metric
from memgate.errors import BIDI_CONTROLS, ConfigError, printable, show
from memgate.metric_specs import budget_keys_suggested, not_suggested
from memgate.sizes import format_size, parse_size

MIB = 1 << 20
# The smallest suggested limits of peaks, caps and ratios: a peak of a few KiB moves by allocator
# rounding and interpreter allocations between runs of the same code, and a 0 ratio fails on 0.001
# of noise: peaks and caps are suggested as at least 1 MiB, ratios as at least 0.010. Growth and
# leaks (GROWTH_KEYS) have no floor: a measured 0 B is suggested as 0 B (a floor would allow a leak
# that was never measured).
SIZE_FLOOR = MIB
RATIO_FLOOR = Decimal("0.010")
# A ratio is at most 1, so a ratio limit of 1 can never fail: the highest suggested is this.
RATIO_CAP = Decimal("0.999")
# Budget keys measured but not suggested, and why (printed as a comment in the block).
NOT_SUGGESTED = not_suggested()  # budget key → why no limit is proposed (the metric table says)


def _is_surrogate(ch: str) -> bool:
    return 0xD800 <= ord(ch) < 0xE000


def _toml_string(text: str) -> str:
    """A TOML basic string that reads back as ``text``, on one line: quotes and backslashes escaped, and
    every character that is not printable (controls, line and paragraph separators, bidi overrides,
    :meth:`str.isprintable`) as a ``\\u`` escape. A lone surrogate has no TOML spelling: the callers
    never pass one (globs write it as ``?``, :func:`_glob_literal`; a budget name holding one is refused)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif _is_surrogate(ch):
            raise ValueError(f"no TOML string holds the lone surrogate {ch!r}")
        elif not ch.isprintable() or ch in BIDI_CONTROLS:
            out.append(f"\\u{ord(ch):04X}" if ord(ch) <= 0xFFFF else f"\\U{ord(ch):08X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _py_string(text: str) -> str:
    """A Python string literal (double-quoted) that reads back as ``text``, on one line: what is not
    printable written as :func:`repr` writes it (``\\n``, ``\\x85``, ``\\u2028``, ``\\udcff``)."""
    return '"' + "".join("\\" + ch if ch in '"\\' else ch if ch.isprintable() and ch not in BIDI_CONTROLS
                         else repr(ch)[1:-1] for ch in text) + '"'


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")


def _toml_key(key: str) -> str:
    """A TOML key: bare where TOML allows it (``parameters``), else a basic string."""
    return key if _BARE_KEY.match(key) else _toml_string(key)


def _comment(text: str) -> str:
    """A comment line's text: one line, whatever the names in it hold (:func:`memgate.errors.printable`)."""
    return printable(text)


def _glob_literal(name: str) -> str:
    """An op name as an op_caps glob that matches exactly that name (``*``, ``?``, ``[`` bracketed); a
    lone surrogate (a file name's byte that is not UTF-8) as ``?``, which TOML can write and matches it."""
    return "".join(f"[{ch}]" if ch in "*?[" else "?" if _is_surrogate(ch) else ch for ch in name)


_INSTANCE = re.compile(r"_[0-9]+\Z")  # cann::trans_TransData_24: the 24th instance of one kernel


def op_globs(ops: dict[str, int]) -> dict[str, int]:
    """Op caps to suggest: instances of one kernel (``cann::trans_TransData_0``, ``_24``) as one glob
    (``cann::trans_TransData_*``), other names as themselves; each with the largest block of every
    op the glob matches, so the cap holds on the profiles it came from."""
    globs = {(_glob_literal(_INSTANCE.sub("", op)) + "_*") if _INSTANCE.search(op) else _glob_literal(op) for op in ops}
    return {glob: max(size for op, size in ops.items() if fnmatch.fnmatchcase(op, glob)) for glob in globs}


OWNER_CAPS_TOP = 10  # owner_caps suggested for at most this many owner globs, the largest at the peak

# An owner's source line, which moves whenever code above it changes: "step (train.py:19)"
# (a Python frame, memgate.owners).
_OWNER_LINE = re.compile(r"\A(?P<head>.+ \(.*?\.[A-Za-z0-9_]+):(?P<line>[0-9]+)\)\Z", re.DOTALL)


def owner_glob(owner: str) -> str:
    """An owner as an owner_caps glob without its line number (``step (train.py:*)``), the rest matched
    literally; other owners as :func:`op_globs` groups them. The glob always matches the owner it came from."""
    m = _OWNER_LINE.match(owner)
    if m:
        return _glob_literal(m["head"]) + ":*)"
    return next(iter(op_globs({owner: 0})))


def owner_cap_sizes(entries: list[dict[str, Any]]) -> tuple[dict[str, int], str]:
    """Owner caps to suggest: owners at the peak grouped into globs by :func:`owner_glob` (no line
    numbers; kernel instances as :func:`op_globs` groups ops), each with the most bytes the owners it matches hold at the peak on one device (an owner cap sums
    them), and only globs that match an owner on every profile (a profile where none matches could
    not be judged). Also why none is suggested, when none is."""
    per_device: list[tuple[int, dict[str, int]]] = []  # (entry index, owners at the peak of one device)
    for i, entry in enumerate(entries):
        for dev in entry["devices"]:
            owners = dev["metrics"].get("owner_bytes_at_peak")
            if isinstance(owners, dict) and owners:
                per_device.append((i, {str(o): int(size) for o, size in owners.items()}))
    if not per_device:
        return {}, "the profiles record no owners at the peak"
    largest: dict[str, int] = {}
    for _, owners in per_device:
        for owner, size in owners.items():
            largest[owner] = max(largest.get(owner, 0), size)
    caps: dict[str, int] = {}
    for glob in sorted({owner_glob(o) for o in largest}):
        matched = [(i, [size for o, size in owners.items() if fnmatch.fnmatchcase(o, glob)]) for i, owners in per_device]
        if {i for i, sizes in matched if sizes} == set(range(len(entries))):
            caps[glob] = max(sum(sizes) for _, sizes in matched)
    if not caps:
        return {}, "no owner at the peak is common to every profile"
    return caps, ""


def category_cap_sizes(entries: list[dict[str, Any]]) -> tuple[dict[str, int], str]:
    """Category caps to suggest: per category the most bytes one device held of it at the peak, for
    the categories held at all, where every profile records categories (a tracked recording); also why
    none is suggested where some profiles record them and not all (a profile without would not be judged).
    No remark where none records them (nothing was tracked)."""
    measured = [[dev["metrics"].get("category_bytes_at_peak") for dev in entry["devices"]] for entry in entries]
    recorded = [any(isinstance(c, dict) and c for c in devices) for devices in measured]
    if not any(recorded):
        return {}, ""
    if not all(recorded):
        return {}, "not every profile records categories (track the model and optimizer in each recording)"
    largest: dict[str, int] = {}
    for devices in measured:
        for by_category in devices:
            for name, size in (by_category or {}).items():
                if int(size) > 0:
                    largest[str(name)] = max(largest.get(str(name), 0), int(size))
    return largest, "" if largest else "no category held bytes at the peak"


def rank_imbalance_measured(entries: list[dict[str, Any]], metric: str = "peak_allocated") -> tuple[float | None, str]:
    """``1 - min/max`` of ``metric`` over the profiles (each its worst device), as ``rank_imbalance``
    judges it; None and why when it cannot be judged (fewer than two ranks, a profile without it)."""
    key = LIMITS[metric][0]
    ranks = {str(e.get("rank")) for e in entries}
    if len(ranks) < 2:
        return None, f"needs at least two ranks, these profiles hold {len(ranks)}"
    values: list[float] = []
    for entry in entries:
        measured = [v for dev in entry["devices"] if isinstance(v := dev["metrics"].get(key), (int, float))
                    and not isinstance(v, bool)]
        if not measured:
            return None, f"{metric} is not measured on rank {entry.get('rank')}"
        values.append(max(measured))
    worst, best = max(values), min(values)
    return (0.0 if worst <= 0 else 1 - best / worst), ""


# Budget keys that judge growth or leaks: suggested from what the cleanest profile measured, never
# from the worst (a leak measured in one profile must not become everyone's allowance), and with no
# floor (a measured 0 B of growth is suggested as "0 B").
GROWTH_KEYS = budget_keys_suggested("least")
# Live blocks of the last steps: a leak or the loop's own last activations (a clean loop measures
# some), so not bounded by the cleanest profile; but, as growth, with no floor: 0 B stays 0 B.
NO_FLOOR_KEYS = budget_keys_suggested("least", "worst, no floor")
FORMS = ("pyproject", "toml", "marker")


def suggested_size(measured: int, factor: Decimal, floor: int = SIZE_FLOOR) -> str:
    """Measured bytes plus headroom, rounded up to a readable size, at least ``floor``
    (:data:`SIZE_FLOOR` for peaks and caps; 0 for :data:`GROWTH_KEYS`: 0 measured stays "0 B")."""
    return _round_up_size(max(int(Decimal(measured) * factor), floor))


def suggested_ratio(measured: float, factor: Decimal) -> Decimal | None:
    """Measured ratio plus headroom, rounded up to 0.001, at least :data:`RATIO_FLOOR`, capped at
    :data:`RATIO_CAP`; None when the cap is below the measured value (no limit that can fail passes)."""
    step = Decimal(1).scaleb(-RATIO_DECIMALS)
    limit = max((Decimal(str(measured)) * factor).quantize(step, rounding=ROUND_CEILING), RATIO_FLOOR)
    limit = min(limit, RATIO_CAP)
    return limit if limit >= Decimal(str(measured)) else None


def profile_label(entry: dict[str, Any]) -> str:
    """What a suggestion calls a profile: its marked test's node id, else its path."""
    test = (entry.get("metadata") or {}).get("test")
    return str(test) if test else str(entry.get("path"))


def _measured(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value >= 0


def _profile_values(entries: list[dict[str, Any]], budget_key: str) -> list[tuple[dict[str, Any], int | float]]:
    """Each profile that measured ``budget_key``, with its worst device's value."""
    metric_key = LIMITS[budget_key][0]
    out: list[tuple[dict[str, Any], int | float]] = []
    for entry in entries:
        values = [v for dev in entry["devices"] if _measured(v := dev["metrics"].get(metric_key))]
        if values:
            out.append((entry, max(values)))
    return out


@dataclass(frozen=True)
class GrowthLimit:
    """A leak/growth limit suggested from the cleanest profile, and the profiles it fails."""
    measured: int  # the least value over the profiles (each its worst device)
    limit: str  # the suggested size
    leaking: tuple[tuple[str, int], ...]  # (profile label, its value) above the limit
    profiles: int  # how many profiles measured it


def growth_limits(entries: list[dict[str, Any]], factor: Decimal) -> dict[str, GrowthLimit]:
    """Per :data:`GROWTH_KEYS` key measured: the minimum over the profiles plus headroom, no floor
    (0 B when any profile measured 0), and every profile whose value exceeds it."""
    out: dict[str, GrowthLimit] = {}
    for key in GROWTH_KEYS:
        values = _profile_values(entries, key)
        if not values:
            continue
        least = int(min(v for _, v in values))
        limit = suggested_size(least, factor, floor=0)
        allowed = parse_size(limit)
        leaking = tuple((profile_label(e), int(v)) for e, v in values if v > allowed)
        out[key] = GrowthLimit(least, limit, leaking, len(values))
    return out


def leak_remarks(key: str, growth: GrowthLimit, only: set[str] | None = None) -> list[str]:
    """One comment per profile the growth limit fails: named, never absorbed into the limit."""
    per = "/step" if key == "step_growth" else ""
    return [f"# {label} leaks {format_size(value)}{per} ({key}; the cleanest profile allows {growth.limit}): "
            "fix it or budget it alone" for label, value in growth.leaking if only is None or label in only]


Value = str | Decimal  # a suggested limit: a size text, or a ratio


@dataclass
class _Suggestion:
    """One budget's suggested keys: sizes as text ("24 MiB"), ratios as Decimal."""
    limits: list[tuple[str, Value, str]]  # (budget key, value, comment)
    op_caps: dict[str, str]
    owner_caps: dict[str, str]
    imbalance: tuple[Decimal, str] | None  # (ratio, comment)
    remarks: list[str]  # comment lines after the budget
    category_caps: dict[str, str] = field(default_factory=dict)  # category → size

    def values(self) -> dict[str, Any]:
        """The budget's keys and values, as the printed text declares them."""
        out: dict[str, Any] = {key: value for key, value, _ in self.limits}
        for key, caps in (("op_caps", self.op_caps), ("owner_caps", self.owner_caps),
                          ("category_caps", self.category_caps)):
            if caps:
                out[key] = dict(caps)
        if self.imbalance is not None:
            out["rank_imbalance"] = {"peak_allocated": self.imbalance[0]}
        return out


@dataclass(frozen=True)
class Suggested:
    """One suggested budget (a budget file's) or marker (a test's), as its text declares it: what a
    TOML reader or the marker's keywords read back is exactly ``values`` (ratios as Decimal here)."""
    heading: str  # a marker's test node id ("" for one marker of all the profiles); "" in a budget file
    values: dict[str, Any]  # budget key → size text, ratio, or a table of name → size text / ratio
    comments: dict[str, str]  # budget key → what it was measured at (one comment line each)
    remarks: tuple[str, ...]  # comment lines under it: what was not suggested, who leaks
    profiles: int  # how many profiles it was suggested from


@dataclass
class _Measured:
    """What a group of profiles measured: the worst value per budget key (and its pool), the largest
    block per operator, and per profile the operators it saw (a cap matching none would be an error)."""
    worst: dict[str, int | float]
    pool_of: dict[str, str]
    ops: dict[str, int]
    ops_of: list[set[str]]


def _worst_measured(entries: list[dict[str, Any]]) -> _Measured:
    out = _Measured({}, {}, {}, [])
    for entry in entries:
        out.ops_of.append(set())
        for dev in entry["devices"]:
            for budget_key, (metric_key, _) in LIMITS.items():
                value = dev["metrics"].get(metric_key)
                if not _measured(value):
                    continue
                if budget_key not in out.worst or value > out.worst[budget_key]:
                    out.worst[budget_key] = value
                    pool = (dev.get("pool_of") or {}).get(metric_key)
                    if pool is not None:
                        out.pool_of[budget_key] = pool
                    else:
                        out.pool_of.pop(budget_key, None)
            for op, size in (dev["metrics"].get("op_max_block_bytes") or {}).items():
                out.ops[op] = max(out.ops.get(op, 0), size)
                out.ops_of[-1].add(op)
    return out


def _suggest_one(entries: list[dict[str, Any]], factor: Decimal, growth: dict[str, GrowthLimit], *,
                 cross_rank: bool) -> _Suggestion:
    """One budget for ``entries``: its limits, caps and (``cross_rank``) rank_imbalance, and the remarks."""
    measured = _worst_measured(entries)
    out = _Suggestion([], {}, {}, None, [])
    labels = {profile_label(e) for e in entries}
    for budget_key, (_, kind) in LIMITS.items():
        if budget_key in measured.worst:
            _suggest_limit(out, budget_key, kind, measured, factor, growth, labels)
    _suggest_caps(out, entries, measured, factor)
    if cross_rank:
        _suggest_imbalance(out, entries, factor)
    unmeasured = [k for k in LIMITS if k not in measured.worst]
    if unmeasured:
        out.remarks.append("# not measured in these profiles: " + ", ".join(unmeasured))
    return out


def _suggest_limit(out: _Suggestion, budget_key: str, kind: str, measured: _Measured, factor: Decimal,
                   growth: dict[str, GrowthLimit], labels: set[str]) -> None:
    """One LIMITS key's suggested limit (with what it was measured at), or the remark why none is."""
    value = measured.worst[budget_key]
    pool = f", pool {measured.pool_of[budget_key]}" if budget_key in measured.pool_of else ""
    what = f"measured {format_metric(kind, value)}{pool}"
    if budget_key in NOT_SUGGESTED:
        out.remarks.append(f"# {budget_key} not suggested ({what}): {NOT_SUGGESTED[budget_key]}")
    elif budget_key in growth:
        g = growth[budget_key]
        note = (f"measured {format_size(g.measured)}" if g.profiles == 1 else
                f"least of {g.profiles} profiles {format_size(g.measured)}") + pool
        if g.measured == 0:
            note += "; no growth measured, none allowed"
        out.limits.append((budget_key, g.limit, note))
        out.remarks.extend(leak_remarks(budget_key, g, labels))
    elif budget_key in NO_FLOOR_KEYS:
        out.limits.append((budget_key, suggested_size(int(value), factor, floor=0), what))
    elif kind == "size":
        limit = suggested_size(int(value), factor)
        floor = ("; 1 MiB is the smallest suggested peak or cap (below it, allocator rounding and "
                 "interpreter noise move the value)" if int(Decimal(int(value)) * factor) < SIZE_FLOOR else "")
        out.limits.append((budget_key, limit, what + floor))
    else:
        ratio = suggested_ratio(float(value), factor)
        if ratio is None:
            out.remarks.append(f"# {budget_key} not suggested ({what}): no ratio limit below 1 leaves "
                               "headroom, and a ratio limit of 1 can never fail")
            return
        note = ""
        if ratio == RATIO_CAP:
            note = "; capped below 1 (a ratio limit of 1 can never fail)"
        elif ratio == RATIO_FLOOR:
            note = f"; {RATIO_FLOOR} is the smallest suggested ratio"
        out.limits.append((budget_key, ratio, what + note))


def _suggest_caps(out: _Suggestion, entries: list[dict[str, Any]], measured: _Measured, factor: Decimal) -> None:
    """Op caps common to every profile (the largest first, at most 10), and owner caps."""
    common = {glob: size for glob, size in op_globs(measured.ops).items()
              if all(any(fnmatch.fnmatchcase(op, glob) for op in seen) for seen in measured.ops_of)}
    for glob, size in sorted(common.items(), key=lambda kv: (-kv[1], kv[0]))[:10]:
        out.op_caps[glob] = suggested_size(size, factor)
    if measured.ops and not common:
        out.remarks.append("# op_caps not suggested: no operator is common to every profile")
    owner_caps, why = owner_cap_sizes(entries)
    for glob, size in sorted(owner_caps.items(), key=lambda kv: (-kv[1], kv[0]))[:OWNER_CAPS_TOP]:
        out.owner_caps[glob] = suggested_size(size, factor)
    if not owner_caps:
        out.remarks.append(f"# owner_caps not suggested: {why}")
    categories, why = category_cap_sizes(entries)
    out.category_caps = {name: suggested_size(size, factor) for name, size in categories.items() if name in CATEGORIES}
    if why:
        out.remarks.append(f"# category_caps not suggested: {why}")
    unknown = sorted(set(categories) - set(CATEGORIES))
    if unknown:  # a report read back (untrusted) may name others: a budget of them would be refused
        out.remarks.append(f"# category_caps not suggested for {', '.join(map(show, unknown[:5]))}"
                           + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
                           + f": not a category ({', '.join(CATEGORIES)})")


def _suggest_imbalance(out: _Suggestion, entries: list[dict[str, Any]], factor: Decimal) -> None:
    """A rank_imbalance of peak_allocated over the profiles, or the remark why none is suggested."""
    imbalance, why = rank_imbalance_measured(entries)
    ratio = None if imbalance is None else suggested_ratio(imbalance, factor)
    if imbalance is None:
        out.remarks.append(f"# rank_imbalance not suggested: {why}")
    elif ratio is None:
        out.remarks.append(f"# rank_imbalance not suggested (measured {imbalance:.3f} on peak_allocated): no "
                           "ratio limit below 1 leaves headroom")
    else:
        note = f"; {RATIO_FLOOR} is the smallest suggested ratio" if ratio == RATIO_FLOOR else ""
        out.imbalance = (ratio, f"measured {imbalance:.3f} over {len(entries)} profiles{note}")


def suggestions(entries: list[dict[str, Any]], headroom: Decimal, name: str = "default",
                form: str = "pyproject") -> list[Suggested]:
    """What :func:`suggest_toml` prints, as values: one budget (the budget-file forms) or one marker per
    marked test (``marker``, :func:`suggest_markers`)."""
    if form not in FORMS:
        raise ConfigError(f"unknown suggestion form {form!r}", expected="one of " + ", ".join(FORMS))
    factor = 1 + headroom / 100
    if form == "marker":
        return _marker_suggestions(entries, factor)
    if any(map(_is_surrogate, name)):  # an argument's byte that is not UTF-8: no TOML string writes it
        raise ConfigError(f"invalid --name {printable(name)!r}", expected="a name TOML can write (UTF-8 text)")
    s = _suggest_one(entries, factor, growth_limits(entries, factor), cross_rank=True)
    comments = {key: comment for key, _, comment in s.limits}
    if s.imbalance is not None:
        comments["rank_imbalance"] = s.imbalance[1]
    return [Suggested("", {"name": name, **s.values()}, comments, tuple(s.remarks), len(entries))]


def suggest_toml(entries: list[dict[str, Any]], headroom: Decimal, name: str = "default",
                 form: str = "pyproject") -> str:
    """A budget suggestion: the worst measured peak, ratio and cap over all profiles plus headroom;
    for :data:`GROWTH_KEYS` the least measured growth (see :func:`growth_limits`), each profile that
    grew past it named in a comment.

    ``form``: ``pyproject`` (a ``[tool.memgate]`` block), ``toml`` (a ``memgate.toml``) or ``marker``
    (see :func:`suggest_markers`). Every LIMITS key measured on some device is proposed (except
    :data:`NOT_SUGGESTED`, said so in a comment), with the floors and the cap above so that every
    limit can fail and none fails on noise; the block passes on the profiles it was suggested from,
    except for the growth limits of the profiles named as leaking.

    Names come from the profiles (ops, owners, categories, paths, test ids: a JSON report or saved run
    read back is untrusted): every one is a quoted, escaped string or inside a one-line comment, so the
    text read back (``tomllib``, the marker's keywords) is exactly :func:`suggestions`' values, and no
    name can end a line, close a table or add a key.
    """
    found = suggestions(entries, headroom, name, form)
    if form == "marker":
        return _marker_text(found)
    [budget] = found
    table = "tool.memgate." if form == "pyproject" else ""
    lines = (["[tool.memgate]", ""] if form == "pyproject" else []) + [f"[[{table}budgets]]"]
    for key, value in budget.values.items():
        comment = budget.comments.get(key)
        lines.append(f"{key} = {_toml_value(value)}" + (f"  # {_comment(comment)}" if comment else ""))
    return "\n".join(lines + [_comment(r) for r in budget.remarks]) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    return _toml_string(value) if isinstance(value, str) else str(value)


def _py_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py_string(k)}: {_py_value(v)}" for k, v in value.items()) + "}"
    return _py_string(value) if isinstance(value, str) else str(value)


def suggest_markers(entries: list[dict[str, Any]], factor: Decimal) -> str:
    """``@pytest.mark.memgate(...)`` lines: one per marked test (its node id in a comment above it)
    when the entries carry marked tests (``metadata.test``: a JSON report's, a saved run's), else one
    for all of them. Growth limits come from the cleanest profile over all the entries, as in the
    budget-file forms."""
    return _marker_text(_marker_suggestions(entries, factor))


def _marker_suggestions(entries: list[dict[str, Any]], factor: Decimal) -> list[Suggested]:
    growth = growth_limits(entries, factor)
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        test = (entry.get("metadata") or {}).get("test")
        groups.setdefault(str(test) if test else "", []).append(entry)
    if "" in groups and len(groups) > 1:  # profiles of no test beside marked tests: judged with them all
        groups = {"": entries}
    out = []
    for test, group in groups.items():
        s = _suggest_one(group, factor, growth, cross_rank=False)
        out.append(Suggested(test, s.values(), {key: comment for key, _, comment in s.limits}, tuple(s.remarks),
                             len(group)))
    return out


def _shown_heading(test: str) -> str:
    """A marker's test id as its heading comment shows it: quoted where it is blank or starts or ends with
    a space (``#   `` would read as a line of the marker before it, a trailing space as nothing)."""
    shown = printable(test)
    return f'"{shown}"' if shown != shown.strip() or not shown else shown


def _marker_text(found: list[Suggested]) -> str:
    lines: list[str] = []
    for marker in found:
        if lines:
            lines.append("")
        lines.append(f"# {_shown_heading(marker.heading)}" if marker.heading
                     else f"# {marker.profiles} profile(s), judged together")
        lines += [f"#   {key}: {comment}" for key, comment in marker.comments.items()]
        lines += marker.remarks
        lines.append("@pytest.mark.memgate(" + ", ".join(f"{key}={_py_value(value)}" for key, value in marker.values.items()) + ")")
    return "\n".join(_comment(line) if line.startswith("#") else line for line in lines) + "\n"


def _round_up_size(nbytes: int) -> str:
    """A readable size >= nbytes that parses back exactly: whole MiB below 10 GiB, else 1/4 GiB steps."""
    if nbytes <= 0:
        return "0 B"
    if nbytes < 10 * (1 << 30):
        return f"{-(-nbytes // MIB)} MiB"
    quarters = -(-nbytes // (1 << 28))
    return f"{Decimal(quarters) / 4} GiB" if quarters % 4 else f"{quarters // 4} GiB"


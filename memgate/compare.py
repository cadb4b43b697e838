"""Baselines and diffs: compare a run's metrics with an earlier run's. Pure.

A baseline is a small JSON file keyed by rank, holding each profile's metrics and what makes its
numbers comparable (device type, framework/CANN versions, world size, format). Comparison rules
read ``peak_allocated:5%``, ``peak_allocated:+256MiB`` or ``peak_allocated:2.5%+256MiB`` (the
last fails only when both the relative and the absolute growth are exceeded).

Every budget key of :data:`memgate.budgets.LIMITS` is compared, diffed and suggested; its kind
there ("size" or "ratio") decides how it prints: sizes in IEC units, ratios with 3 decimals. A
baseline saved before a metric existed lacks its key: that metric is left out of the comparison
(a rule that asks for it says so), every other key still compares.

A regression names its cause: per device the baseline keeps the bytes live at the peak per
operator and per owner, and the git commit it was saved at; :attr:`Regression.detail` lists the
operators and owners whose bytes at the peak grew most, and that commit.
"""

from __future__ import annotations

import fnmatch
import functools
import json
import re
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from typing import Any

from memgate import __version__
from memgate.budgets import LIMITS
from memgate.errors import BIDI_CONTROLS, ConfigError, InputError, printable
from memgate.identity import Pairing, ProfileId, device_kinds, pair_devices, pair_profiles, profile_labels
from memgate.sizes import format_size, parse_size

BASELINE_FORMAT = 1
RUN_LAYOUT = 1  # a saved run's memgate_run.layout (memgate.autosave.LAYOUT: .memgate/v1/)
COMPARABLE_KEYS = ("format", "device_type", "torch_version", "torch_npu_version", "cann_version", "mindspore_version", "world_size")
RATIO_DECIMALS = 3
_RULE = re.compile(r"\A(?P<metric>[a-z_]+):(?:(?P<pct>[0-9]+(?:\.[0-9]+)?)%)?(?:\+(?P<abs>[^%]+))?\Z")
_RATIO_TEXT = re.compile(r"\A\s*[0-9]+(?:\.[0-9]+)?\s*\Z")


def metric_kind(budget_key: str) -> str:
    """``"size"`` or ``"ratio"``: how a budget key's values are measured, printed and limited."""
    return LIMITS[budget_key][1]


def format_metric(kind: str, value: float) -> str:
    """A value as reports print it: IEC size text, or a ratio with :data:`RATIO_DECIMALS` decimals."""
    return format_size(value) if kind == "size" else f"{value:.{RATIO_DECIMALS}f}"


def _signed(kind: str, delta: float) -> str:
    if kind == "size":
        return ("+" if delta >= 0 else "") + format_size(delta)
    return f"{delta:+.{RATIO_DECIMALS}f}"


@dataclass(frozen=True)
class CompareRule:
    """Fail when ``metric`` grew past the allowance. ``both``: relative and absolute must be exceeded."""

    metric: str  # budget key, e.g. peak_allocated
    percent: Decimal | None
    absolute: int | float | None
    text: str

    def allowed(self, base: float) -> int | float:
        """Largest value that still passes against ``base`` (the larger allowance when both are given)."""
        limits: list[Decimal] = []
        if self.percent is not None:
            limits.append(Decimal(str(base)) * (1 + self.percent / 100))
        if self.absolute is not None:
            limits.append(Decimal(str(base)) + Decimal(str(self.absolute)))
        best = max(limits)
        # Sizes are whole bytes: value <= x holds exactly when value <= floor(x).
        return int(best) if metric_kind(self.metric) == "size" else float(best)

    def describe(self) -> str:
        parts = []
        if self.percent is not None:
            parts.append(f"+{self.percent}%")
        if self.absolute is not None:
            kind = metric_kind(self.metric)
            parts.append("+" + (format_size(self.absolute) if kind == "size" else f"{self.absolute:g}"))
        return parts[0] if len(parts) == 1 else f"max({', '.join(parts)})"


def parse_rule(text: str) -> CompareRule:
    m = _RULE.match(text.strip())
    if m is None or (m.group("pct") is None and m.group("abs") is None):
        raise ConfigError(f"invalid compare rule {text!r}",
                          expected="METRIC:P% or METRIC:+SIZE or METRIC:P%+SIZE, e.g. peak_allocated:2.5%+256MiB")
    metric = m.group("metric")
    if metric not in LIMITS:
        raise ConfigError(f"invalid compare rule {text!r}: unknown metric {metric!r}", expected="one of " + ", ".join(LIMITS))
    absolute: int | float | None = None
    if m.group("abs") is not None:
        if metric_kind(metric) == "size":
            absolute = parse_size(m.group("abs"), what=f"compare rule {text!r}")
        elif _RATIO_TEXT.match(m.group("abs")):  # float() would take nan, inf and 1e-3
            absolute = float(m.group("abs"))
        else:
            raise ConfigError(f"invalid compare rule {text!r}", expected=f"a ratio after '+' for {metric}, e.g. "
                              f"{metric}:+0.02", found=m.group("abs"))
    percent = Decimal(m.group("pct")) if m.group("pct") is not None else None
    return CompareRule(metric=metric, percent=percent, absolute=absolute, text=text.strip())


def comparable_key(entry: dict[str, Any]) -> dict[str, Any]:
    """What must match for two profiles' numbers to be comparable."""
    meta = entry.get("metadata", {}) or {}
    kinds = device_kinds(str(d["device"]) for d in entry.get("devices", []))
    key: dict[str, Any] = {"format": entry.get("format"), "device_type": ",".join(kinds) or None}
    for name in COMPARABLE_KEYS[2:]:
        if meta.get(name) is not None:
            key[name] = meta[name]
    return key


def pair_entries(base: list[dict[str, Any]], current: list[dict[str, Any]], *,
                 current_is_whole_run: bool = True) -> Pairing:
    """Which profile of ``base`` is which of ``current`` (:mod:`memgate.identity`)."""
    return pair_profiles([ProfileId.of(e) for e in base], [ProfileId.of(e) for e in current],
                         current_is_whole_run=current_is_whole_run)


def _baseline_keys(entries: list[dict[str, Any]]) -> list[str]:
    """A baseline's keys: the rank where one profile has it (readable, and what baselines of one
    profile per rank always used), else rank and the profile's path below the others'."""
    ranks = [str(e["rank"]) for e in entries]
    labels = profile_labels([str(e["path"]) for e in entries])
    keys: list[str] = []
    for rank, label in zip(ranks, labels):
        key = rank if ranks.count(rank) == 1 else f"{rank}:{label}"
        while key in keys:  # the same path twice (two reports merged): never overwrite
            key += "+"
        keys.append(key)
    return keys


# who held the peak and how many blocks were live then: not numbers a baseline compares
_NOT_BASELINED = ("top_at_peak", "live_at_peak_count")


def baseline_from_entries(entries: list[dict[str, Any]], *, commit: str | None = None,
                          dirty: bool = False) -> dict[str, Any]:
    """Every metric of every device (all of LIMITS' keys, op_max_block_bytes, and the bytes live at
    the peak per operator and per owner, ``op_bytes_at_peak`` / ``owner_bytes_at_peak``: top N plus
    ``(other)``), and the pool each per-pool metric comes from; ``top_at_peak`` is left out (it is
    who held the peak, not a number). Each profile keeps its rank, format and path, by which a later
    run's profile finds it. ``commit`` (the git checkout's HEAD, :func:`memgate.autosave.git_commit`)
    goes into ``metadata`` so a failed comparison can say what it compared with."""
    profiles: dict[str, Any] = {}
    for key, entry in zip(_baseline_keys(entries), entries):
        profiles[key] = {
            "rank": str(entry["rank"]),
            "path": entry["path"],
            "key": comparable_key(entry),
            "devices": {
                d["device"]: {
                    "metrics": {k: v for k, v in d["metrics"].items() if k not in _NOT_BASELINED},
                    "pool_of": dict(d.get("pool_of") or {}),
                }
                for d in entry["devices"]
            },
        }
    document: dict[str, Any] = {"memgate_baseline": BASELINE_FORMAT, "memgate_version": __version__}
    if commit is not None:
        document["metadata"] = {"git_commit": commit, "git_dirty": dirty}
    document["profiles"] = profiles
    return document


def baseline_commit(baseline: dict[str, Any]) -> str | None:
    """The git commit a baseline was saved at (``-dirty`` with uncommitted changes), or None: from
    its ``metadata``, else a saved run's ``memgate_run`` record; baselines saved without one have none."""
    for record, commit_key, dirty_key in ((baseline.get("metadata"), "git_commit", "git_dirty"),
                                          (baseline.get("memgate_run"), "commit", "dirty")):
        if isinstance(record, dict) and isinstance(record.get(commit_key), str) and record[commit_key]:
            return str(record[commit_key]) + ("-dirty" if record.get(dirty_key) else "")
    return None


def ratchet(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Keep, per profile/device/metric, the better (smaller) of the old and new baseline values.

    Profiles pair as in every comparison (:mod:`memgate.identity`). A per-pool metric keeps the
    pool of the value kept. A key the old baseline lacks (saved before memgate measured it) takes
    the new value.
    """
    merged: dict[str, Any] = json.loads(json.dumps(new))
    old_entries, new_entries = baseline_entries(old), baseline_entries(merged)
    new_keys = list(merged["profiles"])
    for b, c in pair_entries(old_entries, new_entries).pairs:
        before, profile = old_entries[b]["baseline"], merged["profiles"][new_keys[c]]
        if before.get("key") != profile.get("key"):
            continue
        devices = list(profile["devices"])
        for old_name, name in pair_devices(list(before.get("devices", {})), devices):
            if old_name is None or name is None:
                continue
            values, old_device = profile["devices"][name], before["devices"][old_name]
            old_metrics = old_device.get("metrics", {})
            pools = values.setdefault("pool_of", {})
            for key, value in values["metrics"].items():
                previous = old_metrics.get(key)
                if isinstance(value, (int, float)) and isinstance(previous, (int, float)) and previous < value:
                    values["metrics"][key] = previous
                    old_pool = (old_device.get("pool_of") or {}).get(key)
                    if old_pool is not None:
                        pools[key] = old_pool
                    else:
                        pools.pop(key, None)
    return merged


def looks_like_memgate_json(path: Path) -> bool:
    """A JSON report or baseline written by memgate (they start with their version key)."""
    if not path.is_file() or path.suffix != ".json":
        return False
    with open(path, "rb") as fh:
        head = fh.read(256).lstrip()
    return head.startswith(b"{") and (b'"memgate_version"' in head or b'"memgate_baseline"' in head)


# ---- reading reports, baselines and saved runs back: untrusted input ------------------------------
#
# They come back from CI artifact storage, caches and other branches: each is validated against its
# schema (schemas/report.schema.json, schemas/baseline.schema.json) before any number of it is used,
# and every refusal is one InputError naming the file and the JSON path, as a bad profile's is.

MAX_DOCUMENT_BYTES = 256 << 20  # a report of thousands of ranks is a few MB
MAX_NUMBER_DIGITS = 40  # 2**63 has 19 digits; a writer never writes a longer number
_MAX_DEPTH = 64  # a baseline nests 6 deep, a report 8: deeper is not one (and would recurse in the walk)


class _Refused:
    """A token json.loads met that no memgate writer produces (NaN, Infinity, a huge number),
    kept in place so that the refusal can name where it is."""

    def __init__(self, text: str, why: str) -> None:
        self.text = text
        self.why = why


def _number(text: str) -> float | _Refused:
    if len(text) > MAX_NUMBER_DIGITS:
        return _Refused(f"{text[:20]}... ({len(text)} characters)", "a number of more than 40 characters")
    value = float(text)
    return value if value - value == 0 else _Refused(text, "a number past the float range")


def _integer(text: str) -> int | _Refused:
    if len(text) > MAX_NUMBER_DIGITS:
        return _Refused(f"{text[:20]}... ({len(text)} digits)", "an integer of more than 40 digits")
    return int(text)


def _constant(text: str) -> _Refused:
    return _Refused(text, f"{text} is not a JSON number (no memgate writer writes it)")


def json_path(parts: Any) -> str:
    """``profiles["0"].devices["npu:0"].metrics.peak_allocated_bytes`` (``$`` for the document)."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(part)):
            out += ("." if out else "") + str(part)
        else:
            out += "[" + json.dumps(str(part)) + "]"
    return out or "$"


def _find_refused(doc: Any) -> tuple[list[Any], _Refused] | None:
    """The first refused token and its path; an explicit stack (the document may nest deep)."""
    stack: list[tuple[list[Any], Any]] = [([], doc)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, _Refused):
            return where, value
        if len(where) > _MAX_DEPTH:
            return where, _Refused("...", f"values nested more than {_MAX_DEPTH} deep")
        if isinstance(value, dict):
            stack.extend((where + [k], v) for k, v in reversed(value.items()))
        elif isinstance(value, list):
            stack.extend((where + [i], v) for i, v in reversed(list(enumerate(value))))
    return None


def read_json_document(path: str | Path, what: str) -> Any:
    """The JSON value of a file memgate wrote (``what``: "baseline", "JSON report"), refusing what no
    writer of it produces: bytes that are not UTF-8 JSON, NaN and Infinity, numbers of more than 40
    digits, a key given twice, nesting deeper than any memgate document."""
    from memgate.readers import limits

    path = Path(path)
    try:
        limits.check_file_size(path, limit=MAX_DOCUMENT_BYTES, why=f"a memgate {what} is a few MB at most")
        raw = path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"{what} file not found", file=path) from None
    except IsADirectoryError:
        raise InputError(f"{what} is a directory", file=path, expected=f"a memgate {what} file") from None
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", file=path) from None

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen:
                    obj[key] = _Refused(repr(key), f"the key {key!r} twice in one object (no memgate writer repeats one)")
                seen.add(key)
        return obj

    try:
        doc = json.loads(raw.decode("utf-8"), parse_float=_number, parse_int=_integer, parse_constant=_constant,
                         object_pairs_hook=pairs)
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text at byte {exc.start}", file=path, expected=f"a memgate {what} (UTF-8 JSON)",
                         found=raw[exc.start:exc.start + 8]) from None
    except json.JSONDecodeError as exc:
        cut = " (the file ends early: truncated?)" if exc.pos >= len(exc.doc.rstrip()) else ""
        raise InputError(f"invalid JSON: {exc.msg}{cut}", file=path, line=exc.lineno, column=f"char {exc.colno}",
                         expected=f"a memgate {what}") from None
    except RecursionError:
        raise InputError(f"values nested too deep for a memgate {what}", file=path,
                         expected=f"at most {_MAX_DEPTH} levels") from None
    found = _find_refused(doc)
    if found is not None:
        where, token = found
        raise InputError(f"not a memgate {what}: {token.why}", file=path, column=json_path(where),
                         expected="a finite JSON number within what memgate writes" if "number" in token.why
                         or "digits" in token.why else f"a memgate {what}", found=token.text)
    return doc


def version_tuple(text: str) -> tuple[int, ...] | None:
    """``0.1.0`` → (0, 1, 0); a pre-release or local suffix is ignored; None for what is no version."""
    m = re.match(r"\A(\d{1,9})((?:\.\d{1,9}){0,5})", text)
    if m is None:
        return None
    return tuple(int(p) for p in (m.group(1) + m.group(2)).split("."))


def _newer(version: Any) -> bool:
    if not isinstance(version, str):
        return False
    theirs, ours = version_tuple(version), version_tuple(__version__)
    return theirs is not None and ours is not None and theirs > ours


def _check_layout(doc: dict[str, Any], key: str, known: int, path: Path, what: str, where: str | None = None) -> None:
    """A layout number this memgate does not read: from the future (upgrade) or an unknown old one."""
    record = doc if where is None else doc.get(where)
    if not isinstance(record, dict) or key not in record:
        return
    layout = record[key]
    if layout == known and type(layout) is int:
        return
    column = key if where is None else f"{where}.{key}"
    version = doc.get("memgate_version")
    by = f"memgate {version}" if isinstance(version, str) else "a memgate"
    if isinstance(layout, int) and not isinstance(layout, bool) and layout > known:
        raise InputError(f"{what} layout {layout} (written by {by}) is newer than the layout this memgate "
                         f"{__version__} reads: upgrade memgate to read it", file=path, column=column, expected=f"layout {known}", found=layout)
    raise InputError(f"unknown {what} layout (this memgate {__version__} reads layout {known} only; an older one is "
                     "not read: save it again)", file=path, column=column, expected=f"layout {known}", found=layout)


_SCHEMA_WORDS = {"integer": "an integer", "number": "a number", "string": "a string", "object": "an object",
                 "array": "an array", "boolean": "true or false", "null": "null"}


def _expected(error: Any) -> str:
    """What the schema asks for at the failing value, in words."""
    schema = error.schema if isinstance(error.schema, dict) else {}
    kind = error.validator
    if kind in ("minimum", "maximum", "type") and "minimum" in schema and "maximum" in schema:
        low, high = schema["minimum"], schema["maximum"]
        if schema.get("type") == "integer" and high == 1 << 56:
            return "a byte count from 0 to 2**56 (64 PiB: no device holds more; memgate.model.MAX_BYTES)"
        if schema.get("type") == "integer":
            return f"an integer from {low} to {high}"
        return f"a ratio from {low} to {high}"
    if kind == "type":
        types = [schema["type"]] if isinstance(schema.get("type"), str) else list(schema.get("type", []))
        return " or ".join(_SCHEMA_WORDS.get(t, t) for t in types)
    if kind == "required":
        return f"the key {error.message.split(' ')[0]}"
    if kind == "additionalProperties":
        return "only the keys " + ", ".join(sorted(schema.get("properties", {}))) or "no keys"
    if kind == "const":
        return json.dumps(schema["const"])
    if kind == "pattern":
        return f"text matching {schema['pattern']}"
    if kind == "maxLength":
        return f"at most {schema['maxLength']} characters"
    return "what the schema allows"


def _best_error(errors: list[Any]) -> Any:
    """The error to report: jsonschema's best match, descending into an anyOf (value-or-null) to the
    branch that is not ``null``, so a byte count past the bound says the bound, not 'not null'."""
    import jsonschema

    error = jsonschema.exceptions.best_match(errors)
    while error is not None and error.validator == "anyOf" and error.context:
        branches = [e for e in error.context if not (e.validator == "type" and e.validator_value == "null")]
        error = jsonschema.exceptions.best_match(branches) if branches else error.context[0]
    return error


@functools.cache
def _validator(schema: str) -> Any:
    """A Draft 2020-12 validator of ``schema`` where an integer is an int (1.0 and true are not: no
    memgate writer writes a byte count as a float or a bool)."""
    import jsonschema

    from memgate.schemas import load_schema

    base = jsonschema.Draft202012Validator
    checker = base.TYPE_CHECKER.redefine(
        "integer", lambda _, v: isinstance(v, int) and not isinstance(v, bool)).redefine(
        "number", lambda _, v: isinstance(v, (int, float)) and not isinstance(v, bool))
    return jsonschema.validators.extend(base, type_checker=checker)(load_schema(schema))


def schema_error(doc: Any, schema: str, *, file: str | Path, what: str, at: tuple[Any, ...] = ()) -> InputError | None:
    """The InputError for the first thing in ``doc`` that ``schemas/<schema>.schema.json`` refuses,
    naming its JSON path (``at``: the path of ``doc`` in its file); None when it validates."""
    error = _best_error(list(_validator(schema).iter_errors(doc)))
    if error is None:
        return None
    where = [*at, *error.absolute_path]
    found: object = error.instance
    if error.validator == "required":
        found = "no such key"
    elif error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        found = f"the key {extra[0]!r}" if extra else "other keys"
    elif error.validator == "type" or (error.validator in ("minimum", "maximum") and isinstance(found, float)):
        found = _typed(found)
    message = error.message if error.validator not in ("minimum", "maximum", "type", "required", "anyOf") else (
        "value out of range" if error.validator in ("minimum", "maximum") else
        "a key is missing" if error.validator == "required" else "wrong type")
    return InputError(f"not a memgate {what}: {message}", file=file, column=json_path(where),
                      expected=_expected(error), found=found)


def _typed(value: object) -> str:
    """A JSON value with its type, for a type error: ``the string "12"``, ``the float 1500000000.0``."""
    from memgate.errors import show

    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, dict):
        return f"an object {show(value, 40)}"
    if isinstance(value, list):
        return f"an array {show(value, 40)}"
    if isinstance(value, str):
        return f"the string {show(value, 40)}"
    if isinstance(value, float):
        return f"the float {value!r}"
    return show(value, 60)


def _check_document(doc: Any, path: Path, schema: str, what: str) -> None:
    """The version checks, then the schema; an InputError naming the file and JSON path."""
    if isinstance(doc, dict) and _newer(doc.get("memgate_version")):
        # a newer memgate may write what this one misreads: named as such, whatever the schema says
        raise InputError(f"written by memgate {doc['memgate_version']}, newer than this memgate {__version__}: "
                         f"upgrade memgate to read this {what}", file=path, column="memgate_version",
                         expected=f"a {what} of memgate {__version__} or older", found=doc["memgate_version"])
    error = schema_error(doc, schema, file=path, what=what)
    if error is not None:
        raise error


def load_report(path: str | Path) -> dict[str, Any]:
    """A JSON report (``--memgate-json``, ``memgate inspect --json``) read back, validated against
    schemas/report.schema.json."""
    path = Path(path)
    doc = read_json_document(path, "JSON report")
    _check_document(doc, path, "report", "JSON report")
    return dict(doc)


def load_baseline(path: str | Path) -> dict[str, Any]:
    """A baseline, saved run or JSON report, validated (schemas/baseline.schema.json, report.schema.json),
    as a baseline."""
    path = Path(path)
    return _as_baseline(read_json_document(path, "baseline"), path)


def _is_report(doc: Any) -> bool:
    return isinstance(doc, dict) and "memgate_baseline" not in doc and "memgate_version" in doc \
        and isinstance(doc.get("profiles"), list)


def _as_baseline(doc: Any, path: Path) -> dict[str, Any]:
    if _is_report(doc):
        _check_document(doc, path, "report", "JSON report")
        return baseline_from_entries(doc["profiles"])  # a JSON report works as a baseline too
    if not isinstance(doc, dict) or "memgate_baseline" not in doc:
        raise InputError("not a memgate baseline or JSON report", file=path,
                         expected=f'{{"memgate_baseline": {BASELINE_FORMAT}, "profiles": {{...}}}} or a JSON report',
                         found=f"an object with the keys {', '.join(map(repr, list(doc)[:5]))}"
                         if isinstance(doc, dict) else doc)
    what = "saved run" if "memgate_run" in doc else "baseline"
    if _newer(doc.get("memgate_version")):
        _check_document(doc, path, "baseline", what)  # names the newer memgate
    _check_layout(doc, "memgate_baseline", BASELINE_FORMAT, path, "baseline")
    _check_layout(doc, "layout", RUN_LAYOUT, path, "saved-run", where="memgate_run")
    _check_document(doc, path, "baseline", what)
    return dict(doc)


def load_entries(path: str | Path) -> list[dict[str, Any]]:
    """The profile entries of a JSON report, or of a baseline / saved run (:func:`baseline_entries`), validated."""
    path = Path(path)
    doc = read_json_document(path, "JSON report or baseline")
    if _is_report(doc):
        _check_document(doc, path, "report", "JSON report")
        return list(doc["profiles"])
    return baseline_entries(_as_baseline(doc, path))


def baseline_entries(baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """A baseline's profiles as report-shaped entries (for :func:`diff_entries`), pools included.
    ``key`` is the stored comparability key; ``baseline`` the stored record itself."""
    commit = baseline_commit(baseline)
    return [
        {"rank": str(p.get("rank", key)), "path": p.get("path", ""), "format": p.get("key", {}).get("format"),
         "key": p.get("key", {}), "baseline": p, "baseline_commit": commit,
         "devices": [{"device": d, "metrics": v.get("metrics", {}), "pool_of": v.get("pool_of") or {}}
                     for d, v in p.get("devices", {}).items()]}
        for key, p in baseline["profiles"].items()
    ]


class NotInBaseline(ConfigError, KeyError):
    """No profile of the baseline pairs with this one: the missing-baseline policy applies."""

    def __str__(self) -> str:
        return self.one_line()


class MetricNotInBaseline(ConfigError, KeyError):
    """A compare rule's metric is absent from a baseline saved before memgate measured it.

    A KeyError like a rank missing from the baseline, so the plugin applies its missing-baseline
    policy (skip, warn, fail); a ConfigError for the CLI (``memgate diff --fail``: exit 2).
    """

    def __str__(self) -> str:
        return self.one_line()  # not KeyError's repr of the message


@dataclass(frozen=True)
class Regression:
    rank: str
    metric: str
    base: int | float | None
    value: int | float | None
    allowed: int | float | None
    passed: bool | None
    device: str | None
    message: str
    pool: str | None = None  # per-pool metrics: the pool of the current value
    base_pool: str | None = None  # and of the baseline value, when the baseline names it
    profile: str | None = None  # the current profile's path
    # what grew at the peak on the judged device: {"ops": [...], "owners": [...]}, each item
    # {"name", "base", "current", "delta"} (base None: not among the baseline's named ones)
    attribution: dict[str, list[dict[str, Any]]] | None = None
    baseline_commit: str | None = None  # the git commit the baseline was saved at

    @property
    def detail(self) -> str:
        """Lines to print under the failure line: what grew most at the peak, and the baseline's commit."""
        return "\n".join(map(printable, attribution_lines(self.attribution or {}, self.baseline_commit)))


ATTRIBUTION_TOP = 5
AT_PEAK = {"ops": "op_bytes_at_peak", "owners": "owner_bytes_at_peak"}  # attribution key → metric key


def grown_at_peak(before: dict[str, Any], now: dict[str, Any], top: int | None = ATTRIBUTION_TOP
                  ) -> dict[str, list[dict[str, Any]]]:
    """Per operator and per owner, the names whose bytes live at the peak grew, most growth first
    (ties by name), at most ``top`` each; a kind one side lacks (a baseline saved before memgate
    kept them) is left out, so old baselines give ``{}``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for what, key in AT_PEAK.items():
        a, b = (before.get("metrics") or {}).get(key), (now.get("metrics") or {}).get(key)
        if not isinstance(a, dict) or not isinstance(b, dict):
            continue
        rows = [{"name": name, "base": a.get(name), "current": size, "delta": size - int(a.get(name) or 0)}
                for name, size in b.items() if size > int(a.get(name) or 0)]
        rows.sort(key=lambda r: (-r["delta"], r["name"]))
        out[what] = rows if top is None else rows[:top]
    return out


def attribution_lines(attribution: dict[str, list[dict[str, Any]]], commit: str | None = None,
                      indent: str = "") -> list[str]:
    """``grew at the peak: op aten::mm 1.00 GiB -> 1.10 GiB (+102.40 MiB)``, one per name, and the commit."""
    lines = []
    for what, word in (("ops", "op"), ("owners", "owner")):
        for row in attribution.get(what, []):
            base = "-" if row["base"] is None else format_size(row["base"])
            lines.append(f"{indent}grew at the peak: {word} {row['name']} {base} -> {format_size(row['current'])} "
                         f"(+{format_size(row['delta'])})")
    if commit:
        lines.append(f"{indent}baseline saved at commit {commit}")
    return lines


def _fmt(metric: str, value: float) -> str:
    return format_metric(metric_kind(metric), value)


def _pool_text(now: str | None, then: str | None) -> str:
    if now is None and then is None:
        return ""
    if then is None or then == now:
        return f", pool {now}"
    return f", pool {now or '-'} (baseline pool {then})"


def compare_entry(entry: dict[str, Any], baseline: dict[str, Any], rule: CompareRule) -> Regression:
    """Judge one profile entry against its pair in the baseline under ``rule``; raise on
    incomparable input.

    :class:`NotInBaseline` (a KeyError): no baseline profile pairs with it; :class:`MetricNotInBaseline`:
    the baseline predates the rule's metric; :class:`~memgate.errors.AmbiguousProfiles`: only pids or
    timestamps tell the baseline's profiles apart; ConfigError: the runs are not comparable or the
    metric is measured in neither run on a common device.
    """
    base = baseline_entries(baseline)
    pairing = pair_entries(base, [entry], current_is_whole_run=False)
    if not pairing.pairs:
        raise NotInBaseline(f"rank {entry['rank']} ({entry.get('format')}) has no profile in the baseline to compare "
                            "with", file=entry.get("path"))
    ((b, _),) = pairing.pairs
    return compare_pair(base[b], entry, rule)


def compare_pair(base: dict[str, Any], entry: dict[str, Any], rule: CompareRule) -> Regression:
    """Judge ``entry`` against the baseline profile it pairs with (an entry of
    :func:`baseline_entries`, or of a JSON report)."""
    rank = entry["rank"]
    key_now, key_then = comparable_key(entry), base.get("key") or comparable_key(base)
    mismatched = [k for k in sorted(set(key_now) | set(key_then)) if key_now.get(k) != key_then.get(k)]
    if mismatched:
        details = ", ".join(f"{k}: baseline {key_then.get(k)!r}, now {key_now.get(k)!r}" for k in mismatched)
        raise ConfigError(f"rank {rank}: not comparable with the baseline ({details}); save a new baseline "
                          "for this configuration")
    metric_key = LIMITS[rule.metric][0]
    base_devices = {str(d["device"]): d for d in base.get("devices", [])}
    now_devices = {str(d["device"]): d for d in entry["devices"]}
    common = [(now_devices[now], base_devices[then])
              for then, now in pair_devices(list(base_devices), list(now_devices)) if then is not None and now is not None]
    if common and all(metric_key not in (then.get("metrics") or {}) for _, then in common):
        raise MetricNotInBaseline(f"rank {rank}: the baseline has no {rule.metric} (saved by a memgate that did not "
                                  f"measure it); nothing compared — save a new baseline to compare {rule.metric}")
    worst: tuple[float, dict[str, Any], dict[str, Any], int | float, int | float] | None = None
    for device, then in common:
        value = device["metrics"].get(metric_key)
        then_value = (then.get("metrics") or {}).get(metric_key)
        if value is None or then_value is None:
            continue
        margin = value - rule.allowed(then_value)
        if worst is None or margin > worst[0]:
            worst = (margin, device, then, then_value, value)
    if worst is None:
        why = next((d.get("not_measurable", {}).get(metric_key) for d, _ in common
                    if d.get("not_measurable", {}).get(metric_key)), None)
        raise ConfigError(f"rank {rank}: {rule.metric} is measured in neither run on a common device"
                          + (f" (now: {why})" if why else ""), file=entry.get("path"))
    _, device, then, base_value, value = worst
    allowed = rule.allowed(base_value)
    passed = value <= allowed
    growth = value - base_value
    pct = f" ({growth / base_value * 100:+.1f}%)" if base_value else ""
    change = f"{_signed(metric_kind(rule.metric), growth)}{pct}"
    if passed:
        head = f"{rule.metric} {_fmt(rule.metric, value)} vs baseline {_fmt(rule.metric, base_value)}: {change}"
    else:
        head = f"{rule.metric} {_fmt(rule.metric, value)} exceeds baseline {_fmt(rule.metric, base_value)} by {change.lstrip('+')}"
    pool = (device.get("pool_of") or {}).get(metric_key)
    base_pool = (then.get("pool_of") or {}).get(metric_key)
    message = f"{head}, allowed {rule.describe()} — rank {rank} {device['device']}{_pool_text(pool, base_pool)}"
    return Regression(rank, rule.metric, base_value, value, allowed, passed, device["device"], message, pool, base_pool,
                      profile=entry.get("path"), attribution=grown_at_peak(then, device) or None,
                      baseline_commit=base.get("baseline_commit"))


# ---- diff ---------------------------------------------------------------------------------------


def _metric_rows(before: dict[str, Any], now: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every LIMITS metric of one (rank, device) pair: base, current, delta, unit, and pools."""
    rows: dict[str, dict[str, Any]] = {}
    base_metrics, metrics = before.get("metrics") or {}, now.get("metrics") or {}
    base_pools, pools = before.get("pool_of") or {}, now.get("pool_of") or {}
    for key, kind in LIMITS.values():
        a, b = base_metrics.get(key), metrics.get(key)
        row: dict[str, Any] = {"base": a, "current": b, "delta": (b - a) if a is not None and b is not None else None,
                               "unit": "bytes" if kind == "size" else "ratio"}
        if key in base_pools or key in pools:
            row["base_pool"], row["current_pool"] = base_pools.get(key), pools.get(key)
        if key not in base_metrics:
            row["note"] = "not in the base"  # a baseline or report saved before memgate measured it
        elif key not in metrics:
            row["note"] = "not in the current run"
        rows[key] = row
    return rows


def _device_diff(before: dict[str, Any], dev: dict[str, Any]) -> dict[str, Any]:
    ops_a = before["metrics"].get("op_max_block_bytes") or {}
    ops_b = dev["metrics"].get("op_max_block_bytes") or {}
    grew = sorted(((op, ops_a[op], ops_b[op]) for op in ops_b if op in ops_a and ops_b[op] > ops_a[op]),
                  key=lambda t: (t[1] - t[2], t[0]))
    shrank = sorted(((op, ops_a[op], ops_b[op]) for op in ops_b if op in ops_a and ops_b[op] < ops_a[op]),
                    key=lambda t: (t[2] - t[1], t[0]))
    metrics = _metric_rows(before, dev)
    out = {
        "device": dev["device"],
        "metrics": metrics,
        "ops_grew": [{"op": o, "base": a, "current": b, "delta": b - a} for o, a, b in grew],
        "ops_shrank": [{"op": o, "base": a, "current": b, "delta": b - a} for o, a, b in shrank],
        "ops_new": [{"op": o, "current": ops_b[o]} for o in sorted(set(ops_b) - set(ops_a), key=lambda o: -ops_b[o])],
        "ops_gone": [{"op": o, "base": ops_a[o]} for o in sorted(set(ops_a) - set(ops_b), key=lambda o: -ops_a[o])],
    }
    # what grew at the peak, per operator and per owner (absent when either side predates them)
    out["grew_at_peak"] = grown_at_peak(before, dev, top=None)
    if before["device"] != dev["device"]:
        out["base_device"] = before["device"]
    at_peak_changed = any(k in before["metrics"] and k in dev["metrics"] and before["metrics"][k] != dev["metrics"][k]
                          for k in AT_PEAK.values())
    out["changed"] = at_peak_changed or bool(out["ops_grew"] or out["ops_shrank"] or out["ops_new"] or out["ops_gone"]) or any(
        row["base"] != row["current"] or row.get("base_pool") != row.get("current_pool") for row in metrics.values())
    return out


def diff_entries(base: list[dict[str, Any]], current: list[dict[str, Any]]) -> dict[str, Any]:
    """Metric and per-operator deltas of the profiles and devices that pair (:mod:`memgate.identity`).

    ``ranks``: one item per current profile, in its order (``status`` "new profile" where the base
    has none to pair with); ``missing_profiles``: the base's unpaired ones; ``changed``: whether
    anything differs at all.
    """
    pairing = pair_entries(base, current)
    base_of = {c: b for b, c in pairing.pairs}
    labels, base_labels = profile_labels([str(e["path"]) for e in current]), profile_labels([str(e["path"]) for e in base])
    ranks = []
    for j, entry in enumerate(current):
        item: dict[str, Any] = {"rank": entry["rank"], "profile": entry["path"], "label": labels[j]}
        if j not in base_of:
            ranks.append({**item, "status": "new profile", "devices": []})
            continue
        old = base[base_of[j]]
        item["base_profile"] = old["path"]
        if old.get("baseline_commit"):
            item["base_commit"] = old["baseline_commit"]
        old_devices = {str(d["device"]): d for d in old["devices"]}
        now_devices = {str(d["device"]): d for d in entry["devices"]}
        devices: list[dict[str, Any]] = []
        for then, now in pair_devices(list(old_devices), list(now_devices)):
            if then is None:
                devices.append({"device": now, "status": "new device"})
            elif now is None:
                devices.append({"device": then, "status": "missing device"})
            else:
                devices.append(_device_diff(old_devices[then], now_devices[now]))
        ranks.append({**item, "devices": devices})
    missing = [{"rank": base[i]["rank"], "profile": base[i]["path"], "label": base_labels[i]} for i in pairing.base_only]
    changed = bool(missing) or any(r.get("status") or any(d.get("status") or d["changed"] for d in r["devices"])
                                   for r in ranks)
    return {"ranks": ranks, "missing_ranks": sorted(m["rank"] for m in missing), "missing_profiles": missing,
            "changed": changed}


_KIND_OF_METRIC = {key: (budget_key, kind) for budget_key, (key, kind) in LIMITS.items()}


def diff_metric_line(key: str, row: dict[str, Any]) -> str:
    """``  fragmentation   0.182 ->  0.200  +0.018 (+9.9%)  pool PTA -> GE`` (key: a metric key)."""
    name, kind = _KIND_OF_METRIC[key]

    def show(value: float | None) -> str:
        return "-" if value is None else format_metric(kind, value)

    line = f"  {name:<24} {show(row['base']):>12} -> {show(row['current']):>12}"
    delta = row["delta"]
    if delta is not None:
        line += f"  {_signed(kind, delta)}" + (f" ({delta / row['base'] * 100:+.1f}%)" if row["base"] else "")
    if "current_pool" in row:
        then, now = row["base_pool"], row["current_pool"]
        # a side that names no pool (not measured, or a baseline saved before pools were named) is not a change
        line += f"  pool {then} -> {now}" if then is not None and now is not None and then != now else f"  pool {now or then}"
    if row.get("note"):
        line += f"  ({row['note']})"
    return line


def diff_text(diff: dict[str, Any], top: int = 10) -> list[str]:
    lines = []
    # Where one rank has several profiles, each header also names its profile.
    ranks = [r["rank"] for r in diff["ranks"]] + [m["rank"] for m in diff.get("missing_profiles", [])]
    shared = {r for r in ranks if ranks.count(r) > 1}

    def head(item: dict[str, Any], device: str | None = None) -> str:
        text = f"rank {item['rank']}" + (f" {device}" if device else "")
        return text + (f"  [{item['label']}]" if item["rank"] in shared and item.get("label") else "")

    for rank in diff["ranks"]:
        if rank.get("status"):
            lines.append(f"{head(rank)}: {rank['status']} (not in the base)")
            continue
        for dev in rank["devices"]:
            if dev.get("status"):
                lines.append(f"{head(rank, dev['device'])}: {dev['status']}")
                continue
            lines.append(head(rank, dev["device"]))
            for key, m in dev["metrics"].items():
                if m["base"] is None and m["current"] is None:
                    continue
                lines.append(diff_metric_line(key, m))
            for o in dev["ops_grew"][:top]:
                lines.append(f"  op grew: {o['op']} {format_size(o['base'])} -> {format_size(o['current'])} (+{format_size(o['delta'])})")
            for o in dev["ops_new"][:top]:
                lines.append(f"  new op:  {o['op']} {format_size(o['current'])}")
            for o in dev["ops_gone"][:top]:
                lines.append(f"  gone op: {o['op']} (was {format_size(o['base'])})")
            grew = {what: rows[:ATTRIBUTION_TOP] for what, rows in (dev.get("grew_at_peak") or {}).items()}
            lines.extend(attribution_lines(grew, indent="  "))
        if rank.get("base_commit"):
            lines.append(f"  base saved at commit {rank['base_commit']}")
    for missing in diff.get("missing_profiles", [{"rank": r} for r in diff["missing_ranks"]]):
        lines.append(f"{head(missing)}: missing from the current run")
    if not diff.get("changed", True):
        lines.append(f"no change: {len(diff['ranks'])} profile(s) paired, every metric and operator equal")
    return lines


# ---- suggest ------------------------------------------------------------------------------------

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
NOT_SUGGESTED = {
    # Budgets pass when value <= limit, and the largest free block is no cost: a larger one means
    # the pool can serve a larger request without growing. An upper limit on it fails when the pool
    # gets less fragmented or caches more, i.e. on an improvement or on a change the reserved budgets
    # already judge. What it is evidence of is budgeted by free_block_fragmentation and reserved_at_dump.
    "largest_free_block": "a larger free block is no regression (use free_block_fragmentation, reserved_at_dump)",
}


def _toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes, control characters and bidi overrides escaped (the
    block is printed: it must not redraw or reorder a terminal, :func:`memgate.errors.printable`)."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or ch in BIDI_CONTROLS:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _glob_literal(name: str) -> str:
    """An op name as an op_caps glob that matches exactly that name (``*``, ``?``, ``[`` bracketed)."""
    return "".join(f"[{ch}]" if ch in "*?[" else ch for ch in name)


_INSTANCE = re.compile(r"_[0-9]+\Z")  # cann::trans_TransData_24: the 24th instance of one kernel


def op_globs(ops: dict[str, int]) -> dict[str, int]:
    """Op caps to suggest: instances of one kernel (``cann::trans_TransData_0``, ``_24``) as one glob
    (``cann::trans_TransData_*``), other names as themselves; each with the largest block of every
    op the glob matches, so the cap holds on the profiles it came from."""
    globs = {(_glob_literal(_INSTANCE.sub("", op)) + "_*") if _INSTANCE.search(op) else _glob_literal(op) for op in ops}
    return {glob: max(size for op, size in ops.items() if fnmatch.fnmatchcase(op, glob)) for glob in globs}


OWNER_CAPS_TOP = 10  # owner_caps suggested for at most this many owner globs, the largest at the peak

# An owner's source line, which moves whenever code above it changes: "train.py(19): step" (Kineto's
# Python stacks) and "/src/train.py:19:step" (snapshot frames).
_OWNER_LINE = (re.compile(r"\A(?P<file>.*?\.[A-Za-z0-9_]+)\((?P<line>[0-9]+)\)(?P<rest>: .*)\Z", re.DOTALL),
               re.compile(r"\A(?P<file>.*?\.[A-Za-z0-9_]+):(?P<line>[0-9]+)(?P<rest>:.*)\Z", re.DOTALL))


def owner_glob(owner: str) -> str:
    """An owner as an owner_caps glob without its line number (``train.py(*): step``,
    ``/src/train.py:*:step``), the rest matched literally; other owners as :func:`op_globs` groups
    them. The glob always matches the owner it came from."""
    for pattern in _OWNER_LINE:
        m = pattern.match(owner)
        if m:
            star = "(*)" if pattern is _OWNER_LINE[0] else ":*"
            return _glob_literal(m["file"]) + star + _glob_literal(m["rest"])
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
GROWTH_KEYS = ("step_growth", "leaked")
# Live blocks of the last steps: a leak or the loop's own last activations (a clean loop measures
# some), so not bounded by the cleanest profile; but, as growth, with no floor: 0 B stays 0 B.
NO_FLOOR_KEYS = (*GROWTH_KEYS, "leak_undetermined")
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


@dataclass
class _Suggestion:
    """One budget's suggested keys (values as Python/TOML-neutral literals where they are scalars)."""
    limits: list[tuple[str, str, str]]  # (budget key, literal, comment)
    op_caps: dict[str, str]
    owner_caps: dict[str, str]
    imbalance: tuple[str, str] | None  # (ratio literal, comment)
    remarks: list[str]  # comment lines after the budget


def _suggest_one(entries: list[dict[str, Any]], factor: Decimal, growth: dict[str, GrowthLimit], *,
                 cross_rank: bool) -> _Suggestion:
    worst: dict[str, int | float] = {}
    pool_of: dict[str, str] = {}
    ops: dict[str, int] = {}
    ops_of: list[set[str]] = []  # per profile, the ops it measured (a cap matching none would be an error)
    for entry in entries:
        ops_of.append(set())
        for dev in entry["devices"]:
            for budget_key, (metric_key, _) in LIMITS.items():
                value = dev["metrics"].get(metric_key)
                if not _measured(value):
                    continue
                if budget_key not in worst or value > worst[budget_key]:
                    worst[budget_key] = value
                    pool = (dev.get("pool_of") or {}).get(metric_key)
                    if pool is not None:
                        pool_of[budget_key] = pool
                    else:
                        pool_of.pop(budget_key, None)
            for op, size in (dev["metrics"].get("op_max_block_bytes") or {}).items():
                ops[op] = max(ops.get(op, 0), size)
                ops_of[-1].add(op)
    labels = {profile_label(e) for e in entries}
    out = _Suggestion([], {}, {}, None, [])
    for budget_key, (_, kind) in LIMITS.items():
        if budget_key not in worst:
            continue
        value = worst[budget_key]
        pool = f", pool {pool_of[budget_key]}" if budget_key in pool_of else ""
        measured = f"measured {format_metric(kind, value)}{pool}"
        if budget_key in NOT_SUGGESTED:
            out.remarks.append(f"# {budget_key} not suggested ({measured}): {NOT_SUGGESTED[budget_key]}")
        elif budget_key in growth:
            g = growth[budget_key]
            note = (f"measured {format_size(g.measured)}" if g.profiles == 1 else
                    f"least of {g.profiles} profiles {format_size(g.measured)}") + pool
            if g.measured == 0:
                note += "; no growth measured, none allowed"
            out.limits.append((budget_key, f'"{g.limit}"', note))
            out.remarks.extend(leak_remarks(budget_key, g, labels))
        elif budget_key in NO_FLOOR_KEYS:
            out.limits.append((budget_key, f'"{suggested_size(int(value), factor, floor=0)}"', measured))
        elif kind == "size":
            limit = suggested_size(int(value), factor)
            floor = ("; 1 MiB is the smallest suggested peak or cap (below it, allocator rounding and "
                     "interpreter noise move the value)" if int(Decimal(int(value)) * factor) < SIZE_FLOOR else "")
            out.limits.append((budget_key, f'"{limit}"', measured + floor))
        else:
            ratio = suggested_ratio(float(value), factor)
            if ratio is None:
                out.remarks.append(f"# {budget_key} not suggested ({measured}): no ratio limit below 1 leaves "
                                   "headroom, and a ratio limit of 1 can never fail")
                continue
            note = ""
            if ratio == RATIO_CAP:
                note = "; capped below 1 (a ratio limit of 1 can never fail)"
            elif ratio == RATIO_FLOOR:
                note = f"; {RATIO_FLOOR} is the smallest suggested ratio"
            out.limits.append((budget_key, str(ratio), measured + note))
    common = {glob: size for glob, size in op_globs(ops).items()
              if all(any(fnmatch.fnmatchcase(op, glob) for op in seen) for seen in ops_of)}
    for glob, size in sorted(common.items(), key=lambda kv: (-kv[1], kv[0]))[:10]:
        out.op_caps[glob] = suggested_size(size, factor)
    if ops and not common:
        out.remarks.append("# op_caps not suggested: no operator is common to every profile")
    owner_caps, why = owner_cap_sizes(entries)
    for glob, size in sorted(owner_caps.items(), key=lambda kv: (-kv[1], kv[0]))[:OWNER_CAPS_TOP]:
        out.owner_caps[glob] = suggested_size(size, factor)
    if not owner_caps:
        out.remarks.append(f"# owner_caps not suggested: {why}")
    if cross_rank:
        imbalance, why = rank_imbalance_measured(entries)
        ratio = None if imbalance is None else suggested_ratio(imbalance, factor)
        if imbalance is None:
            out.remarks.append(f"# rank_imbalance not suggested: {why}")
        elif ratio is None:
            out.remarks.append(f"# rank_imbalance not suggested (measured {imbalance:.3f} on peak_allocated): no "
                               "ratio limit below 1 leaves headroom")
        else:
            note = f"; {RATIO_FLOOR} is the smallest suggested ratio" if ratio == RATIO_FLOOR else ""
            out.imbalance = (str(ratio), f"measured {imbalance:.3f} over {len(entries)} profiles{note}")
    unmeasured = [k for k in LIMITS if k not in worst]
    if unmeasured:
        out.remarks.append("# not measured in these profiles: " + ", ".join(unmeasured))
    return out


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
    """
    if form not in FORMS:
        raise ConfigError(f"unknown suggestion form {form!r}", expected="one of " + ", ".join(FORMS))
    factor = 1 + headroom / 100
    if form == "marker":
        return suggest_markers(entries, factor)
    s = _suggest_one(entries, factor, growth_limits(entries, factor), cross_rank=True)
    table = "tool.memgate." if form == "pyproject" else ""
    lines = (["[tool.memgate]", ""] if form == "pyproject" else []) + [f"[[{table}budgets]]", f"name = {_toml_string(name)}"]
    lines += [f"{key} = {literal}  # {comment}" for key, literal, comment in s.limits]
    for key, caps in (("op_caps", s.op_caps), ("owner_caps", s.owner_caps)):
        if caps:
            lines.append(f"{key} = {{ " + ", ".join(f'{_toml_string(g)} = "{size}"' for g, size in caps.items()) + " }")
    if s.imbalance is not None:
        lines.append(f"rank_imbalance = {{ peak_allocated = {s.imbalance[0]} }}  # {s.imbalance[1]}")
    return "\n".join(lines + s.remarks) + "\n"


def suggest_markers(entries: list[dict[str, Any]], factor: Decimal) -> str:
    """``@pytest.mark.memgate(...)`` lines: one per marked test (its node id in a comment above it)
    when the entries carry marked tests (``metadata.test``), else one for all of them. Growth limits
    come from the cleanest profile over all the entries, as in the budget-file forms."""
    growth = growth_limits(entries, factor)
    groups: dict[str, list[dict[str, Any]]] = {}
    for entry in entries:
        test = (entry.get("metadata") or {}).get("test")
        groups.setdefault(str(test) if test else "", []).append(entry)
    if "" in groups and len(groups) > 1:  # profiles of no test beside marked tests: judged with them all
        groups = {"": entries}
    lines: list[str] = []
    for test, group in groups.items():
        s = _suggest_one(group, factor, growth, cross_rank=False)
        args = [f"{key}={literal}" for key, literal, _ in s.limits]
        for key, caps in (("op_caps", s.op_caps), ("owner_caps", s.owner_caps)):
            if caps:
                args.append(f"{key}={{" + ", ".join(f'{_toml_string(g)}: "{size}"' for g, size in caps.items()) + "}")
        if lines:
            lines.append("")
        lines.append(f"# {printable(test)}" if test else f"# {len(group)} profile(s), judged together")
        lines += [f"#   {key}: {comment}" for key, _, comment in s.limits]
        lines += s.remarks
        lines.append("@pytest.mark.memgate(" + ", ".join(args) + ")")
    return "\n".join(lines) + "\n"


def _round_up_size(nbytes: int) -> str:
    """A readable size >= nbytes that parses back exactly: whole MiB below 10 GiB, else 1/4 GiB steps."""
    if nbytes <= 0:
        return "0 B"
    if nbytes < 10 * (1 << 30):
        return f"{-(-nbytes // MIB)} MiB"
    quarters = -(-nbytes // (1 << 28))
    return f"{Decimal(quarters) / 4} GiB" if quarters % 4 else f"{quarters // 4} GiB"

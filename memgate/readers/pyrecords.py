"""Validate many small records (dicts from a pickle or a JSON stream) against a JSON Schema, by column.

The loaders of snapshot pickles and Kineto traces hold their records as Python dicts. Checking
each one with ``jsonschema`` costs a Python call tree per record; here every property is pulled out
as one column and typed by pyarrow in C (``pa.array`` infers int64 / double / string / bool and
fails on a mix), then ``enum``, ``const``, ``minimum``/``maximum`` and ``pattern`` are checked with
pyarrow compute. Only when a column is wrong does a Python scan locate the first bad record, so an
error still names its JSON path (``segments[3].blocks[1].size``) and the value found.

The subset of JSON Schema understood (``tests/test_snapshot.py`` shows it agrees with
``jsonschema`` on the real samples and on broken records): ``type`` (one name or a list),
``properties``, ``required``, ``$ref`` to ``#/$defs/...``, nested ``object`` properties that are
required, ``enum``, ``const``, ``minimum``, ``maximum``, ``exclusiveMinimum``, ``pattern``, and
``allOf`` of ``{"if": {"properties": {K: {"enum": [...]}}}, "then": {"required": [...]}}``.
Differences from ``jsonschema``, on purpose: a float such as ``1.0`` is not an ``integer`` (no
writer produces one, and a float cannot hold a ns timestamp), and a tuple is an ``array`` (pickles
hold tuples).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import repeat
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memgate.errors import InputError, show
from memgate.schemas import re2_pattern

Where = Callable[[int], str]  # record index -> JSON path of the record, e.g. "device_traces[0][12]"

_INT64 = (-(1 << 63), (1 << 63) - 1)


@dataclass(frozen=True)
class _Problem:
    index: int
    path: str
    message: str
    expected: str
    found: str

    def error(self, file: Path) -> InputError:
        return InputError(self.message, file=file, column=self.path, expected=self.expected, found=self.found)


def join(prefix: str, name: str) -> str:
    if not name:
        return prefix
    return f"{prefix}.{name}" if prefix else name


def resolve(prop: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    """Follow a local ``$ref`` (``#/$defs/name``)."""
    while "$ref" in prop:
        ref = str(prop["$ref"])
        if not ref.startswith("#/"):
            raise ValueError(f"only local $ref are supported, got {ref!r}")
        node: Any = root
        for part in ref[2:].split("/"):
            node = node[part]
        prop = node
    return prop


def types_of(prop: Mapping[str, Any]) -> tuple[str, ...]:
    kind = prop.get("type")
    if kind is None:  # {"const": "i"} alone: the const's own type
        values = [prop["const"]] if "const" in prop else list(prop.get("enum", ()))
        names = {str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null"}
        return tuple(dict.fromkeys(names[type(v)] for v in values if type(v) in names))
    return (kind,) if isinstance(kind, str) else tuple(kind)


def describe(prop: Mapping[str, Any]) -> str:
    """What a value should be, in words, for the ``expected`` part of an error."""
    if "const" in prop:
        return repr(prop["const"])
    if "enum" in prop:
        return "one of " + ", ".join(repr(v) for v in prop["enum"])
    names = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
             "array": "an array", "object": "an object", "null": "null"}
    text = " or ".join(names.get(t, t) for t in types_of(prop)) or "a value"
    bounds = []
    if "minimum" in prop:
        bounds.append(f">= {prop['minimum']}")
    if "exclusiveMinimum" in prop:
        bounds.append(f"> {prop['exclusiveMinimum']}")
    if "maximum" in prop:
        bounds.append(f"<= {prop['maximum']}")
    if "pattern" in prop:
        bounds.append(f"matching {prop['pattern']}")
    return text + (" " + " and ".join(bounds) if bounds else "")


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", tuple: "an array", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number", Decimal: "a number", type(None): "null"}.get(type(value),
                                                                                             type(value).__name__)


def _found(value: Any) -> str:
    if isinstance(value, (dict, list, tuple)):
        return _type_name(value)
    return show(value)  # repr() of a 5000-digit int raises; show() is bounded and never does


def py_matches(value: Any, kinds: tuple[str, ...]) -> bool:
    """Does one Python value have one of the JSON types ``kinds``? (The slow path, per value.)"""
    t = type(value)
    for kind in kinds:
        if kind == "integer" and t is int and _INT64[0] <= value <= _INT64[1]:
            return True
        if kind == "number" and (t is int or (t in (float, Decimal) and math.isfinite(value))):
            return True
        if (kind == "string" and t is str) or (kind == "boolean" and t is bool) or (kind == "null" and value is None):
            return True
        if (kind == "array" and t in (list, tuple)) or (kind == "object" and t is dict):
            return True
    return False


def _arrow_ok(arr: pa.Array, kinds: tuple[str, ...]) -> bool:
    t = arr.type
    if pa.types.is_null(t):
        return True
    if pa.types.is_integer(t):
        return "integer" in kinds or "number" in kinds
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "number" in kinds
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string" in kinds
    if pa.types.is_boolean(t):
        return "boolean" in kinds
    return False


def _int64_array(values: Sequence[int]) -> pa.Array:
    """Python ints as an Arrow int64 array: through numpy, ~2x faster than Arrow's own conversion;
    Arrow's where one does not fit in int64 (its error or its uint64 column are judged as before)."""
    try:
        return pa.array(np.fromiter(values, dtype=np.int64, count=len(values)))
    except OverflowError:
        return pa.array(values, from_pandas=False)


def int_column(arr: pa.Array | None, n: int, fill: int | None = None) -> np.ndarray:
    """A checked integer column (as :func:`check_records` returns it) as int64 numpy, nulls → ``fill``
    (an absent or all-null column: ``n`` of ``fill``, else 0)."""
    if arr is None or pa.types.is_null(arr.type):
        return np.full(n, 0 if fill is None else fill, dtype=np.int64)
    if fill is not None and arr.null_count:
        arr = pc.fill_null(arr, fill)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)


_NO_NULLS = np.zeros(0, dtype=bool)  # a column without nulls: its mask is never read, only summed


def _first_true(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if len(hits) else None


def _none_mask(values: Sequence[Any]) -> np.ndarray:
    return np.fromiter(map(operator.is_, values, repeat(None)), dtype=bool, count=len(values))


def is_scalar(prop: Mapping[str, Any]) -> bool:
    """Is the property a scalar (a column arrow can type), rather than an array or an object?"""
    kinds = types_of(prop)
    return bool(kinds) and not ({"array", "object"} & set(kinds))


_PY_TYPES = {"integer": (int,), "number": (int, float, Decimal), "string": (str,), "boolean": (bool,),
             "array": (list, tuple), "object": (dict,), "null": (type(None),)}


def check_column(
    values: Sequence[Any],
    prop: Mapping[str, Any],
    *,
    name: str,
    where: Where,
    present: Callable[[], np.ndarray] | None = None,
    required: bool = False,
) -> tuple[pa.Array | None, _Problem | None]:
    """Type and constrain one column; return its arrow array (None when not scalar) and its first problem.

    ``present()`` is the mask of records that have the key at all (to tell a missing key from a null);
    computed only when the column has nulls it does not allow.
    """
    arr, problem, _ = _check_column(values, prop, name=name, where=where, present=present, required=required)
    return arr, problem


def _check_column(
    values: Sequence[Any],
    prop: Mapping[str, Any],
    *,
    name: str,
    where: Where,
    present: Callable[[], np.ndarray] | None = None,
    required: bool = False,
    types: set[type] | None = None,
) -> tuple[pa.Array | None, _Problem | None, int | None]:
    """:func:`check_column`, and how many values are null (None where it did not count them).
    ``types``: the set of the values' types, where the caller has it already (:func:`gather_columns`)."""
    kinds = types_of(prop)
    scalar = is_scalar(prop)
    problems: list[_Problem] = []

    def problem(i: int, message: str) -> None:
        problems.append(_Problem(i, join(where(i), name), message, describe(prop), _found(values[i])))

    arr: pa.Array | None = None
    wrong_type = False
    if kinds == ("string",) and "enum" in prop and not {"const", "pattern"} & prop.keys() and len(values):
        arr = _enum_strings(values, prop["enum"])
        if arr is not None:  # every value is one of the names: nothing else to check
            return arr, None, 0
    if scalar:
        # pyarrow's type inference recurses into nested lists (a value nested a million deep kills the
        # process): a column holding any container is wrong already and goes to the Python scan.
        types = set(map(type, values)) if types is None else types
        holds_container = any(issubclass(t, (list, tuple, dict)) for t in types)
        try:
            arr = None if holds_container else _int64_array(values) if types == {int} else pa.array(values, from_pandas=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            arr = None
        except UnicodeEncodeError:  # a lone surrogate (a pickle's or a JSON escape's): no text anything can write
            bad = _first_untextual(values)
            if bad is not None:
                wrong_type = True
                problem(bad, "a string that is not valid Unicode (a lone surrogate)")
            arr = None
        if arr is None or not _arrow_ok(arr, kinds):
            allowed = (*kinds, "null")
            bad = next((i for i, v in enumerate(values) if not py_matches(v, allowed)), None)
            if bad is not None:
                wrong_type = True
                problem(bad, "wrong type")
                _py_constraints(values[:bad], prop, problem)  # a value before it may break a bound
            arr = None  # e.g. ints mixed with Decimals in a number column: valid, but not one arrow type
        # the mask only where there are nulls (most columns have none: no pass over them)
        nulls = (_NO_NULLS if not arr.null_count else np.asarray(arr.is_null())) if arr is not None \
            else _none_mask(values)
    elif kinds:
        # Arrays / objects: the set of Python types present, gathered in C; a scan only when one is wrong.
        allowed = (*kinds, "null")
        ok_types = {t for kind in allowed for t in _PY_TYPES.get(kind, ())}
        found = set(map(type, values)) if types is None else types
        if not found <= ok_types:
            bad = next((i for i, v in enumerate(values) if not py_matches(v, allowed)), None)
            if bad is not None:
                problem(bad, "wrong type")
        nulls = _none_mask(values) if type(None) in found else _NO_NULLS
    else:
        nulls = _NO_NULLS
    null_count = int(nulls.sum()) if kinds else None  # untyped: None values never looked for

    if null_count and "null" not in kinds:
        null_problem = _null_problem(nulls, present() if present is not None else None, required, prop,
                                     name=name, where=where)
        problems.extend([null_problem] if null_problem is not None else [])
    if scalar and not wrong_type:  # bounds too when a null is wrong: the first bad record is reported
        if arr is not None and len(arr) and arr.null_count < len(arr):
            try:
                _constraints(arr, prop, problem)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # e.g. 0E-20 vs an int bound: precision 39
                _py_constraints(values, prop, problem)
        elif arr is None:  # valid types that share no arrow type (ints with Decimals and floats): per value
            _py_constraints(values, prop, problem)
    first = min(problems, key=lambda p: p.index) if problems else None
    return (arr if scalar else None), first, null_count


def _null_problem(nulls: np.ndarray, has: np.ndarray | None, required: bool, prop: Mapping[str, Any], *, name: str,
                  where: Where) -> _Problem | None:
    """The first null a column does not allow: a null value, or a required key missing (``has``: the
    records that have the key; None: all of them)."""
    has = np.ones(len(nulls), dtype=bool) if has is None else has
    null_value = _first_true(nulls & has)
    missing = _first_true(nulls & ~has) if required else None
    if null_value is not None and (missing is None or null_value < missing):
        return _Problem(null_value, join(where(null_value), name), "null value", describe(prop), "null")
    if missing is not None:
        return _Problem(missing, where(missing) or "(top level)", f"missing key {name!r}",
                        f"an object with {name!r}", "no such key")
    return None


# A bound of the schema: its key, the test of a value that breaks it, the message.
_BOUNDS = (("minimum", np.less, "value too small"), ("exclusiveMinimum", np.less_equal, "value too small"),
           ("maximum", np.greater, "value too large"))
_ARROW_TESTS = {np.less: pc.less, np.less_equal: pc.less_equal, np.greater: pc.greater}


def _first_untextual(values: Sequence[Any]) -> int | None:
    """The index of the first string that UTF-8 cannot encode (a lone surrogate), if any."""
    for i, value in enumerate(values):
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return i
    return None


def _enum_strings(values: Sequence[Any], enum: Sequence[Any]) -> pa.Array | None:
    """A column of one of ``enum``'s strings (an action, a state) as a string array, where every value
    is one of them: each looked up once in a dict (one pass, no type pass), the array taken from the
    names. None where a value is anything else (the general checks then say what)."""
    names = [v for v in enum if type(v) is str]
    index = {name: i for i, name in enumerate(names)}
    try:
        codes = np.fromiter(map(index.__getitem__, values), dtype=np.int32, count=len(values))
    except (KeyError, TypeError):  # another string, None, a number (True is no key either), a list
        return None
    out: pa.Array = pc.take(pa.array(names, type=pa.string()), pa.array(codes))
    return out


def _constraints(arr: pa.Array, prop: Mapping[str, Any], problem: Callable[[int, str], None]) -> None:
    checks: list[tuple[pa.Array | np.ndarray, str]] = []
    numeric = pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type) or pa.types.is_decimal(arr.type)
    if "const" in prop:
        checks.append((pc.not_equal(arr, pa.scalar(prop["const"])), "value not allowed"))
    if "enum" in prop:
        allowed = [v for v in prop["enum"] if v is not None and not isinstance(v, bool)]
        try:
            value_set = pa.array(allowed, type=arr.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            value_set = pa.array([], type=arr.type)
        checks.append((pc.invert(pc.is_in(arr, value_set=value_set)), "value not allowed"))
    ints = arr.to_numpy() if pa.types.is_int64(arr.type) and not arr.null_count else None  # no copy
    for key, test, message in _BOUNDS:
        if numeric and key in prop:
            bound = prop[key]
            if ints is not None and type(bound) is int and _INT64[0] <= bound <= _INT64[1]:
                checks.append((test(ints, bound), message))  # in numpy, on the same int64 values
            else:
                checks.append((_ARROW_TESTS[test](arr, bound), message))
    if "pattern" in prop and (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        re.compile(prop["pattern"])
        ok = pc.match_substring_regex(arr, re2_pattern(str(prop["pattern"])))
        checks.append((pc.invert(ok), "malformed value"))
    best: tuple[int, str] | None = None
    for mask, message in checks:
        hit = _first_true(mask if isinstance(mask, np.ndarray) else np.asarray(pc.fill_null(mask, False), dtype=bool))
        if hit is not None and (best is None or hit < best[0]):
            best = (hit, message)
    if best is not None:
        problem(*best)


def _py_constraints(values: Sequence[Any], prop: Mapping[str, Any], problem: Callable[[int, str], None]) -> None:
    pattern = re.compile(prop["pattern"]) if "pattern" in prop else None
    for i, v in enumerate(values):
        if v is None:
            continue
        numeric = type(v) in (int, float, Decimal)
        if ("const" in prop and v != prop["const"]) or ("enum" in prop and v not in prop["enum"]):
            problem(i, "value not allowed")
        elif numeric and (("minimum" in prop and v < prop["minimum"])
                          or ("exclusiveMinimum" in prop and v <= prop["exclusiveMinimum"])):
            problem(i, "value too small")
        elif numeric and "maximum" in prop and v > prop["maximum"]:
            problem(i, "value too large")
        elif pattern is not None and type(v) is str and not pattern.search(v):
            problem(i, "malformed value")
        else:
            continue
        return


def gather(records: Sequence[dict[str, Any]], key: str) -> list[Any]:
    """Each record's value of ``key``, None where a record has none: one C-level pass (itemgetter's,
    ~1.5x faster than dict.get's, which takes over where a record lacks the key)."""
    try:
        return list(map(operator.itemgetter(key), records))
    except KeyError:
        return list(map(dict.get, records, repeat(key)))


_CHUNK = 4096  # records per step of gather_columns: their tuples stay in cache while split into columns


@dataclass(frozen=True)
class Gathered:
    """Columns of records, as :func:`gather_columns` reads them."""

    columns: list[list[Any]]  # per name, each record's value (None where it has none)
    held: int  # how many keys the records hold in all
    types: list[set[type]]  # per name, the types of its values


def gather_columns(records: Sequence[Any], names: Sequence[str]) -> Gathered | None:
    """:func:`gather` of each of ``names`` (two or more), how many keys the records hold in all, and
    the types each column holds (None if a record is no dict).

    One pass over the records instead of one per name: each chunk of records is read into tuples of
    its values once (the dicts the unpickler scattered are the slow part to reach), and the columns
    are transposed from those compact tuples (``zip``, in C) while they are in cache, as their values'
    types are gathered, the values just reached (a pass of its own would reach each of them again:
    ~25 ms per 1M). ~45 % less time than a gather and a pass of types per name for a snapshot's trace
    entries. A chunk where some record lacks a name is gathered name by name, as :func:`gather` does
    (None where absent).
    """
    columns: list[list[Any]] = [[] for _ in names]
    types: list[set[type]] = [set() for _ in names]
    row_of = operator.itemgetter(*names)
    held = 0
    for start in range(0, len(records), _CHUNK):
        chunk = records[start:start + _CHUNK]
        try:
            held += sum(map(dict.__len__, chunk))
        except TypeError:
            return None
        try:
            transposed: Iterable[Sequence[Any]] = zip(*map(row_of, chunk))  # the chunk's rows transposed, in C
        except KeyError:
            transposed = [list(map(dict.get, chunk, repeat(name))) for name in names]
        for column, seen, values in zip(columns, types, transposed):
            column.extend(values)
            seen.update(map(type, values))
    return Gathered(columns, held, types)


def check_records(
    records: Sequence[Any],
    schema: Mapping[str, Any],
    *,
    file: Path,
    where: Where,
    root: Mapping[str, Any] | None = None,
    objects: dict[str, list[Any]] | None = None,
) -> dict[str, pa.Array | None]:
    """Validate ``records`` against the object ``schema``; return their scalar columns by (dotted) name.

    Raises InputError at the first bad record (in record order), naming its JSON path. ``objects``:
    for each top-level property named as one of its keys, it receives the checked values as the
    gather read them (one per record, None where absent), so a caller that needs the objects
    themselves (a snapshot's frames lists) does not read a million records again.
    """
    columns: dict[str, pa.Array | None] = {}
    problem = _check_records(records, resolve(schema, root or schema), root or schema, where, columns, "", objects)
    if problem is not None:
        raise problem.error(file)
    return columns


def _check_records(
    records: Sequence[Any],
    schema: Mapping[str, Any],
    root: Mapping[str, Any],
    where: Where,
    columns: dict[str, pa.Array | None],
    prefix: str,
    objects: dict[str, list[Any]] | None = None,
) -> _Problem | None:
    """:func:`check_records` of one level of objects (``prefix``: the path of the nested property
    they are, their columns named under it); the first bad record's problem, or None."""
    n = len(records)
    required = set(schema.get("required", ()))
    properties = {name: resolve(raw, root) for name, raw in schema.get("properties", {}).items()}
    head = records[0] if n and isinstance(records[0], dict) else {}
    # Read first: the required properties and those the first record has. The others are in no record
    # of most files; that is proved without a pass over every record's keys when the first record has
    # only properties of the schema and each key of every record is one read with a value (the counts agree).
    later = [name for name in properties if n and name not in required and name not in head]
    first_read = [name for name in properties if name not in later]
    first_values, keys_held = _first_columns(records, first_read)
    if keys_held is None:
        return _first_non_object(records, schema, root, where, prefix)
    prove_absent = bool(later) and all(k in properties for k in head)
    held = 0  # non-null values in the columns read (each one key of one record)
    problems: list[_Problem] = []
    read: dict[str, pa.Array | None] = {}

    def check(name: str, prop: Mapping[str, Any], values: list[Any], types: set[type] | None = None) -> int | None:
        def present(key: str = name) -> np.ndarray:
            return np.fromiter(map(operator.contains, records, repeat(key)), dtype=bool, count=n)

        def inner(i: int, key: str = name) -> str:
            return join(where(i), key)

        arr, found, nulls = _check_column(values, prop, name=name, where=where, required=name in required,
                                          present=present, types=types)
        if found is not None:
            problems.append(found)
            return None
        read[prefix + name] = arr
        if objects is not None and not prefix and name in objects:
            objects[name] = values
        if "object" in types_of(prop) and "properties" in prop and name in required:
            nested = _check_records(values, prop, root, inner, read, f"{prefix}{name}.")
            if nested is not None:
                problems.append(nested)
        return nulls

    for name, prop in properties.items():
        if name in later:
            continue
        values, types = first_values.pop(name) if name in first_values else (gather(records, name), None)
        nulls = check(name, prop, values, types)
        if prove_absent and not problems:
            held += n - (nulls if nulls is not None else values.count(None))
    if later:
        absent = prove_absent and not problems and held == keys_held
        keys: set[Any] = set() if absent else set().union(*records)  # every key of every record
        for name in later:
            prop = properties[name]
            if name not in keys:
                # In no record (most optional keys of most files): the all-null column a gather would give.
                read[prefix + name] = pa.nulls(n) if is_scalar(prop) else None
                if objects is not None and not prefix and name in objects:
                    objects[name] = [None] * n
                continue
            check(name, prop, gather(records, name))
    # in the schema's order of properties (then their nested columns), as a single pass would give them
    for name in properties:
        for key in [k for k in read if k == prefix + name or k.startswith(f"{prefix}{name}.")]:
            columns[key] = read.pop(key)
    if problems:
        return min(problems, key=lambda p: p.index)
    clauses = (_check_if_then(records, clause, where, columns, prefix) for clause in schema.get("allOf", ()))
    return min((found for found in clauses if found is not None), key=lambda p: p.index, default=None)


def _first_columns(records: Sequence[Any], names: list[str],
                   ) -> tuple[dict[str, tuple[list[Any], set[type]]], int | None]:
    """The columns ``names`` with their types (one :func:`gather_columns` pass where there are several;
    else none yet), and how many keys the records hold in all: None where a record is not an object."""
    gathered = gather_columns(records, names) if len(names) > 1 else None
    if gathered is not None:
        return dict(zip(names, zip(gathered.columns, gathered.types))), gathered.held
    try:
        return {}, sum(map(dict.__len__, records))
    except TypeError:
        return {}, None


def _first_non_object(records: Sequence[Any], schema: Mapping[str, Any], root: Mapping[str, Any], where: Where,
                      prefix: str) -> _Problem | None:
    """The problem of the first record that is not an object, or of a record before it (the first bad
    record is the one reported)."""
    bad = next(i for i, r in enumerate(records) if not isinstance(r, dict))
    before = _check_records(records[:bad], schema, root, where, {}, prefix) if bad else None
    return before or _Problem(bad, where(bad) or "(top level)", "expected an object", "an object", _found(records[bad]))


def _check_if_then(records: Sequence[dict[str, Any]], clause: Mapping[str, Any], where: Where,
                   columns: Mapping[str, pa.Array | None], prefix: str) -> _Problem | None:
    """``if {K: enum}`` then ``required``, on the typed columns (K and the required keys are properties)."""
    condition = clause.get("if", {}).get("properties", {})
    needed = clause.get("then", {}).get("required", ())
    if len(condition) != 1 or not needed:
        raise ValueError(f"unsupported allOf clause: {clause!r}")
    (key, test), = condition.items()
    allowed = list(test.get("enum", [test.get("const")]))
    selector = columns.get(prefix + key)
    if selector is None or pa.types.is_null(selector.type) or not len(records):
        return None
    held = [columns.get(prefix + name) for name in needed]
    if all(column is not None and not column.null_count for column in held):  # every record has them all
        return None
    applies = np.asarray(pc.fill_null(pc.is_in(selector, value_set=pa.array(allowed, type=selector.type)), False),
                         dtype=bool)
    best: _Problem | None = None
    for name in needed:
        column = columns.get(prefix + name)
        absent = np.asarray(column.is_null(), dtype=bool) if column is not None else np.ones(len(records), bool)
        hit = _first_true(applies & absent)
        if hit is not None and (best is None or hit < best.index):
            best = _Problem(hit, where(hit), f"missing key {name!r} (required when {key} is {records[hit][key]!r})",
                            f"an object with {name!r}", "no such key" if name not in records[hit] else "null")
    return best

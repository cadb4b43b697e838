"""Reading memgate's own JSON documents back: JSON reports, baselines and saved runs. Untrusted input.

They come back from CI artifact storage, caches and other branches: each is validated against its
schema (schemas/report.schema.json, schemas/baseline.schema.json) before any number of it is used,
and every refusal is one InputError naming the file and the JSON path, as a bad profile's is.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

from memgate import __version__
from memgate.baselines import (
    BASELINE_FORMAT,
    RUN_LAYOUT,
    baseline_entries,
    baseline_from_entries,
    respelled_baseline,
    respelled_entries,
)
from memgate.errors import InputError, show


def looks_like_memgate_json(path: Path) -> bool:
    """A JSON report or baseline written by memgate (they start with their version key)."""
    if not path.is_file() or path.suffix != ".json":
        return False
    with open(path, "rb") as fh:
        head = fh.read(256).lstrip()
    return head.startswith(b"{") and (b'"memgate_version"' in head or b'"memgate_baseline"' in head)


MAX_DOCUMENT_BYTES = 256 << 20  # a report of thousands of ranks is a few MB
MAX_NUMBER_DIGITS = 40  # 2**63 has 19 digits; a writer never writes a longer number
_KEY_CHARS = 40  # of a key or version shown in a message
_MESSAGE_CHARS = 160  # a schema message longer than this repeats a value: the value is shown bounded instead
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
        elif len(str(part)) > _KEY_CHARS:  # a key of any length may be a hostile document's: shown bounded
            out += "[" + show(str(part), _KEY_CHARS) + "]"
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
        if path.is_symlink():  # a dangling link: the file it names is gone
            raise InputError(f"{what} file is a symbolic link to {show(os.readlink(path), 4096)}, which does not exist",
                             file=path) from None
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
                    shown = show(key, _KEY_CHARS)
                    obj[key] = _Refused(shown, f"the key {shown} twice in one object (no memgate writer repeats one)")
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


def _version_text(version: str) -> str:
    """A ``memgate_version`` as a message shows it: a version, or its start (the text is the file's)."""
    return version if len(version) <= _KEY_CHARS else show(version, _KEY_CHARS)


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
    by = f"memgate {_version_text(version)}" if isinstance(version, str) else "a memgate"
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
    if len(message) > _MESSAGE_CHARS:  # jsonschema's message repeats the value whole: it is shown bounded as found
        message = f"fails the schema's {error.validator!r} check"
    return InputError(f"not a memgate {what}: {message}", file=file, column=json_path(where),
                      expected=_expected(error), found=found)


def _typed(value: object) -> str:
    """A JSON value with its type, for a type error: ``the string "12"``, ``the float 1500000000.0``."""

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
        raise InputError(f"written by memgate {_version_text(doc['memgate_version'])}, newer than this memgate "
                         f"{__version__}: "
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
        return baseline_from_entries(respelled_entries(doc["profiles"]))  # a JSON report works as a baseline too
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
    return respelled_baseline(dict(doc))  # owners written in an older spelling compare with today's


def load_entries(path: str | Path) -> list[dict[str, Any]]:
    """The profile entries of a JSON report, or of a baseline / saved run (:func:`baseline_entries`), validated."""
    path = Path(path)
    doc = read_json_document(path, "JSON report or baseline")
    if _is_report(doc):
        _check_document(doc, path, "report", "JSON report")
        return respelled_entries(list(doc["profiles"]))
    return baseline_entries(_as_baseline(doc, path))

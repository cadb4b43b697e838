"""The ``traceEvents`` array of a Chrome trace (a Kineto / torch.profiler trace), streamed in batches.

``*.json`` or ``*.json.gz``, never loaded whole (gzip is decompressed as a stream, capped on its
inflated bytes: :class:`memgate.readers.limits.InflateCap`). Two readers read the same events:

- the json module (C) parses the array a chunk of bytes at a time (:func:`json_batches`); memory
  stays a small multiple of one chunk, not of the file (a 1 GB trace: ~0.5 GB peak, where
  orjson.loads peaks at 6.5 GB). Numbers with a fraction are kept as their text
  (:class:`memgate.readers.jsonstream.NumberText`; :func:`as_decimal` gives ijson's Decimal);
- a file that reader cannot vouch for (a syntax error, a limit, a surrogate escape, a key repeated
  with another value: :class:`Unproven`) is read again event by event with ijson
  (:func:`ijson_batches`), which names the first error with its element and line. Both readers accept
  the same files and read them to the same events (tests/test_traceevents.py).

One writer defect is tolerated: torch (2.13, ``with_stack=True``) can write a ``"name": "..."`` line
whose text holds raw quotes; after a syntax error, and only if such a line comes before it, the file
is streamed again through :class:`memgate.readers.jsonstream.NameRepair`, which reads that name as
its text (:func:`read_events` returns that stream, which counts the lines it repaired). Valid files
never take that path. What the events mean is the loader's (:mod:`memgate.loaders.kineto.kineto`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from functools import partial
from itertools import takewhile
from operator import ne
from pathlib import Path
from typing import Any, TypeVar

import ijson

from memgate.errors import InputError, show
from memgate.readers import limits
from memgate.readers.jsonstream import (
    JSON_WHITESPACE,
    DuplicateKey,
    GuardedReader,
    JsonLimitError,
    NameRepair,
    NumberText,
    Readable,
    Shown,
    duplicate_key_error,
    first_conflict,
    guard,
    not_utf8,
    same_json,
    syntax_error,
    unique_keys,
    unique_pairs,
)
from memgate.readers.memory import collector_paused

HEAD_BYTES = 1 << 16
Events = list[dict[str, Any]]  # one batch of trace events
_T = TypeVar("_T")


def read_head(path: Path, size: int = HEAD_BYTES) -> bytes:
    """The first ``size`` bytes of the file (decompressed), for a claim or the trace's header."""
    with open_trace(path, capped=False) as fh:
        return fh.read(size)


@contextmanager
def open_trace(path: Path, *, capped: bool = True, repair: bool = False) -> Iterator[Readable]:
    """The file's bytes; a ``.gz`` one decompressed, past the cap on inflated bytes an InputError
    (limits.InflateCap: a few MB of gzip can inflate to tens of GB). ``capped=False``: for a head,
    a read of a few KB. ``repair``: through :class:`NameRepair` (torch's unescaped names escaped)."""
    if path.name.lower().endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            raw: Readable = limits.InflateCap(fh, path) if capped else fh
            yield NameRepair(raw) if repair else raw
    else:
        with open(path, "rb") as fh:
            yield NameRepair(fh) if repair else fh


# ---- streaming ------------------------------------------------------------------------------------

CHUNK_BYTES = 8 << 20  # bytes the json reader parses at once (~60 MB of Python objects, freed per chunk)
_PENDING_MAX = 64 << 20  # bytes without a complete event (a huge event or tail): left to ijson, which streams
_IJSON_BATCH = 8192  # events per batch from the ijson reader
_TAIL = 64 << 10  # where the last cut is looked for first
_WS = rb"[ \t\n\r]*"  # JSON whitespace
_EVENTS_KEY = re.compile(rb'"traceEvents"' + _WS + rb":" + _WS + rb"\[")
_CUT = re.compile(rb"\}" + _WS + rb"," + _WS + rb"(?=\{)")  # between two events (or inside a string)
_ARRAY_START = re.compile(r"\[" + _WS.decode())
_NEXT_EVENT = re.compile(_WS.decode() + r"," + _WS.decode() + r"(?=\{)")
_ARRAY_END = re.compile(_WS.decode() + r"\]")
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


class Unproven(Exception):
    """The json reader cannot vouch for the file: the ijson reader reads it (and names its first error)."""


class _BadSyntax(Exception):
    """A syntax error of the ijson reader (``error``), met ``offset`` bytes into the file: read_events()
    reads the file again with torch's unescaped names repaired if one comes before that."""

    def __init__(self, error: InputError, offset: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.offset = offset


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # json takes NaN and Infinity; RFC 8259 and ijson do not


# A JSON number with a fraction or exponent, as the json reader keeps it: its text (NumberText). ijson
# reads one as a ``Decimal``. Text is cheaper to build, and Arrow turns a column of it into exact ns 7x
# faster than a column of Decimals (memgate.loaders.kineto.kineto_events.plain_us_ns); any other use takes
# :func:`as_decimal`, the Decimal, so both readers' events check and fail alike.
# Each object through unique_pairs: a key repeated with another value raises DuplicateKey, and the
# ijson reader names it (about +10 % on a whole load, measured on the benchmark trace).
_DECODER = json.JSONDecoder(parse_float=NumberText, parse_constant=_no_constant, object_pairs_hook=unique_pairs)


def as_decimal(value: Any) -> Any:
    """A value as ijson reads it: the json reader's number text as its Decimal."""
    return Decimal(value) if type(value) is NumberText else value


def with_decimals(event: dict[str, Any]) -> dict[str, Any]:
    """The event (its top level and args, what the schema checks) with ijson's types."""
    out = {key: as_decimal(value) for key, value in event.items()}
    if type(out.get("args")) is dict:
        out["args"] = {key: as_decimal(value) for key, value in out["args"].items()}
    return out


def json_batches(reader: GuardedReader, members: dict[str, Any] | None = None) -> Iterator[Events]:
    """The traceEvents array as lists of events, one list per chunk of bytes parsed by the json module;
    ``members`` receives the top-level members outside it (before and after), once the array is read.

    Anything this reader does not vouch for (a syntax error, a limit of the reader or of rows, a
    surrogate escape, an event that is not an object, an event over 64 MiB, a key repeated with
    another value) raises Unproven: the json and ijson readers accept the same files and read them
    to the same events.
    """
    max_rows = limits.current().max_rows
    events = 0
    try:
        for batch in _json_chunks(reader, {} if members is None else members):
            events += len(batch)
            if events > max_rows:
                raise Unproven("too many events")  # ijson's reader names the event
            yield batch
    except (ValueError, RecursionError, EOFError, OSError, zlib.error, JsonLimitError, DuplicateKey) as exc:
        raise Unproven(str(exc)) from exc


def _json_chunks(reader: GuardedReader, members: dict[str, Any]) -> Iterator[Events]:
    """Parse the array a chunk at a time: the complete events of the bytes read so far, the rest kept;
    then the members around the array into ``members``."""
    rest, head = _after_events_key(reader)
    buf = bytearray(b"[") + rest  # the pending bytes, always after a '['
    in_tail = False  # the array has ended: the rest closes the document
    while chunk := reader.read(CHUNK_BYTES):
        if _droppable(buf, reader):
            continue
        buf += chunk
        taken = None if in_tail else _leading_events(buf)
        in_tail = in_tail or taken is None
        if taken is not None and taken[1]:
            buf[taken[1] - 1] = ord("[")  # in place of the separator's last byte
            del buf[: taken[1] - 1]
            yield taken[0]
        if len(buf) > _PENDING_MAX:
            raise Unproven("no complete event in 64 MiB")
    events, tail = _last_events(buf, head)
    members.update((key, value) for key, value in {**head, **tail}.items() if _kept_member(key, value))
    yield events


def _leading_events(buf: bytearray) -> tuple[list[dict[str, Any]], int] | None:
    """The complete events at the start of ``buf`` and where the next one starts (0: none yet), or
    None when the array ends in ``buf`` (the rest is the document's tail).

    One parse up to the last ``}`` followed by ``,`` and ``{``: a cut inside a string or inside an
    event leaves ``[chunk]`` unparseable, so a parse that succeeds proves its cut. Should it fail,
    the events are taken one by one.
    """
    cut = _last_cut(buf)
    if cut is not None:
        try:
            events = _events(buf, cut[0])
        except ValueError:
            return _events_one_by_one(buf)
        return None if events is None else (events, cut[1])
    return _events_one_by_one(buf)


def _events_one_by_one(buf: bytearray) -> tuple[list[dict[str, Any]], int] | None:
    """The slow way: each event parsed alone, up to one that is cut off (or malformed: ijson's reader
    will name it)."""
    text = _text(buf, buf.rfind(b"}") + 1)  # ('}' never ends inside a UTF-8 character)
    events = []
    taken = 0
    separator = _ARRAY_START.match(text)
    while separator is not None:
        try:
            event, end = _DECODER.raw_decode(text, separator.end())
        except ValueError:
            break
        if _ARRAY_END.match(text, end):
            return None
        separator = _NEXT_EVENT.match(text, end)
        if separator is not None:
            events.append(event)
            taken = separator.end()
    return _objects(events), len(text[:taken].encode("utf-8"))


def _droppable(pending: bytearray, reader: GuardedReader) -> bool:
    """Can the chunk the reader just read be left out of the bytes parsed without changing what they
    parse to? Whitespace between tokens, after one that cannot run on into the next token (a number or a literal
    could: ``1`` and ``2`` would read as ``12``); the whitespace ``pending`` ends with then goes too. So
    a trace padded with gigabytes of whitespace is decided at the inflater's speed, not piled up until
    the 64 MiB of pending bytes hand it to ijson. The GuardedReader has scanned it all the same."""
    if not reader.last_blank:
        return False
    last = _last_token_byte(pending)
    if last not in _CLOSED_BEFORE:
        return False
    del pending[pending.rindex(last) + 1 if last else 0:]
    return True


def _last_token_byte(pending: bytes | bytearray) -> bytes:
    """The last byte of ``pending`` that is not whitespace (b"" for none), found in windows from the end
    that grow fourfold: time in the whitespace that ends it, not in its length."""
    size = 64
    while True:
        tail = pending[-size:].rstrip(JSON_WHITESPACE)
        if tail or size >= len(pending):
            return bytes(tail[-1:])
        size *= 4


_CLOSED_BEFORE = (b"", b"[", b"{", b",", b":", b'"', b"}", b"]")  # nothing yet, or a byte no token runs on from


def _after_events_key(reader: GuardedReader) -> tuple[bytes, dict[str, Any]]:
    """Read past the ``[`` that opens the top-level ``traceEvents``; return the bytes after it and the
    top-level members before it."""
    head = bytearray()
    while (key := _EVENTS_KEY.search(head)) is None:
        chunk = reader.read(CHUNK_BYTES)
        if not chunk or len(head) > _PENDING_MAX:
            raise Unproven("no traceEvents array")
        if not _droppable(head, reader):
            head += chunk
    opening = head[: key.end()]
    # ``{..., "traceEvents": []}`` parses only if that ``[`` opens the value of a top-level key
    members = _DECODER.decode(_text(opening + b"]}")) if opening.count(b'"traceEvents"') == 1 else None
    if type(members) is not dict:
        raise Unproven("traceEvents is not the top-level array")
    return bytes(head[key.end():]), members


def _last_cut(buf: bytes | bytearray) -> tuple[int, int] | None:
    """(end of this chunk, start of the next) at the last ``}`` followed by ``,`` and ``{``."""
    for start in (max(len(buf) - _TAIL, 0), 0):
        last = deque(_CUT.finditer(buf, start), maxlen=1)
        if last:
            return last[0].start() + 1, last[0].end()
    return None


def _text(data: bytes | bytearray, end: int | None = None) -> str:
    """``data[:end]`` as text (without copying the bytes first)."""
    end = len(data) if end is None else end
    if data.find(b"\\", 0, end) >= 0 and _SURROGATE.search(data, 0, end):  # memchr first: escapes are rare
        raise Unproven("a surrogate escape")  # json keeps a lone one as is, ijson reads it as "?"
    with memoryview(data)[:end] as view:
        return str(view, "utf-8")


def _events(buf: bytearray, end: int) -> list[dict[str, Any]] | None:
    """The events in ``buf[:end]`` (after its '['); None when the array ends in there (the rest is the tail)."""
    separator = buf[end]
    buf[end] = ord("]")  # for the parse, the list closes in place of the separator's first byte
    try:
        text = _text(buf, end + 1)
    finally:
        buf[end] = separator
    events, stop = _DECODER.raw_decode(text)
    return _objects(events) if stop == len(text) else None


def _last_events(buf: bytearray, head: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The events up to the array's ``]`` (``buf`` starts with '['), and the members after it: the rest
    must close the top-level object, and repeat no key of ``head`` (the members before the array) with
    another value."""
    text = _text(buf)
    events, end = _DECODER.raw_decode(text)
    if '""' in text[end:] or "" in head:
        raise Unproven("an empty key at the top level")  # "" is the tail's placeholder key below
    others = _DECODER.decode('{"": 0' + text[end:])
    if "traceEvents" in others:
        raise Unproven("a second traceEvents key")  # the ijson reader names it
    if any(key in head and not same_json(head[key], value) for key, value in others.items()):
        raise Unproven("a top-level key repeated with another value")
    del others[""]
    return _objects(events), others


def _objects(events: list[Any]) -> list[dict[str, Any]]:
    if not set(map(type, events)) <= {dict}:
        raise Unproven("an event is not an object")  # ijson's reader names it
    return events


def ijson_batches(path: Path, fh: Readable, gz: bool, escaped: bool = False) -> Iterator[Events]:
    """The traceEvents array as lists of events streamed by ijson, the reader that names a file's first error.

    Objects are built as unique_keys() maps, so a key an event repeats with another value is named
    with the event's path once the event is complete; each event and its args are handed on as
    plain dicts. Then a second pass reads and checks the keys outside traceEvents (:func:`_top_level_members`).
    """
    batch: list[dict[str, Any]] = []
    position = [-1]  # the index of the last event read (for the errors of ijson_errors)
    keys, seen = unique_keys()
    max_rows = limits.current().max_rows
    reader = guard(fh, path)
    with ijson_errors(path, gz, lambda: f"traceEvents[{position[0] + 1}]", "traceEvents.item",
                       lambda: position[0] + 1, syntax=reader, escaped=escaped):
        for index, event in enumerate(ijson.items(reader, "traceEvents.item", map_type=keys)):
            position[0] = index
            if index >= max_rows:
                limits.check_rows(path, index + 1, what="trace events", column=f"traceEvents[{index}]")
            if not isinstance(event, dict):
                raise InputError("trace event is not an object", file=path, column=f"traceEvents[{index}]",
                                 expected="an object", found=type(event).__name__)
            if seen and (conflict := first_conflict(seen, event, f"traceEvents[{index}]", path)) is not None:
                raise conflict
            event = dict(event)
            if isinstance(args := event.get("args"), dict):
                event["args"] = dict(args)
            batch.append(event)
            if len(batch) == _IJSON_BATCH:
                yield batch
                batch = []
    yield batch


@contextmanager
def ijson_errors(path: Path, gz: bool, where: Callable[[], str], prefix: str, element: Callable[[], int], *,
                  syntax: GuardedReader | None = None, escaped: bool = False) -> Iterator[None]:
    """ijson's and the stream's exceptions as InputErrors at ``where()`` (element ``element()`` under ``prefix``).

    ``syntax``: the reader ijson reads; a syntax error is raised as a _BadSyntax at its offset.
    ``escaped``: the file is read through NameRepair (an error is located in the repaired text).
    """
    try:
        yield
    except JsonLimitError as exc:
        raise exc.located(path, where()) from None
    except ijson.JSONError as exc:
        if gz:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            error = InputError(f"invalid JSON: {reason}", file=path, column=where())
        else:
            error = syntax_error(path, exc, element(), prefix=prefix, escaped=escaped)
        if syntax is not None:
            raise _BadSyntax(error, syntax.offset) from None
        raise error from None
    except UnicodeDecodeError:
        raise not_utf8(path, where()) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"corrupt or truncated gzip stream: {exc}", file=path, column=where(),
                         expected="a complete .json.gz") from None
    except RecursionError:
        raise InputError("JSON nested too deeply", file=path) from None


_EVENTS_END = ("traceEvents", "end_array", None)  # ijson.parse's event at the end of the top-level array


# The top-level members outside traceEvents that are kept whole (a writer's header, before or after the array:
# Kineto's deviceProperties and distributedInfo); of the others, only the scalars (a member may be huge).
HEADER_OBJECTS = ("deviceProperties", "distributedInfo")
_HEADER_EVENTS_MAX = 1 << 20  # ijson events one kept member may take: a real header takes a few hundred


def _kept_member(key: str, value: Any) -> bool:
    return key in HEADER_OBJECTS or (key != "traceEvents" and not isinstance(value, (dict, list)))


def _top_level_members(path: Path, gz: bool, repair: bool = False) -> dict[str, Any]:
    """The top-level members outside traceEvents the json reader gives too (:data:`HEADER_OBJECTS` and
    the scalars, before or after the array); InputError for a key repeated with another value outside
    traceEvents: in the top-level object (a second traceEvents array included) or in an object among
    its other members.

    The ijson reader's second pass: ijson.parse's events, the traceEvents array's skipped in C
    (``takewhile``); repeated keys are found from digests per key (:class:`_Members`).
    """
    members = _Members(path)
    found: dict[str, Any] = {}
    builder: ijson.ObjectBuilder | None = None
    taken = 0  # events of the member being built
    with open_trace(path, repair=repair) as fh, ijson_errors(path, gz, lambda: "(top level)", "item", lambda: 0,
                                                         escaped=repair):
        events = ijson.parse(guard(fh, path))
        feed = members.feed
        key = ""
        for prefix, event, value in events:
            if prefix == "traceEvents" and event == "start_array":
                deque(takewhile(partial(ne, _EVENTS_END), events), maxlen=0)
                feed("traceEvents", "events", None)
                continue
            feed(prefix, event, value)
            if prefix:  # inside a top-level member's value
                if builder is not None and (taken := taken + 1) <= _HEADER_EVENTS_MAX \
                        and (key in HEADER_OBJECTS or event not in ("start_map", "start_array")):
                    builder.event(event, value)
                else:
                    builder = None
            elif event in ("map_key", "end_map"):  # a member ends where the next begins, or the document ends
                if builder is not None and _kept_member(key, builder.value):
                    found[key] = builder.value
                key, builder, taken = (value, ijson.ObjectBuilder(), 0) if event == "map_key" else ("", None, 0)
    return found


class _Frame:
    """An object or array being read by :class:`_Members`."""

    __slots__ = ("digest", "is_map", "items", "key", "members", "where")

    def __init__(self, is_map: bool, where: str) -> None:
        self.is_map = is_map
        self.where = where
        self.key: str = ""
        self.members: dict[str, tuple[bytes, str]] = {}  # key -> (digest of its value, the value shown)
        self.items = 0
        self.digest = hashlib.blake2b(digest_size=16)


class _Members:
    """Keys repeated with another value, from ijson.parse events: each value is kept as a digest
    (its JSON value's, objects whatever their key order), so memory stays with the keys, not the values."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.frames: list[_Frame] = []
        self.arrays = 0  # traceEvents arrays met

    def feed(self, prefix: str, event: str, value: Any) -> None:
        frames = self.frames
        if event == "map_key":
            frames[-1].key = value
        elif event in ("start_map", "start_array"):
            frames.append(_Frame(event == "start_map", self._child_path()))
        elif event in ("end_map", "end_array"):
            frame = frames.pop()
            if frame.is_map:
                for key, (digest, _) in sorted(frame.members.items()):
                    frame.digest.update(json.dumps(key).encode() + digest)
            self._value(b"{" if frame.is_map else b"[", frame.digest.digest(), "an object" if frame.is_map else "an array")
        elif event == "events":  # the traceEvents array, skipped: a second one is a conflict
            self.arrays += 1
            self._value(b"e", str(self.arrays).encode(), f"an array of events (#{self.arrays})")
        else:
            self._value(b"v", _scalar_digest(value), show(value, 36))

    def _child_path(self) -> str:
        if not self.frames:
            return ""
        parent = self.frames[-1]
        if parent.is_map:
            return f"{parent.where}.{parent.key}" if parent.where else parent.key
        return f"{parent.where}[{parent.items}]"

    def _value(self, kind: bytes, digest: bytes, shown: str) -> None:
        if not self.frames:
            return  # the document itself
        parent = self.frames[-1]
        digest = kind + digest
        if parent.is_map:
            key = parent.key
            before = parent.members.get(key)
            if before is not None and before[0] != digest:
                raise duplicate_key_error(self.path, parent.where, key, Shown(before[1]), Shown(shown))
            parent.members[key] = (digest, shown)
        else:
            parent.items += 1
            parent.digest.update(digest)


def _scalar_digest(value: Any) -> bytes:
    """A scalar as ijson reads it, as bytes that equal exactly when the JSON values are equal."""
    if value is None or isinstance(value, bool):
        return repr(value).encode()
    if isinstance(value, (int, Decimal)):
        number = Decimal(value)
        return b"#" + (b"0" if number == 0 else str(number.normalize()).encode())
    return b'"' + str(value).encode("utf-8", "surrogatepass")


def read_events(path: Path, gz: bool,
                collect: Callable[[Iterator[Events]], _T]) -> tuple[_T, NameRepair | None, dict[str, Any]]:
    """``collect`` of the file's event batches, read with the json reader, or with ijson's when the
    json reader cannot vouch for the file (``collect`` may then be called twice: it starts afresh);
    with the top-level members outside traceEvents, before and after it (a writer may put Kineto's
    header anywhere in the object: key order is no part of JSON).

    torch's unescaped names (``"name": "...(0):     "seed",",``, see jsonstream.escape_names): only
    after a syntax error, and only if such a line comes before it, the file is read again through
    :class:`NameRepair` (streamed; the lines are kept, so another error names the file's own line).
    Returned with what ``collect`` gave: that repairing stream, or None; then the members.
    """
    with collector_paused():
        try:
            return _read_events(path, gz, collect, repair=False)
        except _BadSyntax as bad:
            if not _has_bad_name(path, bad.offset):
                raise bad.error from None
        try:
            return _read_events(path, gz, collect, repair=True)
        except _BadSyntax as bad:
            raise bad.error from None


def _read_events(path: Path, gz: bool, collect: Callable[[Iterator[Events]], _T], *,
                 repair: bool) -> tuple[_T, NameRepair | None, dict[str, Any]]:
    try:
        with open_trace(path, repair=repair) as fh:
            members: dict[str, Any] = {}
            got = collect(json_batches(guard(fh, path), members))
            return got, fh if isinstance(fh, NameRepair) else None, members
    except Unproven:
        pass
    with open_trace(path, repair=repair) as fh:
        got = collect(ijson_batches(path, fh, gz, escaped=repair))
        repaired = fh if isinstance(fh, NameRepair) else None
    return got, repaired, _top_level_members(path, gz, repair)


def _has_bad_name(path: Path, offset: int) -> bool:
    """Does a name line that NameRepair escapes end within ``offset`` bytes (or one line past them)?"""
    with open_trace(path) as raw:
        fh = NameRepair(raw)
        while fh.count == 0 and fh.done <= offset and fh.read(CHUNK_BYTES):
            pass
        return fh.count > 0


"""Kineto / torch.profiler Chrome traces recorded with ``profile_memory=True``. FORMATS.md §5.

``*.json`` or ``*.json.gz``, streamed (never loaded whole; gzip decompressed as a stream). What is
read:
- ``[memory]`` instant events: one per allocation (``Bytes`` > 0) or free (``Bytes`` < 0), with the
  allocator's ``Total Allocated`` / ``Total Reserved`` after the event. ``Total Allocated`` includes
  memory allocated before profiling started; it becomes each block's ``alloc_total`` so the
  reconciliation recovers that baseline. ``Device Type`` (c10 enum: CPU=0, CUDA=1, PrivateUse1 =
  NPU=20) and ``Device Id`` name the device. The CPU allocator reserves nothing (``Total Reserved``
  is always 0 there), so a CPU device has no reserved values rather than a misleading 0.
- ``ProfilerStep#N`` complete (``X``) events: the steps.
- ``cpu_op`` complete events: a memory event belongs to the innermost op on the same (pid, tid)
  whose span ``[ts, ts + dur]`` contains its ts; that op names the block.
- ``python_function`` complete events (``with_stack=True``; ``with_modules=True`` adds the
  ``nn.Module: Name_k`` spans): the module spans around a memory event on the same (pid, tid),
  outermost first, joined by ``/``, are its block's owner; where none encloses it, the innermost
  frame in user code (``file.py(12): fn`` outside a ``torch``/``torch_npu`` package directory).
- ``deviceProperties[]`` (header): ``totalGlobalMem`` of the GPU with that ``id`` becomes
  ``metadata["device_capacity_bytes"][label]``.

Reading: the json module (C) parses the ``traceEvents`` array a chunk of bytes at a time, and only
what memgate needs is kept: the few ProfilerStep events whole, memory events and cpu_ops as int64
columns. So memory stays a small multiple of one chunk, not of the file (a 1 GB trace: ~0.5 GB
peak, where orjson.loads peaks at 6.5 GB). A file that reader cannot vouch for (a syntax error, a
limit, a surrogate escape) is read again event by event with ijson, which names the first
error with its element and line: both readers accept the same files and read them to the same
events. One writer defect is tolerated: torch (2.13, ``with_stack=True``) can write a
``"name": "..."`` line whose text holds raw quotes; after a syntax error, and only if such a line
comes before it, the file is streamed again through ``jsonstream.NameRepair``, which reads that
name as its text, and ``metadata["notes"]`` says so. Valid files never take that path. Each batch of events is checked against the schema as it comes; of several bad events,
the first in the file is reported.

Time: ``ts`` is µs with 3 decimals, relative to ``baseTimeNanoseconds`` when the trace has it.
ijson hands non-integers over as ``Decimal``, the json reader as their text, so
``t_ns = baseTimeNanoseconds + ts * 1000`` is exact (sub-ns digits, which Kineto never writes, are
dropped). Events are unsorted in the file; they are ordered by ts, ties in file order.

Also the JSON written by ``prof.export_memory_timeline("*.json")`` (``[times_us, sizes]``, sizes by
category): claimed only by its name (``*memory_timeline*.json``) *and* its ``[[`` header. It does
not record the device it was exported for, so its device is ``unknown``.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from decimal import Decimal
from functools import partial
from itertools import repeat, takewhile
from operator import ne
from pathlib import Path
from typing import Any

import ijson
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memgate import discover, hints
from memgate.errors import InputError, show
from memgate.lazy import arrow_without_pandas
from memgate.loaders.events import is_torch_file, pair_allocs, repeated_action
from memgate.model import MAX_BYTES, MAX_RANK, DeviceModel, Profile, Series, check_steps, empty_steps, step_number
from memgate.readers import convert, limits
from memgate.readers.jsonstream import (
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
from memgate.readers.limits import check_readable
from memgate.readers.memory import collector_paused
from memgate.readers.pyrecords import check_column, check_records, resolve
from memgate.schemas import load_schema
from memgate.table import Ints, Table, Texts

FORMAT = "kineto"
TIMELINE_FORMAT = "torch_memory_timeline"
SCHEMA = "kineto"
COMPONENT = "allocator"
UNPAIRED = "allocations without Addr"  # the blocks of a trace whose [memory] events carry no Addr
HEAD_BYTES = 1 << 16
STEP_NAME = re.compile(r"^ProfilerStep#([0-9]+)\Z")
# c10::DeviceType, lower-cased; PrivateUse1 is torch_npu's NPU (FORMATS.md).
DEVICE_TYPES = {0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip", 7: "fpga",
                8: "maia", 9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps", 14: "meta", 15: "hpu",
                16: "ve", 17: "lazy", 18: "ipu", 19: "mtia", 20: "npu"}
CPU = 0
_BASE_MAX = 9 * 10**18
MODULE_PREFIX = "nn.Module: "  # python_function spans of traces recorded with_modules=True
_FRAME = re.compile(r"^(?!<built-in)(.+?)\([0-9]+\): ")  # a with_stack frame: ``file.py(12): forward``
_I64_MAX = (1 << 63) - 1
_NONE = np.array(None, dtype=object)  # np.equal(values, _NONE): where an object array holds None


# ---- detection ------------------------------------------------------------------------------------


def _is_json_name(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith((".json", ".json.gz"))


def _is_trace_name(path: Path) -> bool:
    """The name torch's ``tensorboard_trace_handler`` gives a trace (a file given directly that is
    named so goes to this loader, which says what it is instead)."""
    return path.name.lower().endswith((".pt.trace.json", ".pt.trace.json.gz"))


def claims(path: Path) -> bool:
    """A .json/.json.gz file whose first bytes open an object that has ``traceEvents``.

    torch_npu's trace_view.json is a JSON *array*: not claimed (it belongs to its profile dir).
    """
    if not _is_json_name(path) or not path.is_file():
        return False
    try:
        head = read_head(path)
    except PermissionError:
        return _is_trace_name(path)  # load() says why
    except (OSError, EOFError, zlib.error):
        return False
    body = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return body[:1] == b"{" and b'"traceEvents"' in head


def claims_timeline(path: Path) -> bool:
    """``prof.export_memory_timeline`` JSON: the name says so and the file starts with ``[[``
    (a ``*.raw.json`` name is claimed_raw_timeline's, whichever form it holds)."""
    if "memory_timeline" not in path.name.lower() or not _is_json_name(path) or _is_raw_name(path):
        return False
    return _head_matches(path, rb"\s*\[\s*\[\s*([0-9]|\])")


def _is_raw_name(path: Path) -> bool:
    # torch writes the raw form for a path ending "raw.json.gz" (any other: the [times, sizes] form);
    # Holistic Trace Analysis keeps it as "memory_timeline.raw.gz"
    name = path.name.lower()
    return name.endswith(("raw.json.gz", ".raw.json", ".raw.gz"))


def claims_raw_timeline(path: Path) -> bool:
    """``prof.export_memory_timeline("*.raw.json.gz")``: the name says so and the file is a JSON
    array that is empty or starts with an array of numbers."""
    return _is_raw_name(path) and _head_matches(path, rb"(\xef\xbb\xbf)?\s*\[\s*(\]|\[\s*-?[0-9])")


def _head_matches(path: Path, pattern: bytes) -> bool:
    """A file whose first 256 bytes (decompressed) start with ``pattern``; False where they cannot be read."""
    if not path.is_file():
        return False
    try:
        head = read_head(path, 256)
    except (OSError, EOFError, zlib.error):
        return False
    return re.match(pattern, head) is not None


def read_head(path: Path, size: int = HEAD_BYTES) -> bytes:
    with _open(path, capped=False) as fh:
        return fh.read(size)


@contextmanager
def _open(path: Path, *, capped: bool = True, repair: bool = False) -> Iterator[Readable]:
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
_PLAIN_US = r"^[0-9]+\.[0-9]{1,9}$"  # µs that convert exactly as text
_OP_FIELDS = ("name", "ts", "dur", "pid", "tid")  # what is kept of a cpu_op, in the order they are checked


class _Unproven(Exception):
    """The json reader cannot vouch for the file: the ijson reader reads it (and names its first error)."""


class _BadSyntax(Exception):
    """A syntax error of the ijson reader (``error``), met ``offset`` bytes into the file: load()
    reads the file again with torch's unescaped names repaired if one comes before that."""

    def __init__(self, error: InputError, offset: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.offset = offset


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # json takes NaN and Infinity; RFC 8259 and ijson do not


# A JSON number with a fraction or exponent, as the json reader keeps it: its text. ijson reads one
# as a ``Decimal``. Text is cheaper to build, and Arrow turns a column of it into exact ns 7x faster
# than a column of Decimals (see _plain_us_ns); any other use takes :func:`_legacy`, the Decimal, so
# both readers' events check and fail alike.
_Number = NumberText
# Each object through unique_pairs: a key repeated with another value raises DuplicateKey, and the
# ijson reader names it (about +10 % on a whole load, measured on the benchmark trace).
_DECODER = json.JSONDecoder(parse_float=_Number, parse_constant=_no_constant, object_pairs_hook=unique_pairs)


def _legacy(value: Any) -> Any:
    return Decimal(value) if type(value) is _Number else value


def _legacy_event(event: dict[str, Any]) -> dict[str, Any]:
    """The event (its top level and args, what the schema checks) with ijson's types."""
    out = {key: _legacy(value) for key, value in event.items()}
    if type(out.get("args")) is dict:
        out["args"] = {key: _legacy(value) for key, value in out["args"].items()}
    return out


def _json_batches(reader: GuardedReader) -> Iterator[list[dict[str, Any]]]:
    """The traceEvents array as lists of events, one list per chunk of bytes parsed by the json module.

    Anything this reader does not vouch for (a syntax error, a limit of the reader or of rows, a
    surrogate escape, an event that is not an object, an event over 64 MiB, a key repeated with
    another value) raises _Unproven: the json and ijson readers accept the same files and read them
    to the same events.
    """
    max_rows = limits.current().max_rows
    events = 0
    try:
        for batch in _json_chunks(reader):
            events += len(batch)
            if events > max_rows:
                raise _Unproven("too many events")  # ijson's reader names the event
            yield batch
    except (ValueError, RecursionError, EOFError, OSError, zlib.error, JsonLimitError, DuplicateKey) as exc:
        raise _Unproven(str(exc)) from exc


def _json_chunks(reader: GuardedReader) -> Iterator[list[dict[str, Any]]]:
    """Parse the array a chunk at a time: the complete events of the bytes read so far, the rest kept."""
    rest, head = _after_events_key(reader)
    buf = bytearray(b"[") + rest  # the pending bytes, always after a '['
    in_tail = False  # the array has ended: the rest closes the document
    while chunk := reader.read(CHUNK_BYTES):
        buf += chunk
        taken = None if in_tail else _leading_events(buf)
        in_tail = in_tail or taken is None
        if taken is not None and taken[1]:
            buf[taken[1] - 1] = ord("[")  # in place of the separator's last byte
            del buf[: taken[1] - 1]
            yield taken[0]
        if len(buf) > _PENDING_MAX:
            raise _Unproven("no complete event in 64 MiB")
    yield _last_events(buf, head)


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


def _after_events_key(reader: GuardedReader) -> tuple[bytes, dict[str, Any]]:
    """Read past the ``[`` that opens the top-level ``traceEvents``; return the bytes after it and the
    top-level members before it."""
    head = b""
    while (key := _EVENTS_KEY.search(head)) is None:
        chunk = reader.read(CHUNK_BYTES)
        if not chunk or len(head) > _PENDING_MAX:
            raise _Unproven("no traceEvents array")
        head += chunk
    opening = head[: key.end()]
    # ``{..., "traceEvents": []}`` parses only if that ``[`` opens the value of a top-level key
    members = _DECODER.decode(_text(opening + b"]}")) if opening.count(b'"traceEvents"') == 1 else None
    if type(members) is not dict:
        raise _Unproven("traceEvents is not the top-level array")
    return head[key.end():], members


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
        raise _Unproven("a surrogate escape")  # json keeps a lone one as is, ijson reads it as "?"
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


def _last_events(buf: bytearray, head: dict[str, Any]) -> list[dict[str, Any]]:
    """The events up to the array's ``]`` (``buf`` starts with '['); the rest must close the top-level
    object, and repeat no key of ``head`` (the members before the array) with another value."""
    text = _text(buf)
    events, end = _DECODER.raw_decode(text)
    if '""' in text[end:] or "" in head:
        raise _Unproven("an empty key at the top level")  # "" is the tail's placeholder key below
    others = _DECODER.decode('{"": 0' + text[end:])
    if "traceEvents" in others:
        raise _Unproven("a second traceEvents key")  # the ijson reader names it
    if any(key in head and not same_json(head[key], value) for key, value in others.items()):
        raise _Unproven("a top-level key repeated with another value")
    return _objects(events)


def _objects(events: list[Any]) -> list[dict[str, Any]]:
    if not set(map(type, events)) <= {dict}:
        raise _Unproven("an event is not an object")  # ijson's reader names it
    return events


def _ijson_batches(path: Path, fh: Readable, gz: bool, escaped: bool = False) -> Iterator[list[dict[str, Any]]]:
    """The traceEvents array as lists of events streamed by ijson, the reader that names a file's first error.

    Objects are built as unique_keys() maps, so a key an event repeats with another value is named
    with the event's path once the event is complete; each event and its args are handed on as
    plain dicts. Then a second pass checks the keys outside traceEvents (:func:`_top_level_conflict`).
    """
    batch: list[dict[str, Any]] = []
    position = [-1]  # the index of the last event read (for the errors of _ijson_errors)
    keys, seen = unique_keys()
    max_rows = limits.current().max_rows
    reader = guard(fh, path)
    with _ijson_errors(path, gz, lambda: f"traceEvents[{position[0] + 1}]", "traceEvents.item",
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
def _ijson_errors(path: Path, gz: bool, where: Callable[[], str], prefix: str, element: Callable[[], int], *,
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


def _top_level_conflict(path: Path, gz: bool, repair: bool = False) -> None:
    """InputError for a key repeated with another value outside traceEvents: in the top-level object
    (a second traceEvents array included) or in an object among its other members.

    The ijson reader's second pass: ijson.parse's events, the traceEvents array's skipped in C
    (``takewhile``), the rest kept as digests per key (:class:`_Members`), never as values.
    """
    members = _Members(path)
    with _open(path, repair=repair) as fh, _ijson_errors(path, gz, lambda: "(top level)", "item", lambda: 0,
                                                         escaped=repair):
        events = ijson.parse(guard(fh, path))
        feed = members.feed
        for prefix, event, value in events:
            if prefix == "traceEvents" and event == "start_array":
                deque(takewhile(partial(ne, _EVENTS_END), events), maxlen=0)
                feed("traceEvents", "events", None)
            else:
                feed(prefix, event, value)


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


def _head_fields(head: bytes) -> dict[str, Any]:
    """Top-level scalars written before ``traceEvents`` (Kineto's header), plus ``distributedInfo.rank``."""
    fields: dict[str, Any] = {}
    props: list[dict[str, Any]] = []
    try:
        for prefix, event, value in ijson.parse(guard(io.BytesIO(head))):
            if prefix == "deviceProperties.item" and event == "start_map":
                props.append({})
            elif prefix in ("deviceProperties.item.id", "deviceProperties.item.totalGlobalMem") and props:
                props[-1][prefix.rsplit(".", 1)[1]] = value
            if prefix == "traceEvents":
                fields["traceEvents"] = event  # start_array, or what it is instead
                break
            if event in ("number", "string", "boolean") and ("." not in prefix or prefix == "distributedInfo.rank"):
                fields[prefix] = value
    except (ijson.JSONError, JsonLimitError):
        pass  # the head ends mid-document (or nests absurdly: the full read reports that)
    fields["deviceProperties"] = props
    return fields


def _header_int(path: Path, value: Any, column: str, low: int, high: int, what: str) -> int | None:
    """A header value memgate acts on (a rank names the profile, a capacity sizes "92%" budgets):
    None where absent, an InputError where it is no integer from ``low`` to ``high``."""
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:
        raise InputError(f"{column} out of range" if type(value) is int else f"{column} is not an integer", file=path,
                         column=column, expected=f"{what}: an integer from {low} to {high}", found=show(value, 60))
    return value


def _capacities(path: Path, props: list[dict[str, Any]], devices: list[DeviceModel]) -> dict[str, int]:
    """Each GPU's memory as the trace records it: ``deviceProperties[].totalGlobalMem`` by ``id``.
    A value that is no device index or no byte count a device can hold is an error (a "92%" budget
    of 2**80 bytes would pass anything)."""
    by_id: dict[int, int] = {}
    listed_at: dict[int, int] = {}
    for i, p in enumerate(props):
        device_id = _header_int(path, p.get("id"), f"deviceProperties[{i}].id", 0, MAX_RANK, "a device index")
        total = _header_int(path, p.get("totalGlobalMem"), f"deviceProperties[{i}].totalGlobalMem", 0, MAX_BYTES,
                            "the device's memory in bytes")
        if device_id is not None and total is not None:
            if device_id in by_id and by_id[device_id] != total:  # which one a "50%" budget means: unknowable
                raise InputError(f"device {device_id} is listed twice in deviceProperties with two capacities",
                                 file=path, column=f"deviceProperties[{i}].totalGlobalMem",
                                 expected=f"{by_id[device_id]} bytes, as deviceProperties[{listed_at[device_id]}] "
                                          "lists it (one GPU has one memory size)",
                                 found=f"{total} bytes")
            by_id[device_id] = total
            listed_at.setdefault(device_id, i)
    capacity = {}
    for device in devices:
        kind, _, number = device.device.partition(":")
        if kind != "cpu" and number.isdigit() and int(number) in by_id:
            capacity[device.device] = by_id[int(number)]
    return capacity


def _collect(path: Path, gz: bool, schema: dict[str, Any], base: int) -> tuple[_Collected, NameRepair | None]:
    """Read the events with the json reader, or with ijson's when the json reader cannot vouch for the file.

    torch's unescaped names (``"name": "...(0):     "seed",",``, see jsonstream.escape_names): only
    after a syntax error, and only if such a line comes before it, the file is read again through
    :class:`NameRepair` (streamed; the lines are kept, so another error names the file's own line).
    Returned with the events: that repairing stream, or None.
    """
    with collector_paused():
        try:
            return _read_events(path, gz, schema, base, repair=False)
        except _BadSyntax as bad:
            if not _has_bad_name(path, bad.offset):
                raise bad.error from None
        try:
            return _read_events(path, gz, schema, base, repair=True)
        except _BadSyntax as bad:
            raise bad.error from None


def _read_events(path: Path, gz: bool, schema: dict[str, Any], base: int, *,
                 repair: bool) -> tuple[_Collected, NameRepair | None]:
    try:
        with _open(path, repair=repair) as fh:
            got = _Collected.of(_json_batches(guard(fh, path)), path, schema, base)
            return got, fh if isinstance(fh, NameRepair) else None
    except _Unproven:
        pass
    with _open(path, repair=repair) as fh:
        got = _Collected.of(_ijson_batches(path, fh, gz, escaped=repair), path, schema, base)
        repaired = fh if isinstance(fh, NameRepair) else None
    _top_level_conflict(path, gz, repair)
    return got, repaired


def _has_bad_name(path: Path, offset: int) -> bool:
    """Does a name line that NameRepair escapes end within ``offset`` bytes (or one line past them)?"""
    with _open(path) as raw:
        fh = NameRepair(raw)
        while fh.count == 0 and fh.done <= offset and fh.read(CHUNK_BYTES):
            pass
        return fh.count > 0


# ---- what is kept of the events -------------------------------------------------------------------


class _Codes:
    """Integer codes for values met batch by batch (op names, pids, tids); 1 and "1" differ."""

    def __init__(self) -> None:
        self.values: list[Any] = []
        self._index: dict[tuple[type, Any], int] = {}

    def encode(self, values: list[Any], ints: bool = False) -> np.ndarray:
        """Codes of ``values``; ``ints``: all are ints within int64 (coded in C, not as objects).

        Distinct values are met in order of first appearance; a value equal to one met before in
        this batch (1 and True) takes its code, as a dict key would.
        """
        if ints:
            array = np.array(values, dtype=np.int64)
            uniques, first, local = np.unique(array, return_index=True, return_inverse=True)
            order = np.argsort(first, kind="stable")  # the distinct values in order of first appearance
            codes = np.empty(len(uniques) + 1, dtype=np.int64)
            codes[order] = [self._code(v) for v in uniques[order].tolist()]
            codes[-1] = self._code(None)
            return np.asarray(codes[local.reshape(-1)], dtype=np.int64)
        index: dict[Any, int] = {}
        setdefault = index.setdefault
        local = np.fromiter((-1 if v is None else setdefault(v, len(index)) for v in values), dtype=np.int64,
                            count=len(values))
        codes = np.array([self._code(v) for v in index] + [self._code(None)], dtype=np.int64)
        return np.asarray(codes[local], dtype=np.int64)  # a None (local code -1) takes the last one

    def _code(self, value: Any) -> int:
        key = (type(value), value)
        code = self._index.get(key)
        if code is None:
            code = self._index[key] = len(self.values)
            self.values.append(value)
        return code


@dataclass
class _Kept:
    """One kind of event (memory events, cpu_ops) as int64 columns, appended batch by batch."""

    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)
    count: int = 0
    problem: InputError | None = None  # of the first bad event: collecting stops there
    latest: tuple[int, str] = (-1, "")  # the largest ts in ns (before the base) and its text
    past_end: str | None = None  # the dur of the first event whose ts + dur is past int64 ns

    def append(self, **columns: np.ndarray) -> None:
        for name, values in columns.items():
            self.parts.setdefault(name, []).append(values)

    def column(self, name: str) -> np.ndarray:
        return np.concatenate(self.parts[name])

    def note_times(self, ns: np.ndarray, values: list[Any]) -> None:
        k = int(np.argmax(ns))
        if ns[k] > self.latest[0]:
            self.latest = (int(ns[k]), str(_legacy(values[k])))


class _Collected:
    """The events memgate needs, pulled out batch by batch: the few steps whole, memory events and
    cpu_ops as columns (everything else is dropped with its batch)."""

    def __init__(self, path: Path, schema: dict[str, Any], base: int) -> None:
        self.path = path
        self.schema = schema
        self.base = base
        self.events = 0
        self.steps: list[dict[str, Any]] = []
        self.step_index: list[int] = []
        self.mem = _Kept()
        self.ops = _Kept()
        self.op_names = _Codes()
        self.py = _Kept()  # python_function spans: nn.Module spans and user-code frames (owners)
        self.py_names = _Codes()
        self.pids = _Codes()
        self.tids = _Codes()
        self.first_addr: dict[bool, int] = {}  # has Addr -> index of the first memory event that (has) not
        self.addr_count = {True: 0, False: 0}  # memory events with / without Addr
        x_event = resolve(schema["$defs"]["x_event"], schema)
        self.op_props = {key: resolve(prop, schema) for key, prop in x_event["properties"].items()}
        self.op_required = set(x_event["required"])
        self.mem_schema = resolve(schema["$defs"]["memory_event"], schema)
        self.mem_ts_prop = resolve(self.mem_schema["properties"]["ts"], schema)
        # The same without ts, for batches whose ts plainly meet the schema (see _plain_us_ns)
        self.mem_schema_no_ts = {**self.mem_schema,
                                 "properties": {k: v for k, v in self.mem_schema["properties"].items() if k != "ts"},
                                 "required": [k for k in self.mem_schema["required"] if k != "ts"]}

    @classmethod
    def of(cls, batches: Iterator[list[dict[str, Any]]], path: Path, schema: dict[str, Any], base: int) -> _Collected:
        got = cls(path, schema, base)
        for batch in batches:
            got.add(batch)
        return got

    def add(self, events: list[dict[str, Any]]) -> None:
        """Sort a batch into steps, memory events and cpu_ops in one pass (each event is read while in cache)."""
        first = self.events
        self.events += len(events)
        mem: list[dict[str, Any]] = []
        mem_index: list[int] = []
        op_index: list[int] = []
        op_columns: dict[str, list[Any]] = {name: [] for name in _OP_FIELDS}
        add_name, add_ts, add_dur, add_pid, add_tid = (op_columns[name].append for name in _OP_FIELDS)
        py_index: list[int] = []
        py_columns: dict[str, list[Any]] = {name: [] for name in _OP_FIELDS}
        for i, event in enumerate(events):
            get = event.get
            ph = get("ph")
            if ph == "X":
                name = get("name")
                cat = get("cat")
                if type(name) is str and name.startswith("ProfilerStep#"):
                    if cat != "gpu_user_annotation":  # the GPU-side copy runs on device time
                        self.steps.append(_legacy_event(event))
                        self.step_index.append(first + i)
                elif cat == "cpu_op":
                    op_index.append(first + i)
                    add_name(name)
                    add_ts(get("ts"))
                    add_dur(get("dur"))
                    add_pid(get("pid"))
                    add_tid(get("tid"))
                elif cat == "python_function" and type(name) is str and (name.startswith(MODULE_PREFIX)
                                                                          or _user_frame(name)):
                    py_index.append(first + i)
                    for key in _OP_FIELDS:
                        py_columns[key].append(get(key))
            elif get("name") == "[memory]":
                if ph != "i":  # read as another kind of event, its bytes would go unseen
                    raise InputError("a [memory] event that is not an instant event", file=self.path,
                                     column=f"traceEvents[{first + i}].ph",
                                     expected="'i' (Kineto's [memory] events)", found=show(ph, 20))
                mem.append(event)
                mem_index.append(first + i)
        self.mem.count += len(mem)
        self.ops.count += len(op_index)
        if mem and self.mem.problem is None:
            self._add_memory(mem, mem_index)
        if op_index and self.ops.problem is None:
            self._add_ops(op_columns, op_index)
        self.py.count += len(py_index)
        if py_index and self.py.problem is None:
            self._add_ops(py_columns, py_index, self.py, self.py_names)

    def _threads(self, pids: list[Any], tids: list[Any], arrays: Mapping[str, pa.Array | None]) -> np.ndarray:
        """One int64 per distinct (pid, tid); ``arrays``: the checked pid and tid columns."""
        pid = self.pids.encode(pids, _all_ints(arrays["pid"]))
        return np.asarray((pid << 32) | self.tids.encode(tids, _all_ints(arrays["tid"])), dtype=np.int64)

    def _add_memory(self, records: list[dict[str, Any]], index: list[int]) -> None:
        n = len(records)

        def check(k: int, schema: Mapping[str, Any] = self.mem_schema) -> dict[str, pa.Array | None]:
            return check_records(records[:k], schema, file=self.path, where=lambda j: f"traceEvents[{index[j]}]",
                                 root=self.schema)

        ts, pids, tids = (list(map(dict.get, records, repeat(key))) for key in ("ts", "pid", "tid"))
        t = _plain_us_ns(ts, self.mem_ts_prop)
        cols = None
        if t is not None:
            try:  # those ts are valid: check the rest
                cols = check(n, self.mem_schema_no_ts)
            except InputError:
                pass
        if cols is None or t is None or _text_numbers({"pid": pids, "tid": tids}, cols):
            records = [_legacy_event(r) for r in records]  # check as ijson reads them, to name the first bad event
            ts, pids, tids = (list(map(dict.get, records, repeat(key))) for key in ("ts", "pid", "tid"))
            try:
                cols = check(n)
            except InputError as exc:
                self.mem.problem = _first_error(check, n, exc)
                return
            t = us_to_ns(ts, 0)
        self.mem.note_times(t, ts)
        total_alloc, no_alloc = _nullable(cols.get("args.Total Allocated"), n)
        total_res, no_res = _nullable(cols.get("args.Total Reserved"), n)
        addr, no_addr = _nullable(cols.get("args.Addr"), n)
        for has in (True, False):
            hits = np.flatnonzero(no_addr != has)
            self.addr_count[has] += len(hits)
            if len(hits) and has not in self.first_addr:
                self.first_addr[has] = index[int(hits[0])]
        self.mem.append(t=t, nbytes=_ints(cols["args.Bytes"], n), addr=addr,
                        dtype=_ints(cols["args.Device Type"], n), did=_ints(cols["args.Device Id"], n),
                        total_alloc=total_alloc, no_alloc=no_alloc, total_res=total_res, no_res=no_res,
                        thread=self._threads(pids, tids, cols), event=np.asarray(index, dtype=np.int64))

    def _add_ops(self, columns: dict[str, list[Any]], index: list[int], kept: _Kept | None = None,
                 names: _Codes | None = None) -> None:
        """Keep complete events (cpu_ops, or ``kept``: python_function spans) as columns."""
        kept = self.ops if kept is None else kept
        names = self.op_names if names is None else names
        n = len(index)
        t, dur = (_plain_us_ns(columns[name], self.op_props[name]) for name in ("ts", "dur"))
        arrays = None
        if t is not None and dur is not None:
            try:  # those ts and durs are valid: check the rest
                arrays = self._check_ops(columns, index, n, skip=("ts", "dur"))
            except InputError:
                pass
        if arrays is None or t is None or dur is None or _text_numbers({k: columns[k] for k in ("name", "pid", "tid")},
                                                                       arrays):
            columns = {name: list(map(_legacy, values)) for name, values in columns.items()}  # as ijson reads them
            try:
                arrays = self._check_ops(columns, index, n)
            except InputError as exc:
                kept.problem = _first_error(lambda k: self._check_ops(columns, index, k), n, exc)
                return
            t, dur = us_to_ns(columns["ts"], 0), us_to_ns(columns["dur"], 0)
        kept.note_times(t, columns["ts"])
        past = dur > (_I64_MAX - self.base) - t
        if kept.past_end is None and past.any():
            kept.past_end = str(_legacy(columns["dur"][int(np.argmax(past))]))
        kept.append(t=t, dur=dur, name=names.encode(columns["name"]),
                        thread=self._threads(columns["pid"], columns["tid"], arrays))

    def _check_ops(self, columns: dict[str, list[Any]], index: list[int], k: int,
                   skip: tuple[str, ...] = ()) -> dict[str, pa.Array | None]:
        """Check the first k cpu_ops field by field (raises the first field's first problem); their columns."""
        arrays = {}
        for name, values in columns.items():
            if name in skip:
                continue
            arrays[name], problem = check_column(values[:k], self.op_props[name], name=name,
                                                 where=lambda j: f"traceEvents[{index[j]}]",
                                                 required=name in self.op_required)
            if problem is not None:
                raise problem.error(self.path)
        return arrays


def _integers(arr: pa.Array | None) -> bool:
    return arr is not None and pa.types.is_integer(arr.type)


def _all_ints(arr: pa.Array | None) -> bool:
    return arr is not None and pa.types.is_integer(arr.type) and arr.null_count == 0


def _text_numbers(columns: Mapping[str, list[Any]], checked: Mapping[str, pa.Array | None]) -> bool:
    """Do these checked columns hold a json reader's number? It passes as a string; only a column that
    Arrow did not type as integers can hold one."""
    return any(not _integers(checked[name]) and _Number in set(map(type, values)) for name, values in columns.items())


def _first_error(check: Callable[[int], object], n: int, error: InputError) -> InputError:
    """The error of the first bad record of ``n`` (``check(k)`` validates the first k; all n fail with ``error``).

    A column check reports a wrong type before an out-of-range value earlier in the column, so the
    error of a whole batch would depend on where batches end; the shortest failing prefix does not.
    """
    good, bad = 0, n
    while bad - good > 1:
        mid = (good + bad) // 2
        try:
            check(mid)
            good = mid
        except InputError as exc:
            bad, error = mid, exc
    return error


# ---- loading --------------------------------------------------------------------------------------


def load(path: Path) -> Profile:
    # The events are plain Python values (no pandas object): Arrow builds its arrays from them
    # without importing pandas (~0.2 s), as the snapshot loader does.
    with arrow_without_pandas():
        return _load(path)


def _load(path: Path) -> Profile:
    check_readable(path)
    limits.check_file_size(path)
    gz = path.name.lower().endswith(".gz")
    schema = load_schema(SCHEMA)
    try:
        head = read_head(path)
        body = head.lstrip(b"\xef\xbb\xbf \t\r\n")
        if _ARRAY_FORM.match(body):
            raise InputError("a Chrome trace in the JSON array form (torch's legacy autograd profiler, or Kineto "
                             "before torch 1.8), which records no [memory] events", file=path, line=1,
                             expected="a JSON object with traceEvents, as torch.profiler.profile(..., "
                             "profile_memory=True) exports it since torch 1.8", found="[ {\"ph\": ...}, ...]")
        if body[:1] != b"{":
            raise InputError("not a Chrome trace: the file is not a JSON object", file=path, line=1,
                             expected="'{' with traceEvents (a Kineto trace)", found=repr(head[:20]))
        fields = _head_fields(head)
        base = fields.get("baseTimeNanoseconds", 0)
        got, repaired = _collect(path, gz, schema, base if _valid_base(base) else 0)
    except PermissionError:
        raise InputError("file is not readable (permission denied)", file=path) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"corrupt or truncated gzip stream: {exc}", file=path) from None
    if got.events == 0 and b'"traceEvents"' not in head:
        raise InputError("no traceEvents array in this JSON object", file=path, expected="a Kineto trace")
    if fields.get("traceEvents", "start_array") != "start_array":
        raise InputError("traceEvents is not an array", file=path, column="traceEvents", expected="an array of events",
                         found=str(fields["traceEvents"]).replace("start_map", "an object"))
    if not _valid_base(base):
        raise InputError("baseTimeNanoseconds must be a non-negative integer", file=path,
                         column="baseTimeNanoseconds", expected=f"ns since the epoch, at most {_BASE_MAX}",
                         found=repr(base))
    steps = _steps(path, got, schema, base)
    devices = _devices(path, got, base)
    metadata: dict[str, Any] = {"base_time_ns": base, "trace_events": got.events, "memory_events": got.mem.count,
                                "cpu_ops": got.ops.count}
    if got.first_addr.keys() == {False}:
        metadata |= _unpaired_facts(got)
    if repaired is not None and repaired.count:
        lines = ", ".join(map(str, repaired.repaired)) + (", ..." if repaired.count > len(repaired.repaired) else "")
        metadata["repaired_names"] = repaired.count
        note = (f"{repaired.count} event name(s) that torch wrote with unescaped quotes (invalid JSON; the "
                f"Python tracer's, with_stack=True) read as their text: line(s) {lines}")
        metadata["notes"] = [note]
    if capacity := _capacities(path, fields["deviceProperties"], devices):
        metadata["device_capacity_bytes"] = capacity
    if not got.mem.count:
        message, expected = hints.no_kineto_memory_events()
        raise InputError(message, file=path, expected=expected, found=f"{got.events} events, none of them [memory]")
    rank = _header_int(path, fields.get("distributedInfo.rank"), "distributedInfo.rank", -1, MAX_RANK,
                       "the process's rank (-1: not distributed)")
    return Profile(
        path=str(path),
        format=FORMAT,
        rank=str(rank) if rank is not None and rank >= 0 else _rank_of(path),
        devices=tuple(devices),
        steps=steps,
        steps_source=str(path) if len(steps) else None,
        metadata=metadata,
    )


# The trace-event format's other top level: an array of events (the first one's keys include "ph").
_ARRAY_FORM = re.compile(rb'\[\s*\{[^{}\[\]]*"ph"\s*:')


def _valid_base(base: Any) -> bool:
    return isinstance(base, int) and not isinstance(base, bool) and 0 <= base <= _BASE_MAX


def us_to_ns(values: list[Any], base: int, path: Path | None = None) -> np.ndarray:
    """Validated µs values (int or Decimal, <= 9e15 by the schema) → exact int64 ns + ``base``.

    Vectorized through decimal text; a sum past int64 (a huge ts on top of a base) is an InputError.
    """
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:
        ns = _decimal_ns(_us_decimals(values))
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # > 9 decimals or floats: exact per value
        ns = np.array([int((Decimal(v) * 1000).to_integral_value()) for v in values], dtype=np.int64)
    if base and (ns > _I64_MAX - base).any():
        raise InputError("ts + baseTimeNanoseconds is past the year 2262 (int64 ns)", file=path,
                         expected="ts relative to baseTimeNanoseconds", found=str(values[int(np.argmax(ns))]))
    return ns + base


def _us_decimals(values: list[Any]) -> pa.Array:
    """``values`` (ints and Decimals) as Arrow decimal128(38, 9); ArrowInvalid for a Decimal whose
    exponent is far out of that range (pyarrow 26 crashes the process converting ``1E-99999999``
    or ``0E-999999999`` to a decimal type, where ``1E-400`` is an error)."""
    try:
        exponents = list(map(Decimal.adjusted, values))
    except TypeError:  # ints among them
        exponents = [v.adjusted() for v in values if type(v) is Decimal]
    if exponents and not -_DECIMAL_EXPONENTS <= min(exponents) <= max(exponents) <= _DECIMAL_EXPONENTS:
        raise pa.ArrowInvalid("a decimal exponent out of range")
    return pa.array(values, type=pa.decimal128(38, 9))


_DECIMAL_EXPONENTS = 40  # decimal128(38, 9) holds values from 1e-9 to ~1e29


def _us_text_ns(text: pa.Array) -> np.ndarray:
    """µs text without nulls as int64 ns, converted in Arrow (convert.us_text_to_ns builds a pandas
    Series: pandas, ~0.2 s to import, is no part of a Kineto load)."""
    return np.asarray(convert.us_to_ns(text).to_numpy(zero_copy_only=False), dtype=np.int64)


def _decimal_ns(us: pa.Array) -> np.ndarray:
    text = pc.cast(us, pa.string())
    return _us_text_ns(text)


def _plain_us_ns(values: list[Any], prop: Mapping[str, Any]) -> np.ndarray | None:
    """Exact ns of µs values that plainly meet ``prop`` (a number within bounds), else None.

    What check_column would accept, without its cost (Arrow infers a type for a Decimal at ~2 µs
    each). Another type, more than 9 decimals or a value near a bound gives None: check_column
    decides, and names the event.
    """
    if prop.keys() - {"type", "minimum", "maximum", "x-unit"} or prop.get("type") != "number":
        return None
    kinds = set(map(type, values))
    if kinds == {_Number}:
        return _plain_text_us_ns(values, prop)
    if not kinds <= {Decimal, int}:
        return None
    try:
        us = _us_decimals(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return None
    zero = np.flatnonzero(pc.equal(us, 0).to_numpy(zero_copy_only=False))
    if any(values[i] != 0 for i in zero.tolist()):  # Arrow gives 0 for a Decimal like -1E-910 (not an error)
        return None
    bounds = pc.min_max(us)
    if bounds["min"].as_py() < prop["minimum"] or bounds["max"].as_py() > prop["maximum"]:
        return None
    return _decimal_ns(us)


def _plain_text_us_ns(values: list[_Number], prop: Mapping[str, Any]) -> np.ndarray | None:
    """The same for the json reader's text. Digits with up to 9 decimals (Kineto writes 3) convert as
    their Decimal would, dropping sub-ns digits; the bounds are checked on the ns, a ns short of them."""
    text = pa.array(values, type=pa.string())
    if not pc.all(pc.match_substring_regex(text, _PLAIN_US)).as_py():
        return None
    try:
        ns = _us_text_ns(text)
    except InputError:  # an integer part past int64 ns
        return None
    if ns.min() < prop["minimum"] * 1000 or ns.max() >= prop["maximum"] * 1000:
        return None
    return ns


def _span_end(start: np.ndarray, durations: list[Any], path: Path) -> np.ndarray:
    dur = us_to_ns(durations, 0)
    if (dur > _I64_MAX - start).any():
        raise InputError("ts + dur is past the year 2262 (int64 ns)", file=path, expected="a shorter dur",
                         found=str(durations[int(np.argmax(dur > _I64_MAX - start))]))
    return np.asarray(start + dur, dtype=np.int64)


def _steps(path: Path, got: _Collected, schema: dict[str, Any], base: int) -> Table:
    if not got.steps:
        return empty_steps()
    cols = check_records(got.steps, schema["$defs"]["x_event"], file=path,
                         where=lambda k: f"traceEvents[{got.step_index[k]}]", root=schema)
    start = us_to_ns([e["ts"] for e in got.steps], base, path)
    end = _span_end(start, [e["dur"] for e in got.steps], path)
    names = cols["name"]
    assert names is not None
    number = [step_number(m.group(1), path, f"traceEvents[{got.step_index[k]}].name")
              if (m := STEP_NAME.match(n)) else None for k, n in enumerate(names.to_pylist())]
    numbered = np.array([n is not None for n in number], dtype=bool)
    if not numbered.any():
        return empty_steps()
    # one row per step number, in order: its earliest start and latest end
    step, group = np.unique(np.array([n for n in number if n is not None], dtype=np.int64), return_inverse=True)
    group = group.reshape(-1)
    t_start = np.full(len(step), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(t_start, group, start[numbered])
    t_end = np.full(len(step), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(t_end, group, end[numbered])
    steps = Table({"step": Ints.of(step), "t_start": Ints.of(t_start), "t_end": Ints.of(t_end)})
    check_steps(steps, path, column="ProfilerStep")  # one step's spans may repeat; two steps never overlap
    return steps


def _devices(path: Path, got: _Collected, base: int) -> list[DeviceModel]:
    mem = got.mem
    if not mem.count:
        return []
    if mem.problem is not None:
        raise mem.problem
    if len(got.first_addr) == 2:
        # the odd kind: the fewer (on a tie, the later), named at its first event
        odd = (got.addr_count[True], got.first_addr[False]) < (got.addr_count[False], got.first_addr[True])
        raise InputError(
            f"a [memory] event {'with' if odd else 'without'} Addr among [memory] events "
            f"{'without' if odd else 'with'} one: its allocations and frees cannot be paired", file=path,
            column=f"traceEvents[{got.first_addr[odd]}].args.Addr",
            expected="Addr on every [memory] event (torch >= 1.10) or on none (torch 1.9)",
            found="an Addr" if odd else "no Addr")
    unpaired = False in got.first_addr
    t = _add_base(mem, base, path)
    op = _attribute(path, got, t, mem.column("thread"), base)
    owner = _owners(path, got, t, mem.column("thread"), base)
    nbytes, addr, dtype, event = mem.column("nbytes"), mem.column("addr"), mem.column("dtype"), mem.column("event")
    total_alloc = (mem.column("total_alloc"), mem.column("no_alloc"))
    total_res = (mem.column("total_res"), mem.column("no_res"))

    order = np.lexsort((np.arange(len(t)), t))  # time order, ties in file order
    ids, id_of = np.unique(mem.column("did"), return_inverse=True)
    pairs, pair_of = np.unique(dtype * len(ids) + id_of, return_inverse=True)  # one code per (type, id)
    pair_labels = [_label(int(p) // len(ids), int(ids[int(p) % len(ids)])) for p in pairs]
    labels = sorted(set(pair_labels))
    label_of = np.array([labels.index(label) for label in pair_labels], dtype=np.int64)[pair_of]
    models = []
    for k, label in enumerate(labels):
        rows = order[label_of[order] == k]
        cpu = bool(dtype[rows[0]] == CPU)
        model = (_unpaired_device(path, label, rows, t, nbytes, total_alloc, total_res, op, cpu=cpu) if unpaired
                 else _device(path, label, rows, t, nbytes, addr, total_alloc, total_res, op, cpu=cpu, event=event))
        models.append(_with_owners(model, rows, nbytes, owner))
    return models


def _add_base(kept: _Kept, base: int, path: Path) -> np.ndarray:
    """The events' ts in ns since the epoch; past int64 (a huge ts on top of a base) is an InputError."""
    if base and kept.latest[0] > _I64_MAX - base:
        raise InputError("ts + baseTimeNanoseconds is past the year 2262 (int64 ns)", file=path,
                         expected="ts relative to baseTimeNanoseconds", found=kept.latest[1])
    return kept.column("t") + base


def _label(device_type: int, device_id: int) -> str:
    name = DEVICE_TYPES[device_type]
    return name if device_type == CPU or device_id < 0 else f"{name}:{device_id}"


def _ints(arr: pa.Array | None, n: int) -> np.ndarray:
    if arr is None or pa.types.is_null(arr.type):
        return np.zeros(n, dtype=np.int64)
    return np.asarray(pc.fill_null(arr, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _nullable(arr: pa.Array | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, missing mask) of an optional integer column."""
    if arr is None or pa.types.is_null(arr.type):
        return np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
    return _ints(arr, n), np.asarray(arr.is_null(), dtype=bool)


def _device(path: Path, label: str, rows: np.ndarray, t: np.ndarray, nbytes: np.ndarray, addr: np.ndarray,
            total_alloc: tuple[np.ndarray, np.ndarray], total_res: tuple[np.ndarray, np.ndarray], op: np.ndarray, *,
            cpu: bool, event: np.ndarray) -> DeviceModel:
    """Blocks and the allocator series of one device; ``rows`` are its events in time order, ``event``
    each row's index in traceEvents."""
    b = nbytes[rows]
    moving = rows[b != 0]
    is_alloc = nbytes[moving] > 0
    pairing = pair_allocs(addr[moving], is_alloc, t[moving])
    if pairing.repeated is not None:
        k = int(moving[pairing.repeated])
        raise repeated_action(path, f"traceEvents[{int(event[k])}]", nbytes[k] > 0,
                              found=f"Addr {int(addr[k])}, Bytes {int(nbytes[k])}",
                              expected="allocs and frees of one address in turn", context=f" (on {label})")
    partner = pairing.partner
    allocs = np.flatnonzero(is_alloc)
    early = np.flatnonzero(~is_alloc & (partner < 0))  # frees of memory allocated before profiling
    freed_at = partner[allocs]
    tm = t[moving]
    size = np.concatenate([nbytes[moving][allocs], -nbytes[moving][early]])
    n_early = len(early)
    t_alloc = Ints.of(np.concatenate([tm[allocs], np.zeros(n_early, np.int64)]),
                      np.concatenate([np.zeros(len(allocs), bool), np.ones(n_early, bool)]))
    t_free = Ints.of(np.concatenate([np.where(freed_at >= 0, tm[np.maximum(freed_at, 0)], 0), tm[early]]),
                     np.concatenate([freed_at < 0, np.zeros(n_early, bool)]))
    totals, no_total = total_alloc[0][moving], total_alloc[1][moving]
    alloc_total = Ints.of(np.concatenate([totals[allocs], np.zeros(n_early, np.int64)]),
                          np.concatenate([no_total[allocs], np.ones(n_early, bool)]))
    ops = op[moving][allocs].tolist() + [None] * n_early
    blocks = Table({
        "size": Ints.of(size),
        "t_alloc": t_alloc,
        "t_free": t_free,
        "op": Texts.of(ops),
        "stream": Texts.repeat(None, len(size)),
        "owner": Texts.repeat(None, len(size)),
        "component": Texts.repeat(COMPONENT, len(size)),
        "alloc_total": alloc_total,
    })
    series: dict[str, Series] = {}
    if not total_alloc[1][rows].all():
        reserved = Ints.absent(len(rows)) if cpu else Ints.of(total_res[0][rows], total_res[1][rows])
        frame = Table({
            "t_ns": Ints.of(t[rows]),
            "allocated": Ints.of(total_alloc[0][rows], total_alloc[1][rows]),
            "reserved": reserved,
            "active": Ints.absent(len(rows)),
        })
        series[COMPONENT] = Series(COMPONENT, frame, str(path))
    # torch's CPU reporter counts only what was allocated while a profiler ran, and never forgets
    # bytes freed while none ran: its totals are window-relative (see FORMATS.md §5).
    return DeviceModel(device=label, series=series, blocks=blocks, blocks_source=str(path), window_relative=cpu)


def _unpaired_device(path: Path, label: str, rows: np.ndarray, t: np.ndarray, nbytes: np.ndarray,
                     total_alloc: tuple[np.ndarray, np.ndarray], total_res: tuple[np.ndarray, np.ndarray],
                     op: np.ndarray, *, cpu: bool) -> DeviceModel:
    """One device of a trace whose [memory] events carry no Addr (torch 1.9): a free names no
    allocation, so the blocks are the allocations alone, component UNPAIRED, with no free time
    (not "still live": unknown). The series is the totals where the events have them, else the
    running sum of Bytes, window-relative: it starts at 0 whatever the window opened with.
    """
    b = nbytes[rows]
    allocs = rows[b > 0]
    n = len(allocs)
    blocks = Table({
        "size": Ints.of(nbytes[allocs]),
        "t_alloc": Ints.of(t[allocs]),
        "t_free": Ints.absent(n),
        "op": Texts.of(op[allocs].tolist()),
        "stream": Texts.repeat(None, n),
        "owner": Texts.repeat(None, n),
        "component": Texts.repeat(UNPAIRED, n),
        "alloc_total": Ints.absent(n),
    })
    totals = not total_alloc[1][rows].all()
    if totals:
        allocated = Ints.of(total_alloc[0][rows], total_alloc[1][rows])
    else:
        if float(np.abs(b.astype(np.float64)).sum()) >= 2.0**63:
            raise InputError("the Bytes of the [memory] events add up past int64", file=path,
                             expected="a running total of allocated bytes that fits int64",
                             found=f"{len(b)} events of up to {int(np.abs(b).max())} bytes")
        allocated = Ints.of(np.cumsum(b))
    reserved = Ints.of(total_res[0][rows], total_res[1][rows]) if totals and not cpu else Ints.absent(len(rows))
    frame = Table({"t_ns": Ints.of(t[rows]), "allocated": allocated, "reserved": reserved,
                   "active": Ints.absent(len(rows))})
    return DeviceModel(device=label, series={COMPONENT: Series(COMPONENT, frame, str(path))}, blocks=blocks,
                       blocks_source=str(path), window_relative=cpu or not totals)


def _unpaired_facts(got: _Collected) -> dict[str, Any]:
    """What a trace without Addr (torch 1.9) can and cannot measure, for Profile.metadata."""
    totals = bool(got.mem.count) and not got.mem.column("no_alloc").all()
    pairing = ("its [memory] events carry no Addr (torch 1.9 writes only Bytes, Device Type and Device Id): "
               "a free cannot be matched to its allocation, so no block is known to be live at a moment")
    why = {key: pairing for key in ("leaked_bytes", "leak_undetermined_bytes", "top_at_peak")}
    if not totals:
        level = ("its [memory] events carry no Total Allocated / Total Reserved (torch 1.9): the level memory "
                 "stood at when the window opened is unknown, so no peak is; step_growth_bytes (from the "
                 "running sum of Bytes) and op_max_block_bytes are measured")
        why |= {key: level for key in ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation",
                                       "external_fragmentation")}
    elif (got.mem.column("dtype") == CPU).any():
        why["peak_allocated_bytes"] = (
            "its CPU totals may carry bytes from before the window (an earlier profiling session), which only "
            "allocations paired with their frees tell apart, and its [memory] events carry no Addr")
    return {"memory_events_without_addr": True, "not_measurable": why}


def _attribute(path: Path, got: _Collected, t_mem: np.ndarray, mem_thread: np.ndarray, base: int) -> np.ndarray:
    """The innermost cpu_op on the same (pid, tid) whose [ts, ts+dur] contains each memory event."""
    result = np.full(len(t_mem), None, dtype=object)
    spans = _spans(path, got.ops, base) if len(t_mem) else None
    if spans is None:
        return result
    start, end, op_thread, op_name = spans
    names = np.array(got.op_names.values, dtype=object)
    for g in np.unique(mem_thread):
        on_thread = np.flatnonzero(op_thread == g)
        queries = np.flatnonzero(mem_thread == g)
        if not len(on_thread):
            continue
        inner = innermost(start[on_thread], end[on_thread], t_mem[queries])
        hit = inner >= 0
        result[queries[hit]] = names[op_name[on_thread[inner[hit]]]]
    return result


def _spans(path: Path, kept: _Kept, base: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(start, end, thread, name code) of kept complete events, None when there are none."""
    if not kept.count:
        return None
    if kept.problem is not None:
        raise kept.problem
    start = _add_base(kept, base, path)
    if kept.past_end is not None:
        raise InputError("ts + dur is past the year 2262 (int64 ns)", file=path, expected="a shorter dur",
                         found=kept.past_end)
    return start, start + kept.column("dur"), kept.column("thread"), kept.column("name")


def _user_frame(name: str) -> bool:
    """A with_stack frame (``path.py(line): function``) in user code, not in torch's own files."""
    frame = _FRAME.match(name)
    return frame is not None and not is_torch_file(frame.group(1))


def _owners(path: Path, got: _Collected, t_mem: np.ndarray, mem_thread: np.ndarray, base: int) -> np.ndarray:
    """Each memory event's owner: the nn.Module spans around it on the same (pid, tid), outermost to
    innermost, joined by ``/`` (``M_0/Encoder_0/Linear_0``: a glob on an outer module covers the inner
    ones); where no module span encloses it, the innermost user-code frame (with_stack); else None."""
    result = np.full(len(t_mem), None, dtype=object)
    spans = _spans(path, got.py, base) if len(t_mem) else None
    if spans is None:
        return result
    start, end, thread, name = spans
    names = np.array(got.py_names.values, dtype=object)
    is_module = np.array([isinstance(v, str) and v.startswith(MODULE_PREFIX) for v in got.py_names.values] + [False],
                         dtype=bool)[name]
    for g in np.unique(mem_thread):
        queries = np.flatnonzero(mem_thread == g)
        on_thread = thread == g
        for modules in (True, False):  # module spans first; frames for what no module span encloses
            kind = np.flatnonzero(on_thread & (is_module == modules))
            todo = queries[np.equal(result[queries], _NONE)]
            if not len(kind) or not len(todo):
                continue
            inner = innermost(start[kind], end[kind], t_mem[todo])
            hit = inner >= 0
            labels = _module_paths(start[kind], end[kind], names[name[kind]]) if modules else names[name[kind]]
            result[todo[hit]] = labels[inner[hit]]
    return result


def _module_paths(start: np.ndarray, end: np.ndarray, names: np.ndarray) -> np.ndarray:
    """For one thread's nn.Module spans: each span's path of module names, outermost first."""
    order = np.lexsort((-end, start))
    parent = _enclosing(end[order])
    paths = np.empty(len(order), dtype=object)
    for k, i in enumerate(order):  # a parent comes before its children in this order
        own = str(names[i])[len(MODULE_PREFIX):]
        paths[i] = own if parent[k] < 0 else f"{paths[order[parent[k]]]}/{own}"
    return paths


def _with_owners(model: DeviceModel, rows: np.ndarray, nbytes: np.ndarray, owner: np.ndarray) -> DeviceModel:
    """Fill the owner column of the blocks (allocations, in the order _device made them)."""
    if np.equal(owner[rows], _NONE).all():
        return model
    allocs = rows[nbytes[rows] > 0]  # the blocks from allocations come first, in time order
    column = np.full(len(model.blocks), None, dtype=object)
    column[:len(allocs)] = owner[allocs]
    return replace(model, blocks=model.blocks.with_column("owner", Texts.of(column.tolist())))


def innermost(start: np.ndarray, end: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the latest-starting interval with ``start <= t <= end`` per query, -1 if none.

    For properly nested intervals (one thread's ops) that is the innermost one. Vectorized: sort by
    (start, -end), link each interval to its enclosing one (previous with end >= its end, found by
    pointer jumping), then walk each query's candidate outwards until it contains the query.
    """
    order = np.lexsort((-end, start))
    s, e = start[order], end[order]
    parent = _enclosing(e)
    cand = np.searchsorted(s, t, side="right") - 1
    todo = np.flatnonzero(cand >= 0)
    todo = todo[e[cand[todo]] < t[todo]]
    while len(todo):
        cand[todo] = parent[cand[todo]]
        todo = todo[cand[todo] >= 0]
        todo = todo[e[cand[todo]] < t[todo]]
    return np.where(cand >= 0, order[np.maximum(cand, 0)], -1)


def _enclosing(end: np.ndarray) -> np.ndarray:
    """For intervals sorted by (start, -end): the nearest previous one with end >= this end, or -1."""
    n = len(end)
    cand = np.arange(n, dtype=np.int64) - 1
    todo = np.flatnonzero(cand >= 0)
    todo = todo[end[cand[todo]] < end[todo]]
    while len(todo):
        cand[todo] = cand[cand[todo]]
        todo = todo[cand[todo] >= 0]
        todo = todo[end[cand[todo]] < end[todo]]
    return cand


_RANK = re.compile(r"rank[_-]?([0-9]+)", re.IGNORECASE)


def _rank_of(path: Path) -> str:
    m = _RANK.search(path.name) or _RANK.search(path.parent.name)
    return str(int(m.group(1))) if m else "0"


# ---- export_memory_timeline -----------------------------------------------------------------------


def load_timeline(path: Path) -> Profile:
    check_readable(path)
    limits.check_file_size(path)
    schema = load_schema(SCHEMA)
    items: list[Any] = []
    try:
        with _open(path) as fh:
            for index, item in enumerate(ijson.items(guard(fh, path), "item")):
                if index >= 2:
                    raise InputError("a memory timeline has exactly two arrays", file=path, column=f"[{index}]",
                                     expected="[times_us, sizes]", found="a third element")
                items.append(item)
    except JsonLimitError as exc:
        raise exc.located(path, f"[{len(items)}]") from None
    except ijson.JSONError as exc:
        raise syntax_error(path, exc, len(items)) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"corrupt or truncated gzip stream: {exc}", file=path) from None
    if len(items) != 2 or not all(isinstance(i, list) for i in items):
        raise InputError("not a memory timeline", file=path, column="(top level)", expected="[times_us, sizes]",
                         found=f"{len(items)} element(s)")
    times, sizes = items
    prefix = resolve(schema["$defs"]["memory_timeline"], schema)["prefixItems"]
    arr, problem = check_column(times, prefix[0]["items"], name="", where=lambda i: f"[0][{i}]", required=True)
    if problem is not None:
        raise problem.error(path)
    if len(sizes) != len(times):
        raise InputError("sizes and times differ in length", file=path, column="[1]",
                         expected=f"{len(times)} rows (one per time)", found=f"{len(sizes)} rows")
    _, problem = check_column(sizes, {"type": "array"}, name="", where=lambda i: f"[1][{i}]", required=True)
    if problem is not None:
        raise problem.error(path)
    width = len(sizes[0]) if sizes else 0
    odd = next((i for i, row in enumerate(sizes) if len(row) != width), None)
    if odd is not None:
        raise InputError("rows of sizes differ in width", file=path, column=f"[1][{odd}]",
                         expected=f"{width} values (one per category)", found=f"{len(sizes[odd])} values")
    flat = [v for row in sizes for v in row]
    _, problem = check_column(flat, prefix[1]["items"]["items"], name="",
                              where=lambda i: f"[1][{i // width}][{i % width}]", required=True)
    if problem is not None:
        raise problem.error(path)
    totals = np.asarray(flat, dtype=np.int64).reshape(len(sizes), width).sum(axis=1) if width else \
        np.zeros(len(sizes), dtype=np.int64)
    t = _ints(arr, len(times)) * 1000
    frame = Table({
        "t_ns": Ints.of(t),
        "allocated": Ints.of(totals),
        "reserved": Ints.absent(len(t)),
        "active": Ints.absent(len(t)),
    })
    device = DeviceModel(device="unknown", series={COMPONENT: Series(COMPONENT, frame, str(path))})
    return Profile(path=str(path), format=TIMELINE_FORMAT, rank=_rank_of(path), devices=(device,),
                   metadata={"categories": width, "note": "export_memory_timeline does not record the device",
                             "not_measurable": dict(_TIMELINE_GAPS)})


# ---- export_memory_timeline, raw form -------------------------------------------------------------

RAW_TIMELINE_FORMAT = "torch_memory_timeline_raw"
RAW_SCHEMA = "torch_memory_timeline_raw"
_RAW_BATCH = 1 << 16  # rows checked and converted at once
PREEXISTING, CREATE, INCREMENT_VERSION, DESTROY = 1, 2, 3, 4  # torch.profiler._memory_profiler.Action
_TIMELINE_GAPS = {
    key: "the memory timeline records sizes by category, not which allocation a free releases nor which "
         "operator allocated it (the Kineto trace of the same run has both)"
    for key in ("leaked_bytes", "leak_undetermined_bytes", "op_max_block_bytes", "top_at_peak")}


def load_raw_timeline(path: Path) -> Profile:
    """``*.raw.json.gz`` of ``prof.export_memory_timeline``: ``[t_ns, action, bytes, category]`` rows.

    The allocator series is the running sum of bytes, one sample per row in time order (rows of
    memory that existed before profiling, t = -1, at the first time of the file). The device is not
    recorded: ``unknown``. A ``*.raw.json`` holding the ``[times, sizes]`` form (what torch writes
    for that name without ``.gz``) is read as that form.
    """
    check_readable(path)
    limits.check_file_size(path)
    if _coalesced_form(path):
        return load_timeline(path)
    props = resolve(load_schema(RAW_SCHEMA)["$defs"]["row"], load_schema(RAW_SCHEMA))["prefixItems"]
    columns: list[list[np.ndarray]] = [[], [], [], []]
    batch: list[Any] = []
    done = 0
    max_rows = limits.current().max_rows
    with _open(path) as fh, _ijson_errors(path, path.name.lower().endswith(".gz"), lambda: f"[{done + len(batch)}]",
                                          "item", lambda: done + len(batch)):
        for row in ijson.items(guard(fh, path), "item"):
            batch.append(row)
            if len(batch) == _RAW_BATCH:
                _raw_rows(path, batch, done, props, columns, max_rows)
                done += len(batch)
                batch = []
    _raw_rows(path, batch, done, props, columns, max_rows)
    t, action, nbytes, _ = (np.concatenate(c) if c else np.zeros(0, np.int64) for c in columns)
    frame, note = _raw_series(path, t, action, nbytes)
    device = DeviceModel(device="unknown", series={COMPONENT: Series(COMPONENT, frame, str(path))})
    metadata = {"rows": len(t), "note": "export_memory_timeline does not record the device",
                "not_measurable": dict(_TIMELINE_GAPS)}
    if note:
        metadata["times_note"] = note
    return Profile(path=str(path), format=RAW_TIMELINE_FORMAT, rank=_rank_of(path), devices=(device,),
                   metadata=metadata)


def _coalesced_form(path: Path) -> bool:
    """Does the file hold ``[times, sizes]`` (its second element an array of arrays, or empty)
    rather than rows? Read until the second element's first token; a malformed file is left to the
    raw reader, which names its error."""
    try:
        with _open(path) as fh:
            elements = 0
            for prefix, event, _ in ijson.parse(guard(fh, path)):
                if prefix == "item" and event in ("start_array", "end_array") and elements == 2:
                    return bool(event == "end_array")  # [[], []]: the [times, sizes] of an empty timeline
                if prefix == "item.item" and elements == 2:
                    return bool(event == "start_array")
                if prefix == "item" and event == "start_array":
                    elements += 1
                elif prefix == "" and event == "end_array":
                    return False
    except (ijson.JSONError, InputError, EOFError, OSError, zlib.error, UnicodeDecodeError, RecursionError):
        return False
    return False


def _raw_rows(path: Path, rows: list[Any], first: int, props: list[Mapping[str, Any]],
              columns: list[list[np.ndarray]], max_rows: int) -> None:
    """Check a batch of rows (row ``first`` the first) against the schema; append its columns as int64."""
    if not rows:
        return
    if first + len(rows) > max_rows:
        limits.check_rows(path, first + len(rows), what="timeline rows", column=f"[{max_rows}]")
    bad = next((i for i, row in enumerate(rows) if type(row) is not list or len(row) != 4), None) \
        if set(map(type, rows)) != {list} or set(map(len, rows)) != {4} else None
    if bad is not None:
        row = rows[bad]
        raise InputError("a raw memory timeline row is [t, action, bytes, category]", file=path,
                         column=f"[{first + bad}]", expected="an array of 4 integers",
                         found=f"an array of {len(row)}" if isinstance(row, list) else row)
    problems = []
    arrays = []
    for k, values in enumerate(zip(*rows, strict=True)):
        arr, problem = check_column(list(values), props[k], name="", where=partial(_cell, first, k), required=True)
        if problem is not None:
            problems.append(problem)
        arrays.append(arr)
    if problems:
        raise min(problems, key=lambda p: p.index).error(path)
    for k, arr in enumerate(arrays):
        columns[k].append(_ints(arr, len(rows)))


def _cell(first: int, column: int, i: int) -> str:
    return f"[{first + i}][{column}]"


def _raw_series(path: Path, t: np.ndarray, action: np.ndarray, nbytes: np.ndarray) -> tuple[Table, str | None]:
    """The allocator series of raw rows (checked against the file's own rules), and a note on its times."""
    def fail(mask: np.ndarray, message: str, expected: str, column: int) -> None:
        hits = np.flatnonzero(mask)
        if len(hits):
            row = int(hits[0])
            raise InputError(message, file=path, column=f"[{row}][{column}]", expected=expected,
                             found=f"[{t[row]}, {action[row]}, {nbytes[row]}, ...]")

    fail((t == -1) != (action == PREEXISTING), "t is -1 exactly for PREEXISTING rows (memory from before profiling)",
         "t = -1 with action 1 (PREEXISTING), a time in ns with the others", 0)
    fail(((action == PREEXISTING) | (action == CREATE)) & (nbytes < 0), "a PREEXISTING or CREATE row frees bytes",
         "bytes >= 0", 2)
    fail((action == DESTROY) & (nbytes > 0), "a DESTROY row allocates bytes", "bytes <= 0", 2)
    versions = np.flatnonzero(action == INCREMENT_VERSION)  # pairs: -n in the old version's category, +n in the new
    old, new = versions[0::2], versions[1::2]
    odd = np.zeros(len(t), dtype=bool)
    if len(old) > len(new):
        odd[old[-1]] = True
    k = min(len(old), len(new))
    broken = (new[:k] != old[:k] + 1) | (t[new[:k]] != t[old[:k]]) | (nbytes[new[:k]] != -nbytes[old[:k]]) | \
        (nbytes[old[:k]] > 0)
    odd[old[:k][broken]] = True
    fail(odd, "an INCREMENT_VERSION row without its pair", "INCREMENT_VERSION rows in pairs at one t: -bytes, then "
         "+bytes", 2)
    if float(np.abs(nbytes.astype(np.float64)).sum()) >= 2.0**63:
        raise InputError("the bytes of the rows add up past int64", file=path,
                         expected="a running total that fits int64", found=f"{len(nbytes)} rows")
    timed = t[t >= 0]
    note = None
    if len(timed):
        start = int(timed.min())
    else:
        start, note = 0, "no row has a time (only PREEXISTING rows): every sample is at t = 0"
    t_ns = np.where(t >= 0, t, start)
    order = np.argsort(t_ns, kind="stable")
    allocated = np.cumsum(nbytes[order])
    below = np.flatnonzero(allocated < 0)
    if len(below):
        row = int(order[below[0]])
        raise InputError("memory below zero: a row frees bytes the timeline never allocated", file=path,
                         column=f"[{row}][2]", expected="a running total of bytes >= 0 (PREEXISTING rows hold what "
                         "existed before profiling)", found=f"{int(allocated[below[0]])} bytes after this row")
    frame = Table({"t_ns": Ints.of(t_ns[order]), "allocated": Ints.of(allocated),
                   "reserved": Ints.absent(len(t)), "active": Ints.absent(len(t))})
    return frame, note


discover.register(discover.Format(FORMAT, claims, load, rank_hint=_rank_of, named=_is_trace_name))
discover.register(discover.Format(RAW_TIMELINE_FORMAT, claims_raw_timeline, load_raw_timeline))
discover.register(discover.Format(TIMELINE_FORMAT, claims_timeline, load_timeline))

"""Stream the top-level array of a (possibly multi-gigabyte) JSON file, one element at a time.

Never ``json.load`` a whole trace: ijson's C backend walks the bytes and yields each element.
On a syntax error the file is re-read only to locate the line and column, when that is cheap.

ijson gets the bytes through :class:`GuardedReader`, which refuses (as an InputError) JSON nested
deeper than :data:`MAX_DEPTH`, a string longer than :data:`MAX_STRING` bytes and a number longer
than :data:`MAX_NUMBER` *before* ijson builds it: ijson's C backend builds a prefix path per level,
so its memory grows with the square of the depth (10^4 levels take ~250 MB, 10^5 several GB), and
its time with the square of a string's length. A UTF-8 byte order mark before the JSON is skipped (RFC 8259 allows a
parser to ignore one).

Numbers are exact: ijson hands a number with a fraction or exponent over as a ``Decimal`` (never a
float: a µs timestamp of 19 digits loses tens of ns in one), the json module's readers take
:class:`NumberText` (the number's text) as ``parse_float``.

Duplicate keys: RFC 8259 leaves an object that names a key twice undefined, and Python's readers
keep the last value, so a second ``"Bytes"`` would change a peak without a word. An object may
repeat a key with the same value (Kineto writes some keys twice); a key repeated with another value
is an InputError naming the object's JSON path and the key. The json module checks each object in
its ``object_pairs_hook`` (:func:`unique_pairs`: one ``dict`` and two ``len`` per object, ~20 % of
the parse), ijson through a ``map_type`` whose ``__setitem__`` notes a key it already holds
(:func:`unique_keys`), checked once the element is complete (:func:`first_conflict`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import IO, Any, Protocol

import ijson
import numpy as np

from memgate.errors import InputError, show
from memgate.readers import limits
from memgate.readers.files import check_readable

# Past this size a syntax error names the element index only: locating it means json.loads of the
# whole file, whose objects take ~10x the file's size.
_LOCATE_LIMIT = 16 << 20
MAX_DEPTH = 512  # profiler traces nest a handful of levels (event > args > list)
# ijson's C backend copies a string once per buffer it spans (8 MiB: 0.6 s, 16 MiB: 2.3 s; 8 MiB
# of escapes: 7 s), and without use_float it crashes (SIGSEGV) on an integer of more than 4300
# digits (Python's int_max_str_digits).
MAX_STRING = 4 << 20  # bytes of one string (stacks and names are KBs)
MAX_NUMBER = 4000  # bytes of one number or literal at most; also no longer run of digits anywhere
BOM = b"\xef\xbb\xbf"
_KEEP = b'"[]{}\n'  # newlines too: counted from the kept bytes (a tenth of the chunk), for error lines
_DELETE = bytes(b for b in range(256) if b not in _KEEP)
JSON_WHITESPACE = b" \t\n\r"  # RFC 8259's four (bytes.strip() would also take \v and \f)
_SEPARATORS = (b'"', b",", b":", b"[", b"]", b"{", b"}", b" ", b"\n", b"\r", b"\t")
_DIGIT_MAP = bytes(ord("0") if ord("0") <= b <= ord("9") else ord(" ") for b in range(256))
_DIGIT_RUN = b"0" * (MAX_NUMBER + 1)
# A run of MAX_NUMBER + 1 digits covers MAX_NUMBER // _STRIDE bytes in a row of chunk[::_STRIDE]: only a
# chunk whose sample shows that is searched byte by byte (translating all of it costs 40% of a scan).
_STRIDE = 500
_SAMPLED_RUN = b"0" * (MAX_NUMBER // _STRIDE)


class Readable(Protocol):
    """What the readers here need of a binary stream (a file, a gzip stream, limits.InflateCap)."""

    def read(self, size: int = -1, /) -> bytes: ...


class JsonLimitError(InputError):
    """The JSON nests too deeply or holds a too-long token (raised by :class:`GuardedReader`).

    ``line`` is the file's line of the byte that breaks the limit, ``offset`` the byte itself (from
    the file's start) and ``char`` its character in that line (None where the line began more than a
    read earlier: a minified trace is one line, and the offset then says where).
    """

    def __init__(self, message: str, *, file: Path | None, line: int, offset: int, char: int | None,
                 expected: str, found: str) -> None:
        super().__init__(message, file=file, line=line, column=f"byte {offset}", expected=expected, found=found)
        self.offset = offset
        self.char = char

    def located(self, path: Path, where: str) -> InputError:
        """The error for ``path`` with the JSON path of the element the parser was reading (the byte
        is in it or in one after it: the parser reads ahead)."""
        at = f" at char {self.char}" if self.char is not None else ""
        return InputError(f"{self.message}{at}", file=path, line=self.line,
                          column=f"{where} or later (byte {self.offset})", expected=self.expected, found=self.found)


class GuardedReader:
    """A binary file wrapper for ijson that checks nesting depth and token length as bytes pass.

    Per chunk, a few C-level bytes operations (about a tenth of ijson's own time): drop escaped
    quotes, keep only quotes, brackets and newlines (counted for the line an error names), drop
    adjacent quote pairs (an empty string or an empty gap between two strings: neither changes which
    brackets are inside a string), then count the brackets outside strings. Only a chunk that could
    pass the depth cap is scanned exactly.
    """

    def __init__(self, raw: Readable, path: Path | None = None, *, max_depth: int = MAX_DEPTH,
                 max_string: int = MAX_STRING) -> None:
        self._raw = raw
        self.path = path
        self.max_depth = max_depth
        self.max_string = max_string
        self.depth = 0
        self.offset = 0  # bytes handed to the parser so far
        self._in_string = False
        self._escaped = False  # the previous chunk ended on an unpaired backslash
        self._run = 0  # bytes of the token still open at the end of the last chunk
        self._started = False
        self._skipped = 0  # a byte order mark's bytes, before offset 0
        # Where the bytes read so far end, in lines: the line count and the offset its last line
        # starts at. Two C passes per chunk, so a limit error can name a line without a second read.
        self._newlines = 0
        self._line_start = 0
        self.last_blank = False  # the last read was JSON whitespace only, between tokens (not in a string)

    def read(self, size: int = -1) -> bytes:
        chunk = self._raw.read(size)
        if not self._started and chunk:
            self._started = True
            if chunk.startswith(BOM):
                chunk, self._skipped = chunk[len(BOM):], len(BOM)
        self.last_blank = bool(chunk) and not self._in_string and not self._escaped and is_json_whitespace(chunk)
        if chunk:
            newlines = self._scan_blank(chunk) if self.last_blank else self._scan(chunk)
            if newlines:
                self._newlines += newlines
                self._line_start = self.offset + chunk.rfind(b"\n") + 1
            self.offset += len(chunk)
        return chunk

    def _scan_blank(self, chunk: bytes) -> int:
        """:meth:`_scan` of a chunk of whitespace between tokens, in one C pass: it ends any number that
        was open (checked at the last read's end) and changes no depth."""
        self._run = 0
        return chunk.count(b"\n")

    def _scan(self, chunk: bytes) -> int:
        """Check ``chunk``; return how many newlines it holds."""
        if _has_digit_run(chunk):  # a run inside one chunk; across chunks: self._run
            at = chunk.translate(_DIGIT_MAP).find(_DIGIT_RUN)
            start = at if at > 0 or self._in_string else -self._run  # the number may have begun a chunk earlier
            raise self._error(f"a JSON token is too long (a run of over {MAX_NUMBER} digits)", chunk, start,
                              f"numbers of at most {MAX_NUMBER} digits", f"a number of over {MAX_NUMBER} digits")
        escaped_at_start = self._escaped
        data = chunk
        if self._escaped:
            data, self._escaped = data[1:], False
        if b"\\" in data:
            data = data.replace(b"\\\\", b"")
            if data.endswith(b"\\"):
                data, self._escaped = data[:-1], True
            data = data.replace(b'\\"', b"")
        start_in_string = self._in_string
        if self._run:
            self._check_continued(chunk, data, start_in_string)
        kept = data.translate(None, _DELETE).replace(b'""', b"")
        newlines = kept.count(b"\n")  # escapes hold none (a string cannot hold a raw newline)
        quotes = kept.count(b'"')
        if quotes:
            outside = b"".join(kept.split(b'"')[1 if start_in_string else 0::2])
            self._in_string = start_in_string != bool(quotes & 1)
        else:
            outside = b"" if start_in_string else kept
        opens = outside.count(b"[") + outside.count(b"{")
        if self.depth + opens > self.max_depth:
            self._exact_depth(outside, chunk, start_in_string, escaped_at_start)
        self.depth += opens - outside.count(b"]") - outside.count(b"}")
        # The token open at the chunk's end: a string since its quote, else a number since a separator.
        if self._in_string:
            last, cap = data.rfind(b'"'), self.max_string
        else:
            last, cap = max(data.rfind(s) for s in _SEPARATORS), MAX_NUMBER
        self._run = self._run + len(chunk) if last < 0 else len(data) - last - 1
        if self._run > cap:
            # A number's bytes are the data's last ones (escapes are only in strings): its start is
            # exact; a string's is where it passed the cap (escapes were dropped from its count).
            start = len(chunk) - self._run if not self._in_string else len(chunk) - 1
            raise self._too_long(self._in_string, chunk, start)
        return newlines

    def _check_continued(self, chunk: bytes, data: bytes, in_string: bool) -> None:
        """The token left open at the last read's end goes on in this chunk up to its first quote (a
        string) or separator (a number): checked whole, not only at the ends of reads, which would let
        a number of twice the cap through (ijson's C backend crashes on one of 4300 digits)."""
        cap = self.max_string if in_string else MAX_NUMBER
        window = data[:cap - self._run + 1]  # the cap is passed if no end is in here
        ends = (window.find(b'"'),) if in_string else (window.find(s) for s in _SEPARATORS)
        rest = min((i for i in ends if i >= 0), default=len(window))
        if self._run + rest <= cap:
            return
        # a string where it passed the cap (escapes were dropped from the count); a number at its
        # first byte, a read or more back
        raise self._too_long(in_string, chunk, min(cap - self._run, len(chunk) - 1) if in_string else -self._run)

    def _too_long(self, in_string: bool, chunk: bytes, at: int) -> JsonLimitError:
        """The error for a string or number token past its cap, at ``at`` (:meth:`_error`)."""
        what = f"a string over {self.max_string >> 20} MiB" if in_string else f"a number over {MAX_NUMBER} bytes"
        return self._error(f"a JSON token is too long ({what})", chunk, at,
                           f"strings of at most {self.max_string >> 20} MiB and numbers of at most {MAX_NUMBER} bytes",
                           what)

    def _exact_depth(self, outside: bytes, chunk: bytes, in_string: bool, escaped: bool) -> None:
        codes = np.frombuffer(outside, dtype=np.uint8)
        step = np.zeros(len(codes), dtype=np.int64)
        step[(codes == ord("[")) | (codes == ord("{"))] = 1
        step[(codes == ord("]")) | (codes == ord("}"))] = -1
        if self.depth + int(np.cumsum(step).max(initial=0)) > self.max_depth:
            at = _deepening(chunk, self.depth, self.max_depth, in_string, escaped)
            raise self._error(f"JSON nested deeper than {self.max_depth} levels", chunk, at,
                              f"at most {self.max_depth} nested arrays/objects (a profiler trace nests a few)",
                              f"an array or object opened at level {self.max_depth + 1}")

    def _error(self, message: str, chunk: bytes, at: int, expected: str, found: str) -> JsonLimitError:
        """The error for the byte at ``at`` in ``chunk`` (negative: that far back in earlier chunks)."""
        offset = self.offset + at
        if at >= 0:
            line = self._newlines + chunk.count(b"\n", 0, at) + 1
            newline = chunk.rfind(b"\n", 0, at)
            begins = self.offset + newline + 1 if newline >= 0 else self._line_start
        else:  # before this chunk: counted up to its start (a number holds no newline)
            line, begins = self._newlines + 1, self._line_start
        # The character in its line, where the line's bytes are at hand (in this chunk).
        char = len(chunk[begins - self.offset:at].decode("utf-8", "replace")) + 1 if begins >= self.offset else None
        return JsonLimitError(message, file=self.path, line=line, offset=offset + self._skipped, char=char,
                              expected=expected, found=found)


def _deepening(chunk: bytes, depth: int, max_depth: int, in_string: bool, escaped: bool) -> int:
    """The index in ``chunk`` of the bracket that opens level ``max_depth + 1``, reading from
    ``depth`` levels and the string state at the chunk's start (only on the error path: a loop)."""
    for i, byte in enumerate(chunk):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > max_depth:
                return i
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return len(chunk) - 1  # not reached: the fast count said the level is passed in this chunk


def is_json_whitespace(data: bytes) -> bool:
    """Is ``data`` (not empty) JSON's four whitespace bytes only? ``bytes.isspace`` stops at the first other
    byte, where a translate would copy the whole chunk (~6 ms per 8 MiB read, on every read); it also
    takes \\v and \\f, which JSON does not."""
    return data.isspace() and b"\x0b" not in data and b"\x0c" not in data


def _has_digit_run(chunk: bytes) -> bool:
    return _SAMPLED_RUN in chunk[::_STRIDE].translate(_DIGIT_MAP) and _DIGIT_RUN in chunk.translate(_DIGIT_MAP)


def guard(fh: Readable, path: Path | None = None) -> GuardedReader:
    """Wrap a binary stream for ijson (kineto's loader and :func:`iter_array` read through this)."""
    return GuardedReader(fh, path)


def iter_array(path: Path, prefix: str = "item", fh: IO[bytes] | None = None) -> Iterator[Any]:
    """Yield the elements under ``prefix`` (``item`` = the top-level array's elements).

    Numbers with a fraction are ``Decimal`` (exact); objects are dicts (of a subclass that notes
    repeated keys: an element with a key repeated with another value is an InputError).
    """
    check_readable(path)
    limits.check_file_size(path)
    max_rows = limits.current().max_rows
    own = fh is None
    stream = open(path, "rb") if fh is None else fh  # noqa: SIM115 - closed in the finally below
    index = -1
    keys, seen = unique_keys()
    try:
        for index, element in enumerate(ijson.items(guard(stream, path), prefix, map_type=keys)):
            if index >= max_rows:
                limits.check_rows(path, index + 1, what="elements", column=_json_path(prefix, index))
            if seen:
                conflict = first_conflict(seen, element, _json_path(prefix, index), path)
                if conflict is not None:
                    raise conflict
            yield element
    except JsonLimitError as exc:
        raise exc.located(path, _json_path(prefix, index + 1)) from None
    except ijson.JSONError as exc:  # IncompleteJSONError is a subclass
        raise syntax_error(path, exc, index + 1, prefix=prefix) from None
    except UnicodeDecodeError:
        raise not_utf8(path, _json_path(prefix, index + 1)) from None
    except RecursionError:
        raise InputError("JSON nested too deeply", file=path) from None
    finally:
        if own:
            stream.close()


def top_level_kind(path: Path) -> str:
    """``array``, ``object`` or ``other`` from the first non-blank byte."""
    check_readable(path)
    with open(path, "rb") as fh:
        head = fh.read(4096).removeprefix(BOM).lstrip(b" \t\r\n")
    return {b"[": "array", b"{": "object"}.get(head[:1], "other")


def syntax_error(path: Path, exc: Exception, element: int, *, prefix: str = "item",
                 escaped: bool = False) -> InputError:
    """An InputError for a JSON syntax error met while streaming element ``element`` under ``prefix``.

    A file that ends early (a trace cut off by a full disk or a killed job) says so, with the line
    it ends on; other errors are located by line and character when the file is small enough
    (``escaped``: in the file as :func:`escape_names` repairs it, which keeps its lines).
    """
    where = _json_path(prefix, element)
    size = path.stat().st_size
    if _is_premature_end(exc):
        return InputError(
            f"truncated JSON: the file ends inside element {where}",
            file=path, line=_count_lines(path), column=where,
            expected="the rest of the array and its closing ']'", found=f"end of file after {size} bytes",
        )
    if size <= _LOCATE_LIMIT:
        try:
            with open(path, "rb") as fh:
                data = fh.read().removeprefix(BOM)
                json.loads(escape_names(data) if escaped else data)
        except json.JSONDecodeError as located:
            return InputError(f"invalid JSON at char {located.colno}: {located.msg}", file=path,
                              line=located.lineno, column=where)
        except (RecursionError, UnicodeDecodeError, ValueError):
            pass
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return InputError(f"invalid JSON: {reason}", file=path, column=where)


def not_utf8(path: Path, where: str) -> InputError:
    """The error for bytes ijson cannot decode: a byte that is not UTF-8, or an escape of half a
    surrogate pair (``\\udc00`` alone names no character; ijson decodes it to such bytes)."""
    return InputError("file is not UTF-8 text, or a string escapes half a surrogate pair (\\ud800-\\udfff alone)",
                      file=path, column=where, expected="UTF-8 JSON whose \\u escapes name characters")


def _json_path(prefix: str, element: int) -> str:
    """``item`` → ``[12]``, ``traceEvents.item`` → ``traceEvents[12]`` (the DESIGN's JSON-path form)."""
    base = prefix[: -len("item")].rstrip(".") if prefix.endswith("item") else prefix
    return f"{base.replace('.item.', '[].').replace('.item', '[]')}[{element}]"


def _is_premature_end(exc: Exception) -> bool:
    # yajl backends: "parse error: premature EOF"; the pure-Python backend: "Incomplete JSON content"
    text = str(exc)
    return "premature EOF" in text or "Incomplete JSON content" in text


def _count_lines(path: Path) -> int:
    """1-based number of the file's last line (only on the error path: one pass over the bytes)."""
    lines, last = 1, b""
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 22):
            lines += chunk.count(b"\n")
            last = chunk
    return lines - 1 if last.endswith(b"\n") else lines


# ---- torch's unescaped names -----------------------------------------------------------------------

# torch writes each event's name on a line of its own, unescaped: with the Python tracer on, a
# frame name can hold quotes (seen in torch 2.13: `"name": "torch/profiler/_cupti_monitor.py(0):     "seed",",`).
_NAME_LINE = re.compile(rb'^(\s*"name": ")(.*)("(?:,)?)$', re.MULTILINE)
_PLAIN_NAME = re.compile(rb'[^"\\\x00-\x1f]*')  # a valid JSON string's inside without a quote or escape
_REPAIR_LINE_MAX = 2 * MAX_STRING  # a longer line is passed on as it is (no name line is that long)


def escape_names(raw: bytes) -> bytes:
    """The trace with every ``"name"`` value that is not a valid JSON string escaped as one."""
    return _NAME_LINE.sub(_escape_name, raw)


def _escape_name(match: re.Match[bytes]) -> bytes:
    inner = match.group(2)
    if _PLAIN_NAME.fullmatch(inner):
        return match.group(0)  # the common case, without a parse
    try:
        json.loads(b'"' + inner + b'"')
        return match.group(0)
    except json.JSONDecodeError:
        text = json.dumps(inner.decode("utf-8", "replace"), ensure_ascii=False)[1:-1]
        return match.group(1) + text.encode("utf-8") + match.group(3)


class NameRepair:
    """A binary stream with :func:`escape_names` applied line by line as the bytes pass (lines and
    their count are kept, so a later error names the file's own line). Memory: a chunk and the line
    it ends in; a line longer than twice MAX_STRING is passed on unrepaired. ``repaired``: the lines
    changed so far (1-based line numbers, the first 20)."""

    def __init__(self, raw: Readable) -> None:
        self._raw = raw
        self._pending = b""  # the start of a line not yet complete
        self._passing = False  # inside a line too long to be a name line: passed on as it comes
        self._out = bytearray()
        self._lines = 0  # complete lines passed on
        self.count = 0
        self.repaired: list[int] = []
        self.raw_offset = 0  # bytes read from the raw stream

    @property
    def done(self) -> int:
        """Bytes of the raw stream whose lines are repaired and passed on."""
        return self.raw_offset - len(self._pending)

    def read(self, size: int = -1, /) -> bytes:
        whole = size is None or size < 0
        want = 1 << 20 if whole else max(size, 1)
        while whole or len(self._out) < want:
            chunk = self._raw.read(max(want, 1 << 16))
            if not chunk:
                self._flush(self._pending, final=True)
                self._pending = b""
                break
            self.raw_offset += len(chunk)
            self._feed(chunk)
        out = bytes(self._out if whole else self._out[:want])
        del self._out[:len(out)]
        return out

    def _feed(self, chunk: bytes) -> None:
        if self._passing:
            line_end = chunk.find(b"\n") + 1
            if not line_end:
                self._out += chunk
                return
            self._out += chunk[:line_end]
            self._lines += 1
            self._passing = False
            chunk = chunk[line_end:]
        end = chunk.rfind(b"\n") + 1
        if not end:
            self._pending += chunk
            if len(self._pending) > _REPAIR_LINE_MAX:
                self._out += self._pending
                self._pending, self._passing = b"", True
            return
        self._flush(self._pending + chunk[:end], final=False)
        self._pending = chunk[end:]

    def _flush(self, lines: bytes, *, final: bool) -> None:
        if not lines:
            return
        first = self._lines
        fixed = _NAME_LINE.sub(_noting_escape(self, lines, first), lines)
        self._out += fixed
        self._lines += lines.count(b"\n") + (1 if final and not lines.endswith(b"\n") else 0)


def _noting_escape(stream: NameRepair, lines: bytes, first: int) -> Any:
    """The substitution for :class:`NameRepair`: :func:`_escape_name`, noting each line it changes."""

    def escape(match: re.Match[bytes]) -> bytes:
        out = _escape_name(match)
        if out != match.group(0):
            stream.count += 1
            if len(stream.repaired) < 20:
                stream.repaired.append(first + lines.count(b"\n", 0, match.start()) + 1)
        return out

    return escape


# ---- exact numbers and duplicate keys -------------------------------------------------------------


class NumberText(str):
    """A JSON number with a fraction or exponent, as the json module reads it with
    ``parse_float=NumberText``: its text, exact (``Decimal(text)``), cheaper to build than a Decimal."""

    __slots__ = ()


class DuplicateKey(Exception):
    """An object names ``key`` twice with different values (raised by :func:`unique_pairs`)."""

    def __init__(self, key: str, first: Any, second: Any) -> None:
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def _kind(value: Any) -> str:
    kind = type(value)
    if kind is bool or value is None:
        return "literal"
    if kind is int or kind is float or kind is Decimal or kind is NumberText:
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    return "object" if isinstance(value, dict) else kind.__name__


def same_json(a: Any, b: Any) -> bool:
    """Are ``a`` and ``b`` the same JSON value? Numbers by value (``1``, ``1.0`` and ``1e0`` are one
    number; ``true`` is not ``1``), objects whatever their key order. Iterative: any depth."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        kind = _kind(x)
        if kind != _kind(y):
            return False
        if kind == "number":
            try:
                if Decimal(x) != Decimal(y):
                    return False
            except (InvalidOperation, ValueError):
                return False
        elif kind == "array":
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y))
        elif kind == "object":
            if x.keys() != y.keys():
                return False
            stack.extend((x[k], y[k]) for k in x)
        elif x != y or (kind == "literal" and x is not y):
            return False
    return True


def unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for the json module: the object, or DuplicateKey for a key it names twice
    with different values (the same value twice is fine)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        first: dict[str, Any] = {}
        for key, value in pairs:
            if key in first and not same_json(first[key], value):
                raise DuplicateKey(key, first[key], value)
            first.setdefault(key, value)
    return obj


# (object, key, value it held, value set again): the repeats a unique_keys() map met, in file order
Repeats = list[tuple[dict[Any, Any], Any, Any, Any]]


def unique_keys() -> tuple[type[dict[Any, Any]], Repeats]:
    """A ``map_type`` for ijson whose objects note each key set twice, and the list they note them in.

    ijson's builder sets a member when its value starts (an object or array is still empty then),
    so repeats are judged by :func:`first_conflict` once the element they are in is complete.
    """
    seen: Repeats = []
    note = seen.append
    get = dict.__getitem__
    put = dict.__setitem__

    class UniqueKeys(dict[Any, Any]):
        __slots__ = ()

        def __setitem__(self, key: Any, value: Any) -> None:
            if key in self:
                note((self, key, get(self, key), value))
            put(self, key, value)

    return UniqueKeys, seen


def first_conflict(seen: Repeats, root: Any, where: str, path: Path | None) -> InputError | None:
    """The InputError for the first key ``root`` (the complete element at JSON path ``where``)
    repeats with another value, or None when each of its repeats holds the same value.

    ijson builds the elements of a whole buffer before it yields the first of them, so ``seen`` may
    hold repeats of later elements too: those stay in it for their element's turn.
    """
    paths = _object_paths(root, where)
    later: Repeats = []
    conflict = None
    for repeat in seen:
        obj, key, first, second = repeat
        at = paths.get(id(obj))
        if at is None:
            later.append(repeat)
        elif conflict is None and not same_json(first, second):
            conflict = duplicate_key_error(path, at, key, first, second)
    seen[:] = later
    return conflict


def duplicate_key_error(path: Path | None, where: str, key: Any, first: Any, second: Any) -> InputError:
    name = show(key, 60)
    return InputError(
        f"conflicting duplicate key {name}: the object names it twice with different values", file=path,
        column=_join(where, key if isinstance(key, str) and len(key) <= 60 else name),
        expected="each key once, or repeated with the same value (a JSON reader keeps only the last one)",
        found=f"{_shown(first)}, then {_shown(second)}")


class Shown(str):
    """A value already written as text for a message (duplicate_key_error shows it as it is)."""

    __slots__ = ()


def _shown(value: Any) -> str:
    return str(value) if isinstance(value, Shown) else show(value, 36)


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _object_paths(root: Any, where: str) -> dict[int, str]:
    """id() -> JSON path of every object in ``root`` (the error path and elements with repeats only)."""
    out: dict[int, str] = {}
    stack: list[tuple[Any, str]] = [(root, where)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            out[id(node)] = at or "(top level)"
            stack.extend((value, _join(at, str(key))) for key, value in node.items()
                         if isinstance(value, (dict, list)))
        elif isinstance(node, list):
            stack.extend((value, f"{at}[{i}]") for i, value in enumerate(node) if isinstance(value, (dict, list)))
    return out


class _Pairs(list[tuple[str, Any]]):
    """An object as its members in file order, repeats kept (``object_pairs_hook`` to locate one)."""


def loads_unique(data: bytes | str, path: Path) -> Any:
    """``json.loads`` of a small document (profiler_info, profiler_metadata) that refuses a key
    repeated with another value, naming it by its JSON path; json's own errors pass through.

    Numbers stay as json reads them (floats): no time is read from these files, and their values
    travel into reports as JSON."""
    try:
        return json.loads(data, object_pairs_hook=unique_pairs)
    except DuplicateKey as exc:
        try:
            _rebuild(json.loads(data, object_pairs_hook=_Pairs), "", path)
        except InputError as located:
            raise located from None
        except RecursionError:
            pass
        raise duplicate_key_error(path, "", exc.key, exc.first, exc.second) from None


def _rebuild(node: Any, where: str, path: Path) -> Any:
    """``node`` (objects as _Pairs) as plain values; InputError at the first object, in the order
    objects end, that repeats a key with another value."""
    if isinstance(node, _Pairs):
        obj: dict[str, Any] = {}
        for key, child in node:
            value = _rebuild(child, _join(where, key), path)
            if key in obj and not same_json(obj[key], value):
                raise duplicate_key_error(path, where, key, obj[key], value)
            obj[key] = value
        return obj
    if isinstance(node, list):
        return [_rebuild(child, f"{where}[{i}]", path) for i, child in enumerate(node)]
    return node

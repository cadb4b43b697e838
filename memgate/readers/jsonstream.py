"""Stream the top-level array of a (possibly multi-gigabyte) JSON file, one element at a time.

Never ``json.load`` a whole trace: ijson's C backend walks the bytes and yields each element.
On a syntax error the file is re-read only to locate the line and column, when that is cheap.

ijson gets the bytes through :class:`GuardedReader`, which refuses (as an InputError) JSON nested
deeper than :data:`MAX_DEPTH`, a string longer than :data:`MAX_STRING` bytes and a number longer
than :data:`MAX_NUMBER` *before* ijson builds it: ijson's C backend builds a prefix path per level,
so its memory grows with the square of the depth (10^4 levels take ~250 MB, 10^5 several GB), and
its time with the square of a string's length. A UTF-8 byte order mark before the JSON is skipped (RFC 8259 allows a
parser to ignore one).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import ijson
import numpy as np

from memgate.errors import InputError
from memgate.readers import limits
from memgate.readers.csvtable import check_readable

# Past this size a syntax error names the element index only: locating it means json.loads of the
# whole file, whose objects take ~10x the file's size.
_LOCATE_LIMIT = 16 << 20
MAX_DEPTH = 512  # profiler traces nest a handful of levels (event > args > list)
# ijson's C backend copies a string once per buffer it spans (8 MiB: 0.6 s, 16 MiB: 2.3 s; 8 MiB
# of escapes: 7 s), and without use_float it crashes (SIGSEGV) on an integer of more than 4300
# digits (Python's int_max_str_digits).
MAX_STRING = 4 << 20  # bytes of one string (stacks and names are KBs)
MAX_NUMBER = 4000  # bytes of one number or literal; also no run of this many digits anywhere
BOM = b"\xef\xbb\xbf"
_KEEP = b'"[]{}'
_DELETE = bytes(b for b in range(256) if b not in _KEEP)
_SEPARATORS = (b'"', b",", b":", b"[", b"]", b"{", b"}", b" ", b"\n", b"\r", b"\t")
_DIGIT_MAP = bytes(ord("0") if ord("0") <= b <= ord("9") else ord(" ") for b in range(256))
_DIGIT_RUN = b"0" * MAX_NUMBER
# A run of MAX_NUMBER digits covers MAX_NUMBER // _STRIDE bytes in a row of chunk[::_STRIDE]: only a
# chunk whose sample shows that is searched byte by byte (translating all of it costs 40% of a scan).
_STRIDE = 500
_SAMPLED_RUN = b"0" * (MAX_NUMBER // _STRIDE)


class JsonLimitError(InputError):
    """The JSON nests too deeply or holds a too-long token (raised by :class:`GuardedReader`)."""


class GuardedReader:
    """A binary file wrapper for ijson that checks nesting depth and token length as bytes pass.

    Per chunk, a few C-level bytes operations (about a tenth of ijson's own time): drop escaped
    quotes, keep only quotes and brackets, drop adjacent quote pairs (an empty string or an empty
    gap between two strings: neither changes which brackets are inside a string), then count the
    brackets outside strings. Only a chunk that could pass the depth cap is scanned exactly.
    """

    def __init__(self, raw: IO[bytes], path: Path | None = None, *, max_depth: int = MAX_DEPTH,
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

    def read(self, size: int = -1) -> bytes:
        chunk = self._raw.read(size)
        if not self._started and chunk:
            self._started = True
            chunk = chunk.removeprefix(BOM)
        if chunk:
            self._scan(chunk)
            self.offset += len(chunk)
        return chunk

    def _scan(self, chunk: bytes) -> None:
        if _has_digit_run(chunk):  # a run inside one chunk; across chunks: self._run
            raise self._error(f"a JSON token is too long (a run of {MAX_NUMBER} digits)", self.offset,
                              f"numbers under {MAX_NUMBER} digits")
        data = chunk
        if self._escaped:
            data, self._escaped = data[1:], False
        if b"\\" in data:
            data = data.replace(b"\\\\", b"")
            if data.endswith(b"\\"):
                data, self._escaped = data[:-1], True
            data = data.replace(b'\\"', b"")
        kept = data.translate(None, _DELETE).replace(b'""', b"")
        quotes = kept.count(b'"')
        start_in_string = self._in_string
        if quotes:
            outside = b"".join(kept.split(b'"')[1 if start_in_string else 0::2])
            self._in_string = start_in_string != bool(quotes & 1)
        else:
            outside = b"" if start_in_string else kept
        opens = outside.count(b"[") + outside.count(b"{")
        if self.depth + opens > self.max_depth:
            self._exact_depth(outside)
        self.depth += opens - outside.count(b"]") - outside.count(b"}")
        # The token open at the chunk's end: a string since its quote, else a number since a separator.
        if self._in_string:
            last, cap, what = data.rfind(b'"'), self.max_string, f"a string over {self.max_string >> 20} MiB"
        else:
            last, cap, what = max(data.rfind(s) for s in _SEPARATORS), MAX_NUMBER, f"a number over {MAX_NUMBER} bytes"
        self._run = self._run + len(chunk) if last < 0 else len(data) - last - 1
        if self._run > cap:
            raise self._error(f"a JSON token is too long ({what})", self.offset + len(chunk),
                              f"strings under {self.max_string >> 20} MiB and numbers under {MAX_NUMBER} bytes")

    def _exact_depth(self, outside: bytes) -> None:
        codes = np.frombuffer(outside, dtype=np.uint8)
        step = np.zeros(len(codes), dtype=np.int64)
        step[(codes == ord("[")) | (codes == ord("{"))] = 1
        step[(codes == ord("]")) | (codes == ord("}"))] = -1
        if self.depth + int(np.cumsum(step).max(initial=0)) > self.max_depth:
            raise self._error(f"JSON nested deeper than {self.max_depth} levels", self.offset,
                              f"at most {self.max_depth} nested arrays/objects (a profiler trace nests a few)")

    def _error(self, message: str, offset: int, expected: str) -> JsonLimitError:
        return JsonLimitError(message, file=self.path, column=f"byte {offset}", expected=expected,
                              found=f"more in the chunk ending at byte {offset}")


def _has_digit_run(chunk: bytes) -> bool:
    return _SAMPLED_RUN in chunk[::_STRIDE].translate(_DIGIT_MAP) and _DIGIT_RUN in chunk.translate(_DIGIT_MAP)


def guard(fh: IO[bytes], path: Path | None = None) -> GuardedReader:
    """Wrap a binary stream for ijson (kineto's loader and :func:`iter_array` read through this)."""
    return GuardedReader(fh, path)


def iter_array(path: Path, prefix: str = "item", fh: IO[bytes] | None = None) -> Iterator[Any]:
    """Yield the elements under ``prefix`` (``item`` = the top-level array's elements)."""
    check_readable(path)
    limits.check_file_size(path)
    max_rows = limits.current().max_rows
    own = fh is None
    stream = open(path, "rb") if fh is None else fh  # noqa: SIM115 - closed in the finally below
    index = -1
    try:
        for index, element in enumerate(ijson.items(guard(stream, path), prefix, use_float=True)):
            if index >= max_rows:
                limits.check_rows(path, index + 1, what="elements", column=_json_path(prefix, index))
            yield element
    except JsonLimitError as exc:
        raise InputError(exc.message, file=path, column=_json_path(prefix, index + 1), expected=exc.expected,
                         found=exc.found) from None
    except ijson.JSONError as exc:  # IncompleteJSONError is a subclass
        raise syntax_error(path, exc, index + 1, prefix=prefix) from None
    except UnicodeDecodeError:
        raise InputError("file is not UTF-8 text", file=path, column=_json_path(prefix, index + 1),
                         expected="UTF-8 JSON") from None
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


def syntax_error(path: Path, exc: Exception, element: int, *, prefix: str = "item") -> InputError:
    """An InputError for a JSON syntax error met while streaming element ``element`` under ``prefix``.

    A file that ends early (a trace cut off by a full disk or a killed job) says so, with the line
    it ends on; other errors are located by line and character when the file is small enough.
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
                json.loads(fh.read().removeprefix(BOM))
        except json.JSONDecodeError as located:
            return InputError(f"invalid JSON at char {located.colno}: {located.msg}", file=path,
                              line=located.lineno, column=where)
        except (RecursionError, UnicodeDecodeError, ValueError):
            pass
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return InputError(f"invalid JSON: {reason}", file=path, column=where)


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

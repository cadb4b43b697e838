"""Stream the top-level array of a (possibly multi-gigabyte) JSON file, one element at a time.

Never ``json.load`` a whole trace: ijson's C backend walks the bytes and yields each element.
On a syntax error the file is re-read only to locate the line and column, when that is cheap.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import ijson

from memgate.csvtable import check_readable
from memgate.errors import InputError

_LOCATE_LIMIT = 256 << 20  # bytes; past this a syntax error names the element index only


def iter_array(path: Path, prefix: str = "item", fh: IO[bytes] | None = None) -> Iterator[Any]:
    """Yield the elements under ``prefix`` (``item`` = the top-level array's elements)."""
    check_readable(path)
    own = fh is None
    stream = open(path, "rb") if fh is None else fh
    index = -1
    try:
        for index, element in enumerate(ijson.items(stream, prefix, use_float=True)):
            yield element
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
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
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
                json.loads(fh.read())
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

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
    except ijson.common.IncompleteJSONError as exc:
        raise syntax_error(path, exc, index + 1) from None
    except ijson.JSONError as exc:
        raise syntax_error(path, exc, index + 1) from None
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


def syntax_error(path: Path, exc: Exception, element: int) -> InputError:
    size = path.stat().st_size
    if size <= _LOCATE_LIMIT:
        try:
            with open(path, "rb") as fh:
                json.loads(fh.read())
        except json.JSONDecodeError as located:
            return InputError(f"invalid JSON: {located.msg}", file=path, line=located.lineno,
                              column=f"char {located.colno}")
        except (RecursionError, UnicodeDecodeError, ValueError):
            pass
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return InputError(f"invalid JSON near element [{element}]: {reason}", file=path)

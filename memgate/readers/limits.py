"""Caps on what memgate reads: bytes per file, rows or events per file, and pickle size.

The defaults are generous (no real profile comes near them); they turn a runaway or hostile file
into a clear InputError instead of an out-of-memory kill. Each has an override through the
environment (the CLI's ``--max-file-size`` and the plugin's ``--memgate-max-file-size`` set them):

- ``MEMGATE_MAX_FILE_BYTES``: bytes per file, a size (``"64 GiB"``, ``"512MiB"``, bare int = bytes).
- ``MEMGATE_MAX_ROWS``: rows (CSV lines, db rows) or events (JSON elements) per file, an integer.
- ``MEMGATE_MAX_PICKLE_BYTES``: a snapshot pickle is unpickled whole, in memory, and a pickle
  builds objects many times its own size (one byte of ``EMPTY_LIST`` is a 56-byte list), so its
  cap is lower. The file cap applies too: the smaller of the two wins.
- ``MEMGATE_MAX_PICKLE_OBJECTS``: the lists, dicts, tuples and sets one pickle may build, an
  integer; by default one per 8 bytes of the file (at least 2^20), which real snapshots stay far
  below (16 to 270 bytes per container) and a run of ``EMPTY_LIST`` bytes (one per byte) does not.
- ``MEMGATE_MAX_PICKLE_MEMORY``: the memory (address space) one unpickling may add to the process,
  a size; by default 32 bytes per byte of the file plus 256 MiB. Real snapshots take 6 to 8 times
  their size; a 9-byte pickle whose ``LONG_BINPUT`` names memo slot 2^29 asks CPython's unpickler
  for an 8 GiB memo. Enforced on Linux (``RLIMIT_AS`` while the pickle loads).

Loaders check the file size before reading (:func:`check_file_size`) and the row count after
parsing (:func:`check_rows`); :func:`read_csv` does both around :func:`memgate.readers.csvtable.read_csv`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memgate.errors import ConfigError, InputError
from memgate.readers.csvtable import Converter, CsvTable
from memgate.readers.csvtable import read_csv as _read_csv
from memgate.sizes import format_size, parse_size

FILE_BYTES_ENV = "MEMGATE_MAX_FILE_BYTES"
ROWS_ENV = "MEMGATE_MAX_ROWS"
PICKLE_BYTES_ENV = "MEMGATE_MAX_PICKLE_BYTES"  # the same variable memgate.readers.safepickle reads
DEFAULT_MAX_FILE_BYTES = 64 << 30
DEFAULT_MAX_ROWS = 2_000_000_000
DEFAULT_MAX_PICKLE_BYTES = 2 << 30
PICKLE_OBJECTS_ENV = "MEMGATE_MAX_PICKLE_OBJECTS"
PICKLE_BYTES_PER_OBJECT = 8
MIN_PICKLE_OBJECTS = 1 << 20
PICKLE_MEMORY_ENV = "MEMGATE_MAX_PICKLE_MEMORY"
PICKLE_MEMORY_PER_BYTE = 32
PICKLE_MEMORY_FLOOR = 256 << 20
FILE_FLAGS = "--max-file-size (CLI) / --memgate-max-file-size (pytest)"
_INTEGER = re.compile(r"\A\s*[0-9][0-9_]*\s*\Z")


@dataclass(frozen=True)
class Limits:
    max_file_bytes: int
    max_rows: int
    max_pickle_bytes: int


def current() -> Limits:
    """The caps in force now (the environment is read on every call: tests and flags may change it)."""
    return Limits(
        max_file_bytes=_size_env(FILE_BYTES_ENV, DEFAULT_MAX_FILE_BYTES),
        max_rows=_int_env(ROWS_ENV, DEFAULT_MAX_ROWS),
        max_pickle_bytes=_size_env(PICKLE_BYTES_ENV, DEFAULT_MAX_PICKLE_BYTES),
    )


def _size_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    value = parse_size(raw, what=f"${name}")
    if value <= 0:
        raise ConfigError(f"invalid ${name}: must be above 0", expected="a size such as 64GiB", found=raw)
    return value


def _int_env(name: str, default: int, what: str = "rows") -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not _INTEGER.match(raw) or int(raw.replace("_", "")) <= 0:
        raise ConfigError(f"invalid ${name}", expected=f"a whole number of {what} above 0", found=repr(raw))
    return int(raw.replace("_", ""))


def max_pickle_bytes() -> int:
    """The cap for a pickle read whole: the pickle cap or the file cap, whichever is smaller."""
    limits = current()
    return min(limits.max_pickle_bytes, limits.max_file_bytes)


def max_pickle_objects(file_bytes: int) -> int:
    """The cap on containers unpickling a ``file_bytes``-byte pickle may build: ``$MEMGATE_MAX_PICKLE_OBJECTS``
    when set, else one per 8 bytes of the file, at least 2^20 (so a small file is never refused for it)."""
    return _int_env(PICKLE_OBJECTS_ENV, max(file_bytes // PICKLE_BYTES_PER_OBJECT, MIN_PICKLE_OBJECTS), "objects")


def max_pickle_memory(file_bytes: int) -> int:
    """The memory unpickling a ``file_bytes``-byte pickle may add: ``$MEMGATE_MAX_PICKLE_MEMORY`` when
    set, else 32 bytes per byte of the file plus 256 MiB."""
    return _size_env(PICKLE_MEMORY_ENV, file_bytes * PICKLE_MEMORY_PER_BYTE + PICKLE_MEMORY_FLOOR)


def check_file_size(path: Path, *, limit: int | None = None, why: str | None = None) -> int:
    """The file's size in bytes; InputError when it is over the cap (checked before any read).

    ``limit``/``why``: a fixed cap for a file kind that is always small (``why`` says so); the
    configurable cap still applies when it is the lower one.
    """
    configured = current().max_file_bytes
    cap = configured if limit is None else min(limit, configured)
    try:
        size = os.stat(path).st_size
    except OSError:
        return 0  # the reader's own checks say what is wrong with a missing or unreadable file
    if size > cap:
        fixed = limit is not None and limit < configured
        how = (why or "a fixed limit") if fixed else f"raise the limit with {FILE_FLAGS} or ${FILE_BYTES_ENV}"
        raise InputError(
            f"file is {format_size(size)}, over the {format_size(cap)} size limit",
            file=path,
            expected=f"at most {cap} bytes ({how})",
            found=f"{size} bytes",
        )
    return size


def check_rows(path: Path, rows: int, *, what: str = "rows", column: str | None = None) -> None:
    """InputError when a file holds more than the row/event cap (checked after parsing)."""
    cap = current().max_rows
    if rows > cap:
        raise InputError(
            f"{rows} {what}, over the limit of {cap}",
            file=path,
            column=column,
            expected=f"at most {cap} {what} per file (raise the limit with ${ROWS_ENV})",
            found=f"{rows} {what}",
        )


def read_csv(path: Path, schema: dict[str, Any], columns: Mapping[str, Converter] | None = None) -> CsvTable:
    """:func:`memgate.readers.csvtable.read_csv` between the size check and the row check."""
    check_file_size(path)
    table = _read_csv(path, schema, columns)
    check_rows(path, table.num_rows)
    return table

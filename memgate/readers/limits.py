"""Caps on what memgate reads: bytes per file, rows or events per file, and pickle size.

The defaults are generous (no real profile comes near them); they turn a runaway or hostile file
into a clear InputError instead of an out-of-memory kill. Each has an override through the
environment (the same for the CLI, the plugin and xdist workers):

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
- ``MEMGATE_MAX_INFLATED_BYTES``: the bytes a compressed file (``*.json.gz``) may decompress to, a
  size; by default 100 times the compressed file (real traces inflate 10 to 20 times; deflate
  at most ~1000 times), at least 16 MiB (the file cap applies to the compressed file). A gzip stream of a few MB can
  inflate to tens of GB, which the file cap alone let a loader read for minutes: now a 1 MB
  bomb stops after 100 MB (:class:`InflateCap`).

Readers check the file size before reading (:func:`check_file_size`) and the row count after
parsing (:func:`check_rows`), :func:`memgate.readers.csvtable.read_csv` included.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from memgate.errors import ConfigError, InputError
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
INFLATED_BYTES_ENV = "MEMGATE_MAX_INFLATED_BYTES"
INFLATE_RATIO = 100
MIN_INFLATED_BYTES = 16 << 20
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


def max_inflated_bytes(compressed_bytes: int) -> int:
    """The bytes a ``compressed_bytes``-byte file may decompress to: ``$MEMGATE_MAX_INFLATED_BYTES``
    when set, else 100 times the file, at least 16 MiB."""
    default = max(compressed_bytes * INFLATE_RATIO, MIN_INFLATED_BYTES)
    return _size_env(INFLATED_BYTES_ENV, default)


class InflateCap:
    """A decompressing stream (``gzip.open(path)``) that stops with an InputError once it has given
    more than :func:`max_inflated_bytes` bytes: never asks its stream for more than one byte past
    the cap, so a gzip bomb costs at most the cap in time and one read's size in memory."""

    def __init__(self, raw: io.BufferedIOBase | IO[bytes], path: Path) -> None:
        self._raw = raw
        self.path = path
        try:
            self.compressed = os.stat(path).st_size
        except OSError:
            self.compressed = 0  # the open that follows says what is wrong
        self.cap = max_inflated_bytes(self.compressed)
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        room = self.cap - self.count + 1
        data = self._raw.read(room if size < 0 or size > room else size)
        self.count += len(data)
        if self.count > self.cap:
            configured = bool(os.environ.get(INFLATED_BYTES_ENV, "").strip())
            how = "" if configured else f"the default: {INFLATE_RATIO}x the compressed file, at least " \
                f"{format_size(MIN_INFLATED_BYTES)}; "
            raise InputError(
                f"the compressed file inflates past the {format_size(self.cap)} limit on decompressed bytes",
                file=self.path,
                expected=f"at most {self.cap} bytes once decompressed ({how}raise the limit with "
                         f"${INFLATED_BYTES_ENV})",
                found=f"more than {self.cap} bytes from a {self.compressed}-byte file",
            )
        return data

    def close(self) -> None:
        self._raw.close()


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
        how = (why or "a fixed limit") if fixed else f"raise the limit with ${FILE_BYTES_ENV}"
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


# --- sqlite query budget ---------------------------------------------------------------------------
# Every sqlite query memgate runs (memgate.readers.sqlitetable.Database.query) stops after this many
# seconds of wall time, checked by a progress handler every 100k VM instructions: a db cannot hang a
# load (a table that is really a VIEW over an endless recursive query is refused before any read; this
# budget is the guard behind that). Rows are capped while they are fetched by ``MEMGATE_MAX_ROWS``.
QUERY_SECONDS_ENV = "MEMGATE_MAX_QUERY_SECONDS"
DEFAULT_MAX_QUERY_SECONDS = 600.0
_SECONDS = re.compile(r"\A\s*[0-9]+(\.[0-9]+)?\s*\Z")


def max_query_seconds() -> float:
    """Seconds one sqlite query may run: ``$MEMGATE_MAX_QUERY_SECONDS`` (a number above 0, decimals
    allowed), else 600 s (the largest real dbs read in well under a minute per query)."""
    raw = os.environ.get(QUERY_SECONDS_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_QUERY_SECONDS
    if not _SECONDS.match(raw) or float(raw) <= 0:
        raise ConfigError(f"invalid ${QUERY_SECONDS_ENV}", expected="a number of seconds above 0 (e.g. 600 or 0.5)",
                          found=repr(raw))
    return float(raw)

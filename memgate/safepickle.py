"""Load a pickle of plain data without ever running code from it.

A memory snapshot from a CI artifact is untrusted input, and ``pickle.load`` runs whatever the
file names (``os.system`` via ``REDUCE``). The Unpickler here refuses every class lookup
(``find_class``, which also guards the ``EXT*`` opcodes) and every persistent id, so only the
opcodes that build dict, list, tuple, str, bytes, int, float, bool and None can succeed.

A pickle cannot create more objects than it has opcodes, so capping the file size caps the memory
the load can take; the cap has an override for legitimately huge snapshots.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
from pathlib import Path
from typing import Any

from memgate.errors import InputError

DEFAULT_MAX_BYTES = 2 << 30  # 2 GiB: a snapshot with 10^6 trace entries and full stacks is ~1 GiB
MAX_BYTES_ENV = "MEMGATE_MAX_PICKLE_BYTES"
HIGHEST_PROTOCOL = 5
_FRAME = 0x95  # protocol 4+ FRAME opcode: 8-byte length follows


class RefusedClass(pickle.UnpicklingError):
    """The pickle asked for a class or function: refused, never imported."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise RefusedClass(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedClass(f"persistent id {pid!r}"[:120])


def _unpickle(stream: io.BytesIO) -> Any:
    """Unpickle with the cyclic GC paused: a snapshot is millions of small dicts and lists, and
    each GC generation pass over them while they are created costs more than the unpickling
    (1M trace entries: 1.29 s with GC, 0.56 s without). Collection is only delayed, never skipped.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        return _PlainDataUnpickler(stream).load()
    finally:
        if paused:
            gc.enable()


def max_bytes_default() -> int:
    """The size cap: ``$MEMGATE_MAX_PICKLE_BYTES`` when set (a plain byte count), else 2 GiB."""
    raw = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    if not raw.isdigit() or int(raw) <= 0:
        raise InputError(f"${MAX_BYTES_ENV} must be a positive number of bytes", found=raw)
    return int(raw)


def sniff(head: bytes) -> int | None:
    """The protocol (2..5) when ``head`` starts like a binary pickle, else None."""
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= HIGHEST_PROTOCOL:
        return head[1]
    return None


def first_opcode(head: bytes) -> int | None:
    """The opcode after the PROTO (and a protocol-4+ FRAME) header: what the top-level object starts with."""
    if sniff(head) is None:
        return None
    at = 2
    if len(head) > at and head[at] == _FRAME:
        at += 9
    return head[at] if len(head) > at else None


def load(path: str | os.PathLike[str], *, max_bytes: int | None = None) -> Any:
    """Unpickle ``path`` as plain data; any class, persistent id or malformed byte is an InputError."""
    path = Path(path)
    limit = max_bytes_default() if max_bytes is None else max_bytes
    data = read_capped(path, limit)
    if sniff(data) is None:
        found = data[:8].hex(" ")
        if data[:2] == b"\x80\x06" or (data[:1] == b"\x80" and len(data) > 1 and data[1] > HIGHEST_PROTOCOL):
            raise InputError(f"unsupported pickle protocol {data[1]}", file=path, line=None,
                             expected=f"pickle protocol 2..{HIGHEST_PROTOCOL}", found=found)
        raise InputError("not a pickle file", file=path,
                         expected=f"a binary pickle (protocol 2..{HIGHEST_PROTOCOL}, first byte 0x80)", found=found)
    stream = io.BytesIO(data)
    try:
        value = _unpickle(stream)
    except RefusedClass as exc:
        raise InputError(
            f"refused to load {exc.what!r}: the pickle references code, and memgate never runs code from a "
            "profile file",
            file=path, column=f"byte {stream.tell()}",
            expected="plain data only (dict, list, tuple, str, int, float, bool, None)", found=exc.what,
        ) from None
    except EOFError:
        raise InputError("truncated pickle: the file ends in the middle of the data", file=path,
                         column=f"byte {len(data)}", expected="a complete pickle ending with STOP ('.')",
                         found=f"end of file after {len(data)} bytes") from None
    except MemoryError:
        raise InputError("pickle too large to load in memory", file=path) from None
    except RecursionError:
        raise InputError("pickle nested too deeply", file=path) from None
    except Exception as exc:  # noqa: BLE001 - any other unpickling failure is malformed input
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        truncated = "ran out of input" in reason.lower() or "truncated" in reason.lower()
        raise InputError(
            ("truncated pickle: " if truncated else "malformed pickle: ") + reason,
            file=path, column=f"byte {stream.tell()}", expected="a complete pickle of plain data",
        ) from None
    if stream.tell() < len(data) and data[stream.tell():].strip(b"\x00"):
        raise InputError("trailing bytes after the end of the pickle", file=path, column=f"byte {stream.tell()}",
                         found=f"{len(data) - stream.tell()} more bytes")
    return value


def read_capped(path: Path, limit: int) -> bytes:
    """The file's bytes, with clear errors for a missing, unreadable, empty or oversized file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputError("no such file", file=path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=path) from None
    if not path.is_file():
        raise InputError("not a regular file", file=path)
    if st.st_size == 0:
        raise InputError("empty file (0 bytes)", file=path, expected="a pickle")
    if st.st_size > limit:
        raise InputError(
            f"file is {st.st_size} bytes, over the {limit}-byte limit for pickles",
            file=path,
            expected=f"at most {limit} bytes (raise it with max_bytes= or ${MAX_BYTES_ENV})",
            found=f"{st.st_size} bytes",
        )
    try:
        with open(path, "rb") as fh:
            data = fh.read(limit + 1)
    except PermissionError:
        raise InputError(
            "file is not readable (permission denied); torch_npu's _dump_snapshot writes snapshots "
            "owner-write-only, so run `chmod u+r` on it",
            file=path, expected="read permission",
        ) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", file=path) from None
    if len(data) > limit:  # grew while we looked
        raise InputError(f"file is over the {limit}-byte limit for pickles", file=path)
    return data

"""Load a pickle of plain data without ever running code from it.

A memory snapshot from a CI artifact is untrusted input, and ``pickle.load`` runs whatever the
file names (``os.system`` via ``REDUCE``). The Unpickler here refuses every class lookup
(``find_class``, which also guards the ``EXT*`` opcodes) and every persistent id, so only the
opcodes that build dict, list, tuple, str, bytes, int, float, bool and None can succeed.

Memory is bounded three times. The file size is capped (a pickle cannot build more objects than it
has bytes), and so is the number of containers the load builds: one byte of ``EMPTY_LIST`` is a
56-byte list, and a file of them would take 60-200 times its size, where real snapshots build one
container per 16 to 270 bytes. What no count of objects sees is the unpickler's own memo: it is an
array as long as the largest index a ``PUT`` names, so ``LONG_BINPUT 2**29`` in a 9-byte file zero-fills
8 GiB. The address space the load may add is therefore capped too (Linux), and an allocation past it
is an InputError. Each cap has an override for legitimately huge or unusual snapshots
(:mod:`memgate.readers.limits`).

A framed pickle (protocol 4+, what torch writes) is read from its file as the Unpickler asks, a FRAME
at a time; an unframed one is read whole first. Both hand the Unpickler the same bytes through the
same checks, so what a file loads as and the error it raises are the same either way (the number of
containers a refusal reports as built may differ by one: it counts what the process allocated).
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

from memgate.errors import InputError, cannot_read, show
from memgate.readers import limits
from memgate.readers.files import check_not_lfs_pointer
from memgate.readers.memory import address_space_capped, collector_paused
from memgate.sizes import format_size

DEFAULT_MAX_BYTES = 2 << 30  # 2 GiB: a snapshot with 10^6 trace entries and full stacks is ~1 GiB
MAX_BYTES_ENV = "MEMGATE_MAX_PICKLE_BYTES"
HIGHEST_PROTOCOL = 5
_FRAME = 0x95  # protocol 4+ FRAME opcode: 8-byte length follows
_LONG_FRAME = 1 << 18  # bytes: longer than any frame Python's picklers write
_HEAD = 16  # bytes read first: the protocol and whether a FRAME follows


class RefusedClass(pickle.UnpicklingError):
    """The pickle asked for a class or function: refused, never imported."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _PlainDataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise RefusedClass(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedClass(f"persistent id {show(pid, 100)}")


class TooManyObjects(Exception):
    """The load built (or was about to be handed a FRAME that could build) more containers than allowed.

    Not an UnpicklingError: the C Unpickler turns one raised while it fetches an opcode into EOFError.
    """

    def __init__(self, built: int, frame: int, limit: int) -> None:
        super().__init__(f"{built} containers built, limit {limit}")
        self.built, self.frame, self.limit = built, frame, limit


class _MeteredInput:
    """The pickle's bytes as a file for the C Unpickler, counting the containers built between reads.

    The C Unpickler calls back into Python only to fetch input, and without ``peek()`` it fetches
    exactly what it needs next: a whole FRAME (Python writes 64 to 128 KiB ones), a large string or
    bytes written outside frames, or one opcode. So the count overshoots the limit by at most one
    frame's worth; a FRAME longer than Python writes is checked before it is handed over, as if each
    of its bytes built a container. The count is the collector's generation-0 count (containers
    allocated minus freed), which only grows while the collector is paused, as it is while
    unpickling. Slices are memoryviews: the Unpickler copies what it keeps.
    """

    def __init__(self, data: bytes, limit: int) -> None:
        self._data = data
        self._view = memoryview(data)
        self._pos = 0
        self._handed = 0  # the end of the data handed out so far: where an error happened, at the latest
        self._limit = limit
        self._base = 0

    def start_count(self) -> None:
        self._base = gc.get_count()[0]

    def tell(self) -> int:
        return self._pos

    def handed_out(self) -> int:
        return self._handed

    def rest(self) -> bytes:
        """What follows the data read so far."""
        return bytes(self._view[self._pos:])

    def read(self, size: int = -1) -> memoryview:
        self._check(size if self._is_long_frame(size) else 0)
        chunk = self._hand_out(len(self._data) if size < 0 else self._pos + size)
        self._pos += len(chunk)
        return chunk

    def readinto(self, buffer: Any) -> int:
        with memoryview(buffer) as target:
            chunk = self.read(target.nbytes)
            target[:len(chunk)] = chunk
        return len(chunk)

    def readline(self) -> memoryview:
        end = self._data.find(b"\n", self._pos)
        return self.read(-1 if end < 0 else end + 1 - self._pos)

    def _hand_out(self, end: int) -> memoryview:
        chunk = self._view[self._pos:end]
        self._handed = max(self._handed, self._pos + len(chunk))
        return chunk

    def _is_long_frame(self, size: int) -> bool:
        """Is this read the body of a FRAME (the 9 bytes before it: FRAME and its length) over 256 KiB?"""
        at = self._pos
        return (size > _LONG_FRAME and at >= 9 and self._data[at - 9] == _FRAME
                and int.from_bytes(self._data[at - 8:at], "little") == size)

    def _check(self, upcoming: int) -> None:
        built = gc.get_count()[0] - self._base
        if built + upcoming > self._limit:
            raise TooManyObjects(built, upcoming, self._limit)


class _PrefetchedInput(_MeteredInput):
    """For an unframed pickle (protocols 2 and 3), which would otherwise be fetched one opcode per call.

    With ``peek()`` the Unpickler fetches 128 KiB at a time (and reads what it used of it): at most
    that many containers are built between two checks. Not for framed pickles: parsing frames out of
    the peeked window is ~20% slower than fetching each FRAME whole.
    """

    def peek(self, size: int = 1) -> memoryview:
        self._check(0)
        return self._hand_out(self._pos + max(size, 1))


class _ReadFailed(Exception):
    """Reading the file failed while it was unpickled (EIO, a file that vanished): not an
    UnpicklingError, which the C Unpickler would turn into EOFError."""

    def __init__(self, error: OSError) -> None:
        super().__init__(str(error))
        self.error = error


class _StreamedInput(_MeteredInput):
    """A framed pickle (protocol 4+, what torch writes) read from its open file as the Unpickler asks,
    a FRAME at a time, rather than read whole first: the whole file would be a second copy of it in
    memory, ~0.1 s of fresh pages for a 150 MB snapshot that the objects it builds then pay again.

    It hands out what :class:`_MeteredInput` would from the file's bytes (the file's first ``size``
    bytes, its size when opened): the same reads, the same checks, the same positions, the same count.
    """

    def __init__(self, fh: BinaryIO, head: bytes, size: int, limit: int) -> None:
        super().__init__(b"", limit)
        self._fh = fh
        self._head = head  # the first bytes, read already to tell the protocol and the framing
        self._offset = len(head)  # in the file
        self.size = size
        self._last = b""  # the last bytes handed out (up to 9: a FRAME opcode and its length)

    def read(self, size: int = -1) -> memoryview:
        self._check(size if self._is_long_frame(size) else 0)
        if size < 0:
            return self._hand(self.rest())
        chunk, self._head = self._head[:size], self._head[size:]
        if len(chunk) < size:  # never more than the file holds: a FRAME's length may be anything
            chunk += self._from_file(min(size - len(chunk), max(self.size - self._offset, 0)))
        return self._hand(chunk)

    def readline(self) -> memoryview:
        before, newline, after = self._head.partition(b"\n")
        if newline:  # within the first bytes
            chunk, self._head = before + newline, after
        else:
            chunk, self._head = self._head + self._from_file(None), b""
        asked = len(chunk) if chunk.endswith(b"\n") else -1  # as _MeteredInput.readline reads
        self._check(asked if self._is_long_frame(asked) else 0)
        return self._hand(chunk)

    def rest(self) -> bytes:
        """What follows the data handed out, to the end of the file."""
        rest, self._head = self._head + self._from_file(-1), b""
        return rest

    def _from_file(self, size: int | None) -> bytes:
        """``size`` bytes of the file (-1: all that is left; None: a line)."""
        try:
            data = self._fh.readline() if size is None else self._fh.read(size)
        except OSError as exc:
            raise _ReadFailed(exc) from None
        self._offset += len(data)
        return data

    def _hand(self, chunk: bytes) -> memoryview:
        # The bytes themselves (the Unpickler takes any buffer): a memoryview of a chunk of its own
        # would add containers (the view and its buffer) to the count the whole file's reader keeps.
        self._pos += len(chunk)
        self._handed = self._pos
        self._last = (self._last + chunk[-9:])[-9:]
        return cast(memoryview, chunk)

    def _is_long_frame(self, size: int) -> bool:
        return (size > _LONG_FRAME and self._pos >= 9 and self._last[0] == _FRAME
                and int.from_bytes(self._last[1:], "little") == size)


def _metered(data: bytes, limit: int) -> _MeteredInput:
    framed = len(data) > 2 and data[2] == _FRAME  # what protocol 4+ writes right after PROTO
    return _MeteredInput(data, limit) if framed else _PrefetchedInput(data, limit)


def _unpickle(stream: _MeteredInput, memory: int) -> Any:
    with collector_paused(), address_space_capped(memory):
        stream.start_count()
        # typeshed wants read() -> bytes; the C Unpickler takes any buffer, and memoryviews copy nothing
        return _PlainDataUnpickler(cast(Any, stream)).load()


def max_bytes_default() -> int:
    """The size cap: ``$MEMGATE_MAX_PICKLE_BYTES`` when set (a plain byte count), else 2 GiB."""
    raw = os.environ.get(MAX_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    if not (raw.isascii() and raw.isdigit()) or int(raw) <= 0:  # "²".isdigit() is True, int("²") fails
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
    with _open_capped(path, limit) as (fh, size):
        head = _read(path, lambda: fh.read(_HEAD))
        if sniff(head) is not None and len(head) > 2 and head[2] == _FRAME:  # framed: streamed from the file
            stream: _MeteredInput = _StreamedInput(fh, head, size, limits.max_pickle_objects(size))
        else:
            data = _read_rest(path, fh, head, size, limit)
            _check_protocol(path, data)
            stream, size = _metered(data, limits.max_pickle_objects(len(data))), len(data)
        return _unpickled(path, stream, size)


def _check_protocol(path: Path, data: bytes) -> None:
    if sniff(data) is None:
        check_not_lfs_pointer(path, data)
        found = data[:8].hex(" ")
        if data[:2] == b"\x80\x06" or (data[:1] == b"\x80" and len(data) > 1 and data[1] > HIGHEST_PROTOCOL):
            raise InputError(f"unsupported pickle protocol {data[1]}", file=path, line=None,
                             expected=f"pickle protocol 2..{HIGHEST_PROTOCOL}", found=found)
        raise InputError("not a pickle file", file=path,
                         expected=f"a binary pickle (protocol 2..{HIGHEST_PROTOCOL}, first byte 0x80)", found=found)


# The opcodes that name code: a class (GLOBAL, STACK_GLOBAL, INST, and EXT1/2/4 through copyreg's registry)
# or a persistent id; the unpickler refuses the first of them.
_NAMES_CODE = frozenset({"GLOBAL", "STACK_GLOBAL", "INST", "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID"})
_LOCATE_OPCODES = 1 << 21  # ~2 s of pickletools' walk at most, on the error path only


def _code_reference_at(path: Path, before: int) -> int | None:
    """The byte where the pickle's first opcode that names code begins (the unpickler had been handed
    ``before`` bytes when it refused it: a read's worth past it), walked with pickletools; None where the
    walk cannot tell (past its opcode budget, or a malformed byte first)."""
    import pickletools

    try:
        with open(path, "rb") as fh:
            for n, (opcode, _, pos) in enumerate(pickletools.genops(fh)):
                if opcode.name in _NAMES_CODE:
                    return pos
                if n >= _LOCATE_OPCODES or (pos is not None and pos >= before):
                    return None
    except Exception:  # noqa: BLE001 - whatever the walk meets, the refusal stands without a position
        return None
    return None


def _unpickled(path: Path, stream: _MeteredInput, size: int) -> Any:
    """The value the pickle of ``size`` bytes holds, read through ``stream``; its errors as InputErrors."""
    memory = limits.max_pickle_memory(size)
    try:
        value = _unpickle(stream, memory)
        rest = stream.rest()
    except RefusedClass as exc:
        at = _code_reference_at(path, stream.handed_out())
        raise InputError(
            f"refused to load {exc.what!r}: the pickle references code, and memgate never runs code from a "
            "profile file",
            file=path, column=f"byte {stream.handed_out()} or before" if at is None else f"byte {at}",
            expected="plain data only (dict, list, tuple, str, int, float, bool, None)", found=exc.what,
        ) from None
    except TooManyObjects as exc:
        raise _too_many_objects(path, exc, size, stream.handed_out()) from None
    except _ReadFailed as exc:  # as a read of the whole file would have failed
        raise (_not_readable(path) if isinstance(exc.error, PermissionError) else cannot_read(exc.error, path)) from None
    except EOFError:
        raise InputError("truncated pickle: the file ends in the middle of the data", file=path,
                         column=f"byte {size}", expected="a complete pickle ending with STOP ('.')",
                         found=f"end of file after {size} bytes") from None
    except MemoryError:
        raise InputError(
            f"unpickling ran out of memory ({format_size(memory)} allowed for a {size}-byte file): a pickle "
            "bomb (such as a huge memo index), or a snapshot too large for this machine",
            file=path, column=f"byte {stream.handed_out()}",
            expected=f"at most {memory} bytes (raise the limit with ${limits.PICKLE_MEMORY_ENV})",
        ) from None
    except RecursionError:
        raise InputError("pickle nested too deeply", file=path) from None
    except Exception as exc:  # noqa: BLE001 - any other unpickling failure is malformed input
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        truncated = "ran out of input" in reason.lower() or "truncated" in reason.lower()
        raise InputError(
            ("truncated pickle: " if truncated else "malformed pickle: ") + reason,
            file=path, column=f"byte {stream.handed_out()}", expected="a complete pickle of plain data",
        ) from None
    if rest.strip(b"\x00"):
        raise InputError("trailing bytes after the end of the pickle", file=path, column=f"byte {stream.tell()}",
                         found=f"{len(rest)} more bytes")
    return value


def _too_many_objects(path: Path, exc: TooManyObjects, size: int, at: int) -> InputError:
    how = (f"{exc.built} built, then a {exc.frame}-byte FRAME that could build as many more" if exc.frame
           else f"{exc.built} built")
    return InputError(
        f"the pickle builds more than {exc.limit} lists, dicts, tuples and sets, too many for a {size}-byte "
        "file: a pickle bomb, or an unusual writer",
        file=path, column=f"byte {at}",
        expected=f"at most {exc.limit} (raise the limit with ${limits.PICKLE_OBJECTS_ENV})", found=how,
    )


def read_capped(path: Path, limit: int) -> bytes:
    """The file's bytes, with clear errors for a missing, unreadable, empty or oversized file."""
    with _open_capped(path, limit) as (fh, size):
        return _read_rest(path, fh, b"", size, limit)


@contextlib.contextmanager
def _open_capped(path: Path, limit: int) -> Iterator[tuple[BinaryIO, int]]:
    """The file open for reading, and its size; clear errors for a missing, unreadable, empty or
    oversized file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputError("no such file", file=path) from None
    except OSError as exc:
        raise cannot_read(exc, path) from None
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
        fh = open(path, "rb")  # noqa: SIM115 - closed below, after the caller's block
    except PermissionError:
        raise _not_readable(path) from None
    except OSError as exc:
        raise cannot_read(exc, path) from None
    with fh:
        yield fh, st.st_size


def _not_readable(path: Path) -> InputError:
    return InputError(
        "file is not readable (permission denied); torch_npu's _dump_snapshot writes snapshots "
        "owner-write-only, so run `chmod u+r` on it",
        file=path, expected="read permission",
    )


def _read(path: Path, read: Callable[[], bytes]) -> bytes:
    try:
        return read()
    except PermissionError:
        raise _not_readable(path) from None
    except OSError as exc:
        raise cannot_read(exc, path) from None


def _read_rest(path: Path, fh: BinaryIO, head: bytes, size: int, limit: int) -> bytes:
    """``head`` (the first bytes, read already) and the rest of the file, up to the cap."""
    # read the file's size, not the cap: read(n) allocates n bytes first, and 2 GiB for a small
    # file can fail under another thread's address-space cap (address_space_capped)
    data = head + _read(path, lambda: fh.read(max(min(size, limit) + 1 - len(head), 0)))
    if len(data) > size:  # grew while we looked: on to the cap
        data += _read(path, lambda: fh.read(limit + 1 - len(data)))
    if len(data) > limit:  # grew while we looked
        raise InputError(f"file is over the {limit}-byte limit for pickles", file=path)
    return data

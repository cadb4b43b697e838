"""Memory habits of the big loads: freed memory given back, the cyclic collector paused.

A 10M-row file is parsed in blocks; the freed block buffers stay with the allocators (Arrow's
mimalloc pool, glibc's heap) and would count in the process's peak RSS through the steps that
follow. Both are asked to return what they hold unused.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import threading
from collections.abc import Callable, Iterator

import pyarrow as pa

try:
    import resource
except ImportError:  # Windows: no address-space cap
    resource = None  # type: ignore[assignment]


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    return trim


def release_free_memory() -> None:
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic GC while millions of small dicts and lists are created (and read): each
    generation pass over them costs more than building them (1M snapshot entries: 1.29 s unpickling
    with the GC, 0.56 s without; a 1 GB Kineto trace: 49 s, 19 s). Collection is only delayed,
    never skipped; nesting is harmless.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


def _mapped_bytes() -> int | None:
    """The process's address space now (Linux ``/proc/self/statm``), or None where it cannot be read."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


_ADDRESS_SPACE = threading.Lock()  # one cap at a time: two would restore each other's limits out of order


@contextlib.contextmanager
def address_space_capped(extra: int) -> Iterator[None]:
    """While the block runs, the process may map at most ``extra`` more bytes than it maps now: an
    allocation past that raises MemoryError in the thread that asked, where an unbounded one would
    bring in the OOM killer. ``RLIMIT_AS`` on Linux; elsewhere (no ``/proc``, no ``resource``) this
    caps nothing. An existing tighter limit is left as it is. The limit is the process's: threads
    that cap at once take turns.
    """
    if resource is None:  # Windows
        yield
        return
    with _ADDRESS_SPACE:
        mapped = _mapped_bytes()  # measured in turn: after any other thread's capped load
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = None if mapped is None else mapped + extra
        if cap is not None and hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        if cap is None or (soft != resource.RLIM_INFINITY and soft <= cap):  # no /proc, or already tighter
            yield
            return
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        try:
            yield
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))

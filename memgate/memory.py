"""Give freed memory back to the operating system between the big steps of a load.

A 10M-row file is parsed in blocks; the freed block buffers stay with the allocators (Arrow's
mimalloc pool, glibc's heap) and would count in the process's peak RSS through the steps that
follow. Both are asked to return what they hold unused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

import pyarrow as pa


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    return trim  # type: ignore[no-any-return]


def release_free_memory() -> None:
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)

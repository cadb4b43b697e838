"""What the loaders of allocator event streams share (snapshot traces, Kineto ``[memory]`` events):
pairing each alloc with its free, and telling torch's own source files from the user's.

Its own module so that loading one format does not import the other's loader.
"""

from __future__ import annotations

import re

import numpy as np


def pair_allocs(addr: np.ndarray, is_alloc: np.ndarray) -> np.ndarray:
    """For events in time order: the index of each alloc's next free at the same address, and of each
    free's alloc; -1 where there is none (a free of memory allocated before the window, a block still
    live at its end). Vectorized: a stable sort by address keeps time order within an address.
    """
    n = len(addr)
    partner = np.full(n, -1, dtype=np.int64)
    if n < 2:
        return partner
    by_addr = np.argsort(addr, kind="stable")  # stable: time order within an address
    a = addr[by_addr]
    alloc = is_alloc[by_addr]
    matched = np.flatnonzero((a[1:] == a[:-1]) & alloc[:-1] & ~alloc[1:])
    partner[by_addr[matched]] = by_addr[matched + 1]
    partner[by_addr[matched + 1]] = by_addr[matched]
    return partner


_TORCH_DIR = re.compile(r"(^|/)(torch|torch_npu)/")


def is_torch_file(filename: str) -> bool:
    """Does ``filename`` lie under a ``torch`` / ``torch_npu`` package directory (torch's own code)?"""
    return _TORCH_DIR.search(filename.replace("\\", "/")) is not None

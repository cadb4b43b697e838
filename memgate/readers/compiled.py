"""Which snapshot reader a load uses: the compiled one (:mod:`memgate.readers._snapshot_core`) where it was
built and is not turned off, else the pure-Python one. Light to import: ``memgate --version`` says it."""

from __future__ import annotations

import importlib.util
import os

PURE_ENV = "MEMGATE_PURE_PYTHON"
MODULE = "memgate.readers._snapshot_core"


def pure_forced() -> bool:
    """``$MEMGATE_PURE_PYTHON`` set to anything but empty or 0."""
    return os.environ.get(PURE_ENV, "").strip() not in ("", "0")


def built() -> bool:
    """Was the extension built for this Python (found beside the package)?"""
    return importlib.util.find_spec(MODULE) is not None


def reader_name() -> str:
    """The snapshot reader a load uses now, in words."""
    if pure_forced():
        return f"pure Python (${PURE_ENV} is set)"
    return "compiled" if built() else "pure Python (the compiled reader is not built)"

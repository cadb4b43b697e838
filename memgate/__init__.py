"""memgate: memory budgets for ML runs, checked from profiler output in pytest and CI."""

from __future__ import annotations

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic)


def __getattr__(name: str) -> object:
    """``memgate.estimate``: imported on first use (``import memgate`` stays lean: no numpy, no torch). By
    name, as the registry imports a loader: the package is the public face of a later row (docs/design.md)."""
    if name == "estimate":
        import importlib

        return importlib.import_module("memgate.estimation.api").estimate
    raise AttributeError(f"module 'memgate' has no attribute {name!r}")

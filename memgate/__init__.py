"""memgate: memory budgets for ML runs, checked from profiler output in pytest and CI."""

from __future__ import annotations

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic)


def __getattr__(name: str) -> object:
    """``memgate.estimate``: imported on first use (``import memgate`` stays lean: no numpy, no torch)."""
    if name == "estimate":
        from memgate.estimation.api import estimate

        return estimate
    raise AttributeError(f"module 'memgate' has no attribute {name!r}")

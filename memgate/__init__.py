"""memgate: memory budgets for ML runs, checked from profiler output in pytest and CI."""

from __future__ import annotations

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it (tool.setuptools.dynamic)

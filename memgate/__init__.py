"""memgate: memory budgets for ML runs, checked from profiler output in pytest and CI."""

from __future__ import annotations

__version__ = "0.1.0"

"""Estimate on a CPU-only machine what a CUDA run would record (:mod:`memgate.estimation.api`)."""

from __future__ import annotations

from memgate.estimation.api import ESTIMATE_SNAPSHOT, Estimator, estimate

__all__ = ["ESTIMATE_SNAPSHOT", "Estimator", "estimate"]

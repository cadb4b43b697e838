"""Hypothesis settings profiles: "ci" when $CI is set, else "dev"; $HYPOTHESIS_PROFILE overrides."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large]

# CI runs at least 200 examples per property, derandomize=False so every run explores new inputs;
# print_blob lets a failure be replayed with @reproduce_failure.
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=False, print_blob=True,
                          suppress_health_check=_SLOW_DATA)
settings.register_profile("dev", max_examples=30, deadline=None, suppress_health_check=_SLOW_DATA)
settings.register_profile("thorough", max_examples=1000, deadline=None, print_blob=True,
                          suppress_health_check=_SLOW_DATA)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

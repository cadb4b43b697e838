"""Hypothesis settings profiles: "ci" when $CI is set, else "dev"; $HYPOTHESIS_PROFILE overrides."""

from __future__ import annotations

import os
from collections.abc import Callable

# pytester's in-process runs drop the modules first imported inside them when they end, and numpy
# cannot be imported twice in one process: memgate binds numpy, pandas and pyarrow on first use
# (memgate/lazy.py), so the suite imports them up front, before any pytester run.
import numpy  # noqa: F401
import pandas  # noqa: F401
import pyarrow  # noqa: F401
from _pytest import pytester as pytester_module
from hypothesis import HealthCheck, settings

# torch cannot be imported twice either (its operator libraries register again: "Only a single
# TORCH_LIBRARY ..." or a crashed worker), and a test may import it, or a submodule such as
# torch._dynamo, first inside a pytester run: pytester's snapshot of sys.modules keeps torch's modules.
_pytester_snapshot_init = pytester_module.SysModulesSnapshot.__init__


def _keeping_torch(self: pytester_module.SysModulesSnapshot, preserve: Callable[[str], bool] | None = None) -> None:
    def keep(name: str) -> bool:
        return name == "torch" or name.startswith("torch.") or (preserve is not None and preserve(name))

    _pytester_snapshot_init(self, preserve=keep)


pytester_module.SysModulesSnapshot.__init__ = _keeping_torch  # type: ignore[method-assign]

_SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large]

# CI runs at least 200 examples per property, derandomize=False so every run explores new inputs;
# print_blob lets a failure be replayed with @reproduce_failure.
settings.register_profile("ci", max_examples=200, deadline=None, derandomize=False, print_blob=True,
                          suppress_health_check=_SLOW_DATA)
settings.register_profile("dev", max_examples=30, deadline=None, suppress_health_check=_SLOW_DATA)
settings.register_profile("thorough", max_examples=1000, deadline=None, print_blob=True,
                          suppress_health_check=_SLOW_DATA)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))

"""Third-party modules imported on first use.

pytest imports memgate's plugin on every run, gating or not, and the plugin imports the core:
with numpy, pandas and pyarrow imported at the top that cost every pytest run ~0.5 s before a
single test. A module of the core binds them lazily instead::

    if TYPE_CHECKING:
        import pandas as pd
    else:
        pd = lazy_module("pandas", globals(), "pd")

The first attribute read (``pd.DataFrame``) imports pandas and rebinds ``pd`` in that module's
globals to the module itself, so later reads cost what a plain import's do.
"""

from __future__ import annotations

import importlib
from typing import Any


class _LazyModule:
    def __init__(self, name: str, namespace: dict[str, Any], alias: str) -> None:
        self._name = name
        self._namespace = namespace
        self._alias = alias

    def __getattr__(self, attr: str) -> Any:
        module = importlib.import_module(self._name)
        self._namespace[self._alias] = module
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<{self._name}, imported on first use>"


def lazy_module(name: str, namespace: dict[str, Any], alias: str) -> Any:
    """A stand-in for ``import NAME as ALIAS`` in the module whose ``globals()`` is ``namespace``."""
    return _LazyModule(name, namespace, alias)

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
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def arrow_without_pandas() -> Iterator[None]:
    """Inside: pyarrow builds arrays on this thread without importing pandas (~0.4 s), in the
    memgate command's own process (memgate.fastexit.is_command); elsewhere nothing changes.

    pyarrow imports pandas, where installed, on ``pa.array()`` calls, only to ask whether the input
    is a pandas object or holds pandas' missing values. A path whose inputs hold no pandas object
    (an unpickled snapshot) would pay for pandas before its first byte. Inside the block, an import
    of pandas on this thread fails as if pandas were not installed (other threads are not touched),
    so pyarrow reads the input as plain Python. pyarrow remembers "no pandas"; the first real import
    of pandas afterwards, by memgate or by anyone else in the process, hands it back to pyarrow's
    Python side (pandas objects convert as usual). The limit, and why only the memgate command
    allows it: pyarrow's C++ conversion of Python lists then never learns pandas' scalars for the
    rest of the process (``pa.array([1, pd.NA], from_pandas=True)`` fails); memgate converts no such list.
    A no-op once pandas is imported.
    """
    import importlib.util  # here: pytest imports this module on every run

    from memgate import fastexit

    if not fastexit.is_command() or "pandas" in sys.modules or importlib.util.find_spec("pandas") is None:
        yield
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _PandasGate)), None)
    if finder is None:
        finder = _PandasGate()
        sys.meta_path.insert(0, finder)
    me = threading.get_ident()
    finder.refusing[me] = finder.refusing.get(me, 0) + 1
    try:
        yield
    finally:
        finder.refusing[me] -= 1
        if not finder.refusing[me]:
            del finder.refusing[me]


class _PandasGate:  # a sys.meta_path finder
    """Refuses pandas to the threads inside :func:`arrow_without_pandas`; finds it as usual for the
    others, and once pandas has run, has pyarrow import it again (pyarrow only retries when asked
    for something pandas-specific)."""

    def __init__(self) -> None:
        self.refusing: dict[int, int] = {}

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "pandas":
            return None
        if threading.get_ident() in self.refusing:
            raise ModuleNotFoundError("pandas is not imported here (memgate.lazy.arrow_without_pandas)", name=name)
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("pandas")
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            import pyarrow

            pyarrow.lib._pandas_api.version  # noqa: B018  # re-imports pandas into pyarrow where it has none

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

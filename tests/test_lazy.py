"""memgate.lazy: third-party modules bound on first use, and pyarrow kept from importing pandas inside the
memgate command (each probe runs in a fresh interpreter: pandas, once imported, stays)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from memgate.lazy import arrow_without_pandas, lazy_module


def test_a_lazy_module_is_imported_on_first_use_and_then_is_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    namespace: dict[str, Any] = {}
    namespace["cs"] = lazy_module("colorsys", namespace, "cs")
    assert repr(namespace["cs"]) == "<colorsys, imported on first use>"
    assert "colorsys" not in sys.modules  # binding it imports nothing
    assert namespace["cs"].rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    assert namespace["cs"] is sys.modules["colorsys"]  # rebound: later reads cost a plain global's


def test_a_missing_module_fails_where_it_is_first_used() -> None:
    namespace: dict[str, Any] = {}
    namespace["x"] = lazy_module("memgate_no_such_module", namespace, "x")
    with pytest.raises(ModuleNotFoundError, match="memgate_no_such_module"):
        namespace["x"].anything  # noqa: B018
    assert type(namespace["x"]).__name__ == "_LazyModule"  # still the stand-in: the next use says so again


def test_in_this_process_arrow_without_pandas_changes_nothing() -> None:
    """pytest's own process: not the memgate command, and pandas already imported."""
    finders = list(sys.meta_path)
    with arrow_without_pandas():
        assert sys.meta_path == finders
        import pandas  # noqa: F401


_ARROW_THEN_PANDAS = """
import json, sys, threading
import pyarrow as pa
from memgate.cli import as_command
from memgate.lazy import arrow_without_pandas

seen = {}
as_command()  # the memgate command's own process
with arrow_without_pandas():
    seen["types"] = [str(pa.array([1, None]).type), str(pa.array(["a", None]).type)]
    seen["inside"] = "pandas" in sys.modules
    other = threading.Thread(target=lambda: seen.setdefault("other_thread", __import__("pandas").__name__))
    other.start()
    other.join()
import pandas as pd
seen["nullable"] = pa.array(pd.Series([1, None], dtype="Int64")).to_pylist()
seen["categorical"] = str(pa.array(pd.Categorical(["a", "b"])).type)
seen["back"] = pa.table({"a": [1, 2]}).to_pandas()["a"].tolist()
print(json.dumps(seen))
"""


def test_outside_the_command_arrow_without_pandas_changes_nothing() -> None:
    """A pytest run or a library user never asked: pyarrow imports pandas as usual, and pandas'
    scalars in Python lists stay understood."""
    probe = ("import sys, pyarrow as pa\nfrom memgate.lazy import arrow_without_pandas\n"
             "with arrow_without_pandas():\n    pa.array([1])\n    inside = 'pandas' in sys.modules\n"
             "import pandas as pd\nprint(inside, pa.array([1, pd.NA], from_pandas=True).to_pylist())\n")
    done = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "[1,", "None]"]


def test_arrow_builds_arrays_without_pandas_and_gets_it_back_once_imported() -> None:
    """memgate.lazy.arrow_without_pandas: pyarrow imports pandas on pa.array() only to ask whether
    the input is a pandas object; inside the block it does not, on that thread only, and after the
    first real import pyarrow handles pandas objects as usual."""
    done = subprocess.run([sys.executable, "-c", _ARROW_THEN_PANDAS], check=True, capture_output=True, text=True, timeout=120)
    seen = json.loads(done.stdout)
    assert seen["types"] == ["int64", "string"] and seen["inside"] is False
    assert seen["other_thread"] == "pandas"  # another thread imports it as usual
    assert seen["nullable"] == [1, None]
    assert seen["categorical"].startswith("dictionary<")
    assert seen["back"] == [1, 2]

"""The cell checks of a CSV block (memgate.readers.csvcheck): a column of few distinct values is checked
on those values, and names the same first bad row as the cell-by-cell check; what the check proves
serves the conversion.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from memgate.readers import convert, csvcheck


def test_categories_from_the_check_equal_the_plain_ones() -> None:
    col = pa.array([f"NPU:{i % 3}" if i % 11 else "npu:1 " for i in range(5000)])
    prop = {"type": "string", "pattern": "^(NPU|npu):[0-9]+ ?$"}
    row, _, proof = csvcheck.first_bad_parsed(col, prop)
    assert row is None and proof is not None and proof.encoded is not None
    fused = convert.ToCategories(labels=True)(col, proof)
    assert fused.cast(pa.string()).to_pylist() == convert.label_categories(col).cast(pa.string()).to_pylist()
    assert convert.ToCategories()(col, proof).to_pylist() == convert.categories(col).to_pylist()


def test_few_distinct_values_with_a_null_are_checked(tmp_path: Path) -> None:
    prop = {"type": "string", "pattern": "^NPU:[0-9]+$"}
    cells: list[str | None] = [f"NPU:{i % 3}" for i in range(5000)]
    cells[4000] = None
    assert csvcheck.first_bad(pa.array(cells, type=pa.string()), prop) == (4000, "empty cell")


@given(bad_at=st.integers(0, 4999), bad=st.sampled_from([None, "NPU:x", "npu:1", ""]))
def test_few_distinct_values_are_checked_like_every_cell(bad_at: int, bad: str | None) -> None:
    """A long column of few distinct values (checked on its distinct values) names the same first
    bad row and problem as the cell-by-cell check."""
    prop = {"type": "string", "pattern": "^NPU:[0-9]+$"}
    cells: list[str | None] = [f"NPU:{i % 3}" for i in range(5000)]
    assert csvcheck.first_bad(pa.array(cells), prop) == (None, "")
    cells[bad_at] = bad
    column = pa.array(cells, type=pa.string())
    assert csvcheck.first_bad(column, prop) == csvcheck.check_cells(column, prop)
    assert csvcheck.first_bad(column, prop)[0] == bad_at

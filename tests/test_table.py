"""memgate.table: the model's numpy columns, against plain Python lists as ground truth."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memgate.table import Ints, Table, Texts, column_from_arrow, column_from_pandas, texts_from_arrow

INTS = st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=40)
TEXTS = st.lists(st.one_of(st.none(), st.sampled_from(["", "PTA", "GE", "aten::mm", "é", "1"])), max_size=40)


@given(INTS)
def test_ints_keep_values_and_missing(values: list[int | None]) -> None:
    column = Ints.of_optional(values)
    assert column.tolist() == values
    assert column.known().tolist() == [v for v in values if v is not None]
    assert not column.values[column.isna()].any()  # 0 under the mask, whatever was there
    assert (column.missing is None) == (None not in values)
    assert column.any_present() == any(v is not None for v in values)


@given(INTS, st.data())
def test_take_and_filled(values: list[int | None], data: st.DataObject) -> None:
    column = Ints.of_optional(values)
    rows = np.array(data.draw(st.lists(st.integers(0, max(len(values) - 1, 0)), max_size=10) if values else st.just([])),
                    dtype=np.int64)
    assert column.take(rows).tolist() == [values[i] for i in rows.tolist()]
    assert column.filled(-1).tolist() == [-1 if v is None else v for v in values]


@given(TEXTS, TEXTS)
def test_texts_code_equal_values_alike_and_concatenate(first: list[str | None], second: list[str | None]) -> None:
    a, b = Texts.of(first), Texts.of(second)
    assert a.tolist() == first
    assert len(set(a.names.tolist())) == len(a.names)  # names are distinct
    assert Texts.concat([a, b]).tolist() == first + second
    assert a.isin(["PTA", "GE"]).tolist() == [v in ("PTA", "GE") for v in first]
    assert sorted(a.used()) == sorted({v for v in first if v is not None})


def test_coded_merges_repeated_names() -> None:
    texts = Texts.coded([0, 1, 2, -1], ["x", "y", "x"])
    assert texts.tolist() == ["x", "y", "x", None]
    assert texts.names.tolist() == ["x", "y"]


@given(INTS, TEXTS)
def test_arrow_and_pandas_round_trips_are_exact(numbers: list[int | None], text: list[str | None]) -> None:
    n = min(len(numbers), len(text))
    table = Table({"n": Ints.of_optional(numbers[:n]), "t": Texts.of(text[:n])})
    for back in (Table.from_arrow(table.to_arrow()), Table.from_pandas(table.to_pandas())):
        assert back.columns == ("n", "t")
        assert back.records() == table.records()
    frame = table.to_pandas()
    assert str(frame["n"].dtype) == "Int64" and isinstance(frame["t"].dtype, pd.StringDtype)


def test_columns_of_one_length_and_of_their_kind() -> None:
    with pytest.raises(ValueError, match="different lengths"):
        Table({"a": Ints.of([1]), "b": Ints.of([1, 2])})
    table = Table({"a": Ints.of([1]), "b": Texts.of(["x"])})
    with pytest.raises(TypeError):
        table.ints("b")
    with pytest.raises(TypeError):
        table.texts("a")
    assert len(Table({})) == 0


def test_from_pandas_and_arrow_read_each_dtype() -> None:
    assert column_from_pandas(pd.Series([1.0, None])).tolist() == [1, None]
    with pytest.raises(TypeError, match="fractions"):
        column_from_pandas(pd.Series([1.5]))
    assert column_from_pandas(pd.Series(["a", None], dtype="category")).tolist() == ["a", None]
    assert column_from_pandas(pd.Series([None, None], dtype=object)).tolist() == [None, None]
    assert column_from_arrow(pa.array([1, None], pa.int32())).tolist() == [1, None]
    assert column_from_arrow(pa.nulls(2)).tolist() == [None, None]
    chunked = pa.chunked_array([pa.array(["a", None]).dictionary_encode(), pa.array(["b", "a"]).dictionary_encode()])
    assert texts_from_arrow(chunked).tolist() == ["a", None, "b", "a"]

"""memgate.readers.convert: the profile files' number text turned into exact int64 ns and bytes (digit by
digit, never through a float where that would round), device labels, and a number past int64 named by its row.
Whole files through these conversions: tests/test_csvtable.py and tests/test_csv_ranges.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memgate.readers import convert
from memgate.readers.convert import ns_text_to_ns, unit_text_to_bytes, us_text_to_ns


def test_us_text_to_ns_is_exact_digit_by_digit() -> None:
    col = pa.array(["1764246877082702.440\t", "1764246877082702", "1764246877082702.4", "1764246877082702.44",
                    "1764246877082702.123456\t", "1764246877082702.999999", "0.001", None, "9007199254740993.001"])
    got = us_text_to_ns(col).tolist()
    assert got[:7] == [1764246877082702440, 1764246877082702000, 1764246877082702400, 1764246877082702440,
                       1764246877082702123, 1764246877082702999, 1]  # past 3 decimals: truncated, not rounded
    assert got[7] is pd.NA
    assert got[8] == 9007199254740993001  # beyond float64's exact integers
    assert float("1764246877082702.440") * 1000 != 1764246877082702440  # why digits, not floats


def test_us_text_to_ns_on_chunked_arrays() -> None:
    col = pa.chunked_array([["1.5\t", None], ["2.250"]])
    assert us_text_to_ns(col).tolist() == [1500, pd.NA, 2250]
    assert ns_text_to_ns(pa.array(["1764246877082702440", "12"])).tolist() == [1764246877082702440, 12]


@given(n_bytes=st.integers(-(1 << 53) + 1, (1 << 53) - 1))
def test_unit_text_to_bytes_is_exact_for_python_float_text(n_bytes: int) -> None:
    """torch_npu writes bytes/1024 and bytes/1024/1024 as Python float text: that round-trips exactly."""
    kb, mb = repr(n_bytes / 1024), repr(n_bytes / 1024 / 1024)
    assert unit_text_to_bytes(pa.array([kb]), 1024).tolist() == [n_bytes]
    assert unit_text_to_bytes(pa.array([mb]), 1 << 20).tolist() == [n_bytes]


def test_unit_text_to_bytes_rounds_decimal_text_to_the_nearest_byte() -> None:
    # MindSpore-style MB = KB/1000 text is not a binary fraction: nearest byte, nulls stay null.
    got = unit_text_to_bytes(pa.array(["0.001", "954.37060546875", "-0.5", "1e-05", None, "4304.95751953125"]), 1 << 20)
    assert got.tolist() == [1049, 1000730112, -524288, 10, pd.NA, 4514075136]
    assert str(got.dtype) == "Int64"


def test_times_convert_alike_on_both_paths() -> None:
    cells = ["1764246877082702.440\t", None, "1764246877082703.000\t", "0000000000000001.999\t"]
    fast = convert.us_to_ns(pa.array(cells))
    slow = convert.us_to_ns(pa.array(cells + ["5\t"]))  # another width: the general path
    assert fast.to_pylist() == slow.to_pylist()[:4] == [1764246877082702440, None, 1764246877082703000, 1999]


def test_to_int_names_the_first_value_past_int64_not_a_19_digit_one_that_fits() -> None:
    for cells, bad in ((["1764753084425691000", "9" * 25], 1), ([None, "-9223372036854775808", "-9223372036854775809"], 2),
                       (["0009223372036854775807", "09223372036854775808"], 1)):
        with pytest.raises(convert.OutOfRange) as info:
            convert.to_int(pa.array(cells, type=pa.string()))
        assert info.value.row == bad, cells


def test_a_number_past_its_range_is_out_of_range_naming_its_row() -> None:
    with pytest.raises(convert.OutOfRange) as info:
        convert.us_to_ns(pa.array(["5", "1" * 25]))
    assert info.value.row == 1
    assert info.value.one_line() == ("number out of range; expected a time below 9223372036854775 (int64 ns), found "
                                     f"'{'1' * 25}'")
    with pytest.raises(convert.OutOfRange) as info:
        convert.unit_to_bytes(pa.array(["1", "1e400"]), 1 << 20)
    assert (info.value.row, info.value.expected, info.value.found) == (1, "a finite size below 8 EiB", "'1e400'")
    assert convert.ns_to_ns(pa.array(["12", None, "007"])).to_pylist() == [12, None, 7]


def test_device_labels_are_trimmed_and_lower_case() -> None:
    assert convert.device_labels(pa.array(["NPU:0", " npu:1 ", None])).tolist() == ["npu:0", "npu:1", pd.NA]
    encoded = convert.label_categories(pa.array(["NPU:0", "npu:0 ", "NPU:1", None, "NPU:0"]))
    assert encoded.dictionary.to_pylist() == ["npu:0", "npu:1"]  # two spellings of npu:0 are one category
    assert encoded.indices.to_pylist() == [0, 0, 1, None, 0]


def test_missing_values() -> None:
    assert convert.na_to_null(pa.chunked_array([["N/A", "1", None, "n/a"]])).to_pylist() == [None, "1", None, "n/a"]
    assert convert.int64_or_zero(None, 3).tolist() == [0, 0, 0]  # an absent column
    assert convert.int64_or_zero(pa.nulls(2), 2).tolist() == [0, 0]
    zeros = convert.int64_or_zero(pa.array([1, None, 3]), 3)
    assert zeros.tolist() == [1, 0, 3] and zeros.dtype == np.int64

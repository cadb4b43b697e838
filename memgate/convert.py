"""Exact conversions from the writers' text cells to int64 bytes and ns.

A float64 cannot hold a µs timestamp like ``1764246877082702.440`` exactly, so timestamps are
parsed digit by digit into int64 ns. Sizes in MB/KB are binary fractions that float64 holds
exactly (torch_npu writes ``bytes / 1024**2``), so ``round(value * unit)`` recovers the bytes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

_TIME = r"^(?P<int>[0-9]+)(?:\.(?P<frac>[0-9]*))?"


def us_text_to_ns(col: pa.ChunkedArray | pa.Array) -> pd.Series:
    """``"1764246877082702.440\\t"`` (µs) → 1764246877082702440 (ns); nulls stay null.

    Digits past the third decimal (sub-ns) are dropped.
    """
    return _decimal_text_to_int(col, decimals=3)


def ns_text_to_ns(col: pa.ChunkedArray | pa.Array) -> pd.Series:
    return _decimal_text_to_int(col, decimals=0)


def _decimal_text_to_int(col: pa.ChunkedArray | pa.Array, decimals: int) -> pd.Series:
    parts = pc.extract_regex(col, _TIME)
    whole = pc.cast(pc.struct_field(parts, "int"), pa.int64())
    scale = 10**decimals
    if decimals == 0:
        values = whole
    else:
        frac = pc.fill_null(pc.struct_field(parts, "frac"), "")
        frac = pc.utf8_slice_codeunits(pc.utf8_rpad(frac, decimals, "0"), 0, decimals)
        values = pc.add_checked(pc.multiply_checked(whole, scale), pc.cast(frac, pa.int64()))
    return _int64_series(values)


def unit_text_to_bytes(col: pa.ChunkedArray | pa.Array, bytes_per_unit: float) -> pd.Series:
    """Decimal text in a unit (MB, KB, ...) → int64 bytes, rounded to the nearest byte."""
    values = np.asarray(pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    scaled = np.rint(values * bytes_per_unit)
    missing = np.isnan(scaled)
    return pd.Series(pd.arrays.IntegerArray(np.where(missing, 0, scaled).astype(np.int64), missing))


def int_text(col: pa.ChunkedArray | pa.Array) -> pd.Series:
    return _int64_series(pc.cast(col, pa.int64()))


def text(col: pa.ChunkedArray | pa.Array) -> pd.Series:
    return pd.Series(col.to_pylist(), dtype="string")


def _int64_series(values: pa.ChunkedArray | pa.Array) -> pd.Series:
    return pd.Series(values.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get), dtype="Int64")

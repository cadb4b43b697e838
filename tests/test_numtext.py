"""The number-text fast paths agree with the schema patterns and with exact decimal arithmetic."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from memgate.readers.numtext import _FLOAT_TEXT, _PATTERNS, fixed_column, proven_valid

SCHEMAS = Path(__file__).parents[1] / "memgate" / "schemas"


def layout_cells(int_digits: int, frac_digits: int, tab: bool) -> st.SearchStrategy[str]:
    digits = st.text("0123456789", min_size=1, max_size=1)
    whole = st.lists(digits, min_size=int_digits, max_size=int_digits).map("".join)
    frac = st.lists(digits, min_size=frac_digits, max_size=frac_digits).map("".join)
    return st.tuples(whole, frac).map(lambda p: p[0] + ("." + p[1] if frac_digits else "") + ("\t" if tab else ""))


@st.composite
def columns(draw: st.DrawFn, stray: bool = True) -> list[str | None]:
    """Cells of one layout (the fast path), with or without a stray cell of another shape."""
    layout = draw(st.tuples(st.integers(1, 20), st.sampled_from([0, 0, 1, 3, 6]), st.booleans()))
    cells: list[str | None] = draw(st.lists(st.one_of(layout_cells(*layout), st.none()), min_size=1, max_size=40))
    if stray:
        odd = draw(st.text("0123456789.\t-+eE \n", min_size=0, max_size=len(cells[0] or "x") + 1))
        cells.insert(draw(st.integers(0, len(cells))), odd)
    return cells


@given(columns(stray=False))
def test_one_layout_takes_the_fast_path(cells: list[str | None]) -> None:
    fixed = fixed_column(pa.array(cells, type=pa.string()))
    assert (fixed is None) == all(c is None for c in cells)


@given(st.one_of(columns(), columns(stray=False)))
def test_a_fixed_layout_is_only_accepted_where_the_pattern_accepts_every_cell(cells: list[str | None]) -> None:
    fixed = fixed_column(pa.array(cells, type=pa.string()))
    if fixed is None:
        return
    for pattern in _PATTERNS:
        if fixed.accepted_by(pattern):
            assert all(re.fullmatch(pattern[1:-1], c) for c in cells if c is not None), pattern
            assert fixed.accepted_by(pattern + "|^N/A$")


@given(st.one_of(columns(), columns(stray=False)), st.sampled_from([0, 3]))
def test_fixed_layout_values_are_exact(cells: list[str | None], decimals: int) -> None:
    col = pa.array(cells, type=pa.string())
    fixed = fixed_column(col)
    values = fixed.scaled_ints(decimals) if fixed is not None else None
    if values is None:
        return
    for cell, value in zip(cells, values.to_pylist(), strict=True):
        if cell is None:
            assert value is None
            continue
        whole, _, frac = cell.rstrip("\t").partition(".")
        assert value == int(Decimal(whole + "." + (frac[:decimals] or "0")).scaleb(decimals))
        assert value <= 2**63 - 1


def test_past_int64_takes_the_general_path() -> None:
    assert fixed_column(pa.array(["9223372036854775.808"])).scaled_ints(3) is None
    assert fixed_column(pa.array(["9223372036854775.807"])).scaled_ints(3).to_pylist() == [2**63 - 1]


def test_the_schemas_number_patterns_have_the_fast_path() -> None:
    """A schema whose time or size pattern is respelled would silently lose the fast path."""
    patterns = {prop.get("pattern") for path in SCHEMAS.glob("*.schema.json")
                for prop in json.loads(path.read_text()).get("properties", {}).values() if isinstance(prop, dict)}
    numeric = {p for p in patterns if p and p.startswith(("^[0-9]+", "^-?[0-9]+"))}
    assert {p.removesuffix("|^N/A$") for p in numeric} <= set(_PATTERNS), numeric


FLOAT_CELL = st.from_regex(_FLOAT_TEXT, fullmatch=True).filter(lambda c: "\n" not in c)
NEAR_MISS = st.text("0123456789.-+eEinfatyINFATY \t", max_size=8)


@given(st.lists(st.one_of(FLOAT_CELL, st.none()), min_size=1, max_size=30))
def test_float_text_is_proven(cells: list[str | None]) -> None:
    assert proven_valid(pa.array(cells, type=pa.string()), _FLOAT_TEXT) == any(c is not None for c in cells)


@given(st.lists(st.one_of(FLOAT_CELL, NEAR_MISS, st.none()), min_size=1, max_size=30),
       st.sampled_from(list(_PATTERNS)))
def test_a_proof_means_every_cell_matches(cells: list[str | None], pattern: str) -> None:
    col = pa.array(cells, type=pa.string())
    for spelled in (pattern, pattern + "|^N/A$"):
        if proven_valid(col, spelled):
            assert all(re.fullmatch(pattern[1:-1], c) for c in cells if c is not None), (spelled, cells)


def test_float_text_edges() -> None:
    for cell in ["+1", ".5", "-.5", "5.", "1.e5", "inf", "-inf", "nan", "Infinity", "1e", "-", " 1", "1\t"]:
        assert not proven_valid(pa.array(["12.5", cell]), _FLOAT_TEXT), cell
    assert proven_valid(pa.array(["12.5", "-0.25", "1e-5", "3E+07", None, "4301.658203125"]), _FLOAT_TEXT)
    assert proven_valid(pa.array(["12.5", "-0.25"]).slice(1), _FLOAT_TEXT)

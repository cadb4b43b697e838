"""Building an error message never fails: ``found`` values are shown bounded (memgate.errors.show).

``repr()`` raises on an int of more than 4300 digits (``sys.int_max_str_digits``) and on a list
nested deeper than the interpreter's recursion guard (a million deep passes it on any version), loops
on nothing but is unbounded on a list that contains itself, and copies a 100 MB string whole. The
expected texts are written out here, not taken from memgate.
"""

from __future__ import annotations

import pickle
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memgate.discover import discover, load
from memgate.errors import FOUND_CHARS, InputError, show


def nested(depth: int) -> list[Any]:
    root: list[Any] = []
    inner = root
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return root


def test_the_premise_repr_fails_on_these() -> None:
    with pytest.raises(ValueError):
        repr(10**5000)
    # A million deep, as shown below. Not sys.getrecursionlimit() + 100: from 3.12 repr() of nested
    # lists is bounded by the C stack's own limit instead, which that depth does not reach.
    with pytest.raises(RecursionError):
        repr(nested(1_000_000))


SHOWN = {  # id -> (a factory of the value, its text)
    "huge int": (lambda: 10**5000, "<16610-bit integer>"),
    "huge negative int": (lambda: -(10**5000), "<negative 16610-bit integer>"),
    "256-bit int": (lambda: 2**256 - 1, repr(2**256 - 1)),  # up to 256 bits: written out
    "a million deep": (lambda: nested(1_000_000), "[" * (FOUND_CHARS - 3) + "..."),
    "100 MB string": (lambda: "x" * 100_000_000, "'" + "x" * (FOUND_CHARS - 4) + "..."),
    "bytes": (lambda: b"ab\x00", "b'ab\\x00'"),
    "decimal": (lambda: Decimal("1E+999999999"), "1E+999999999"),
    "long decimal": (lambda: Decimal("1" * 100), "<decimal of 100 digits>"),
    "mixed": (lambda: {"a": [1, (2,)], 3: None}, "{'a': [1, (2,)], 3: None}"),
    "empty set": (lambda: set(), "set()"),
    "frozenset": (lambda: frozenset({1}), "{1}"),
}


@pytest.mark.parametrize("case", sorted(SHOWN))
def test_show_is_bounded_and_never_raises(case: str) -> None:
    make, text = SHOWN[case]
    value = make()
    assert show(value) == text
    assert len(show(value)) <= FOUND_CHARS


def test_a_list_that_contains_itself() -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    assert show(loop) == ("[1, " * 20)[: FOUND_CHARS - 3] + "..."


def test_an_object_whose_repr_fails() -> None:
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("no")

    assert show(Broken()) == "<Broken>"


JSONISH = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**200), 2**200), st.floats(allow_nan=False),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=20,
)


@given(value=JSONISH)
def test_show_is_repr_where_repr_is_short(value: Any) -> None:
    text = repr(value)
    assert show(value, len(text)) == text
    if len(text) > 10:
        assert show(value, 10) == text[:7] + "..."


@pytest.mark.parametrize("make, line", [
    (lambda: 10**5000, "found '<16610-bit integer>'"),
    (lambda: nested(1_000_000), "found '" + "[" * (FOUND_CHARS - 4) + "..."),  # cut as any long text is
    (lambda: "no such key", "found 'no such key'"),  # text stays as it was
    (lambda: "'quoted'", "found 'quoted'"),
], ids=["huge int", "a million deep", "text", "quoted text"])
def test_the_one_line_message(make: Any, line: str) -> None:
    err = InputError("bad value", file="f.json", column="x", expected="a number", found=make())
    assert err.one_line().endswith(line)
    again = pickle.loads(pickle.dumps(err))  # errors travel back from --jobs workers
    assert again.one_line() == err.one_line() and again.found == err.found


def test_a_huge_integer_in_a_snapshot_is_an_input_error(tmp_path: Path) -> None:
    """End to end: the value a pickle can hold and repr() cannot write (it was exit 3, a ValueError)."""
    snapshot = {"segments": [{"device": 0, "address": 1, "total_size": 10**5000, "allocated_size": 0,
                              "active_size": 0, "stream": 0, "segment_type": "large", "blocks": []}],
                "device_traces": [[]]}
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    with pytest.raises(InputError) as info:
        load(discover(path)[0])
    assert info.value.column == "segments[0].total_size" and info.value.found == "<16610-bit integer>"

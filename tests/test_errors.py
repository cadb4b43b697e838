"""memgate.errors: one error family, each error one line (``FILE:LINE: column 'C': message; expected E,
found F``), printable on a terminal, and its ``found`` value shown bounded (:func:`memgate.errors.show`).

``repr()`` raises on an int of more than 4300 digits (``sys.int_max_str_digits``) and on a list
nested deeper than the interpreter's recursion guard (a million deep passes it on any version), loops
on nothing but is unbounded on a list that contains itself, and copies a 100 MB string whole. The
expected texts are written out here, not taken from memgate.
"""

from __future__ import annotations

import pickle
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memgate.discover import discover, load
from memgate.errors import (
    FOUND_CHARS,
    AmbiguousProfiles,
    ConfigError,
    InputError,
    MemgateError,
    NotMeasurable,
    NotSelected,
    cannot_read,
    printable,
    read_errors_named,
    remembered,
    show,
)


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


# ---- the one-line message ---------------------------------------------------------------------------


def test_one_line_names_the_file_line_and_column_then_says_what_was_expected_and_found() -> None:
    err = InputError("bad cell", file=Path("a") / "f.csv", line=3, column="Size(KB)", expected="a number", found="12x")
    assert err.one_line() == "a/f.csv:3: column 'Size(KB)': bad cell; expected a number, found '12x'"
    assert str(err) == err.one_line() and err.file == "a/f.csv"  # a Path is kept as text
    assert InputError("bad", file="f.csv").one_line() == "f.csv: bad"
    assert InputError("bad", line=3).one_line() == "bad"  # a line without its file names nothing
    assert InputError("two\nlines", found=[1, 2]).one_line() == "two lines, found '[1, 2]'"
    assert InputError("m", found="'quoted'").one_line() == "m, found 'quoted'"  # text already quoted stays as is


def test_lines_are_the_error_then_the_others_of_the_same_input_in_order() -> None:
    first = ConfigError("first", file="b.toml", line=1)
    assert first.lines() == ["b.toml:1: first"] and first.also == ()
    first.also = (ConfigError("second", file="b.toml", line=4), ConfigError("third", file="b.toml", line=9))
    assert first.lines() == ["b.toml:1: first", "b.toml:4: second", "b.toml:9: third"]
    assert first.one_line() == "b.toml:1: first"


@pytest.mark.parametrize("cls", [MemgateError, InputError, ConfigError, NotMeasurable, NotSelected, AmbiguousProfiles])
def test_an_error_keeps_its_class_and_fields_through_pickle(cls: type[MemgateError]) -> None:
    """Errors travel back from --jobs worker processes."""
    err = cls("no device", file="p", line=2, column="devices", expected="npu:*", found="cpu")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is cls
    fields = ("message", "file", "line", "column", "expected", "found")
    assert [getattr(again, f) for f in fields] == [getattr(err, f) for f in fields]


def test_errors_are_one_family() -> None:
    assert issubclass(InputError, MemgateError)
    assert issubclass(ConfigError, MemgateError) and issubclass(NotMeasurable, MemgateError)
    assert issubclass(NotSelected, NotMeasurable)  # a skip is a kind of "cannot measure here"
    assert issubclass(AmbiguousProfiles, ConfigError)


def test_cannot_read_names_the_file_the_os_names_else_the_path() -> None:
    err = cannot_read(PermissionError(13, "Permission denied", "/x/y"), "/x")
    assert isinstance(err, InputError) and err.one_line() == "/x/y: cannot read: Permission denied"
    assert cannot_read(OSError("boom"), "/x", expected="z").one_line() == "/x: cannot read: boom; expected z"


def test_a_loader_s_failed_read_is_one_input_error_and_the_loader_keeps_its_name() -> None:
    def load(path: Path) -> int:
        """Read it."""
        if path.name == "gone":
            raise FileNotFoundError(2, "No such file or directory", str(path / "memory_record.csv"))
        return 7

    wrapped = read_errors_named(load)
    assert wrapped(Path("/p/here")) == 7
    with pytest.raises(InputError) as info:
        wrapped(Path("/p/gone"))
    assert info.value.one_line() == "/p/gone/memory_record.csv: cannot read: No such file or directory"
    assert (wrapped.__name__, wrapped.__module__, wrapped.__doc__) == ("load", __name__, "Read it.")


# ---- what a terminal shows --------------------------------------------------------------------------

RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    assert printable("a\x1b[31mb") == "a\\x1b[31mb"
    assert printable("x\ny\rz") == "x\\x0ay\\x0dz"
    assert printable("\x9b\x7f\u202e\u2066") == "\\x9b\\x7f\\u202e\\u2066"
    assert printable("run\udcff\ud800") == "run\\xff\\ud800"  # a name's byte that is not UTF-8; a lone surrogate
    # what a name may hold and a terminal shows as it is: tabs, accents, CJK, emoji
    assert printable("aten::añadir\t層 🔥") == "aten::añadir\t層 🔥"


def test_an_error_is_one_printable_line() -> None:
    err = InputError("bad \x1b]0;title\x07 cell", file="dir\x1b[2J/f.csv", line=3, found="q\u202eq")
    text = err.one_line()
    assert not RAW.search(text), text
    assert "\\x1b]0;title\\x07" in text and "\\u202e" in text


def test_remembered_makes_once_per_key_and_raises_a_kept_error_again() -> None:
    calls: list[str] = []
    memo: dict[str, int | MemgateError] = {}

    def make(key: str) -> int:
        calls.append(key)
        if key == "bad":
            raise InputError("unreadable", file=key)
        return len(key)

    assert remembered(memo, "good", lambda: make("good")) == 4
    assert remembered(memo, "good", lambda: make("good")) == 4
    for _ in range(2):
        with pytest.raises(InputError, match="unreadable") as info:
            remembered(memo, "bad", lambda: make("bad"))
        assert info.value.file == "bad"
    assert calls == ["good", "bad"]  # neither made twice
    with pytest.raises(ZeroDivisionError):  # only memgate's own errors are kept: a bug is not remembered
        remembered(memo, "bug", lambda: 1 // 0)
    assert "bug" not in memo


def test_a_message_quoting_a_huge_value_is_cut_in_the_middle() -> None:
    """A value a message quoted whole (none should: they go to found, bounded) still makes no huge line."""
    line = InputError("start " + "x" * 100_000 + " end", file="f.json", expected="y" * 5000 + "!").one_line()
    assert len(line) < 4100
    assert line.startswith("f.json: start xxx") and " end; expected yyy" in line and line.endswith("y!")
    assert "…(98036 characters)…" in line and "…(3027 characters)…" in line  # 100,010 - 2 * 987; 5001 - 2 * 987
    short = InputError("short", file="f", expected="e").one_line()
    assert short == "f: short; expected e"

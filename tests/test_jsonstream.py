"""memgate.readers.jsonstream: JSON read as a stream under guards (nesting depth, number length, a digit
run checked by sampling), a trace's elements one at a time with every error located (a truncated file, a
syntax error, a key repeated with another value), and torch's unescaped name lines repaired, as a stream
and at once alike. The loaders reading through it: tests/test_traceevents.py, tests/test_kineto.py."""

from __future__ import annotations

import io
import json
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from helpers import ODD_EVENT, SAMPLES
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import fuzz_settings

from memgate.errors import InputError
from memgate.readers import jsonstream
from memgate.readers.jsonstream import GuardedReader, JsonLimitError, iter_array, loads_unique, top_level_kind

ACTIVE6 = SAMPLES / "torch" / "cpu_train_active6_profile_memory.json"


def _write(tmp_path: Path, data: bytes, name: str = "trace.json") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# ---- a trace's elements, one at a time ------------------------------------------------------------------


def test_elements_are_read_exactly_under_their_prefix(tmp_path: Path) -> None:
    path = _write(tmp_path, b'[1, 2.50, {"a": [true, null]}, "x", {"k": 1, "k": 1.0}]')
    assert list(iter_array(path)) == [1, Decimal("2.50"), {"a": [True, None]}, "x", {"k": Decimal("1.0")}]
    path = _write(tmp_path, b'{"traceEvents": [{"ph": "X"}, {"ph": "i"}], "other": 1}')
    assert list(iter_array(path, "traceEvents.item")) == [{"ph": "X"}, {"ph": "i"}]


@pytest.mark.parametrize(("data", "says"), [
    (b'[{"a": 1}, {"a": 2', (":1: column '[1]': truncated JSON: the file ends inside element [1]; expected the rest "
                             "of the array and its closing ']', found 'end of file after 18 bytes'")),
    (b'[{"a": 1},\n {"a": 2,, }]', (":2: column '[1]': invalid JSON at char 10: Expecting property name enclosed in "
                                     "double quotes")),
    (b'[{"a": 1}, {"a": 1, "a": 2}]', (": column '[1].a': conflicting duplicate key 'a': the object names it twice "
                                       "with different values; expected each key once, or repeated with the same "
                                       "value (a JSON reader keeps only the last one), found '1, then 2'")),
], ids=["truncated", "syntax", "key_twice"])
def test_an_error_names_the_element_and_the_line(tmp_path: Path, data: bytes, says: str) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(InputError) as info:
        list(iter_array(path))
    assert info.value.one_line() == f"{path}{says}"


def test_top_level_kind(tmp_path: Path) -> None:
    kinds = [top_level_kind(_write(tmp_path, data, f"{i}.json"))
             for i, data in enumerate((b'\xef\xbb\xbf  [1]', b'\n{"a": 1}', b'"x"'))]
    assert kinds == ["array", "object", "other"]  # a byte-order mark and blanks first are skipped


def test_a_small_document_with_a_key_twice_names_its_path(tmp_path: Path) -> None:
    path = tmp_path / "profiler_info.json"
    assert loads_unique(b'{"a": 1, "b": 1.5, "c": {"k": 1, "k": 1}}', path) == {"a": 1, "b": 1.5, "c": {"k": 1}}
    with pytest.raises(InputError) as info:
        loads_unique(b'{"a": {"k": 1, "k": 2}}', path)
    assert (info.value.file, info.value.column, info.value.found) == (str(path), "a.k", "1, then 2")


# ---- the guard: nesting depth and number length, located in any chunking ------------------------------------

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
              st.text(alphabet=st.sampled_from(list('ab[]{}"\\,: \n\u00e9')), max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)),
    max_leaves=40,
)


def depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


def drain(text: bytes, chunks: list[int], max_depth: int) -> GuardedReader:
    guard = GuardedReader(io.BytesIO(text), max_depth=max_depth)
    k = 0
    while guard.read(chunks[k % len(chunks)]):
        k += 1
    return guard


@fuzz_settings(ci=200, dev=60)
@given(value=json_values, chunks=st.lists(st.integers(1, 7), min_size=1, max_size=5), indent=st.sampled_from((None, 1)))
def test_depth_guard_matches_the_true_depth(value: Any, chunks: list[int], indent: int | None) -> None:
    text = json.dumps([value], indent=indent, ensure_ascii=False).encode("utf-8")
    true_depth = depth([value])
    guard = drain(text, chunks, true_depth)  # exactly at the cap: fine
    assert guard.depth == 0
    with pytest.raises(JsonLimitError) as info:
        drain(text, chunks, true_depth - 1)
    # located at the bracket that opens the level past the cap, whatever the chunks
    at = first_bracket_at_level(text, true_depth)
    assert_located(info.value, text, at)


def first_bracket_at_level(text: bytes, level: int) -> int:
    """Offset of the first [ or { that opens ``level``, from the decoded text (strings skipped by
    json's own tokenizer, not by the guard's byte scan)."""
    depth, i, s = 0, 0, text.decode("utf-8")
    while i < len(s):
        c = s[i]
        if c == '"':
            _, i = json.decoder.scanstring(s, i + 1)  # type: ignore[attr-defined]
            continue
        if c in "[{":
            depth += 1
            if depth == level:
                return len(s[:i].encode("utf-8"))
        elif c in "]}":
            depth -= 1
        i += 1
    raise AssertionError("no such level")


def assert_located(err: JsonLimitError, text: bytes, at: int) -> None:
    assert err.offset == at, (err.offset, at)
    assert err.line == text[:at].count(b"\n") + 1
    if err.char is not None:  # the line's bytes were at hand
        line_start = text.rfind(b"\n", 0, at) + 1
        assert err.char == len(text[line_start:at].removeprefix(b"\xef\xbb\xbf").decode("utf-8")) + 1  # a BOM is no character


@fuzz_settings(ci=60, dev=20)
@given(before=st.lists(st.integers(0, 10**6), max_size=30), digits=st.integers(4001, 8200),
       chunk=st.sampled_from([1, 7, 333, 4096, 65536]), indent=st.sampled_from((None, 1)), bom=st.booleans())
def test_a_too_long_number_is_located_at_its_first_digit(before: list[int], digits: int, chunk: int,
                                                        indent: int | None, bom: bool) -> None:
    """Inside one read or across many: the error names the number's own line, character and byte."""
    head = json.dumps({"ts": before, "é": "[{"}, indent=indent, ensure_ascii=False)[:-1].encode("utf-8")
    text = (b"\xef\xbb\xbf" if bom else b"") + head + b', "x": ' + b"7" * digits + b"}"
    with pytest.raises(JsonLimitError) as info:
        drain(text, [chunk], 512)
    assert_located(info.value, text, text.index(b"7" * 4000))
    # the limit is one: 4000 digits pass whether inside one read or across many
    at_cap = text.replace(b"7" * digits, b"7" * 4000)
    assert drain(at_cap, [chunk], 512).depth == 0


# ---- the digit-run check of the guard ---------------------------------------------------------------------


@given(runs=st.lists(st.tuples(st.integers(0, 20_000), st.integers(1, jsonstream.MAX_NUMBER + 5)), max_size=4),
       size=st.integers(0, 30_000), seed=st.integers(0, 2**16))
@example(runs=[(0, jsonstream.MAX_NUMBER)], size=0, seed=0)  # at the limit: allowed
@example(runs=[(0, jsonstream.MAX_NUMBER + 1)], size=0, seed=0)  # one over: a run
def test_the_sampled_digit_run_check_is_exact(runs: list[tuple[int, int]], size: int, seed: int) -> None:
    """A run is more than MAX_NUMBER digits in a row; the stride sample never misses one."""
    rng = random.Random(seed)
    chunk = bytearray(rng.choice(b'0123456789 ."{}[],:e') for _ in range(size))
    for at, length in runs:
        chunk[at:at + length] = b"7" * length
    data = bytes(chunk)
    longer = b"0" * (jsonstream.MAX_NUMBER + 1) in data.translate(jsonstream._DIGIT_MAP)
    assert jsonstream._has_digit_run(data) == longer


# ---- torch's unescaped names (torch 2.13, with_stack=True) ------------------------------------------------


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_name_repair_streams_what_escape_names_repairs_at_once(chunk: int) -> None:
    raw = ACTIVE6.read_bytes()
    at = raw.index(b'"traceEvents": [\n') + len(b'"traceEvents": [\n')
    data = raw[:at] + ODD_EVENT.encode() * 3 + raw[at:] + b'\n    "name": "a\\"b"'  # the last: valid, kept
    stream = jsonstream.NameRepair(io.BytesIO(data))
    out = b"".join(iter(lambda: stream.read(chunk), b""))
    assert out == jsonstream.escape_names(data)
    assert out.count(b"\n") == data.count(b"\n") and stream.count == 3
    assert jsonstream.escape_names(raw) == raw


def test_a_name_line_with_quotes_inside_is_escaped_and_a_valid_one_kept() -> None:
    repaired = jsonstream.escape_names(b'    "name": "a "b" c",\n    "name": "ok"\n')
    assert repaired == b'    "name": "a \\"b\\" c",\n    "name": "ok"\n'
    assert json.loads(b"[{" + repaired.split(b"\n")[0].rstrip(b",") + b"}]") == [{"name": 'a "b" c'}]

"""The two readers of a Chrome trace's events (memgate.readers.traceevents): chunked json and ijson.

The json reader (``traceevents.json_batches``) parses the traceEvents array a chunk at a time and
gives up (``Unproven``) on anything it cannot vouch for; the ijson reader then reads the file and
names its first error. These tests hold it to that contract on generated and mutated JSON: when
the json reader answers, ijson accepts the file too and reads the very same events (same keys in
the same order, same Python types, same ``Decimal`` text), whatever the chunk size. They also pin
that the json reader does answer for ordinary traces (else the loader would be slow, not wrong),
and that an error does not depend on where batches end.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from helpers import ODD_EVENT, ODD_NAME
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memgate.errors import InputError
from memgate.loaders.kineto import kineto
from memgate.metrics import profile_metrics
from memgate.readers import traceevents
from memgate.readers.jsonstream import NumberText, guard, same_json

TORCH = Path(__file__).parent / "data" / "samples" / "torch"
LEAK = TORCH / "cpu_train_leak_profile_memory.json"
RELAXED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                         HealthCheck.function_scoped_fixture])


def canon(value: Any) -> Any:
    """A value with its Python types spelled out (1 vs Decimal('1.0') vs '1', key order kept); the json
    reader's number text stands for the Decimal that ijson reads."""
    if type(value) is NumberText:
        return "Decimal", str(Decimal(value))
    if isinstance(value, dict):
        return [(k, canon(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [canon(v) for v in value]
    return type(value).__name__, str(value)


def json_reader(data: bytes, chunk: int) -> list[Any] | None:
    """The json reader's events with ``chunk``-byte reads; None when it gives up."""
    with mock.patch.object(traceevents, "CHUNK_BYTES", chunk), \
            mock.patch.object(traceevents, "_TAIL", max(chunk // 2, 1)):
        try:
            return [e for batch in traceevents.json_batches(guard(io.BytesIO(data))) for e in batch]
        except traceevents.Unproven:
            return None


def ijson_reader(data: bytes, tmp: Path) -> list[Any] | InputError:
    path = tmp / "t.pt.trace.json"
    path.write_bytes(data)
    try:
        with open(path, "rb") as fh:
            return [e for batch in traceevents.ijson_batches(path, fh, gz=False) for e in batch]
    except InputError as exc:
        return exc


def assert_readers_agree(data: bytes, chunk: int, tmp: Path) -> list[Any] | None:
    fast = json_reader(data, chunk)
    if fast is not None:
        slow = ijson_reader(data, tmp)
        assert not isinstance(slow, InputError), f"the json reader took what ijson rejects: {slow}"
        assert canon(fast) == canon(slow)
    return fast


# ---- generated traces -----------------------------------------------------------------------------

WS = st.sampled_from(["", " ", "\n", "\n  ", "\t", "\r\n"])
NUMBERS = st.from_regex(r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,12})?([eE][+-]?[0-9]{1,3})?", fullmatch=True)
CLEAN_TEXT = st.text(st.sampled_from(list("ab c:#[]\\\"/é\u2028\t") + ["\U0001f600"]), max_size=12)
BRACE_TEXT = st.text(st.sampled_from(list('{}[], "\\:x')), max_size=12)  # "}, {" inside strings


@st.composite
def json_texts(draw: st.DrawFn, strings: st.SearchStrategy[str], depth: int = 0) -> str:
    kind = draw(st.sampled_from(["number", "string", "literal"] + (["array", "object"] if depth < 3 else [])))
    if kind == "number":
        return draw(NUMBERS)
    if kind == "string":
        text = draw(strings)  # (an escaped astral character is a surrogate pair: left to ijson, see below)
        return json.dumps(text, ensure_ascii=draw(st.booleans()) and max(text, default="a") < "\U00010000")
    if kind == "literal":
        return draw(st.sampled_from(["true", "false", "null"]))
    items = draw(st.lists(json_texts(strings, depth + 1), max_size=3))
    ws = draw(WS)
    if kind == "array":
        return "[" + ws + ("," + ws).join(items) + ws + "]"
    keys = draw(st.lists(st.sampled_from(["ts", "dur", "name", "pid", "args", "Bytes", "k", ""]),
                         min_size=len(items), max_size=len(items), unique=True))  # repeats: see below
    return "{" + ws + ("," + ws).join(f"{json.dumps(k)}:{ws}{v}" for k, v in zip(keys, items, strict=True)) + ws + "}"


@st.composite
def events(draw: st.DrawFn, strings: st.SearchStrategy[str]) -> str:
    """A trace event: a realistic memory event or cpu_op, or an object of random members."""
    ts = draw(st.from_regex(r"(0|[1-9][0-9]{0,15})\.[0-9]{3}", fullmatch=True))
    kind = draw(st.sampled_from(["memory", "op", "random"]))
    if kind == "memory":
        return ('{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 2, "ts": ' + ts
                + ', "args": {"Addr": 94, "Bytes": 512, "Total Allocated": 1024, "Total Reserved": 0, '
                + '"Device Type": 0, "Device Id": -1}}')
    if kind == "op":
        name = json.dumps(draw(strings), ensure_ascii=False)
        return (f'{{"ph": "X", "cat": "cpu_op", "name": {name}, "pid": 1, "tid": 2, "ts": {ts}, '
                f'"dur": {draw(NUMBERS)}, "args": {draw(json_texts(strings, 1))}}}')
    members = draw(st.lists(st.tuples(st.sampled_from(["ph", "name", "cat", "ts", "dur", "args", "x"]),
                                      json_texts(strings, 1)), max_size=5, unique_by=lambda m: m[0]))
    ws = draw(WS)
    return "{" + ws + ("," + ws).join(f'"{k}":{ws}{v}' for k, v in members) + ws + "}"


@st.composite
def traces(draw: st.DrawFn, strings: st.SearchStrategy[str]) -> bytes:
    ws = draw(WS)
    head = [f'"schemaVersion":{ws}1', f'"deviceProperties":{ws}[{{"id": 0}},{ws}{{"id": 1}}]']
    tail = [f'"traceName":{ws}"x"', f'"devices":{ws}[{{"a": {{}}}},{ws}{{"b": [{{}},{ws}{{}}]}}]']
    body = ("," + ws).join(draw(st.lists(events(strings), max_size=12)))
    members = draw(st.permutations(head))[: draw(st.integers(0, 2))]
    members.append(f'"traceEvents":{ws}[{ws}{body}{ws}]')
    members += draw(st.permutations(tail))[: draw(st.integers(0, 2))]
    return ("{" + ws + ("," + ws).join(members) + ws + "}" + ws).encode("utf-8")


@RELAXED
@given(data=st.one_of(traces(CLEAN_TEXT), traces(BRACE_TEXT)), chunk=st.integers(1, 600))
def test_the_json_reader_reads_valid_traces_like_ijson(data: bytes, chunk: int, tmp_path: Path) -> None:
    """A valid trace (without surrogate escapes) is the json reader's to read, at any chunk size,
    '}, {' inside strings or arrays included."""
    assert assert_readers_agree(data, chunk, tmp_path) is not None


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(traces(BRACE_TEXT)))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data)))
        edit = draw(st.sampled_from(["insert", "delete", "flip"]))
        if edit == "insert":
            data[at:at] = draw(st.sampled_from([b",", b"]", b"}", b"{", b"[", b'"', b"\\", b"NaN", b"-Infinity",
                                                b'"\\ud800"', b"\xff", b"\xed\xa0\x80", b"\x00", b"1e400", b"01",
                                                b" \n\t\r" * 40]))  # whitespace inside a token too
        elif edit == "delete":
            del data[at:at + draw(st.integers(1, 4))]
        elif at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
    return bytes(data)


@RELAXED
@given(data=mutated(), chunk=st.integers(1, 600))
def test_the_json_reader_never_takes_what_ijson_rejects(data: bytes, chunk: int, tmp_path: Path) -> None:
    assert_readers_agree(data, chunk, tmp_path)


@pytest.mark.parametrize("case", [
    b'{"traceEvents": [{"name": "\\ud800"}]}',  # ijson reads a lone surrogate escape as "?"
    b'{"traceEvents": [{"name": "\\ud83d\\ude00"}]}',  # (a pair reads alike, but it is rare)
    b'{"traceEvents": [{"ts": NaN}]}',
    b'{"traceEvents": [{"a": 1}, 7]}',
    b'{"traceEvents": [{"a": 1}], "traceEvents": [{"b": 2}]}',  # ijson yields both arrays
    b'{"traceEvents": [{"a": 1}]} {}',
    b'{"x": {"traceEvents": [{"a": 1}]}}',
    b'{"traceEvents": [{"a": 1},]}',
    b'{"traceEvents": [{"a": 1}, {"b": 2}]',
])
def test_the_json_reader_leaves_odd_files_to_ijson(case: bytes, tmp_path: Path) -> None:
    for chunk in (1, 9, 1 << 20):
        assert json_reader(case, chunk) is None, chunk
    assert_readers_agree(case, 1 << 20, tmp_path)


def test_a_cut_inside_an_event_falls_back_to_one_event_at_a_time(tmp_path: Path) -> None:
    """'}, {' inside an event (its arrays, its strings) is no place to cut: at any chunk size the json
    reader still reads every event."""
    data = b'{"traceEvents": [{"a": [{}, {"b": "}, {"}]}, {"c": [{"d": 1}, {"e": [{}, {}]}]}, {"f": 2}]}'
    for chunk in range(1, len(data) + 1):
        assert assert_readers_agree(data, chunk, tmp_path) is not None, chunk


@pytest.mark.parametrize("case", [
    b'{"traceEvents": [{"a": 1' + b" " * 300 + b'2}]}',  # "1 2" is no number: whitespace never joins tokens
    b'{"traceEvents": [{"a": tr' + b" " * 300 + b'ue}]}',
    b'{"traceEvents": [{"a": 1' + b"\n" * 300 + b'e5}]}',
    b'{"traceEvents": [{"a": "x' + b" " * 300 + b'y"}]}',  # inside a string it is the string's
    b'{"traceEvents": [{"a": 1}' + b" \x0b\x0c" * 100 + b']}',  # \v and \f are no JSON whitespace
])
def test_whitespace_between_the_reads_changes_nothing(case: bytes, tmp_path: Path) -> None:
    for chunk in (1, 7, 64, 100, 1 << 20):
        assert_readers_agree(case, chunk, tmp_path)


def test_a_trace_padded_with_whitespace_reads_its_events_with_the_json_reader(tmp_path: Path) -> None:
    """Whitespace between tokens, in runs far longer than a read, is left out: the same events, and
    the json reader keeps the file (it used to pile the whitespace up and hand the file to ijson)."""
    pad = b" \n" * 5000
    plain = b'{"traceEvents": [{"ts": 1, "a": "x y"}, {"ts": 2, "args": {"b": [1, 2]}}]}'
    padded = (b'{' + pad + b'"traceEvents"' + pad + b':' + pad + b'[' + pad + b'{"ts": 1,' + pad + b'"a": "x y"}'
              + pad + b',' + pad + b'{"ts": 2, "args": {"b": [1,' + pad + b'2]}}' + pad + b']' + pad + b'}' + pad)
    for chunk in (1000, 4096):
        got = json_reader(padded, chunk)
        assert got is not None, chunk
        assert canon(got) == canon(json_reader(plain, 1 << 20))
        assert_readers_agree(padded, chunk, tmp_path)


def test_a_gzip_of_whitespace_is_decided_without_ijson(tmp_path: Path, no_ijson: None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A gzip bomb of whitespace inside the events array stops at the inflate cap, read by the json
    reader alone (its whitespace is never parsed)."""
    path = tmp_path / "bomb.pt.trace.json.gz"
    with gzip.open(path, "wb") as fh:
        fh.write(b'{"traceEvents": [{"ts": 1},')
        for _ in range(20):  # past the 64 MiB the json reader holds pending before it gives up
            fh.write(b" " * (4 << 20))
    monkeypatch.setenv("MEMGATE_MAX_INFLATED_BYTES", str(72 << 20))
    with pytest.raises(InputError) as info:
        kineto.load(path)
    assert "inflates past" in info.value.message


# ---- the loader -----------------------------------------------------------------------------------


@pytest.fixture
def no_ijson(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if the loader falls back to the ijson reader."""
    def refuse(*args: Any) -> Iterator[list[dict[str, Any]]]:
        raise AssertionError("the json reader gave up")
    monkeypatch.setattr(traceevents, "ijson_batches", refuse)


@pytest.mark.parametrize("chunk", [64, 1000, 1 << 20])
def test_chunk_size_does_not_change_the_profile(chunk: int, no_ijson: None, monkeypatch: pytest.MonkeyPatch) -> None:
    [expected] = profile_metrics(kineto.load(LEAK))
    monkeypatch.setattr(traceevents, "CHUNK_BYTES", chunk)
    profile = kineto.load(LEAK)
    [got] = profile_metrics(profile)
    assert got.values == expected.values and got.peak_t_ns == expected.peak_t_ns
    assert profile.metadata["trace_events"] == len(json.loads(LEAK.read_bytes())["traceEvents"])


def test_an_array_of_objects_after_the_events_keeps_the_json_reader(tmp_path: Path, no_ijson: None,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    text = LEAK.read_bytes().rstrip().removesuffix(b"}") + b', "devices": [{"id": 0}, {"id": 1}]}'
    path = tmp_path / "tail.pt.trace.json"
    path.write_bytes(text)
    monkeypatch.setattr(traceevents, "CHUNK_BYTES", len(text) - 20)  # the last cut falls in the tail
    [got] = profile_metrics(kineto.load(path))
    [expected] = profile_metrics(kineto.load(LEAK))
    assert got.values == expected.values


def test_of_several_bad_events_the_first_is_reported_at_any_batch_size(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong type after an out-of-range value in the same column: the earlier event is named."""
    trace = json.loads(LEAK.read_bytes())  # floats: repr round-trips the 3-decimal µs text
    mem = [i for i, e in enumerate(trace["traceEvents"]) if e.get("name") == "[memory]"]
    trace["traceEvents"][mem[2]]["args"]["Device Type"] = 99
    trace["traceEvents"][mem[5]]["args"]["Device Type"] = "cpu"
    path = tmp_path / "bad.pt.trace.json"
    path.write_text(json.dumps(trace, indent=1))
    for chunk in (300, 1 << 20):
        monkeypatch.setattr(traceevents, "CHUNK_BYTES", chunk)
        with pytest.raises(InputError) as info:
            kineto.load(path)
        assert info.value.column == f"traceEvents[{mem[2]}].args.Device Type", chunk
        assert "value too large" in info.value.message


# ==== issue 11: keys an object repeats --------------------------------------------------------------------
# A key repeated with the same value is read as once, by both readers alike; with another value the
# json reader gives up and the ijson reader names the object's path and the key.

REPEAT_PLACES = {  # an event holding {member} -> the JSON path of that object (event number i)
    "event": (('{{"ph": "X", "cat": "cpu_op", "name": "aten::mm", {member}, "ts": 5.000, "dur": 1.000, "pid": 1, '
              '"tid": 2}}'), "traceEvents[{i}]"),
    "args": (('{{"ph": "i", "name": "[memory]", "ts": 5.000, "pid": 1, "tid": 2, "args": {{"Addr": 94, "Bytes": 512, '
             '{member}, "Device Type": 0, "Device Id": -1}}}}'), "traceEvents[{i}].args"),
    "deep": (('{{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 5.000, "dur": 1.000, "args": {{"Input Dims": '
             '[[1], {{{member}}}]}}}}'), "traceEvents[{i}].args.Input Dims[1]"),
}


def _value(text: str) -> Any:
    return json.loads(text, parse_float=Decimal)


@RELAXED
@given(place=st.sampled_from(sorted(REPEAT_PLACES)), first=json_texts(CLEAN_TEXT, 1), data=st.data(),
       before=st.lists(events(CLEAN_TEXT), max_size=3), after=st.lists(events(CLEAN_TEXT), max_size=3),
       chunk=st.integers(1, 600))
def test_a_repeated_key_is_refused_only_with_another_value(place: str, first: str, data: st.DataObject,
                                                           before: list[str], after: list[str], chunk: int,
                                                           tmp_path: Path) -> None:
    second = data.draw(st.one_of(st.just(first), json_texts(CLEAN_TEXT, 1)), label="second")
    template, where = REPEAT_PLACES[place]
    event = template.format(member=f'"k": {first}, "k": {second}')
    trace = ('{"traceEvents": [' + ", ".join([*before, event, *after]) + "]}").encode()
    fast = json_reader(trace, chunk)
    slow = ijson_reader(trace, tmp_path)
    if same_json(_value(first), _value(second)):
        assert fast is not None and not isinstance(slow, InputError)
        assert canon(fast) == canon(slow)
    else:
        assert fast is None
        assert isinstance(slow, InputError)
        assert slow.column == where.format(i=len(before)) + ".k"
        assert "conflicting duplicate key 'k'" in slow.message


@pytest.mark.parametrize("first, second, same", [
    ('"aten::mm"', '"aten::mm"', True),
    ("1", "1.0", True),  # one number, written two ways
    ("1.5", "15e-1", True),
    ('{"a": 1, "b": [2]}', '{"b": [2], "a": 1}', True),  # an object whatever its key order
    ("1", "true", False),  # Python's 1 == True: not JSON's
    ("0", "false", False),
    ("null", "0", False),
    ('"1"', "1", False),
    ("[1, 2]", "[2, 1]", False),
    ('{"a": 1}', '{"a": 1, "b": 2}', False),
])
def test_what_counts_as_the_same_value(first: str, second: str, same: bool, tmp_path: Path) -> None:
    assert same_json(_value(first), _value(second)) is same
    trace = ('{"traceEvents": [' + REPEAT_PLACES["args"][0].format(member=f'"k": {first}, "k": {second}') + "]}").encode()
    assert (json_reader(trace, 1 << 20) is not None) is same
    assert isinstance(ijson_reader(trace, tmp_path), InputError) is not same


def test_a_third_occurrence_is_judged_against_the_first(tmp_path: Path) -> None:
    trace = b'{"traceEvents": [{"ph": "M", "args": {"k": 1, "k": 1, "k": 2}}]}'
    assert json_reader(trace, 1 << 20) is None
    error = ijson_reader(trace, tmp_path)
    assert isinstance(error, InputError) and error.column == "traceEvents[0].args.k" and error.found == "1, then 2"


def test_repeats_in_later_events_of_one_buffer_are_named_in_their_own_event(tmp_path: Path) -> None:
    """ijson builds a whole buffer's events before yielding the first: a repeat in event 40 is
    named there, not in the event being handed on when it was met."""
    events = ['{"ph": "M", "args": {"k": 1, "k": 1}}'] * 40 + ['{"ph": "M", "args": {"j": 1, "j": 2}}']
    error = ijson_reader(('{"traceEvents": [' + ", ".join(events) + "]}").encode(), tmp_path)
    assert isinstance(error, InputError) and error.column == "traceEvents[40].args.j"


# ---- torch's unescaped names (torch 2.13, with_stack=True) -----------------------------------------

ACTIVE6 = TORCH / "cpu_train_active6_profile_memory.json"  # ODD_EVENT (tests/helpers.py) goes in it


def _with_odd_name(tmp_path: Path, name: str) -> tuple[Path, int]:
    """The sample with a python_function event whose name line torch left unescaped; and that line's number."""
    text = ACTIVE6.read_text(encoding="utf-8")
    at = text.index('"traceEvents": [\n') + len('"traceEvents": [\n')
    data = (text[:at] + ODD_EVENT + text[at:]).encode()
    line = text[:at].count("\n") + 4
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wb") as fh:
            fh.write(data)
    else:
        path.write_bytes(data)
    return path, line


@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_a_name_torch_left_unescaped_is_read_as_its_text(name: str, tmp_path: Path) -> None:
    path, line = _with_odd_name(tmp_path, name)
    with pytest.raises(json.JSONDecodeError):
        json.loads(gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes())
    original, repaired = kineto.load(ACTIVE6), kineto.load(path)
    got, expected = profile_metrics(repaired), profile_metrics(original)
    assert [(m.device, m.component, m.values) for m in got] == [(m.device, m.component, m.values) for m in expected]
    assert got[0].values["peak_allocated_bytes"] and got[0].values["op_max_block_bytes"]
    assert repaired.metadata["trace_events"] == original.metadata["trace_events"] + 1
    assert repaired.metadata["cpu_ops"] == original.metadata["cpu_ops"]
    assert repaired.metadata["repaired_names"] == 1
    [note] = repaired.metadata["notes"]
    assert f"line(s) {line}" in note
    assert "notes" not in original.metadata and "repaired_names" not in original.metadata
    with traceevents.open_trace(path, repair=True) as fh:
        events = json.loads(fh.read())["traceEvents"]
    assert events[0]["name"] == ODD_NAME and events[0]["cat"] == "python_function"


@pytest.mark.parametrize("name", ["trace.json", "trace.json.gz"])
def test_other_syntax_errors_are_still_refused(name: str, tmp_path: Path) -> None:
    text = ACTIVE6.read_text(encoding="utf-8")
    at = text.index('"cat": "cpu_op",')
    broken = text[:at] + text[at:].replace('"cat": "cpu_op",', '"cat": "cpu_op"', 1)  # a missing comma
    line = text[:at].count("\n") + 2  # the line after the comma's
    plain = tmp_path / "plain.json"
    plain.write_text(broken, encoding="utf-8")
    odd, _ = _with_odd_name(tmp_path, "odd.json")  # and with an unescaped name before it
    odd.write_text(odd.read_text(encoding="utf-8").replace('"cat": "cpu_op",', '"cat": "cpu_op"', 1), encoding="utf-8")
    for path, shift in ((plain, 0), (odd, ODD_EVENT.count("\n"))):
        if name.endswith(".gz"):
            gz = path.with_name(path.name + ".gz")
            gz.write_bytes(gzip.compress(path.read_bytes()))
            path = gz
        with pytest.raises(InputError) as caught:
            kineto.load(path)
        assert "invalid JSON" in str(caught.value)
        if not name.endswith(".gz"):  # a gzip stream names the event, not the line
            assert caught.value.line == line + shift, str(caught.value)
        assert caught.value.column is not None and caught.value.column.startswith("traceEvents[")

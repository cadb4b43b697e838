"""memgate.readers.pyrecords: many small records (a snapshot's trace entries, a trace's events) checked
against a JSON Schema a column at a time, on hand-made records. The first bad record, in record order, is
an InputError naming its JSON path, what the schema expects and the value found; the columns come back
typed by pyarrow. (Its agreement with jsonschema on real and broken snapshots: tests/test_snapshot.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from memgate.errors import InputError
from memgate.readers.pyrecords import check_records, describe, gather, gather_columns, join, types_of

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["addr", "action"],
    "properties": {
        "addr": {"type": "integer", "minimum": 0},
        "size": {"type": "integer", "minimum": 0, "maximum": 1 << 56},
        "action": {"enum": ["alloc", "free_requested", "free_completed"]},
        "stream": {"type": ["integer", "null"]},
        "name": {"type": "string", "pattern": "^[a-z]+$"},
        "frames": {"$ref": "#/$defs/frames"},
    },
    "$defs": {"frames": {"type": "array"}},
}
FILE = Path("snapshot.pickle")


def _where(index: int) -> str:
    return f"device_traces[0][{index}]"


def test_good_records_give_typed_columns() -> None:
    records = [{"addr": 1, "size": 512, "action": "alloc", "stream": 0, "name": "mm", "frames": []},
               {"addr": 2, "action": "free_requested", "stream": None}]
    objects: dict[str, list[Any]] = {"frames": []}
    columns = check_records(records, SCHEMA, file=FILE, where=_where, objects=objects)
    typed = {name: None if col is None else (str(col.type), col.to_pylist()) for name, col in columns.items()}
    assert typed == {"addr": ("int64", [1, 2]), "size": ("int64", [512, None]),
                     "action": ("string", ["alloc", "free_requested"]), "stream": ("int64", [0, None]),
                     "name": ("string", ["mm", None]), "frames": None}  # an array is no scalar column
    assert objects["frames"] == [[], None]  # the values as gathered, for a caller that needs the objects


@pytest.mark.parametrize(("records", "column", "says"), [
    ([{"addr": 1, "action": "alloc"}, {"addr": -1, "action": "alloc"}], "[1].addr",
     "value too small; expected an integer >= 0, found '-1'"),
    ([{"addr": 1, "action": "alloc"}, {"addr": 1.0, "action": "alloc"}], "[1].addr",
     "wrong type; expected an integer >= 0, found '1.0'"),  # a float is no integer (it cannot hold a ns time)
    ([{"addr": True, "action": "alloc"}], "[0].addr", "wrong type; expected an integer >= 0, found 'True'"),
    ([{"addr": 1, "action": "alloc"}, {"action": "alloc"}], "[1]",
     "missing key 'addr'; expected an object with 'addr', found 'no such key'"),
    ([{"addr": 1, "action": "oops"}], "[0].action",
     "value not allowed; expected one of 'alloc', 'free_requested', 'free_completed', found 'oops'"),
    ([{"addr": 1, "action": "alloc", "name": "MM"}], "[0].name",
     "malformed value; expected a string matching ^[a-z]+$, found 'MM'"),
    ([{"addr": 1, "action": "alloc", "size": 1 << 60}], "[0].size",
     "value too large; expected an integer >= 0 and <= 72057594037927936, found '1152921504606846976'"),
    ([{"addr": 1, "action": "alloc", "stream": "x"}], "[0].stream", "wrong type; expected an integer or null, found 'x'"),
    ([{"addr": 1, "action": "alloc", "frames": 3}], "[0].frames", "wrong type; expected an array, found '3'"),
    ([{"addr": 1, "action": "alloc"}, [1, 2]], "[1]", "expected an object; expected an object, found 'an array'"),
], ids=["minimum", "float", "bool", "required", "enum", "pattern", "maximum", "type_list", "ref", "not_object"])
def test_the_first_bad_record_is_named_by_its_json_path(records: list[Any], column: str, says: str) -> None:
    with pytest.raises(InputError) as info:
        check_records(records, SCHEMA, file=FILE, where=_where)
    assert info.value.one_line() == f"snapshot.pickle: column 'device_traces[0]{column}': {says}"


def test_the_first_bad_record_in_record_order_wins() -> None:
    records = [{"addr": 1, "action": "alloc"}, {"addr": 1, "action": "oops"}, {"addr": -1, "action": "alloc"}]
    with pytest.raises(InputError) as info:
        check_records(records, SCHEMA, file=FILE, where=_where)
    assert info.value.column == "device_traces[0][1].action"  # before the bad addr of record 2


def test_gathering_columns() -> None:
    assert gather([{"a": 1}, {"b": 2}], "a") == [1, None]
    gathered = gather_columns([{"a": 1, "b": 2}, {"a": 3}], ["a", "b"])
    assert gathered is not None
    assert (gathered.columns, gathered.held) == ([[1, 3], [2, None]], 3)  # 3 keys held
    assert gathered.types == [{int}, {int, type(None)}]  # each column's types, gathered as it was read
    assert gather_columns([{"a": 1}, 5], ["a"]) is None  # a record that is no dict


def test_what_a_property_asks_for_in_words() -> None:
    assert describe({"type": ["integer", "null"]}) == "an integer or null"
    assert describe({"enum": ["a", "b"]}) == "one of 'a', 'b'"
    assert describe({"type": "integer", "minimum": 0}) == "an integer >= 0"
    assert describe({"type": "string", "pattern": "^x$"}) == "a string matching ^x$"
    assert types_of({"type": ["integer", "null"]}) == ("integer", "null") and types_of({"enum": [1]}) == ("integer",)
    assert (join("", "a"), join("a", "b"), join("a", "")) == ("a", "a.b", "a")

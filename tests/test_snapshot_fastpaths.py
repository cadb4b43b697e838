"""The snapshot loader's fast paths agree with the plain definitions they replace.

- Frames lists grouped by content (``stack_groups.first_equal``, C comparisons against candidates)
  against the definition: a list's group is the first list with the same frames; the attribution
  of each list against :func:`snapshot_stacks.op_owner` called on every list, errors included.
- ``check_records`` proving optional keys absent from the key counts (no pass over every record's
  keys) against ``jsonschema`` record by record: valid or not, and the first bad record named; its
  columns gathered in one pass over chunks of records (``gather_columns``) against a gather per key.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any
from unittest import mock

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memgate.errors import InputError
from memgate.loaders.snapshot import snapshot_stacks, stack_groups
from memgate.readers import pyrecords
from memgate.readers.pyrecords import check_records, gather, gather_columns
from memgate.schemas import load_schema

# ---- frames lists: grouping and attribution --------------------------------------------------------

_NAMES = ("torch::unwind::unwind()", "c10::cuda::CUDACachingAllocator::malloc", "at::_ops::mm::call(x)",
          "at::_ops::add_Tensor::call(y)", "forward", "<module>", "train_step")
_FILES = ("??", "/work/model.py", "/work/train.py", "none", "")


@st.composite
def frame_pools(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Distinct frame dicts, some of them equal copies of others (writers that share no dicts)."""
    pool = [{"name": draw(st.sampled_from(_NAMES)), "filename": draw(st.sampled_from(_FILES)),
             "line": draw(st.integers(0, 3))} for _ in range(draw(st.integers(1, 8)))]
    return pool + [dict(f) for f in draw(st.lists(st.sampled_from(pool), max_size=3))]


@st.composite
def frames_lists(draw: st.DrawFn, odd: bool = False) -> list[Any]:
    """Frames lists as torch writes them (a list of its own per entry over shared dicts), the same
    list object repeated, tuples, None and empty lists; with ``odd``, values that are no list."""
    pool = draw(frame_pools())
    stacks = draw(st.lists(st.lists(st.sampled_from(pool), max_size=5), min_size=1, max_size=6))
    kinds = ["copy", "copy", "tuple", "same", "none", "empty"] + (["odd"] * odd)
    out: list[Any] = []
    for _ in range(draw(st.integers(0, 40))):
        kind = draw(st.sampled_from(kinds))
        stack = draw(st.sampled_from(stacks))
        if kind == "copy" or (kind == "same" and not out):
            out.append(list(stack))
        elif kind == "tuple":
            out.append(tuple(stack))
        elif kind == "same":
            out.append(draw(st.sampled_from(out)))
        elif kind == "none":
            out.append(None)
        elif kind == "empty":
            out.append([])
        else:
            out.append(draw(st.sampled_from(["", "ab", {}, {"name": "x"}, 7])))
    return out


def _blank(x: Any) -> bool:
    return x is None or (isinstance(x, (list, tuple)) and not x)


def _check_grouping(lists: list[Any], first: list[int]) -> None:
    for i, x in enumerate(lists):
        j = first[i]
        assert j <= i and first[j] == j  # the group's first list
        if not isinstance(x, (list, tuple)) and x is not None:
            # a value that is no list (op_owner reports it) never joins a stack of frame dicts
            assert j == i or (not isinstance(lists[j], (list, tuple)) and lists[j] == x)
        elif _blank(x):
            assert j == next(k for k, y in enumerate(lists) if _blank(y))
        else:
            group = lists[j]
            assert isinstance(x, (list, tuple)) and isinstance(group, (list, tuple)) and tuple(group) == tuple(x)
            # the same frame dicts in the same order: always found together (torch's case)
            same = next(k for k, y in enumerate(lists)
                        if isinstance(y, (list, tuple)) and list(map(id, y)) == list(map(id, x)))
            assert first[same] == j


@given(frames_lists(odd=True), st.sampled_from([0, 1, 8]))
def test_frames_lists_group_with_the_first_list_of_the_same_frames(lists: list[Any], rounds: int,
                                                                   ) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stack_groups, "_ROUNDS", rounds)  # 0: all by frame identities; 1: candidates, then identities
        _check_grouping(lists, stack_groups.first_equal(lists).tolist())


@given(frames_lists(), st.data())
def test_grouping_over_distinct_stacks_equals_grouping_the_lists(stacks: list[Any], data: st.DataObject) -> None:
    """The compiled reader's frames (distinct stacks and a stack id per entry, -1: none; some stacks equal
    by content, as separate frame dicts make them): the same groups as over the entries' own lists."""
    import numpy as np

    stacks = [list(x) for x in stacks if x is not None]  # the reader's stacks are lists
    sid = data.draw(st.lists(st.integers(-1, len(stacks) - 1), max_size=60))
    lists = [stacks[k] if k >= 0 else None for k in sid]
    got = stack_groups.first_equal_of_stacks(stacks, np.array(sid, dtype=np.int32))
    assert got.tolist() == stack_groups.first_equal(lists).tolist()


def _naive(lists: list[Any]) -> list[tuple[str | None, str | None]]:
    return [(None, None) if x is None else snapshot_stacks.op_owner(x, None, f"e[{j}].frames") for j, x in enumerate(lists)]


@given(frames_lists(odd=True), st.sampled_from([0, 1, 8]))
def test_attribution_equals_op_owner_of_every_list(lists: list[Any], rounds: int) -> None:
    """Same (op, owner) per list; with a bad list, the same error: the first bad list, the same frame."""
    try:
        expected: list[tuple[str | None, str | None]] | InputError = _naive(lists)
    except InputError as exc:
        expected = exc
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stack_groups, "_ROUNDS", rounds)
        try:
            ops, owners = snapshot_stacks.op_owner_each(lists, None, lambda j: f"e[{j}].frames")
        except InputError as exc:
            assert isinstance(expected, InputError), exc
            assert (exc.column, exc.message, exc.found) == (expected.column, expected.message, expected.found)
            return
    assert not isinstance(expected, InputError), expected
    assert list(zip(ops.tolist(), owners.tolist())) == expected


def test_a_bad_frame_shared_by_many_lists_is_reported_at_its_first_use() -> None:
    good = {"name": "forward", "filename": "/work/model.py", "line": 3}
    bad = {"name": "forward", "line": 3}  # no filename
    lists = [[good] for _ in range(5)] + [[good, bad] for _ in range(5)] + [[bad]]
    with pytest.raises(InputError) as info:
        snapshot_stacks.op_owner_each(lists, None, lambda j: f"device_traces[0][{j}].frames")
    assert info.value.column == "device_traces[0][5].frames[1]"
    assert info.value.message == "malformed stack frame"


def test_each_frame_is_read_once_however_many_stacks_share_it(monkeypatch: pytest.MonkeyPatch) -> None:
    shared = [{"name": f"f{i}", "filename": f"/w/m{i}.cpp", "line": i} for i in range(20)]
    py = [{"name": "step", "filename": "/w/train.py", "line": k} for k in range(50)]
    lists = [shared + [py[k]] for k in range(50) for _ in range(3)]  # 50 stacks of 21 frames, 3 lists each
    read: list[int] = []
    role = snapshot_stacks._role

    def counted(frame: Any, *args: Any) -> Any:
        read.append(id(frame))
        return role(frame, *args)

    monkeypatch.setattr(snapshot_stacks, "_role", counted)
    _, owners = snapshot_stacks.op_owner_each(lists, None, lambda j: f"e[{j}]")
    assert sorted(read) == sorted(set(read)) and len(read) == 20 + 50
    assert owners.tolist() == [f"step (/w/train.py:{k})" for k in range(50) for _ in range(3)]


def _cpp(name: str, filename: str = "??") -> dict[str, Any]:
    return {"name": name, "filename": filename, "line": 0}


# A backward allocation on the GPU as torch records it with stacks="all" (a real training snapshot's
# frames, shortened): autograd's own thread, no Python frame.
_BACKWARD = [
    _cpp("torch::unwind::unwind()"), _cpp("torch::CapturedTraceback::gather(bool, bool, bool)"),
    _cpp("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long)",
         "CUDACachingAllocator.cpp"),
    _cpp("at::detail::empty_cuda(c10::ArrayRef<long>, c10::TensorOptions const&)"),
    _cpp("at::(anonymous namespace)::create_out(c10::ArrayRef<long>, c10::ArrayRef<long>, c10::TensorOptions const&)",
         "RegisterCUDA.cpp"),
    _cpp("at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)"),
    _cpp("torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
    _cpp("torch::autograd::Node::operator()(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)"),
    _cpp("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
]


def test_a_backward_allocation_without_python_frames_is_owned_by_its_autograd_node() -> None:
    """Its innermost frame outside the allocator (``create_out(...) (RegisterCUDA.cpp:0)``) named no one a
    user knows; the node running (``BmmBackward0``, a grad_fn's name) does. A user's Python frame still
    comes first (a backward on the CPU runs on the caller's thread), and a stack with neither keeps the
    innermost frame outside the allocator."""
    assert snapshot_stacks.op_owner(_BACKWARD, None, "e") == ("aten::bmm", "BmmBackward0")
    accumulate = [*_BACKWARD[:4], _cpp("torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)")]
    assert snapshot_stacks.op_owner(accumulate, None, "e") == (None, "AccumulateGrad")
    on_the_cpu = [*_BACKWARD, {"name": "train", "filename": "/w/train.py", "line": 30}]
    assert snapshot_stacks.op_owner(on_the_cpu, None, "e") == ("aten::bmm", "train (/w/train.py:30)")
    forward_in_cpp = [f for f in _BACKWARD if "autograd" not in f["name"]]
    assert snapshot_stacks.op_owner(forward_in_cpp, None, "e")[1] == (
        "at::(anonymous namespace)::create_out(c10::ArrayRef<long>, c10::ArrayRef<long>, c10::TensorOptions const&) "
        "(RegisterCUDA.cpp:0)")


# ---- check_records: optional keys proved absent by the key counts ----------------------------------

SCHEMA = load_schema("torch_snapshot")
ENTRY = {"$defs": SCHEMA["$defs"], **SCHEMA["$defs"]["trace_entry"]}
_FRAME = {"name": "forward", "filename": "/work/model.py", "line": 1}
_VALUES: dict[str, Any] = {
    "action": st.sampled_from(["snapshot", "oom", "annotate", "user_defined", "teleport", 3, None]),
    "addr": st.sampled_from([0, 7, 1 << 40, -1, "7", 1.5, True, None]),
    "size": st.sampled_from([0, 512, -5, "512", None]),
    "stream": st.sampled_from([0, 3, -1, "s", None]),
    "time_us": st.sampled_from([0, 1_700_000_000_000_000, 9223372036854776, -1, 2.5, None]),
    "device_free": st.sampled_from([0, 1 << 33, "x", None]),
    "compile_context": st.sampled_from(["", "N/A", 5, None]),
    "frames": st.sampled_from([[], [_FRAME], (_FRAME,), "frames", 5, None]),
    "forward_frames": st.sampled_from([[], [1], "no", None]),
    "user_metadata": st.sampled_from(["", 1, [1], None]),  # not in the schema: anything goes
}
_VALID_FIRST = {"action": "snapshot", "addr": 0, "size": 0, "stream": 0}


@st.composite
def entries(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Trace entries with no memory action (no if/then clause applies), keys present or not at random;
    the first one often has only some of the keys, as a real first entry does."""
    keys = sorted(_VALUES)
    out = []
    for i in range(draw(st.integers(1, 12))):
        present = draw(st.lists(st.sampled_from(keys), unique=True))
        record = {k: draw(_VALUES[k]) for k in present}
        if i == 0 and draw(st.booleans()):
            record = {**_VALID_FIRST, **{k: v for k, v in record.items() if k in ("time_us", "frames")}}
        out.append(record)
    if draw(st.integers(0, 9)) == 0:  # now and then a record that is no object
        out.insert(draw(st.integers(0, len(out))), draw(st.sampled_from([[_FRAME], "alloc", 7, None])))
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


@given(entries(), st.sampled_from([1, 2, 3, pyrecords._CHUNK]))
def test_check_records_agrees_with_jsonschema_on_each_record(records: list[Any], chunk: int) -> None:
    """Whatever the chunks the columns are gathered in: keys missing in some chunks, not in others."""
    validator = jsonschema.Draft202012Validator(ENTRY)
    bad = [i for i, r in enumerate(records) if any(validator.iter_errors(_jsonable(r)))]
    kept: dict[str, list[Any]] = {"frames": []}
    before = copy.deepcopy(records)
    try:
        with mock.patch.object(pyrecords, "_CHUNK", chunk):
            columns = check_records(records, SCHEMA["$defs"]["trace_entry"], file=Path("t.pickle"),
                                    where=lambda i: f"device_traces[0][{i}]", root=SCHEMA, objects=kept)
    except InputError as exc:
        assert bad, exc
        assert (exc.column or "").startswith(f"device_traces[0][{bad[0]}]"), (exc.column, bad)
        return
    finally:
        assert records == before  # read, never changed
    assert not bad
    assert [k for k in columns if "." not in k] == list(ENTRY["properties"])
    for name in ("action", "addr", "size", "stream", "time_us", "device_free", "compile_context"):
        column = columns[name]
        assert column is not None and column.to_pylist() == [r.get(name) for r in records]
    assert kept["frames"] == [r.get("frames") for r in records]
    assert all(a is b for a, b in zip(kept["frames"], (r.get("frames") for r in records)))


def test_a_key_the_first_entry_lacks_is_checked_in_every_entry() -> None:
    records: list[dict[str, Any]] = [{"action": "snapshot"} for _ in range(50)]
    records[37]["device_free"] = "lots"
    with pytest.raises(InputError) as info:
        check_records(records, SCHEMA["$defs"]["trace_entry"], file=Path("t.pickle"),
                      where=lambda i: f"device_traces[0][{i}]", root=SCHEMA)
    assert info.value.column == "device_traces[0][37].device_free"
    records[37]["device_free"] = None  # a key with a null value is no absent key
    with pytest.raises(InputError, match="null value") as info:
        check_records(records, SCHEMA["$defs"]["trace_entry"], file=Path("t.pickle"),
                      where=lambda i: f"device_traces[0][{i}]", root=SCHEMA)
    assert info.value.column == "device_traces[0][37].device_free"


def test_keys_absent_from_every_entry_give_null_columns() -> None:
    records = [{"action": "alloc", "addr": i, "size": 8, "stream": 0, "frames": []} for i in range(10)]
    kept: dict[str, list[Any]] = {"forward_frames": [], "frames": []}
    columns = check_records(records, SCHEMA["$defs"]["trace_entry"], file=Path("t.pickle"),
                            where=lambda i: f"device_traces[0][{i}]", root=SCHEMA, objects=kept)
    assert columns["time_us"] is not None and columns["time_us"].null_count == 10
    assert columns["forward_frames"] is None  # not a scalar column
    assert kept["forward_frames"] == [None] * 10 and kept["frames"] == [[]] * 10


@given(st.lists(st.dictionaries(st.sampled_from("abc"), st.integers(0, 3) | st.none(), max_size=3), max_size=12),
       st.sampled_from([1, 2, 5, pyrecords._CHUNK]))
def test_columns_gathered_in_chunks_equal_a_gather_per_key(records: list[dict[str, Any]], chunk: int) -> None:
    with mock.patch.object(pyrecords, "_CHUNK", chunk):
        gathered = gather_columns(records, ["a", "b", "c"])
    assert gathered is not None
    columns, held = gathered.columns, gathered.held
    assert columns == [gather(records, key) for key in "abc"]
    assert all(x is y for column, key in zip(columns, "abc") for x, y in zip(column, gather(records, key)))
    assert held == sum(map(len, records))
    assert gathered.types == [set(map(type, gather(records, key))) for key in "abc"]
    assert gather_columns([*records, [1]], ["a", "b"]) is None  # a record that is no object

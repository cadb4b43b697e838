"""PyTorch memory snapshots: safe unpickling, schema, every era of the real samples, properties.

Expected values are derived in the tests from the raw pickles with a restricted unpickler written
here and plain loops (the memory viewer's reconstruction: live-by-trace allocations plus, as the
baseline, frees without an alloc and final ``active_allocated`` blocks no alloc accounts for) —
never copied from memgate's output. Sizes: the requested ones for the requested peak (what the viewer
plots), the allocator's blocks for the rest, by a replay of the caching allocator's rules written here
(:func:`block_replay`) and checked against the blocks the allocator itself wrote in the final segments.
"""

from __future__ import annotations

import contextlib
import copy
import copyreg
import importlib
import io
import json
import pickle
import pickletools
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd
import pytest
from groundtruth import Trace, expected_metrics
from hypothesis import given
from hypothesis import strategies as st
from snapshot_reference import (
    EORNN,
    LEGACY,
    MODERN,
    MULTI,
    PICKLES,
    TORCH,
    allocator_rules,
    allocator_written,
    as_dict,
    assert_no_history,
    block_dict,
    block_replay,
    devices_of,
    final_active,
    has_history,
    level_curves,
    raw,
    reference,
    requested_size,
    segment_dict,
    torch_round,
    write_pickle,
)
from strategies import traces
from writers.snapshot import (
    ERAS,
    SnapshotOptions,
    expected_block_count,
    on_microsecond_grid,
    recoverable_ops,
    render,
)

from memgate import cli
from memgate.discover import discover, load
from memgate.errors import InputError, MemgateError
from memgate.loaders.snapshot import snapshot, stack_groups
from memgate.loaders.snapshot.snapshot_trace import ACTIONS
from memgate.metrics import profile_metrics
from memgate.readers import safepickle
from memgate.readers.pyrecords import check_records
from memgate.schemas import load_schema

# ---- safe unpickling ------------------------------------------------------------------------------


class _Boom:
    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.target, "w"))  # would create a file if ever run


def test_hostile_pickle_is_refused_and_runs_nothing(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[_Boom(str(target))]]}))
    with pytest.raises(InputError) as info:
        snapshot.load(path)
    assert not target.exists()
    err = info.value
    assert err.file == str(path) and "refused to load" in err.message
    # the global as this Python's pickler names open(): io.open to 3.11, _io.open from 3.12
    assert err.found == f"{open.__module__}.{open.__qualname__}"
    assert getattr(importlib.import_module(open.__module__), open.__qualname__) is open
    assert err.column is not None and err.column.startswith("byte ")


def test_reduce_to_os_system_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.pkl"
    # The classic payload, hand-assembled: GLOBAL posix system, a string, TUPLE1, REDUCE.
    path.write_bytes(b"\x80\x02cposix\nsystem\nX\x0c\x00\x00\x00touch /tmp/x\x85R.")
    with pytest.raises(InputError, match="refused to load 'posix.system'") as info:
        safepickle.load(path)
    assert info.value.column == "byte 2"  # the GLOBAL itself, not the end of what the unpickler was handed


def test_a_refused_class_is_located_at_its_opcode_not_where_reading_stopped(tmp_path: Path) -> None:
    """The unpickler reads ahead (a 4 MB replay buffer's deque at byte 6 was "byte 131072"): the error names the
    byte of the opcode that references code, in a small file, past a large plain prefix, and in a framed one."""
    from collections import deque

    for protocol in (2, 4):
        for prefix in (0, 300_000):
            data = pickle.dumps([list(range(prefix)), deque([1])], protocol=protocol)
            path = tmp_path / f"p{protocol}_{prefix}.pickle"
            path.write_bytes(data)
            at = next(pos for op, _, pos in pickletools.genops(data) if op.name in ("GLOBAL", "STACK_GLOBAL"))
            with pytest.raises(InputError, match="refused to load 'collections.deque'") as info:
                safepickle.load(path)
            assert info.value.column == f"byte {at}", (protocol, prefix, info.value.column)


def test_extension_registry_opcodes_are_refused(tmp_path: Path) -> None:
    """EXT1 names a class through copyreg's registry: still a find_class call, still refused."""
    from collections import OrderedDict

    path = tmp_path / "ext.pickle"
    copyreg.add_extension("collections", "OrderedDict", 0xF0)
    try:
        data = pickle.dumps(OrderedDict(a=1), protocol=2)
        assert b"\x82\xf0" in data  # EXT1 240
        path.write_bytes(data)
        with pytest.raises(InputError, match="refused to load 'collections.OrderedDict'"):
            safepickle.load(path)
    finally:
        copyreg.remove_extension("collections", "OrderedDict", 0xF0)
    with pytest.raises(InputError, match="unregistered extension code 240"):  # unknown code: malformed
        safepickle.load(path)


@pytest.mark.parametrize(("pid", "shown"), [
    ("storage-7", "persistent id 'storage-7'"),
    (10**5000, "persistent id <16610-bit integer>"),  # past the 4300 digits Python will print
    ([1, 10**5000], "persistent id [1, <16610-bit integer>]"),
], ids=["text", "huge int", "list holding a huge int"])
def test_persistent_ids_are_refused(tmp_path: Path, pid: Any, shown: str) -> None:
    class P(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            return pid if obj == "x" else None

    buf = io.BytesIO()
    P(buf, protocol=4).dump({"segments": ["x"]})
    path = tmp_path / "persistent.pickle"
    path.write_bytes(buf.getvalue())
    with pytest.raises(InputError, match="refused to load") as info:
        safepickle.load(path)
    assert info.value.found == shown


@pytest.mark.parametrize("cut", [3, 40, -1])
def test_truncated_pickle(tmp_path: Path, cut: int) -> None:
    data = MODERN.read_bytes()
    path = tmp_path / "cut.pickle"
    path.write_bytes(data[:cut])
    with pytest.raises(InputError) as info:
        snapshot.load(path)
    assert "truncated pickle" in info.value.message
    assert info.value.file == str(path)


def test_not_a_pickle_and_empty_and_newer_protocol(tmp_path: Path) -> None:
    text = tmp_path / "notes.pickle"
    text.write_text("segments: none\n")
    with pytest.raises(InputError, match="not a pickle file") as info:
        safepickle.load(text)
    assert info.value.found == "73 65 67 6d 65 6e 74 73"
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty file"):
        safepickle.load(empty)
    future = tmp_path / "future.pickle"
    future.write_bytes(b"\x80\x07}.")
    with pytest.raises(InputError, match="unsupported pickle protocol 7"):
        safepickle.load(future)


def test_size_cap_and_its_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    size = MODERN.stat().st_size
    with pytest.raises(InputError) as info:
        snapshot.load(MODERN, max_bytes=size - 1)
    assert f"file is {size} bytes, over the {size - 1}-byte limit" in info.value.message
    assert "max_bytes" in (info.value.expected or "") and safepickle.MAX_BYTES_ENV in (info.value.expected or "")
    assert snapshot.load(MODERN, max_bytes=size).devices  # exactly at the cap: fine
    monkeypatch.setenv(safepickle.MAX_BYTES_ENV, str(size - 1))
    with pytest.raises(InputError, match="limit"):
        snapshot.load(MODERN)
    monkeypatch.setenv(safepickle.MAX_BYTES_ENV, "lots")
    with pytest.raises(MemgateError, match=safepickle.MAX_BYTES_ENV):
        snapshot.load(MODERN)


def test_unreadable_snapshot_is_claimed_and_explained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch_npu writes snapshots owner-write-only; as root chmod does not stop reads, so open() is denied."""
    path = tmp_path / "snapshot_rank3.pickle"
    path.write_bytes(MODERN.read_bytes())
    path.chmod(0o200)
    real_open = open

    def deny(file: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(str(file)) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", deny)
    [found] = discover(tmp_path)
    assert found.format.name == "torch_snapshot"
    with pytest.raises(InputError) as info:
        load(found)
    assert "not readable (permission denied)" in info.value.message and "chmod u+r" in info.value.message
    assert info.value.file == str(path)


@pytest.mark.parametrize("path", PICKLES, ids=lambda p: p.name)
def test_samples_unpickle_to_the_same_data(path: Path) -> None:
    assert safepickle.load(path) == raw(path)


# ---- detection ------------------------------------------------------------------------------------


def test_claims_by_extension_and_header(tmp_path: Path) -> None:
    for sample in PICKLES:
        assert snapshot.claims(sample), sample.name
    other = tmp_path / "weights.pickle"
    other.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    assert not snapshot.claims(other)  # a pickle, but not of a snapshot
    renamed = tmp_path / "snapshot.bin"
    renamed.write_bytes(MODERN.read_bytes())
    assert not snapshot.claims(renamed)  # a snapshot, but not by name
    pkl = tmp_path / "snap.pkl"
    pkl.write_bytes(MODERN.read_bytes())
    assert snapshot.claims(pkl)
    for protocol in (2, 3, 5):
        p = tmp_path / f"p{protocol}.pickle"
        p.write_bytes(pickle.dumps(raw(MULTI), protocol=protocol))
        assert snapshot.claims(p), protocol
    bare = tmp_path / "bare.pickle"
    bare.write_bytes(pickle.dumps(raw(LEGACY)["segments"]))
    assert snapshot.claims(bare)
    text = tmp_path / "segments.pickle"
    text.write_text("segments")
    assert not snapshot.claims(text)


def test_discover_registers_the_format(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "snap.pickle").write_bytes(MULTI.read_bytes())
    (tmp_path / "notes.pkl").write_bytes(pickle.dumps([1, 2, 3]))
    found = discover(tmp_path)
    assert [(f.path.name, f.format.name) for f in found] == [("snap.pickle", "torch_snapshot")]


# ---- schema ---------------------------------------------------------------------------------------


def _listify(value: Any) -> Any:
    """Tuples → lists, as jsonschema only calls a list an array."""
    if isinstance(value, tuple):
        return [_listify(v) for v in value]
    if isinstance(value, list):
        return [_listify(v) for v in value]
    if isinstance(value, dict):
        return {k: _listify(v) for k, v in value.items()}
    return value


def test_schema_is_valid_draft_2020_12() -> None:
    schema = load_schema("torch_snapshot")
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$defs"]["trace_entry"]["properties"]["action"]["enum"] == list(ACTIONS)


@pytest.mark.parametrize("path", [MODERN, LEGACY, MULTI, TORCH / "kineto_cpu_profile_to_snapshot.pickle", EORNN],
                         ids=lambda p: p.name)
def test_real_samples_are_valid_by_jsonschema_and_by_the_vectorized_check(path: Path) -> None:
    schema = load_schema("torch_snapshot")
    data = raw(path)
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(_listify(data)))
    assert errors == []
    check_records(data["segments"], schema["$defs"]["segment"], file=path, where=lambda i: f"segments[{i}]",
                  root=schema)
    for dev, entries in enumerate(data["device_traces"]):
        if entries:
            check_records(entries, schema["$defs"]["trace_entry"], file=path,
                          where=lambda i, d=dev: f"device_traces[{d}][{i}]", root=schema)


def _broken(mutate: Any) -> dict[str, Any]:
    data = copy.deepcopy(raw(MODERN))
    mutate(data)
    return data


BROKEN = {
    "block size text": (lambda d: d["segments"][3]["blocks"].__setitem__(
        0, {**d["segments"][3]["blocks"][0], "size": "2097152"}), "segments[3].blocks[0].size", "wrong type"),
    "negative total": (lambda d: d["segments"][1].__setitem__("total_size", -5), "segments[1].total_size",
                       "value too small"),
    "unknown state": (lambda d: d["segments"][0]["blocks"][0].__setitem__("state", "zombie"),
                      "segments[0].blocks[0].state", "value not allowed"),
    "unknown action": (lambda d: d["device_traces"][0][7].__setitem__("action", "teleport"),
                       "device_traces[0][7].action", "value not allowed"),
    "float addr": (lambda d: d["device_traces"][0][2].__setitem__("addr", 1.5), "device_traces[0][2].addr",
                   "wrong type"),
    "bool size": (lambda d: d["device_traces"][0][4].__setitem__("size", True), "device_traces[0][4].size",
                  "wrong type"),
    "alloc without addr": (lambda d: d["device_traces"][0][5].pop("addr"), "device_traces[0][5]",
                           "missing key 'addr'"),
    "segment without blocks": (lambda d: d["segments"][2].pop("blocks"), "segments[2]", "missing key 'blocks'"),
    "entry not a dict": (lambda d: d["device_traces"][0].__setitem__(9, ["alloc"]), "device_traces[0][9]",
                         "expected an object"),
    "annotation stage": (lambda d: d["external_annotations"].append(
        {"name": "ProfilerStep#1", "stage": "MIDDLE", "time_us": 1}), "external_annotations[0].stage",
        "value not allowed"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_schema_violations_name_the_json_path(tmp_path: Path, case: str) -> None:
    mutate, where, problem = BROKEN[case]
    data = _broken(mutate)
    path = tmp_path / "broken.pickle"
    path.write_bytes(pickle.dumps(data))
    with pytest.raises(InputError) as info:
        snapshot.load(path)
    err = info.value
    assert (err.file, err.column) == (str(path), where)
    assert problem in err.message
    assert err.expected
    # jsonschema agrees that the file is invalid (the vectorized check is the same schema)
    schema = load_schema("torch_snapshot")
    assert list(jsonschema.Draft202012Validator(schema).iter_errors(_listify(data)))


def test_other_structural_errors(tmp_path: Path) -> None:
    def write(value: Any) -> Path:
        path = tmp_path / "x.pickle"
        path.write_bytes(pickle.dumps(value))
        return path

    with pytest.raises(InputError, match="missing key 'segments'"):
        snapshot.load(write({"device_traces": []}))
    for empty in ([], {"segments": [], "device_traces": []}):  # nothing to measure is not a passing gate
        with pytest.raises(InputError, match="empty snapshot") as info:
            snapshot.load(write(empty))
        assert info.value.column == "segments"
    with pytest.raises(InputError, match="not a memory snapshot") as info:
        snapshot.load(write("segments"))
    assert info.value.found == "str"
    # another pickled dict named like a snapshot (a real one in a public repository: a word list)
    with pytest.raises(InputError, match="not a memory snapshot: a pickled dict without 'segments'") as info:
        snapshot.load(write({"graag gedaan!": "you're welcome", "dank je": "thank you"}))
    assert (info.value.column, info.value.found) == ("(top level)", "a dict of 2 keys, the first 'graag gedaan!'")
    data = raw(EORNN)
    data["device_traces"][0][10].pop("time_us")
    with pytest.raises(InputError, match="without time_us") as info:
        snapshot.load(write(data))
    assert info.value.column == "device_traces[0][10]"
    for frame in ({"name": "f"}, {"name": "f", "filename": "x.py", "line": "1"},
                  {"name": "f", "filename": "x.py", "line": True}):  # line is an integer (schema)
        data = raw(MODERN)
        data["device_traces"][0][3]["frames"] = [frame]
        with pytest.raises(InputError, match="malformed stack frame") as info:
            snapshot.load(write(data))
        assert info.value.column == "device_traces[0][3].frames[0]"
    modern = raw(MODERN)  # blocks with addresses tile their segment too
    modern["segments"][1]["total_size"] += 512
    with pytest.raises(InputError, match="the blocks of a segment do not add up") as info:
        snapshot.load(write(modern))
    assert info.value.column == "segments[1].total_size"
    legacy = raw(LEGACY)
    legacy["segments"][0]["total_size"] += 512
    with pytest.raises(InputError, match="do not add up") as info:
        snapshot.load(write(legacy))
    assert info.value.column == "segments[0].total_size"


# ---- the real samples -----------------------------------------------------------------------------


@pytest.mark.parametrize("path", PICKLES, ids=lambda p: p.name)
def test_real_sample_metrics_equal_the_viewer_reconstruction(path: Path) -> None:
    data = as_dict(raw(path))
    profile = snapshot.load(path)
    assert profile.format == "torch_snapshot"
    devices = devices_of(data)
    assert [d.device for d in profile.devices] == [f"cuda:{d}" for d in devices]
    for dev, model, m in zip(devices, profile.devices, profile_metrics(profile)):
        ref = reference(data, dev)
        assert m.component == "allocator"
        if has_history(data):
            # the viewer plots the requested bytes: memgate keeps that peak beside the allocator's
            assert m.values["peak_requested_bytes"] == ref["peak_requested_bytes"]
            assert m.values["peak_allocated_bytes"] == ref["peak_allocated_bytes"]
            assert m.values["peak_reserved_bytes"] == ref["peak_reserved_bytes"]
            top = [b["size"] for b in m.values["top_at_peak"]]  # the largest blocks live at the peak
            assert top and top == sorted(ref["at_peak"], reverse=True)[:len(top)]
        else:  # only the state at dump time: no peak to gate on, and the message says how to record one
            assert_no_history(m)
        assert len(model.blocks) == ref["blocks"]
        assert m.values["op_max_block_bytes"] == ref["ops"]
        frame = model.series["allocator"].frame.to_pandas()
        assert int(frame["allocated"].iloc[-1]) == ref["end_allocated"]
        assert ref["end_requested"] == sum(final_active(data, dev).values())
        if allocator_written(data):  # the replay ends where the allocator's own final blocks say
            assert ref["end_allocated"] == sum(final_active(data, dev, blocks=True).values())
        assert int(frame["reserved"].iloc[-1]) == sum(s["total_size"] for s in data["segments"] if s["device"] == dev)
        assert frame["t_ns"].is_monotonic_increasing


def test_eras_are_recognized() -> None:
    meta = {p.name: snapshot.load(p).metadata for p in PICKLES}
    assert meta[LEGACY.name]["era"] == "legacy_history"
    assert meta[LEGACY.name]["time_base"] == "none"  # one 'snapshot' entry: nothing moves
    assert meta["kineto_cpu_profile_to_snapshot.pickle"]["time_base"] == "trace_index"
    assert meta[EORNN.name]["time_base"] == "time_us"
    assert meta[MULTI.name]["alloc_conf"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True,max_split_size_mb:128"}


def test_legacy_addresses_are_derived_from_the_segment(tmp_path: Path) -> None:
    data = raw(LEGACY)
    profile = snapshot.load(LEGACY)
    [model] = profile.devices
    # No block of the legacy file has an 'address'; history[0].addr is the segment address plus the
    # sizes before the block, which is what the loader derives.
    derived = []
    for seg in data["segments"]:
        addr = seg["address"]
        for block in seg["blocks"]:
            assert "address" not in block
            if block.get("history"):
                assert block["history"][0]["addr"] == addr
            if block["state"] == "active_allocated":
                derived.append((addr, requested_size(block)))
            addr += block["size"]
    # An alloc in the trace at a derived address accounts for that block: 459 blocks live all along + 1.
    addr, size = derived[17]
    data["device_traces"][0].append({"action": "alloc", "addr": addr, "size": size, "stream": 0})
    path = tmp_path / "legacy_with_alloc.pickle"
    path.write_bytes(pickle.dumps(data))
    blocks = snapshot.load(path).devices[0].blocks.to_pandas()
    assert len(blocks) == 460 and int(blocks["t_alloc"].notna().sum()) == 1
    live = [b for s in data["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    assert len(model.blocks) == len(live) == 460
    frame = model.blocks.to_pandas()
    assert frame["t_alloc"].isna().all() and frame["t_free"].isna().all()
    assert sorted(frame["size"].tolist()) == sorted(b["size"] for b in live)  # the allocator's blocks
    with_stack = [b for b in live if b.get("history") and b["history"][0].get("frames")]
    owners = {f"{f['name']} ({f['filename']}:{f['line']})" for b in with_stack for f in b["history"][0]["frames"][:1]}
    assert with_stack and set(frame["owner"].dropna()) <= owners
    assert frame["owner"].notna().sum() == len(with_stack)


def test_bare_list_of_segments(tmp_path: Path) -> None:
    data = raw(LEGACY)
    path = tmp_path / "bare.pickle"
    path.write_bytes(pickle.dumps(data["segments"]))
    profile = snapshot.load(path)
    assert profile.metadata["era"] == "bare_list"
    [model] = profile.devices
    [m] = profile_metrics(profile)
    assert_no_history(m)  # a bare list of segments is the final state only
    frame = model.series["allocator"].frame.to_pandas()
    assert int(frame["allocated"].iloc[-1]) == sum(final_active(data, 0, blocks=True).values())
    assert int(frame["reserved"].iloc[-1]) == sum(s["total_size"] for s in data["segments"])


def test_no_trace_multidevice_expandable() -> None:
    data = raw(MULTI)
    metrics = {m.device: m for m in profile_metrics(snapshot.load(MULTI))}
    assert set(metrics) == {"cuda:0", "cuda:1"}
    profile = snapshot.load(MULTI)
    divisions, _, expandable = allocator_rules(data)
    assert expandable
    for dev, model in zip((0, 1), profile.devices):
        m = metrics[f"cuda:{dev}"]
        assert_no_history(m)
        frame = model.series["allocator"].frame.to_pandas()
        # in expandable segments a block is its rounded request (4704 B → 5120 B): the final blocks agree
        requested, blocks = final_active(data, dev), final_active(data, dev, blocks=True)
        assert blocks == {a: torch_round(size, divisions) for a, size in requested.items()}
        assert int(frame["allocated"].iloc[-1]) == sum(blocks.values())
        assert int(frame["reserved"].iloc[-1]) == sum(s["total_size"] for s in data["segments"] if s["device"] == dev)


def test_front_inserted_entries_are_put_back_in_time_order(tmp_path: Path) -> None:
    """torch_npu inserts workspace entries at the front: moving entries there must change nothing."""
    data = raw(EORNN)
    entries = data["device_traces"][0]
    moved = [e for e in entries[2000:2600] if e["action"] in ("alloc", "free_requested", "free_completed")][::7]
    ids = {id(e) for e in moved}
    data["device_traces"][0] = moved + [e for e in entries if id(e) not in ids]
    data["allocator_settings"] = {"PYTORCH_NPU_ALLOC_CONF": ""}
    path = tmp_path / "npu.pickle"
    path.write_bytes(pickle.dumps(data))
    profile = snapshot.load(path)
    [shuffled] = profile_metrics(profile)
    [original] = profile_metrics(snapshot.load(EORNN))
    assert shuffled.device == "npu:0"
    # a free_completed moved before its free_requested (one µs) frees the same block: the allocated
    # series still ends at the blocks the final segments hold
    frame = profile.devices[0].series["allocator"].frame.to_pandas()
    assert int(frame["allocated"].iloc[-1]) == sum(final_active(data, 0, blocks=True).values())
    for key in ("peak_allocated_bytes", "peak_requested_bytes", "peak_reserved_bytes", "op_max_block_bytes"):
        assert shuffled.values[key] == original.values[key], key
    assert shuffled.peak_t_ns == original.peak_t_ns


@pytest.mark.parametrize("drop", [1, 500, 2999])
def test_ring_buffer_truncation_frees_without_allocs(tmp_path: Path, drop: int) -> None:
    """Cutting the oldest entries (what the ring buffer does) leaves frees without allocs: pre-window blocks.
    The cut file does not say how large their blocks were; the whole history's replay does, and its levels
    over the window are the truth. A cut between a free_requested and its free_completed is detectable:
    the peaks are then not measurable."""
    data = raw(EORNN)
    entries = data["device_traces"][0]
    assert [e["time_us"] for e in entries] == sorted(e["time_us"] for e in entries)  # file order is time order
    whole = level_curves(data, 0)  # level k: after the first k entries that are no marker
    first = sum(e["action"] not in ("snapshot", "oom") for e in entries[:drop])
    block_of = {id(e): b for e, b in block_replay(data, 0)}
    data["device_traces"][0] = kept = entries[drop:]
    path = tmp_path / "ring.pickle"
    path.write_bytes(pickle.dumps(data))
    profile = snapshot.load(path)
    [model] = profile.devices
    [m] = profile_metrics(profile)
    live: set[int] = set()
    frees_without_alloc = []
    split = False  # an address whose first entry kept is a free_completed
    seen: set[int] = set()
    for e in kept:
        if e["action"] == "alloc":
            live.add(e["addr"])
        elif e["action"] == "free_requested":
            if e["addr"] in live:
                live.remove(e["addr"])
            else:
                frees_without_alloc.append(e)
        elif e["action"] == "free_completed":
            split |= e["addr"] not in seen
        seen.add(e["addr"])
    assert split == (drop == 2999)  # the cuts chosen: before an alloc, a free_requested, a free_completed
    if split:
        for key in ("peak_allocated_bytes", "peak_reserved_bytes"):
            assert m.values[key] is None and "ring buffer" in m.missing[key], key
    else:
        assert m.values["peak_allocated_bytes"] == max(whole["allocated"][first:])
        assert m.values["peak_requested_bytes"] == max(whole["requested"][first:])
        assert m.values["peak_reserved_bytes"] == max(whole["reserved"][first:])
    frame = model.blocks.to_pandas()
    early = frame[frame["t_alloc"].isna() & frame["t_free"].notna()]
    assert len(early) == len(frees_without_alloc) == profile.metadata["devices"]["cuda:0"]["pre_window_frees"]
    # each at the block the whole history gave it (4587520 B for a 4194304 B request, the rest unsplit)
    assert sorted(early["size"].tolist()) == sorted(block_of[id(e)] for e in frees_without_alloc)
    assert any(block_of[id(e)] > torch_round(e["size"], [0] * 16) for e in frees_without_alloc) == (drop > 1)
    assert sorted(early["t_free"].tolist()) == sorted(e["time_us"] * 1000 for e in frees_without_alloc)


def test_cli_inspect_json_on_a_snapshot() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["inspect", str(MODERN), "--json"])
    assert code == 0
    [entry] = json.loads(out.getvalue())["profiles"]
    [dev] = entry["devices"]
    ref = reference(raw(MODERN), 0)
    assert entry["format"] == "torch_snapshot"
    assert dev["metrics"]["peak_allocated_bytes"] == ref["peak_allocated_bytes"]
    assert dev["metrics"]["peak_requested_bytes"] == ref["peak_requested_bytes"] < ref["peak_allocated_bytes"]
    assert dev["metrics"]["peak_reserved_bytes"] == ref["peak_reserved_bytes"]
    assert dev["metrics"]["allocated_at_dump_bytes"] == sum(final_active(raw(MODERN), 0, blocks=True).values())


# ---- properties: a ground-truth trace written as a snapshot reads back to its own metrics ----------


def _options() -> st.SearchStrategy[SnapshotOptions]:
    return st.builds(SnapshotOptions, era=st.sampled_from(ERAS), device=st.sampled_from(("cuda", "npu")),
                     front_workspace=st.booleans(), protocol=st.integers(2, 5), markers=st.booleans())


NPU_PAD = 32  # torch_npu's round_size adds it to every request before rounding (AddPadSize)


def _as_blocks(trace: Trace, pad: int = 0) -> Trace:
    """The trace with every block at what the allocator hands out for its request: the files written here
    have expandable segments (legacy: blocks outside its one segment), where a block is its rounded request
    (``pad``: bytes torch_npu adds to a request first)."""
    baseline = torch_round(trace.hidden_baseline + pad, [0] * 16) if trace.hidden_baseline else 0
    return replace(trace, hidden_baseline=baseline,
                   blocks=tuple(replace(b, size=torch_round(b.size + pad, [0] * 16)) for b in trace.blocks))


def _with_requests(blocks: dict[str, Any], requested: dict[str, Any], pad: int = 0) -> dict[str, Any]:
    """``blocks`` (a trace rendered at its blocks) with the requested sizes of ``requested`` (the same trace
    rendered as requested): its segments and reserve are an allocator's, its entries record the requests.
    The legacy writer keeps the blocks freed in the window outside its one segment, which no large pool
    does: that segment is marked expandable (a block is then its rounded request, no layout to replay)."""
    for segment in blocks["segments"]:
        segment.setdefault("is_expandable", True)
    moves = ("alloc", "free_requested", "free_completed", "free")
    for mine, theirs in zip(blocks["device_traces"], requested["device_traces"], strict=True):
        # the same events in the same order (segment_map entries aside): each entry gets its request back
        for e, r in zip([e for e in mine if e["action"] in moves], [r for r in theirs if r["action"] in moves],
                        strict=True):
            assert e["action"] == r["action"] and e["size"] == torch_round(r["size"] + pad, [0] * 16)
            e["size"] = r["size"]
    for segment, other in zip(blocks["segments"], requested["segments"], strict=True):
        for b, r in zip([b for b in segment["blocks"] if b["state"] != "inactive"],
                        [r for r in other["blocks"] if r["state"] != "inactive"], strict=True):
            b["requested_size"] = r["requested_size"]
            if b.get("history"):
                b["history"][0]["real_size"] = r["history"][0]["real_size"]
    return blocks


def _live_past_the_steps(trace: Trace, warmup_steps: int = 1) -> Trace:
    """The trace with the blocks freed after the last counted step never freed. memgate's leak is a block
    live when that step ends (metrics._leaked: a test's locals freed as its function returns were held
    through every step all the same); groundtruth.expected_metrics counts the blocks never freed."""
    counted = sorted(trace.steps)[warmup_steps:]
    if not counted:
        return trace
    last = max(end for _, _, end in counted)
    return replace(trace, blocks=tuple(replace(b, t_free=None) if b.t_free is not None and b.t_free > last else b
                                       for b in trace.blocks))


@given(trace=traces(max_blocks=20), opts=_options())
def test_written_snapshot_reads_back_to_ground_truth(trace: Trace, opts: SnapshotOptions) -> None:
    """Exact: sizes are bytes and the trace is moved onto a µs grid (time_us resolution), which keeps
    the order of instants and hence every metric. Eras without time_us have no steps. The file records
    the trace's requests over the segments of their blocks (``_as_blocks``): the figures are the blocks',
    the requested peak the requests'."""
    grid = on_microsecond_grid(trace)
    expected_requested = expected_metrics(grid)
    assert expected_requested == expected_metrics(trace)  # the grid changes no metric
    pad = NPU_PAD if opts.device == "npu" else 0
    blocks = _as_blocks(grid, pad)
    expected = expected_metrics(blocks)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "snapshot.pickle"
        path.write_bytes(pickle.dumps(_with_requests(render(blocks, opts), render(grid, opts), pad),
                                      protocol=opts.protocol))
        [found] = discover(path)
        assert found.format.name == "torch_snapshot"
        profile = load(found)
    [m] = profile_metrics(profile)
    [model] = profile.devices
    assert m.device == f"{opts.device}:{trace.device_id}"
    assert m.values["peak_allocated_bytes"] == expected["peak_allocated_bytes"]
    assert m.values["peak_requested_bytes"] == expected_requested["peak_allocated_bytes"]
    assert m.values["peak_reserved_bytes"] == expected["peak_reserved_bytes"]
    assert m.values["fragmentation"] == expected["fragmentation"]
    assert m.values["op_max_block_bytes"] == recoverable_ops(blocks)
    assert len(model.blocks) == expected_block_count(blocks)
    frame = model.series["allocator"].frame.to_pandas()
    assert int(frame["allocated"].iloc[0]) == blocks.pre_window_bytes()
    # Every free completes at once here: active only lags allocated between the two entries.
    assert (frame["active"] >= frame["allocated"]).all()
    assert frame["active"].max() == expected["peak_allocated_bytes"]
    assert frame["active"].iloc[-1] == frame["allocated"].iloc[-1]
    if opts.era == "modern":
        assert m.values["step_growth_bytes"] == expected["step_growth_bytes"]
        assert m.values["leaked_bytes"] == expected_metrics(_live_past_the_steps(blocks))["leaked_bytes"]
        assert sorted(map(tuple, profile.steps.to_pandas().astype("int64").to_numpy().tolist())) == sorted(grid.steps)
    else:
        assert len(profile.steps) == 0 and m.values["step_growth_bytes"] is None
        assert profile.metadata["time_base"] == "trace_index"


@pytest.mark.parametrize("field", ["total_size", "size"])
def test_a_number_nested_a_million_lists_deep_is_an_input_error(tmp_path: Path, field: str) -> None:
    """pyarrow's type inference recursed into such a value and killed the process (exit 139)."""
    depth = 1_000_000
    nested = b"]" * depth + b"a" * (depth - 1)  # EMPTY_LIST pushed depth times, each APPENDed into the one below
    data = {"segments": [{"device": 0, "address": 0, "total_size": 512, "stream": 0, "segment_type": "small",
                          "allocated_size": 0, "active_size": 0, "blocks": []}],
            "device_traces": [[{"action": "alloc", "addr": 0, "size": 512, "stream": 0, "frames": []}]]}
    raw = pickle.dumps(data, protocol=2)
    key = b"X" + len(field).to_bytes(4, "little") + field.encode()  # the pickled key (BINUNICODE)
    at = raw.index(b"\x4d\x00\x02", raw.index(key))  # BININT2 512, the key's value
    path = tmp_path / "nested.pickle"
    path.write_bytes(raw[:at] + nested + raw[at + 3:])
    where = "segments[0].total_size" if field == "total_size" else "device_traces[0][0].size"
    with pytest.raises(InputError, match="wrong type") as info:
        snapshot.load(path)
    assert info.value.column == where


def test_an_address_reused_within_one_instant_of_a_resorted_trace(tmp_path: Path) -> None:
    """torch_npu inserts entries at the front of its trace; put in time order here, the entries of one
    µs are in file order, which may list an address's next alloc before the free that made room."""
    x = 1 << 20

    def entry(action: str, t: int) -> dict[str, Any]:
        return {"action": action, "addr": x, "size": 100, "stream": 0, "time_us": t, "frames": []}

    trace = [entry("alloc", 5), entry("alloc", 1), entry("free_requested", 5), entry("free_completed", 5)]
    data = {"segments": [segment_dict(0, x, [block_dict(512, "active_allocated", 100)])], "device_traces": [trace]}
    blocks = snapshot.load(write_pickle(tmp_path, data)).devices[0].blocks.to_pandas()
    lifetimes = [(int(a), None if f is pd.NA else int(f)) for a, f in zip(blocks["t_alloc"], blocks["t_free"])]
    assert sorted(lifetimes, key=str) == [(1000, 5000), (5000, None)]
    # in record order the same entries are a broken record: no free between the two allocs
    in_order = [entry("alloc", 1), entry("alloc", 5), entry("free_requested", 5), entry("free_completed", 5)]
    data["device_traces"] = [in_order]
    with pytest.raises(InputError, match="allocated twice"):
        snapshot.load(write_pickle(tmp_path, data))


# ---- frames no metric reads: checked by `memgate validate` ----------------------------------------


def _with_bad_frame(tmp_path: Path, source: Path, name: str, pick: Any) -> tuple[Path, str]:
    """``source`` with ``[5]`` as the frames of the record ``pick(data)`` returns (with its JSON path)."""
    data = pickle.loads(source.read_bytes())
    record, where = pick(data)
    record["frames"] = [5, {"name": "x"}]
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data))
    return path, where


def _first_free(data: dict[str, Any]) -> tuple[dict[str, Any], str]:
    i = next(i for i, e in enumerate(data["device_traces"][0]) if e["action"] == "free_requested")
    return data["device_traces"][0][i], f"device_traces[0][{i}].frames[0]"


def _first_block(state: str) -> Callable[[Any], tuple[dict[str, Any], str]]:
    def pick(data: Any) -> tuple[dict[str, Any], str]:
        segments = data["segments"] if isinstance(data, dict) else data
        for s, segment in enumerate(segments):
            for b, block in enumerate(segment["blocks"]):
                if block["state"] == state:
                    return block, f"segments[{s}].blocks[{b}].frames[0]"
        raise AssertionError(f"no {state} block")
    return pick


def _validate(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = cli.main(["validate", *args])
    return rc, capsys.readouterr().out


@pytest.mark.parametrize("case", ["free entry", "free block"])
def test_validate_reads_the_frames_a_load_skips(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A load reads the frames of the blocks it attributes; the frames of frees and of free blocks no
    metric reads, and `memgate validate` checks them too (with --jobs and with a cache as well)."""
    pick = _first_free if case == "free entry" else _first_block("inactive")
    path, where = _with_bad_frame(tmp_path, MODERN, "bad.pickle", pick)
    assert profile_metrics(snapshot.load(path))  # what inspect and the gate read is sound
    rc, out = _validate(str(path), capsys=capsys)
    assert rc == cli.EXIT_BAD_INPUT and f"column '{where}': malformed stack frame" in out, out
    assert str(path) in out
    # through the process pool, and past a cache that holds the file's (unchecked) load
    (tmp_path / "other.pickle").write_bytes(MODERN.read_bytes())
    cache = tmp_path / "cache"
    assert cli.main(["inspect", "--cache-dir", str(cache), str(tmp_path)]) == cli.EXIT_OK
    capsys.readouterr()
    rc, out = _validate("--jobs", "2", "--cache-dir", str(cache), str(tmp_path), capsys=capsys)
    assert rc == cli.EXIT_BAD_INPUT and where in out and "other.pickle [torch_snapshot]: ok" in out, out


def test_a_bad_frame_of_a_live_block_names_the_file(tmp_path: Path) -> None:
    """A block allocated before the window and live through it: its frames give its op; a malformed
    one is an error naming the file (it once named only the JSON path)."""
    path, where = _with_bad_frame(tmp_path, MULTI, "live.pickle", _first_block("active_allocated"))
    with pytest.raises(InputError) as info:
        snapshot.load(path)
    assert info.value.file == str(path) and info.value.column == where, info.value.one_line()


def test_frames_lists_that_hold_themselves_are_an_error_not_a_crash(tmp_path: Path) -> None:
    """Two lists [f, X] and [f, Y] where X and Y hold themselves compare equal by ``==`` forever
    (RecursionError, exit 3): grouped by identity instead, and the first is reported."""
    frame = {"name": "f", "filename": "m.py", "line": 1}
    x: list[Any] = [frame]
    x.append(x)
    y: list[Any] = [frame]
    y.append(y)
    assert stack_groups.first_equal([x, y, [frame], x]).tolist() == [0, 1, 2, 0]

    def pick(data: dict[str, Any]) -> tuple[dict[str, Any], str]:
        allocs = [i for i, e in enumerate(data["device_traces"][0]) if e["action"] == "alloc"]
        data["device_traces"][0][allocs[1]]["frames"] = y
        return data["device_traces"][0][allocs[0]], f"device_traces[0][{allocs[0]}].frames[1]"

    data = pickle.loads(MODERN.read_bytes())
    record, where = pick(data)
    record["frames"] = x
    path = tmp_path / "cycle.pickle"
    path.write_bytes(pickle.dumps(data))
    with pytest.raises(InputError) as info:
        snapshot.load(path)
    assert info.value.column == where and "malformed stack frame" in info.value.message, info.value.one_line()

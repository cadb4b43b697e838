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
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pandas as pd
import pytest
from groundtruth import Trace, expected_metrics
from helpers import SAMPLES, in_process, sample_pickle
from hypothesis import given
from hypothesis import strategies as st
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

TORCH = Path(__file__).parent / "data" / "samples" / "torch"
CUDA_LEAK = SAMPLES / "torch_cuda" / "h200_snapshot_leak" / "snapshot.pickle"
PICKLES = sorted(TORCH.glob("*.pickle"))
MODERN = TORCH / "snapshot_modern_small_cs336.pickle"
LEGACY = TORCH / "snapshot_legacy_history_flexgen.pickle"
EORNN = TORCH / "snapshot_mid_timeus_noallocsettings_eornn.pickle"
MULTI = TORCH / "snapshot_multidevice_expandable_notrace.pickle"


raw = sample_pickle  # the name the other snapshot tests import


# ---- an independent reading of a snapshot (plain loops) -----------------------------------------


def _requested(block: dict[str, Any]) -> int:
    if block.get("requested_size") is not None:
        return int(block["requested_size"])
    if block.get("history"):
        return int(block["history"][0]["real_size"])
    return int(block["size"])


def _final_active(data: dict[str, Any], dev: int, *, blocks: bool = False) -> dict[int, int]:
    """address → requested size (``blocks``: the allocator's block size) of every active_allocated block of
    the device's final segments."""
    out = {}
    for seg in data["segments"]:
        if seg["device"] != dev:
            continue
        addr = seg["address"]
        for block in seg["blocks"]:
            where = block.get("address", addr)
            if block["state"] == "active_allocated":
                out[where] = block["size"] if blocks else _requested(block)
            addr += block["size"]
    return out


def _in_time_order(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    moving = [e for e in entries if e["action"] not in ("snapshot", "oom", "workspace_snapshot")]
    if moving and all("time_us" in e for e in moving):
        return sorted(moving, key=lambda e: e["time_us"])
    return moving


# The caching allocator's rules (c10/cuda/CUDACachingAllocator.cpp), written out here: what
# torch.cuda.memory_allocated() counts is the block each request got, not the request.
_MIB = 1 << 20  # kSmallSize: a rounded request up to it comes from the small pool (2 MiB segments)


def torch_round(size: int, divisions: list[int]) -> int:
    """round_size: below 512 B → 512; up to a multiple of 512; with roundup_power2_divisions ``n`` > 1 for
    the size's interval ([1 MiB, 2 MiB) is interval 0, and everything below it too), up to the next of
    ``n`` equal parts of the size's power-of-two range (a power of two stays)."""
    if size < 512:
        return 512
    log2 = size.bit_length() - 1
    n = divisions[min(max(log2 - 20, 0), len(divisions) - 1)]
    if n > 1 and size > 512 * n:
        if size & (size - 1) == 0:
            return size
        part = (1 << log2) >> (n.bit_length() - 1)
        return -(-size // part) * part if part else 2 << log2
    return -(-size // 512) * 512


def _allocator_rules(data: dict[str, Any]) -> tuple[list[int], int, bool]:
    """(divisions per interval, max_split_size, expandable) from the snapshot's allocator_settings."""
    settings = data.get("allocator_settings") or {}
    divisions = [0] * 16
    for mib, n in (settings.get("roundup_power2_divisions") or {}).items():  # keyed by the interval's start in MiB
        divisions[int(mib).bit_length() - 1] = n
    split = settings.get("max_split_size")
    expandable = settings.get("expandable_segments") is True or any(s.get("is_expandable") for s in data["segments"])
    return divisions, split if isinstance(split, int) and split > 0 else 1 << 62, expandable


def block_replay(data: dict[str, Any], dev: int) -> list[tuple[dict[str, Any], int | None]]:
    """(entry, the allocator block it allocates or frees; None for other entries) of the device's trace in
    time order. A request rounded to at most 1 MiB, or in expandable segments, gets its rounded size; a
    larger one gets the free block that starts at its address in the large pool, less the rest when that
    rest is over 1 MiB and the request is below max_split_size. The large pool is replayed from the
    window's start: the final segments, less those the trace allocates, plus those it frees, occupied by
    the blocks that no trace alloc accounts for (their final size) and free elsewhere; a block freed at
    free_completed merges with its free neighbours."""
    divisions, max_split, expandable = _allocator_rules(data)
    traces = data.get("device_traces") or []
    entries = _in_time_order(list(traces[dev]) if dev < len(traces) else [])
    if not _allocator_written(data):  # no caching allocator's file: its sizes are the blocks, nothing rounds
        moves = ("alloc", "free_requested", "free_completed", "free")
        return [(e, e["size"] if e["action"] in moves else None) for e in entries]
    allocated_here = {e["addr"] for e in entries if e["action"] == "alloc"}
    segments = {s["address"]: s for s in data["segments"] if s["device"] == dev}
    for e in reversed(entries):
        if e["action"] == "segment_alloc":
            segments.pop(e["addr"], None)
        elif e["action"] == "segment_free":
            segments[e["addr"]] = {"address": e["addr"], "total_size": e["size"], "blocks": []}
    layout: dict[int, dict[int, list[Any]]] = {}  # large segment → block start → [size, free]
    for start, seg in segments.items():
        kind = seg.get("segment_type")
        if seg.get("is_expandable") or (kind == "small" if kind else seg["total_size"] <= 2 * _MIB):
            continue
        blocks, cursor = {}, start
        for b in seg["blocks"]:
            at = b.get("address", cursor)
            if b["state"].startswith("active") and at not in allocated_here:
                blocks[at] = [b["size"], False]
            cursor += b["size"]
        cursor = start
        for at in sorted(blocks):  # the gaps between them are free blocks
            if at > cursor:
                blocks[cursor] = [at - cursor, True]
            cursor = at + blocks[at][0]
        if cursor < start + seg["total_size"]:
            blocks[cursor] = [start + seg["total_size"] - cursor, True]
        layout[start] = blocks

    def segment_of(addr: int) -> dict[int, list[Any]] | None:
        for start, blocks in layout.items():
            if start <= addr < start + sum(size for size, _ in blocks.values()):
                return blocks
        return None

    out: list[tuple[dict[str, Any], int | None]] = []
    held: dict[int, int] = {}
    for e in entries:
        action, addr = e["action"], e["addr"]
        block: int | None = None
        if action == "alloc":
            block = torch_round(e["size"], divisions)
            if block > _MIB and not expandable:
                blocks = segment_of(addr)
                assert blocks is not None and blocks.get(addr, [0, False])[1], f"no free block at {addr:#x}"
                whole = blocks[addr][0]
                assert whole >= block, (whole, block)
                if block < max_split and whole - block > _MIB:
                    blocks[addr + block] = [whole - block, True]
                else:
                    block = whole
                blocks[addr] = [block, False]
            held[addr] = block
        elif action in ("free_requested", "free_completed", "free"):
            if addr not in held:  # allocated before the window: its extent is known only in the small pool
                block = torch_round(e["size"], divisions)
                assert block <= _MIB or expandable, "a large block from before the window: replay the whole history"
                held[addr] = block
            block = held[addr]
            if action != "free_requested":
                del held[addr]
                blocks = segment_of(addr)
                if blocks is not None and addr in blocks and not blocks[addr][1]:
                    blocks[addr][1] = True
                    starts = sorted(blocks)
                    i = starts.index(addr)
                    if i + 1 < len(starts) and blocks[starts[i + 1]][1]:
                        blocks[addr][0] += blocks.pop(starts[i + 1])[0]
                    if i > 0 and blocks[starts[i - 1]][1]:
                        blocks[starts[i - 1]][0] += blocks.pop(addr)[0]
        elif action == "segment_alloc" and e["size"] > 2 * _MIB and not expandable:
            layout[addr] = {addr: [e["size"], True]}
        elif action == "segment_free":
            layout.pop(addr, None)
        out.append((e, block))
    return out


def _op(entry: dict[str, Any]) -> str | None:
    for frame in entry.get("frames", []):
        name = frame["name"]
        if name.startswith("at::_ops::") and ("::call(" in name or "::redispatch(" in name):
            return "aten::" + name[len("at::_ops::"):].split("::")[0]
    return None


def _levels(data: dict[str, Any], dev: int) -> dict[str, Any]:
    """The device's levels at the window's start and after each entry of :func:`block_replay`:
    ``allocated`` in the allocator's blocks (the blocks live through the window at their final size),
    ``requested`` by the memory viewer's reconstruction (the requested sizes), ``reserved`` rebuilt from
    the final segments; ``at_peak``: the blocks live when ``allocated`` first peaks; the block count and ops
    (largest block)."""
    replayed = block_replay(data, dev)
    opened: set[int] = set()
    early: dict[int, tuple[int, int]] = {}  # address → (block, requested) of the frees without an alloc
    count = 0
    ops: dict[str, int] = {}
    for e, block in replayed:
        if e["action"] == "alloc":
            opened.add(e["addr"])
            count += 1
            if (op := _op(e)) is not None:
                ops[op] = max(ops.get(op, 0), block)
        elif e["action"] in ("free_requested", "free"):
            if e["addr"] in opened:
                opened.remove(e["addr"])
            else:
                early[e["addr"]] = (block, e["size"])
                count += 1
    final, final_blocks = _final_active(data, dev), _final_active(data, dev, blocks=True)
    through = [a for a in final if a not in opened]
    requested = sum(r for _, r in early.values()) + sum(final[a] for a in through)
    holders = {("early", a): b for a, (b, _) in early.items()}
    holders.update({("through", a): final_blocks[a] for a in through})
    total = sum(s["total_size"] for s in data["segments"] if s["device"] == dev)
    sign_of = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    reserved = total - sum(sign_of.get(e["action"], 0) * e["size"] for e, _ in replayed)
    level = sum(holders.values())
    out: dict[str, Any] = {"allocated": [level], "requested": [requested], "reserved": [reserved],
                           "at_peak": sorted(holders.values()), "blocks": count + len(through), "ops": ops}
    key_of: dict[int, Any] = {a: ("early", a) for a in early}
    best = level
    for n, (e, block) in enumerate(replayed):
        action, addr = e["action"], e["addr"]
        if action == "alloc":
            key_of[addr] = ("trace", n)
            holders[key_of[addr]] = block
            level += block
            requested += e["size"]
        elif action in ("free_requested", "free"):
            del holders[key_of.pop(addr)]
            level -= block
            requested -= e["size"]
        reserved += sign_of.get(action, 0) * e["size"]
        if level > best:
            best, out["at_peak"] = level, sorted(holders.values())
        out["allocated"].append(level)
        out["requested"].append(requested)
        out["reserved"].append(reserved)
    return out


def reference(data: dict[str, Any], dev: int) -> dict[str, Any]:
    """Peaks, block count, ops, the level at the end and the blocks live at the (first) allocated peak:
    ``peak_requested_bytes`` and ``end_requested`` by the memory viewer's reconstruction (the requested
    sizes), the others in the allocator's blocks (:func:`_levels`)."""
    levels = _levels(data, dev)
    return {"peak_allocated_bytes": max(levels["allocated"]), "peak_requested_bytes": max(levels["requested"]),
            "peak_reserved_bytes": max(levels["reserved"]), "blocks": levels["blocks"], "ops": levels["ops"],
            "end_allocated": levels["allocated"][-1], "end_requested": levels["requested"][-1],
            "at_peak": levels["at_peak"]}


def _allocator_written(data: dict[str, Any]) -> bool:
    """Whether the final blocks are the caching allocator's (multiples of 512 B); _profile_to_snapshot
    (kineto_cpu_profile_to_snapshot.pickle) writes the requested sizes of a CPU profile instead."""
    return all(b["size"] % 512 == 0 for s in data["segments"] for b in s["blocks"])


def _as_dict(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else {"segments": data, "device_traces": []}


def _devices(data: dict[str, Any]) -> list[int]:
    devs = {s["device"] for s in data["segments"]} | {i for i, t in enumerate(data.get("device_traces") or []) if t}
    return sorted(devs)


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
    with pytest.raises(InputError, match="refused to load 'posix.system'"):
        safepickle.load(path)


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
    data = _as_dict(raw(path))
    profile = snapshot.load(path)
    assert profile.format == "torch_snapshot"
    devices = _devices(data)
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
        assert ref["end_requested"] == sum(_final_active(data, dev).values())
        if _allocator_written(data):  # the replay ends where the allocator's own final blocks say
            assert ref["end_allocated"] == sum(_final_active(data, dev, blocks=True).values())
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
                derived.append((addr, _requested(block)))
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


def has_history(data: dict[str, Any]) -> bool:
    """Whether any device trace records an event (a lone 'snapshot' marker is not history)."""
    return any(e.get("action") != "snapshot" for t in data.get("device_traces") or [] for e in t)


def assert_no_history(m: Any) -> None:
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation", "step_growth_bytes", "leaked_bytes"):
        assert m.values[key] is None, key
        assert "_record_memory_history" in m.missing[key], m.missing[key]
    assert m.values["top_at_peak"] == []
    assert (m.peak_t_ns, m.peak_step) == (None, None)  # no peak: no moment or step of it either
    # the pools break fragmentation down: at the dump alone 1 - allocated/reserved is the cache kept
    assert m.pools == {} and m.pool_of == {}


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
    assert int(frame["allocated"].iloc[-1]) == sum(_final_active(data, 0, blocks=True).values())
    assert int(frame["reserved"].iloc[-1]) == sum(s["total_size"] for s in data["segments"])


def test_no_trace_multidevice_expandable() -> None:
    data = raw(MULTI)
    metrics = {m.device: m for m in profile_metrics(snapshot.load(MULTI))}
    assert set(metrics) == {"cuda:0", "cuda:1"}
    profile = snapshot.load(MULTI)
    divisions, _, expandable = _allocator_rules(data)
    assert expandable
    for dev, model in zip((0, 1), profile.devices):
        m = metrics[f"cuda:{dev}"]
        assert_no_history(m)
        frame = model.series["allocator"].frame.to_pandas()
        # in expandable segments a block is its rounded request (4704 B → 5120 B): the final blocks agree
        requested, blocks = _final_active(data, dev), _final_active(data, dev, blocks=True)
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
    assert int(frame["allocated"].iloc[-1]) == sum(_final_active(data, 0, blocks=True).values())
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
    whole = _levels(data, 0)  # level k: after the first k entries that are no marker
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


def test_profiler_step_annotations_are_steps(tmp_path: Path) -> None:
    data = raw(EORNN)
    times = sorted(e["time_us"] for e in data["device_traces"][0])
    cuts = [times[k * (len(times) - 1) // 6] for k in range(7)]  # six steps, 5 counted: growth is measurable
    data["external_annotations"] = [
        {"name": f"ProfilerStep#{10 + k}", "stage": stage, "device": 0, "time_us": t}
        for k in range(6) for stage, t in (("START", cuts[k]), ("END", cuts[k + 1] - 1))
    ] + [{"name": "Optimizer.step#SGD.step", "stage": "START", "device": 0, "time_us": cuts[1]}]
    path = tmp_path / "steps.pickle"
    path.write_bytes(pickle.dumps(data))
    profile = snapshot.load(path)
    assert profile.steps.to_pandas()["step"].tolist() == list(range(10, 16))
    assert profile.steps.to_pandas()["t_start"].tolist() == [c * 1000 for c in cuts[:6]]
    assert profile.steps.to_pandas()["t_end"].tolist() == [(c - 1) * 1000 for c in cuts[1:]]
    assert "steps_by_optimizer" not in profile.metadata  # ProfilerStep#N, where there are any, are the steps
    [m] = profile_metrics(profile)
    assert isinstance(m.values["step_growth_bytes"], int)
    assert m.values["leaked_bytes"] is not None and m.values["leak_undetermined_bytes"] is not None


def test_optimizer_step_annotations_are_steps_without_profiler_steps(tmp_path: Path) -> None:
    """_record_memory_history without torch.profiler: the optimizer's own ``Optimizer.step#...``
    annotations mark the steps, step n ending where optimizer step n ends (the first starting at the
    history's first entry); a second optimizer's (a GAN's) add none."""
    data = raw(EORNN)
    times = sorted(e["time_us"] for e in data["device_traces"][0])
    ends = [times[k * (len(times) - 1) // 6] for k in range(1, 7)]
    data["external_annotations"] = [
        {"name": name, "stage": stage, "device": 0, "time_us": t}
        for end in ends for name, shift in (("Optimizer.step#SGD.step", 0), ("Optimizer.step#Adam.step", 1))
        for stage, t in (("START", end - 50 + shift), ("END", end + shift))]
    path = tmp_path / "optimizer.pickle"
    path.write_bytes(pickle.dumps(data))
    profile = snapshot.load(path)
    steps = profile.steps.to_pandas()
    assert steps["step"].tolist() == list(range(6))
    assert steps["t_end"].tolist() == [t * 1000 for t in ends]
    assert steps["t_start"].tolist() == [times[0] * 1000] + [t * 1000 for t in ends[:-1]]
    assert profile.metadata["steps_by_optimizer"] == "Optimizer.step#SGD.step"
    [m] = profile_metrics(profile)
    assert isinstance(m.values["step_growth_bytes"], int)


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
    assert dev["metrics"]["allocated_at_dump_bytes"] == sum(_final_active(raw(MODERN), 0, blocks=True).values())


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


# ---- the pool at the dump (DeviceModel.dump_state) -----------------------------------------------


def pool_reference(data: dict[str, Any], dev: int) -> dict[str, int]:
    """The device's pool as its final segments record it, by plain loops over the raw pickle:
    active_allocated blocks by their block size, as torch.cuda.memory_allocated() sums them
    (active_pending_free ones were freed by the program), reserved = the segments' total_size,
    free = inactive blocks by their block size."""
    allocated = reserved = free_bytes = largest = 0
    for seg in data["segments"]:
        if seg["device"] != dev:
            continue
        reserved += seg["total_size"]
        for block in seg["blocks"]:
            if block["state"] == "active_allocated":
                allocated += block["size"]
            elif block["state"] == "inactive":
                free_bytes += block["size"]
                largest = max(largest, block["size"])
    return {"allocated": allocated, "reserved": reserved, "free_bytes": free_bytes, "largest_free_block": largest}


def _pool(model: Any) -> dict[str, int]:
    state = model.dump_state
    assert state is not None, model.device
    return {"allocated": state.allocated, "reserved": state.reserved, "free_bytes": state.free_bytes,
            "largest_free_block": state.largest_free_block}


def test_the_samples_cover_every_era_of_the_pool_state() -> None:
    assert len(PICKLES) >= 6  # every pickle sample is checked below
    datas = {p.name: raw(p) for p in PICKLES}
    assert any(not has_history(_as_dict(d)) for d in datas.values())
    assert any(has_history(_as_dict(d)) for d in datas.values())
    assert len(_devices(datas[MULTI.name])) == 2 and not has_history(datas[MULTI.name])
    assert any(s["is_expandable"] for s in datas[MULTI.name]["segments"])
    assert any("history" in b for s in datas[LEGACY.name]["segments"] for b in s["blocks"])


@pytest.mark.parametrize("path", PICKLES, ids=lambda p: p.name)
def test_real_sample_dump_state_equals_the_segments(path: Path) -> None:
    data = _as_dict(raw(path))
    profile = snapshot.load(path)
    assert [d.device for d in profile.devices] == [f"cuda:{d}" for d in _devices(data)]
    for dev, model in zip(_devices(data), profile.devices):
        assert _pool(model) == pool_reference(data, dev), model.device
        assert model.dump_state is not None
        # the caching allocator's blocks; a file none wrote (4 B blocks) keeps its sizes as requested
        basis = "rounded" if _allocator_written(data) else "requested"
        assert model.dump_state.size_basis == basis == profile.metadata["size_basis"]
        assert model.dump_state.source == str(path)
        assert 0 <= model.dump_state.largest_free_block <= model.dump_state.free_bytes
        assert model.dump_state.allocated + model.dump_state.free_bytes <= model.dump_state.reserved


@pytest.mark.parametrize("path", [p for p in PICKLES if has_history(_as_dict(raw(p)))], ids=lambda p: p.name)
def test_dump_state_ends_the_series_where_there_is_history(path: Path) -> None:
    """The pool at the dump is where the allocated and reserved series end: the same basis (the blocks)."""
    for model in snapshot.load(path).devices:
        frame = model.series["allocator"].frame.to_pandas()
        assert model.dump_state is not None
        assert model.dump_state.allocated == int(frame["allocated"].iloc[-1])
        assert model.dump_state.reserved == int(frame["reserved"].iloc[-1])


def test_no_history_keeps_history_metrics_unmeasurable_and_not_the_pool_state() -> None:
    for path in (MULTI, LEGACY):
        not_measurable = snapshot.load(path).metadata["not_measurable"]
        assert set(not_measurable) == set(snapshot.HISTORY_METRICS) >= {
            "peak_allocated_bytes", "peak_reserved_bytes", "step_growth_bytes", "leaked_bytes", "top_at_peak"}
        assert not set(not_measurable) & {"allocated_at_dump_bytes", "reserved_at_dump_bytes",
                                          "largest_free_block_bytes", "free_block_fragmentation"}
        assert all("_record_memory_history" in why for why in not_measurable.values())
    assert "not_measurable" not in snapshot.load(MODERN).metadata


def _block(size: int, state: str, requested: int | None = None) -> dict[str, Any]:
    return {"size": size, "state": state, "requested_size": size if requested is None else requested}


def _segment(device: int, address: int, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    at = address
    for block in blocks:
        block["address"] = at
        at += block["size"]
    # the small pool's segments are 2 MiB, the large pool's larger
    return {"device": device, "address": address, "total_size": at - address, "stream": 0,
            "segment_type": "small" if at - address <= 2 << 20 else "large", "blocks": blocks}


def _write(tmp_path: Path, data: Any, name: str = "snap.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data))
    return path


def test_dump_state_without_free_blocks(tmp_path: Path) -> None:
    data = {"segments": [_segment(0, 1 << 20, [_block(1024, "active_allocated", 1000),
                                               _block(512, "active_pending_free", 500)])],
            "device_traces": []}
    [model] = snapshot.load(_write(tmp_path, data)).devices
    assert model.dump_state is not None
    # the block of the 1000 B request (as torch.cuda.memory_allocated() counts it); the pending free is not allocated
    assert (model.dump_state.allocated, model.dump_state.reserved) == (1024, 1536)
    assert (model.dump_state.largest_free_block, model.dump_state.free_bytes) == (0, 0)
    assert int(model.series["allocator"].frame.to_pandas()["allocated"].iloc[-1]) == 1024


def test_dump_state_of_a_segment_all_free(tmp_path: Path) -> None:
    """A segment whose one block is free: nothing allocated, the whole segment is one free block.
    The free block's stale requested_size does not count."""
    data = [_segment(0, 1 << 21, [_block(2 << 20, "inactive", 7)])]  # a bare list of segments
    [model] = snapshot.load(_write(tmp_path, data)).devices
    assert model.dump_state is not None
    assert (model.dump_state.allocated, model.dump_state.reserved) == (0, 2 << 20)
    assert (model.dump_state.largest_free_block, model.dump_state.free_bytes) == (2 << 20, 2 << 20)


def test_dump_state_per_device(tmp_path: Path) -> None:
    """Two devices: each device's pool from its own segments only; a device with a trace and no
    segment left (all released) has an empty pool."""
    segments = [
        _segment(0, 1 << 20, [_block(4096, "active_allocated", 4000), _block(8192, "inactive"),
                              _block(2048, "inactive")]),
        _segment(1, 1 << 22, [_block(1024, "inactive"), _block(3072, "active_allocated", 3000)]),
        _segment(1, 1 << 23, [_block(16384, "inactive")]),
    ]
    trace2 = [{"action": "segment_alloc", "addr": 1 << 24, "size": 4096, "stream": 0},
              {"action": "segment_free", "addr": 1 << 24, "size": 4096, "stream": 0}]
    data = {"segments": segments, "device_traces": [[], [], trace2]}
    profile = snapshot.load(_write(tmp_path, data))
    states = {m.device: _pool(m) for m in profile.devices}
    assert states == {
        "cuda:0": {"allocated": 4096, "reserved": 14336, "free_bytes": 10240, "largest_free_block": 8192},
        "cuda:1": {"allocated": 3072, "reserved": 4096 + 16384, "free_bytes": 17408, "largest_free_block": 16384},
        "cuda:2": {"allocated": 0, "reserved": 0, "free_bytes": 0, "largest_free_block": 0},
    }
    for dev, model in enumerate(profile.devices):
        assert _pool(model) == pool_reference(data, dev)


def test_legacy_history_blocks_count_their_real_size(tmp_path: Path) -> None:
    """A legacy block (no requested_size) was requested at its history's real_size: that is its share of
    the requested peak; allocated counts its block, like every other."""
    block = {"size": 1536, "state": "active_allocated", "history": [{"addr": 1 << 20, "real_size": 1500}]}
    data = {"segments": [{"device": 0, "address": 1 << 20, "total_size": 2048, "stream": 0, "segment_type": "small",
                          "blocks": [block, {"size": 512, "state": "inactive"}]}], "device_traces": []}
    [model] = snapshot.load(_write(tmp_path, data)).devices
    assert _pool(model) == {"allocated": 1536, "reserved": 2048, "free_bytes": 512, "largest_free_block": 512}
    # with a history (legacy era: the single 'free' action, no time_us): 500 B requested in the free 512 B
    at = (1 << 20) + 1536
    data["device_traces"] = [[{"action": "alloc", "addr": at, "size": 500, "stream": 0},
                              {"action": "free", "addr": at, "size": 500, "stream": 0}]]
    profile = snapshot.load(_write(tmp_path, data))
    [m] = profile_metrics(profile)
    assert m.values["peak_requested_bytes"] == 1500 + 500
    assert m.values["peak_allocated_bytes"] == 1536 + 512
    assert sorted(profile.devices[0].blocks.to_pandas()["size"].tolist()) == [512, 1536]


# ---- torch_npu snapshots: device label ------------------------------------------------------------


def _labelled(tmp_path: Path, filenames: list[str], *, where: str = "trace", conf: str | None = None) -> str:
    frames = [{"name": "f", "filename": f, "line": 1} for f in filenames]
    block = _block(1024, "active_allocated", 1000)
    data: dict[str, Any] = {"segments": [_segment(0, 1 << 20, [block])], "device_traces": [[]]}
    if conf is not None:
        data["allocator_settings"] = {conf: "", "max_split_size": -1}
    if where == "trace":
        data["device_traces"] = [[{"action": "alloc", "addr": 1 << 20, "size": 1000, "stream": 0, "frames": frames}]]
    elif where == "block":
        block["frames"] = frames
    elif where == "history":  # legacy (<= 2.0): the block's frames are in its history
        block.pop("address")
        block["history"] = [{"addr": 1 << 20, "real_size": 1000, "frames": frames}]
    else:
        data["segments"][0]["frames"] = frames
    [model] = snapshot.load(_write(tmp_path, data)).devices
    return model.device


NPU_PATHS = ["/usr/local/lib/python3.9/site-packages/torch_npu/npu/memory.py",
             "C:\\Python310\\Lib\\site-packages\\torch_npu\\utils\\_tensor.py",
             "/home/ci/build/torch_npu/csrc/core/npu/NPUCachingAllocator.cpp"]
NOT_NPU_PATHS = ["/usr/local/lib/python3.9/site-packages/torch/nn/modules/module.py",
                 "/home/me/torch_npu_helper/train.py", "/home/me/my_torch_npu/x.py", "/home/me/torch_npu.py",
                 "torch_npu", "??", ""]


@pytest.mark.parametrize("path", NPU_PATHS)
@pytest.mark.parametrize("where", ["trace", "block", "history", "segment"])
def test_frames_in_torch_npu_make_an_npu_snapshot(tmp_path: Path, path: str, where: str) -> None:
    assert _labelled(tmp_path, ["/work/train.py", path], where=where) == "npu:0"


@pytest.mark.parametrize("where", ["trace", "segment"])
def test_a_cuda_allocator_conf_settles_the_label_before_any_frame(tmp_path: Path, where: str) -> None:
    """torch's CUDA (and ROCm) allocator names its conf in allocator_settings; no torch_npu release writes
    allocator_settings, so a torch_npu frame there (a user's wrapper) leaves the snapshot CUDA's."""
    for conf in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        assert _labelled(tmp_path, ["/work/train.py", NPU_PATHS[0]], where=where, conf=conf) == "cuda:0"
    assert _labelled(tmp_path, ["/work/train.py", NPU_PATHS[0]], where=where, conf="PYTORCH_NPU_ALLOC_CONF") == "npu:0"
    # a conf of no known allocator (a newer torch's generic name) decides nothing: the frames still do
    assert _labelled(tmp_path, ["/work/train.py", NPU_PATHS[0]], where=where, conf="PYTORCH_ALLOC_CONF") == "npu:0"


@pytest.mark.parametrize("cuda", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"])
@pytest.mark.parametrize("npu_first", [True, False])
def test_a_cuda_conf_settles_cuda_whatever_else_the_settings_hold(tmp_path: Path, cuda: str, npu_first: bool) -> None:
    """Both confs (a CUDA file relabelled by an NPU key beside its own), in either order, and torch_npu's
    workspace entries at the front of the trace: the CUDA conf settles it (formats-reference §4)."""
    confs = ["PYTORCH_NPU_ALLOC_CONF", cuda][:: 1 if npu_first else -1]
    block = _block(1024, "active_allocated", 1000)
    workspace = {"action": "workspace_snapshot", "addr": 0, "size": 0, "stream": 0, "frames": []}
    alloc = {"action": "alloc", "addr": 1 << 20, "size": 1000, "stream": 0,
             "frames": [{"name": "f", "filename": NPU_PATHS[0], "line": 1}]}
    data = {"segments": [_segment(0, 1 << 20, [block])], "device_traces": [[workspace, alloc]],
            "allocator_settings": {**dict.fromkeys(confs, ""), "max_split_size": -1}}
    assert [d.device for d in snapshot.load(_write(tmp_path, data)).devices] == ["cuda:0"]
    # a key that merely holds "NPU" is no torch_npu conf: without workspace entries or frames, CUDA
    data = {"segments": [_segment(0, 1 << 20, [block])], "device_traces": [[]],
            "allocator_settings": {"MY_NPU_NOTE": "", "max_split_size": -1}}
    assert [d.device for d in snapshot.load(_write(tmp_path, data)).devices] == ["cuda:0"]


def test_a_real_cuda_snapshot_with_an_npu_conf_added_is_judged_as_cuda(tmp_path: Path, capsys: Any) -> None:
    """An H200 snapshot given a PYTORCH_NPU_ALLOC_CONF beside its PYTORCH_CUDA_ALLOC_CONF was labelled npu:0,
    so a cuda:* budget skipped it and a 725 MiB peak passed a 1 MiB limit with exit 0."""
    data = sample_pickle(CUDA_LEAK)
    data["allocator_settings"]["PYTORCH_NPU_ALLOC_CONF"] = "expandable_segments:False"
    (tmp_path / "snapshot.pickle").write_bytes(pickle.dumps(data))
    (tmp_path / "b.toml").write_text('[[budgets]]\nname = "gpu"\ndevices = "cuda:*"\npeak_allocated = "1 MiB"\n')
    rc, out, _ = in_process(["check", tmp_path / "snapshot.pickle", "--budgets", tmp_path / "b.toml"], capsys)
    assert rc == 1
    assert "peak_allocated 725.20 MiB exceeds budget 1.00 MiB by 724.20 MiB (+72419.6%) — rank 0 cuda:0, step 5" in out


@pytest.mark.parametrize("path", NOT_NPU_PATHS)
def test_other_frames_leave_a_cuda_snapshot(tmp_path: Path, path: str) -> None:
    assert _labelled(tmp_path, ["/work/train.py", path]) == "cuda:0"


def test_npu_frames_deep_in_a_shared_stack(tmp_path: Path) -> None:
    """torch shares frame dicts among entries; a torch_npu frame at the far end of a long stack counts."""
    shared = [{"name": f"f{i}", "filename": f"/usr/lib/python3/site-packages/torch/m{i}.py", "line": i}
              for i in range(300)]
    npu = {"name": "malloc", "filename": "/opt/site-packages/torch_npu/npu/memory.py", "line": 1}
    entries: list[dict[str, Any]] = [{"action": "alloc", "addr": (1 << 20) + 1024 * i, "size": 1000, "stream": 0,
                                      "frames": list(shared)} for i in range(50)]
    entries[-1]["frames"].append(npu)
    blocks = [_block(1024, "active_allocated", 1000) for _ in range(50)]
    data = {"segments": [_segment(0, 1 << 20, blocks)], "device_traces": [entries]}
    assert [m.device for m in snapshot.load(_write(tmp_path, data)).devices] == ["npu:0"]
    entries[-1]["frames"].pop()
    assert [m.device for m in snapshot.load(_write(tmp_path, data)).devices] == ["cuda:0"]


def test_real_cuda_samples_stay_cuda() -> None:
    for path in PICKLES:
        assert all(m.device.startswith("cuda:") for m in snapshot.load(path).devices), path.name


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
    data = {"segments": [_segment(0, x, [_block(512, "active_allocated", 100)])], "device_traces": [trace]}
    blocks = snapshot.load(_write(tmp_path, data)).devices[0].blocks.to_pandas()
    lifetimes = [(int(a), None if f is pd.NA else int(f)) for a, f in zip(blocks["t_alloc"], blocks["t_free"])]
    assert sorted(lifetimes, key=str) == [(1000, 5000), (5000, None)]
    # in record order the same entries are a broken record: no free between the two allocs
    in_order = [entry("alloc", 1), entry("alloc", 5), entry("free_requested", 5), entry("free_completed", 5)]
    data["device_traces"] = [in_order]
    with pytest.raises(InputError, match="allocated twice"):
        snapshot.load(_write(tmp_path, data))


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

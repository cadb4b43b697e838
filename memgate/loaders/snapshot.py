"""PyTorch caching-allocator memory snapshots (``_dump_snapshot`` pickles), every era. docs/formats-reference.md §4.

Eras read: a bare list of segments (oldest); legacy ``history`` blocks without ``address`` (≤ 2.0:
the address is derived from the segment address and the sizes before the block); trace entries
without ``time_us`` (< 2.2); ``time_us`` entries; ``allocator_settings`` / ``external_annotations``;
``compile_context``; several devices; expandable segments; snapshots recorded without history
(empty ``device_traces``); torch_npu files (workspace entries inserted at the *front* of a trace;
labelled ``npu:N``, see :func:`_is_npu`).

What one device becomes:
- **blocks**: one per ``alloc`` entry (freed at the matching ``free_requested``, or never), one per
  ``free_requested`` without an ``alloc`` in the trace (allocated before the window: the trace is a
  ring buffer), and one per ``active_allocated`` block of the final ``segments`` that no trace
  ``alloc`` accounts for (live for the whole window). That is the baseline torch's memory viewer
  reconstructs. ``op`` is the innermost ``at::_ops::<name>`` C++ frame (``aten::<name>``, overload
  suffix kept), ``owner`` the innermost Python frame (``file:line:function``).
- **series** ``allocator``: ``allocated`` (drops at ``free_requested``, like
  ``torch.cuda.memory_allocated``), ``active`` (drops at ``free_completed``) and ``reserved``
  (``segment_alloc``/``segment_map`` up, ``segment_free``/``segment_unmap`` down), each rebuilt
  backwards from the final ``segments`` so the level at the window start is exact.
- **dump_state**: the pool the final ``segments`` record (allocated, reserved, free blocks), with or
  without history; a snapshot without history measures only this (HISTORY_METRICS are not measurable).
- **steps**: ``external_annotations`` named ``ProfilerStep#N`` (START/END).

Sizes are the caching allocator's *block* sizes (:mod:`memgate.loaders.block_sizes`: the 512 B
rounding, ``roundup_power2_divisions``, a large-pool remainder it does not split), what
``torch.cuda.memory_allocated()`` and ``max_memory_allocated()`` count; the requested sizes the trace
records are kept for ``peak_requested_bytes``. A snapshot of a non-caching allocator (or one whose
blocks are not multiples of 512 B, as ``_profile_to_snapshot`` of a CPU run) keeps its requested sizes.

Time: ``t_ns = time_us * 1000`` when the entries carry ``time_us``, sorted stably by it (torch_npu's
front-inserted entries are out of order). Without ``time_us`` the clock is the 1-based position in
the trace (0 = the window start), ``metadata["time_base"] == "trace_index"``, and steps are not
measurable (annotations carry real time only). A snapshot without any trace has one sample at 0.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import chain, repeat
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from memgate import fastexit
from memgate.errors import InputError
from memgate.lazy import arrow_without_pandas
from memgate.loaders import block_sizes, registry
from memgate.loaders.categories import ADDRESS, note_starts
from memgate.loaders.events import is_torch_file, pair_allocs, repeated_action
from memgate.loaders.registry import rank_of_file as _rank_of  # the rank a snapshot's file or folder name states
from memgate.model import DeviceModel, PoolState, Profile, Series, check_bytes, empty_steps, step_number
from memgate.readers import limits, safepickle
from memgate.readers.memory import collector_paused
from memgate.readers.pyrecords import check_records
from memgate.schemas import load_schema
from memgate.table import Ints, Table, Texts

FORMAT = "torch_snapshot"
SCHEMA = "torch_snapshot"
SUFFIXES = (".pickle", ".pkl")
COMPONENT = "allocator"
NOTE_STARTS = "note_starts_ns"  # metadata of a load with addresses: memgate::note#k START by k
SIZE_BASIS = "rounded"  # the allocator's block sizes, what torch.cuda.memory_allocated() counts
STEP_NAME = re.compile(r"^ProfilerStep#([0-9]+)$")  # also read by RE2 (Arrow), where $ is the end
# Metrics that need the allocation history (peaks, growth of reserved or per step, leaks, the peak's
# holders): not measurable from a snapshot without one. A one-sample series would otherwise read as
# a peak, and as "reserved never grew" (external_fragmentation 0).
HISTORY_METRICS = ("peak_allocated_bytes", "peak_requested_bytes", "peak_reserved_bytes", "fragmentation", "external_fragmentation",
                   "step_growth_bytes", "leaked_bytes", "leak_undetermined_bytes", "top_at_peak")

ACTIONS = ("alloc", "free_requested", "free_completed", "free", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot", "oom", "annotate", "user_defined", "workspace_snapshot")
_A = {name: i for i, name in enumerate(ACTIONS)}
EMPTY = "empty snapshot: no segments and no device traces"  # a dump from a process that never used the device
# Actions that move a counter; only these need an address, a size and (in the time_us era) a time.
_MEMORY_ACTIONS = ("alloc", "free_requested", "free_completed", "free", "segment_alloc", "segment_free",
                   "segment_map", "segment_unmap")


def _is(*names: str) -> np.ndarray:
    """A lookup table over action codes: ``_is(...)[code]`` is whether each entry's action is one of ``names``."""
    return np.isin(np.arange(len(ACTIONS)), [_A[a] for a in names])


_MOVES = _is(*_MEMORY_ACTIONS)
_GROWS = _is("segment_alloc", "segment_map")
_SHRINKS = _is("segment_free", "segment_unmap")
_ACTIVE_STATES = ("active_allocated", "active_pending_free")
_EMPTY_DICT, _EMPTY_LIST = 0x7D, 0x5D
# Keys one of which a snapshot's first record names within its first bytes (dict or bare list).
_HEAD_KEYS = (b"segments", b"device_traces", b"total_size")
_OP_FRAME = re.compile(r"at::_ops::([A-Za-z0-9_]+)::(?:call|redispatch)\b")
_INTERNAL = ("unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "CachingAllocator", "_start",
             "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_")


# ---- detection ------------------------------------------------------------------------------------


def claims(path: Path) -> bool:
    """A ``.pickle``/``.pkl`` file whose first bytes are a binary pickle of a snapshot dict or segment list."""
    if path.suffix.lower() not in SUFFIXES or not path.is_file():
        return False
    try:
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except PermissionError:
        return True  # torch_npu writes snapshots owner-write-only: load() says so clearly
    except OSError:
        return False
    return is_snapshot_head(head)


def is_snapshot_head(head: bytes) -> bool:
    """PROTO 2..5, a dict or list as the top-level object, and a snapshot key in the first record."""
    if safepickle.first_opcode(head) not in (_EMPTY_DICT, _EMPTY_LIST):
        return False
    return any(key in head for key in _HEAD_KEYS)


# ---- loading --------------------------------------------------------------------------------------


def load(path: Path, *, max_bytes: int | None = None, every_frame: bool = False, addresses: bool = False) -> Profile:
    """``addresses``: each block keeps its address (column ``addr``) and ``metadata[NOTE_STARTS]`` holds
    the start (ns) of each ``memgate::note#k`` annotation by k (a tracked recording's moments)."""
    limits.check_file_size(path)  # the general cap first: its message names its own override
    # The collector stays paused while the millions of unpickled objects are read too (a pass over
    # them costs ~0.4 s per 1M trace entries); they are freed before it resumes. A pickle holds no
    # pandas object: Arrow reads the records without importing pandas.
    with collector_paused(), arrow_without_pandas():
        profile, entries = _load_paused(path, limits.current().max_pickle_bytes if max_bytes is None else max_bytes,
                                        every_frame, addresses)
    limits.check_rows(path, entries, what="trace entries", column="device_traces")
    return profile


def _load_paused(path: Path, max_bytes: int, every_frame: bool, addresses: bool = False) -> tuple[Profile, int]:
    """The profile and its number of trace entries."""
    data = safepickle.load(path, max_bytes=max_bytes)
    profile = build_profile(path, data, every_frame=every_frame, addresses=addresses)
    traces = data.get("device_traces") if isinstance(data, dict) else None
    entries = sum(len(t) for t in traces if isinstance(t, (list, tuple))) if isinstance(traces, list) else 0
    fastexit.keep(data, path.stat().st_size)  # the memgate command ends without freeing them one by one
    return profile, entries


@dataclass(frozen=True)
class _Segments:
    """The final segments' blocks, flattened: one row per block."""

    device: np.ndarray  # int64, the block's segment device
    stream: np.ndarray  # int64, the segment's stream
    address: np.ndarray  # int64
    size: np.ndarray  # int64, the allocator's (rounded) block size
    requested: np.ndarray  # int64, requested size (history real_size for legacy blocks)
    active: np.ndarray  # bool, state active_allocated or active_pending_free
    allocated: np.ndarray  # bool, state active_allocated
    inactive: np.ndarray  # bool, state inactive (free, reusable by the pool)
    frames: list[Any]  # per block, the frames of its allocation ([] when unknown)
    seg_device: np.ndarray  # per segment
    seg_total: np.ndarray  # per segment
    seg_address: np.ndarray  # per segment
    seg_replayable: np.ndarray  # per segment: a large-pool segment that is not expandable (block_sizes)
    where: list[str]  # per block, its JSON path


def build_profile(path: Path, data: Any, *, every_frame: bool = False, addresses: bool = False) -> Profile:
    """The normalized model of an unpickled snapshot (``data`` as ``safepickle.load`` returned it).

    ``every_frame``: check the frames no metric reads too (of frees and other non-alloc entries, and
    of segment blocks not allocated through the window), as ``memgate validate`` asks; a load reads
    the frames of the blocks it attributes (~30 % of a trace's entries), and those are checked."""
    schema = load_schema(SCHEMA)
    defs = schema["$defs"]
    era: str
    if isinstance(data, list):
        era, snapshot = "bare_list", {"segments": data, "device_traces": []}
    elif isinstance(data, dict):
        era, snapshot = "dict", data
        check_records([data], defs["snapshot"], file=path, where=lambda i: "", root=schema)
    else:
        raise InputError("not a memory snapshot", file=path, column="(top level)",
                         expected="a dict with 'segments' and 'device_traces' (or a list of segments)",
                         found=type(data).__name__)
    segments = _read_segments(path, snapshot["segments"], schema)
    if era == "dict" and any(isinstance(b, dict) and "history" in b for b in _iter_blocks(snapshot["segments"])):
        era = "legacy_history"
    traces = snapshot.get("device_traces") or []
    for dev, entries in enumerate(traces):
        if not isinstance(entries, (list, tuple)):
            raise InputError("a device trace must be a list of entries", file=path, column=f"device_traces[{dev}]",
                             expected="an array", found=type(entries).__name__)
    annotations = snapshot.get("external_annotations") or []
    ann = check_records(annotations, defs["annotation"], file=path,
                        where=lambda i: f"external_annotations[{i}]", root=schema) if annotations else {}

    parsed = [_parse_trace(path, dev, entries, schema) for dev, entries in enumerate(traces)]
    bases = {p.time_base for p in parsed if p.time_base != "none"}
    time_base = bases.pop() if len(bases) == 1 else ("none" if not bases else "mixed")
    if time_base == "mixed":
        raise InputError("some device traces carry time_us and others do not", file=path, column="device_traces",
                         expected="time_us on every entry of every device, or on none")
    t_origin = min((int(p.t_ns[0]) for p in parsed if len(p.t_ns)), default=0) if time_base == "time_us" else 0

    npu = _is_npu(snapshot, parsed)
    settings = block_sizes.Settings.of(snapshot.get("allocator_settings"))
    if any(isinstance(s, dict) and s.get("is_expandable") is True for s in snapshot["segments"]):
        settings = replace(settings, expandable=True)
    if ((segments.size % block_sizes.MIN_BLOCK) != 0).any():  # no caching allocator hands out such blocks
        settings = replace(settings, caching=False)
    size_basis = SIZE_BASIS if settings.caching else "requested"
    devices = sorted({int(d) for d in segments.seg_device} | {p.device for p in parsed if p.n})
    if not devices:
        devices = list(range(len(traces)))
    if not devices:  # torch dumps at least the segments the allocator holds, or a trace per device
        raise InputError(EMPTY, file=path, column="segments",
                         expected="a snapshot dumped with torch.cuda.memory._dump_snapshot() after "
                                  "_record_memory_history()", found="[]")
    models = []
    notes: dict[str, Any] = {}
    by_dev = {p.device: p for p in parsed}
    for dev in devices:
        trace = by_dev.get(dev) or _parse_trace(path, dev, [], schema)
        model, facts = _device_model(dev, trace, segments, npu, t_origin, path, settings, every_frame, addresses)
        models.append(model)
        notes[model.device] = facts

    steps, steps_source = empty_steps(), None
    step_note = by_optimizer_name = None
    if ann:
        steps, by_optimizer = _steps(path, ann, t_origin)
        if len(steps) and time_base != "time_us":
            step_note = "ProfilerStep annotations ignored: the trace has no time_us to place them on"
            steps = empty_steps()
        elif len(steps):
            steps_source = f"{path} (external_annotations)"
            if by_optimizer:
                by_optimizer_name = by_optimizer
                step_note = (f"steps from the {by_optimizer} annotations (the snapshot has no ProfilerStep#N ones): "
                             "step n ends where optimizer step n ends, the first starts at the history's first entry")
    metadata: dict[str, Any] = {
        "era": era,
        "time_base": {"time_us": "time_us", "none": "none"}.get(time_base, "trace_index"),
        "size_basis": size_basis,
        "devices": notes,
    }
    raw_settings = snapshot.get("allocator_settings")
    if isinstance(raw_settings, dict):
        conf = {k: v for k, v in raw_settings.items()
                if isinstance(k, str) and k.endswith("ALLOC_CONF") and isinstance(v, (str, int, float, bool))}
        if conf:
            metadata["alloc_conf"] = conf
    if step_note:
        metadata["steps_note"] = step_note
    if by_optimizer_name:
        metadata["steps_by_optimizer"] = by_optimizer_name
    if addresses:  # a tracked recording's moments, in the snapshot's clock (none without time_us)
        metadata[NOTE_STARTS] = _note_starts(ann) if ann and time_base == "time_us" else {}
    cut = next((f"{label}: {facts['history_truncated']}" for label, facts in notes.items()
                if facts.get("history_truncated")), None)
    if cut:
        metadata["not_measurable"] = truncated_window(cut)
    markers = ("snapshot", "workspace_snapshot")  # mark the dump, record no allocation
    if not any(isinstance(e, dict) and e.get("action") not in markers for t in traces for e in t):
        # Only the final state: no history to find a peak, a growth or a leak in. The pool state at
        # the dump (DeviceModel.dump_state) needs none, so its metrics are never marked here.
        why = ("the snapshot has no allocation history (device_traces are empty): record with "
               "torch.cuda.memory._record_memory_history() before the run, then _dump_snapshot()")
        metadata["not_measurable"] = {
            k: why + ("; free_block_fragmentation judges the pool at the dump" if k.endswith("fragmentation") else "")
            for k in HISTORY_METRICS}
    return Profile(
        path=str(path),
        format=FORMAT,
        rank=_rank_of(path),
        devices=tuple(models),
        steps=steps,
        steps_source=steps_source,
        metadata=metadata,
    )


def _iter_blocks(segments: Sequence[Any]) -> Any:
    return chain.from_iterable(s.get("blocks") or () for s in segments if isinstance(s, dict))


def _read_segments(path: Path, segments: Sequence[Any], schema: dict[str, Any]) -> _Segments:
    defs = schema["$defs"]
    cols = check_records(segments, defs["segment"], file=path, where=lambda i: f"segments[{i}]", root=schema)
    counts = np.fromiter((len(s["blocks"]) for s in segments), dtype=np.int64, count=len(segments))
    blocks = list(chain.from_iterable(s["blocks"] for s in segments))
    seg_of = np.repeat(np.arange(len(segments), dtype=np.int64), counts)
    offsets = np.cumsum(counts) - counts  # each segment's first block
    index_in_seg = np.arange(len(blocks), dtype=np.int64) - np.repeat(offsets, counts)
    where = [f"segments[{s}].blocks[{b}]" for s, b in zip(seg_of.tolist(), index_in_seg.tolist())]
    bcols = check_records(blocks, defs["block"], file=path, where=lambda i: where[i], root=schema)

    seg_device = _ints(cols["device"], len(segments))
    seg_address = _ints(cols["address"], len(segments))
    seg_total = _ints(cols["total_size"], len(segments))
    seg_stream = _ints(cols.get("stream"), len(segments), fill=0)
    size = _ints(bcols["size"], len(blocks))
    check_bytes(seg_total, path, "segments[].total_size", summed=True)
    check_bytes(size, path, "segments[].blocks[].size", summed=True)
    # Address of each block = its segment's address + the sizes before it (legacy blocks carry none).
    before = np.cumsum(size) - size  # bytes of all blocks listed before this one
    first_before = np.concatenate([before, [0]])[offsets]  # ... before each segment's first block
    derived = np.repeat(seg_address, counts) + before - np.repeat(first_before, counts)
    given = bcols.get("address")
    has_address = np.asarray(given.is_valid()) if given is not None else np.zeros(len(blocks), dtype=bool)
    address = np.where(has_address, _ints(given, len(blocks), fill=0), derived) if len(blocks) else derived
    # A segment's blocks tile it (torch lists its free blocks too; every real sample agrees, expandable
    # segments included): a total they do not add up to is a broken dump, whatever the addresses say.
    sums = np.zeros(len(segments), dtype=np.int64)
    np.add.at(sums, seg_of, size)
    bad = np.flatnonzero((sums != seg_total) & ((counts > 0) | (not has_address.all())))
    if len(bad):
        i = int(bad[0])
        addressed = "" if has_address[offsets[i]:offsets[i] + counts[i]].all() else " without block addresses"
        raise InputError(f"the blocks of a segment{addressed} do not add up to its total_size",
                         file=path, column=f"segments[{i}].total_size",
                         expected=f"the sum of its block sizes ({int(sums[i])})", found=str(int(seg_total[i])))

    state = bcols["state"]
    active = np.asarray(pc.is_in(state, value_set=pa.array(_ACTIVE_STATES)), dtype=bool) if len(blocks) \
        else np.zeros(0, dtype=bool)
    allocated = np.asarray(pc.equal(state, "active_allocated"), dtype=bool) if len(blocks) \
        else np.zeros(0, dtype=bool)
    inactive = np.asarray(pc.equal(state, "inactive"), dtype=bool) if len(blocks) else np.zeros(0, dtype=bool)
    requested_col = bcols.get("requested_size")
    requested = np.where(np.asarray(requested_col.is_valid()), _ints(requested_col, len(blocks), fill=0), size) \
        if requested_col is not None and len(blocks) else size.copy()
    frames: list[Any] = [b.get("frames") for b in blocks]
    legacy = [i for i, b in enumerate(blocks) if b.get("history")]
    if legacy:
        first = [blocks[i]["history"][0] for i in legacy]
        hcols = check_records(first, defs["history_entry"], file=path,
                              where=lambda k: f"{where[legacy[k]]}.history[0]", root=schema)
        real = _ints(hcols["real_size"], len(first))
        idx = np.asarray(legacy, dtype=np.int64)
        no_requested = ~np.asarray(requested_col.is_valid())[idx] if requested_col is not None \
            else np.ones(len(idx), dtype=bool)
        requested[idx[no_requested]] = real[no_requested]
        for k, i in enumerate(legacy):
            if frames[i] is None:
                frames[i] = first[k].get("frames")
    frames = [f if f is not None else [] for f in frames]
    return _Segments(
        device=np.repeat(seg_device, counts), stream=np.repeat(seg_stream, counts), address=address, size=size,
        requested=requested, active=active, allocated=allocated, inactive=inactive, frames=frames,
        seg_device=seg_device, seg_total=seg_total, seg_address=seg_address,
        seg_replayable=_replayable(segments, seg_total), where=where,
    )


def _replayable(segments: Sequence[Any], totals: np.ndarray) -> np.ndarray:
    """Per segment, whether its layout is replayed for block sizes: the large pool (``segment_type``, or a
    size above the small pool's 2 MiB where older files omit it), not an expandable segment."""
    kinds = [s.get("segment_type") for s in segments]
    large = np.fromiter((k == "large" if isinstance(k, str) else t > block_sizes.SMALL_SEGMENT
                         for k, t in zip(kinds, totals.tolist())), dtype=bool, count=len(segments))
    expandable = np.fromiter((s.get("is_expandable") is True for s in segments), dtype=bool, count=len(segments))
    replayable: np.ndarray = large & ~expandable
    return replayable


def _ints(arr: pa.Array | None, n: int, fill: int | None = None) -> np.ndarray:
    """An int64 numpy array of a validated column (nulls → ``fill``)."""
    if arr is None or pa.types.is_null(arr.type):
        return np.full(n, 0 if fill is None else fill, dtype=np.int64)
    if fill is not None and arr.null_count:
        arr = pc.fill_null(arr, fill)
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)


@dataclass(frozen=True)
class _Trace:
    """One device's trace in time order."""

    device: int
    n: int
    time_base: str  # "time_us", "trace_index" or "none" (no entries that move memory)
    code: np.ndarray  # action code per sorted entry
    addr: np.ndarray
    size: np.ndarray
    stream: np.ndarray
    t_ns: np.ndarray  # per sorted entry
    order: np.ndarray  # sorted position -> index in the file's list
    frames: Sequence[Any]  # per entry in the file's order, its frames list (None without one)

    @cached_property
    def first_equal(self) -> np.ndarray:
        """Per entry in the file's order, the first entry whose frames list equals its own
        (:func:`_first_equal`): the distinct stacks, found once for the torch_npu scan and the attribution."""
        return _first_equal(self.frames)

    @property
    def grouped(self) -> bool:
        """Whether :attr:`first_equal` is known (a file labelled npu by its settings never groups them all)."""
        return "first_equal" in self.__dict__


def _parse_trace(path: Path, dev: int, entries: Sequence[Any], schema: dict[str, Any]) -> _Trace:
    n = len(entries)
    empty = np.zeros(0, dtype=np.int64)
    if n == 0:
        return _Trace(dev, 0, "none", empty, empty, empty, empty, empty, empty, [])
    kept: dict[str, list[Any]] = {"frames": []}  # the frames lists as the check gathered them (read once)
    cols = check_records(entries, schema["$defs"]["trace_entry"], file=path,
                         where=lambda i: f"device_traces[{dev}][{i}]", root=schema, objects=kept)
    code = np.asarray(pc.index_in(cols["action"], value_set=pa.array(ACTIONS)).to_numpy(zero_copy_only=False),
                      dtype=np.int64)
    moves = _MOVES[code]
    time_col = cols.get("time_us")
    timed = np.asarray(time_col.is_valid(), dtype=bool) if time_col is not None and not pa.types.is_null(
        time_col.type) else np.zeros(n, dtype=bool)
    if not moves.any():
        base = "none"
    elif timed[moves].all():
        base = "time_us"
    elif not timed[moves].any():
        base = "trace_index"
    else:
        i = int(np.flatnonzero(moves & ~timed)[0])
        raise InputError("entry without time_us in a trace whose other entries have it", file=path,
                         column=f"device_traces[{dev}][{i}]", expected="time_us on every alloc/free/segment entry",
                         found="no time_us")
    if base == "time_us":
        raw = _ints(time_col, n, fill=0)
        # Entries without a time (markers) keep their neighbour's place: carry the last time forward.
        if not timed.all():
            idx = np.where(timed, np.arange(n), 0)
            np.maximum.accumulate(idx, out=idx)
            raw = np.where(timed, raw, raw[idx])
        in_order = not (raw[1:] < raw[:-1]).any()  # torch's own traces; torch_npu inserts some at the front
        order = np.arange(n, dtype=np.int64) if in_order else np.argsort(raw, kind="stable")
        t_ns = (raw if in_order else raw[order]) * 1000
    else:
        in_order = True
        order = np.arange(n, dtype=np.int64)
        t_ns = np.arange(1, n + 1, dtype=np.int64)

    def sort(values: np.ndarray) -> np.ndarray:
        return values if in_order else values[order]

    return _Trace(
        device=dev, n=n, time_base=base, code=sort(code), addr=sort(_ints(cols.get("addr"), n, fill=0)),
        size=sort(_ints(cols.get("size"), n, fill=0)), stream=sort(_ints(cols.get("stream"), n, fill=0)), t_ns=t_ns,
        order=order, frames=kept["frames"],
    )


def _device_model(
    dev: int, trace: _Trace, segs: _Segments, npu: bool, t_origin: int, path: Path,
    settings: block_sizes.Settings, every_frame: bool = False, addresses: bool = False,
) -> tuple[DeviceModel, dict[str, Any]]:
    label = f"{'npu' if npu else 'cuda'}:{dev}"
    code = trace.code
    is_alloc = code == _A["alloc"]
    is_free = (code == _A["free_requested"]) | (code == _A["free"])
    is_done = (code == _A["free_completed"]) | (code == _A["free"])
    sel = np.flatnonzero(is_alloc | is_free)
    # A trace in record order is the truth; one put in time order here (torch_npu inserts entries at
    # the front) lost the order of one instant's entries: those are paired as the address allows.
    resorted = bool((trace.order != np.arange(trace.n)).any())
    pairing = pair_allocs(trace.addr[sel], is_alloc[sel], trace.t_ns[sel] if resorted else None)
    if pairing.repeated is not None:
        raise _repeated(path, trace, int(sel[pairing.repeated]))
    partner_sel = pairing.partner
    partner = np.full(trace.n, -1, dtype=np.int64)
    partner[sel] = np.where(partner_sel >= 0, sel[np.maximum(partner_sel, 0)], -1)

    mine = segs.device == dev
    allocs = np.flatnonzero(is_alloc)
    open_allocs = allocs[partner[allocs] < 0]
    early_frees = np.flatnonzero(is_free & (partner < 0))
    live_through = np.flatnonzero(mine & segs.allocated & ~np.isin(segs.address, trace.addr[open_allocs]))
    missing_in_segments = int((~np.isin(trace.addr[open_allocs], segs.address[mine & segs.active])).sum())

    # Blocks: trace allocations, frees of earlier allocations, and blocks live all along.
    t = trace.t_ns
    ops, owners = _attribution(path, trace, allocs)
    live_ops, live_owners = _ops_of_frames(path, segs, live_through)
    if every_frame:  # `memgate validate`: the frames no metric reads are checked too
        _op_owner_each(*_frames_at(path, trace, np.setdiff1d(np.arange(trace.n), allocs, assume_unique=True)))
        _ops_of_frames(path, segs, np.setdiff1d(np.flatnonzero(mine), live_through, assume_unique=True))
    # The allocator's block behind every alloc/free (what torch.cuda.memory_allocated() counts).
    sizes = trace.size
    check_bytes(sizes, path, f"device_traces[{trace.device}] size", summed=True)
    seg_rows = np.flatnonzero(segs.seg_device == dev)
    replay = block_sizes.block_sizes(
        code, trace.addr, sizes, alloc=_A["alloc"], frees=(_A["free_requested"], _A["free"]),
        completes=(_A["free_completed"], _A["free"]), seg_alloc=_A["segment_alloc"], seg_free=_A["segment_free"],
        early=early_frees,
        final_segments=list(zip(segs.seg_address[seg_rows].tolist(), segs.seg_total[seg_rows].tolist(),
                                segs.seg_replayable[seg_rows].tolist())),
        live_blocks=list(zip(segs.address[live_through].tolist(), segs.size[live_through].tolist())),
        settings=settings)
    block = replay.block
    # A free is of the block its alloc got (a re-sort may put a free_completed before its free_requested)
    paired = np.flatnonzero(is_free & (partner >= 0))
    block[paired] = block[partner[paired]]
    n_alloc, n_early, n_live = len(allocs), len(early_frees), len(live_through)
    frees_at = partner[allocs]
    size = np.concatenate([block[allocs], block[early_frees], segs.size[live_through]])
    not_here = n_early + n_live
    t_alloc = Ints.of(np.concatenate([t[allocs], np.zeros(not_here, np.int64)]),
                      np.concatenate([np.zeros(n_alloc, bool), np.ones(not_here, bool)]))
    t_free = Ints.of(
        np.concatenate([np.where(frees_at >= 0, t[np.maximum(frees_at, 0)], 0), t[early_frees], np.zeros(n_live, np.int64)]),
        np.concatenate([frees_at < 0, np.zeros(n_early, bool), np.ones(n_live, bool)]))
    stream = np.concatenate([trace.stream[allocs], trace.stream[early_frees], segs.stream[live_through]])
    blocks = Table({
        "size": Ints.of(size),
        "t_alloc": t_alloc,
        "t_free": t_free,
        "op": Texts.concat([ops, Texts.repeat(None, n_early), live_ops]),
        "stream": _int_text(stream),
        "owner": Texts.concat([owners, Texts.repeat(None, n_early), live_owners]),
        "component": Texts.repeat(COMPONENT, len(size)),
        "alloc_total": Ints.absent(len(size)),
    })
    if addresses:
        blocks = blocks.with_column(ADDRESS, Ints.of(np.concatenate([trace.addr[allocs], trace.addr[early_frees],
                                                                     segs.address[live_through]])))

    # Series: deltas per entry, levels rebuilt backwards from the final segments.
    d_alloc = np.where(is_alloc, block, 0) - np.where(is_free, block, 0)
    d_active = np.where(is_alloc, block, 0) - np.where(is_done, block, 0)
    grow = _GROWS[code]
    shrink = _SHRINKS[code]
    d_reserved = np.where(grow, sizes, 0) - np.where(shrink, sizes, 0)
    start_alloc = int(block[early_frees].sum() + segs.size[live_through].sum())
    start_active = int(segs.size[mine & segs.active].sum()) - int(d_active.sum())
    start_reserved = int(segs.seg_total[segs.seg_device == dev].sum()) - int(d_reserved.sum())
    # The same level in the bytes the program requested (the rounding overhead is the difference).
    d_requested = np.where(is_alloc, sizes, 0) - np.where(is_free, sizes, 0)
    start_requested = int(sizes[early_frees].sum() + segs.requested[live_through].sum())
    requested_peak = start_requested + max(int(np.cumsum(d_requested).max()) if trace.n else 0, 0)
    changed = np.flatnonzero((d_alloc != 0) | (d_active != 0) | (d_reserved != 0))
    # The window start: the first entry's time; 0 on the trace-index clock; the profile's first time
    # for a device whose trace moves nothing.
    t0 = {"time_us": int(t[0]) if trace.n else t_origin, "trace_index": 0}.get(trace.time_base, t_origin)
    every = len(changed) == trace.n  # the usual case: every entry moves a counter (no indexing then)

    def level(start: int, deltas: np.ndarray) -> Ints:
        levels = np.empty(len(changed) + 1, dtype=np.int64)
        levels[0] = 0
        if every:
            np.cumsum(deltas, out=levels[1:])
        else:
            np.take(np.cumsum(deltas), changed, out=levels[1:])
        levels += start
        return Ints.of(levels)

    series: dict[str, Ints] = {
        "t_ns": Ints.of(np.concatenate([[t0], t if every else t[changed]])),
        "allocated": level(start_alloc, d_alloc),
        "reserved": level(start_reserved, d_reserved),
        "active": level(start_active, d_active),
    }
    if start_reserved >= 0:
        _check_within_reserved(path, trace, series, changed, every, start_alloc)
    facts: dict[str, Any] = {
        "trace_entries": trace.n,
        "pre_window_frees": n_early,
        "live_through_blocks": n_live,
    }
    if missing_in_segments:
        facts["open_allocs_without_segment_block"] = missing_in_segments
    truncated = _lost_free_requests(trace)
    if truncated:
        facts["history_truncated"] = (
            f"{truncated} free_completed entr{'y' if truncated == 1 else 'ies'} without the free_requested before "
            "it: the history's ring buffer filled and dropped its oldest entries")
    if replay.unplaced:
        facts["blocks_at_rounded_size"] = (f"{replay.unplaced} allocation(s) could not be placed in the replayed "
                                           "segment layout: counted at their rounded size, which may be below "
                                           "the block the allocator handed out")
    if start_reserved < 0:  # segments mapped in the trace that the final segments never held
        raise InputError("the trace maps more segment memory than the final segments hold", file=path,
                         column=f"device_traces[{trace.device}]",
                         expected="segment_alloc/segment_map sizes that the final segments (minus frees and unmaps) "
                                  "account for",
                         found=f"reserved {start_reserved} bytes (below zero) at the window's start")
    for column, start in (("active", start_active),):
        if start < 0:  # the trace moves more than the final state holds: the file is inconsistent
            series[column] = Ints.absent(len(series["t_ns"]))
            facts[f"{column}_unavailable"] = (f"the trace changes {column} by more than the final segments hold "
                                              f"({-start} bytes short)")
    model = DeviceModel(
        device=label,
        series={COMPONENT: Series(COMPONENT, Table(series), str(path))},
        blocks=blocks,
        blocks_source=str(path),
        dump_state=_pool_state(segs, mine, segs.seg_device == dev, path,
                               SIZE_BASIS if settings.caching else "requested"),
        requested_peak=requested_peak if trace.n else None,
    )
    return model, facts


def _lost_free_requests(trace: _Trace) -> int:
    """Addresses whose first free entry is a ``free_completed``: its ``free_requested`` (always recorded
    first) was dropped from the front of a ring buffer that filled (``max_entries``)."""
    code = trace.code
    frees = np.flatnonzero((code == _A["free_requested"]) | (code == _A["free_completed"]))
    if not len(frees):
        return 0
    _, first = np.unique(trace.addr[frees], return_index=True)
    return int((code[frees[first]] == _A["free_completed"]).sum())


def truncated_window(reason: str) -> dict[str, str]:
    """The figures a history that lost its oldest entries covers only in part, each with how to record it all."""
    why = (f"{reason}: this figure would cover only the entries kept; record the whole window with a larger "
           "_record_memory_history(max_entries=...) (memgate.record: Recorder(max_entries=...))")
    return dict.fromkeys(HISTORY_METRICS, why)


def _check_within_reserved(path: Path, trace: _Trace, series: dict[str, Ints], changed: np.ndarray, every: bool,
                           start_alloc: int) -> None:
    """Blocks are carved from segments: at the end of every instant, allocated <= reserved. A trace
    that allocates more than its segments hold has a bogus size (a free of 10^15 bytes at an unknown
    address would otherwise be a peak of 909 TiB) or lost its segment events."""
    t, allocated, reserved = series["t_ns"].values, series["allocated"].values, series["reserved"].values
    # An alloc may be listed just before the segment it needs (in its instant, or the next entry
    # without times): judged at the end of each instant, against the reserve one entry later too.
    ends = np.r_[t[1:] != t[:-1], True]
    ends[0] = True  # the window's start: what pre-window frees say was allocated, before any entry
    cover = np.maximum(reserved, np.r_[reserved[1:], reserved[-1:]])
    over = np.flatnonzero(ends & (allocated > cover))
    if not len(over):
        return
    point = int(over[0])  # 0: the window's start; j: after the j-th entry that moved a counter
    k = None if point == 0 else (point - 1 if every else int(changed[point - 1]))
    where = f"device_traces[{trace.device}]" + ("" if k is None else f"[{int(trace.order[k])}]")
    start = f" at the window's start (frees of memory from before it: {start_alloc} bytes)" if k is None else ""
    raise InputError(f"more memory allocated than the segments reserve{start}", file=path, column=where,
                     expected="allocated <= reserved at the end of every instant (blocks are carved from segments)",
                     found=f"{int(allocated[point])} bytes allocated, {int(reserved[point])} reserved")


def _repeated(path: Path, trace: _Trace, k: int) -> InputError:
    """The error for the entry at sorted position ``k`` that repeats its address's last action."""
    action = ACTIONS[int(trace.code[k])]
    return repeated_action(path, f"device_traces[{trace.device}][{int(trace.order[k])}]", action == "alloc",
                           found=f"{action} of {hex(int(trace.addr[k]))} ({int(trace.size[k])} bytes)",
                           expected="allocs and frees of one address in turn (torch's caching allocator)")


def _pool_state(segs: _Segments, mine: np.ndarray, mine_segments: np.ndarray, path: Path,
                size_basis: str = SIZE_BASIS) -> PoolState:
    """The device's pool at the dump, from the final segments alone (so with or without history).

    ``allocated`` sums the ``active_allocated`` blocks' sizes, as ``torch.cuda.memory_allocated()`` does:
    an ``active_pending_free`` block was freed by the program (``free_requested``, where that counter
    drops) and only waits for its stream's events before reuse. Free blocks count by their size too:
    theirs is what the pool can hand out (their ``requested_size`` is stale).
    """
    free = segs.size[mine & segs.inactive]
    return PoolState(
        allocated=int(segs.size[mine & segs.allocated].sum()),
        reserved=int(segs.seg_total[mine_segments].sum()),
        largest_free_block=int(free.max()) if len(free) else 0,
        free_bytes=int(free.sum()),
        size_basis=size_basis,
        source=str(path),
    )


def _attribution(path: Path, trace: _Trace, allocs: np.ndarray) -> tuple[Texts, Texts]:
    """(op, owner) of each trace allocation, from its frames."""
    return _op_owner_each(*_frames_at(path, trace, allocs))


def _frames_at(path: Path, trace: _Trace, at: np.ndarray,
               ) -> tuple[list[Any], Path, Callable[[int], str], np.ndarray | None]:
    """:func:`_op_owner_each`'s arguments for the entries at sorted positions ``at``, with the trace's
    grouping of all its frames lists where the torch_npu scan made it (:attr:`_Trace.first_equal`)."""
    rows = trace.order[at]
    first = _first_of_label(trace.first_equal[rows]) if trace.grouped else None  # else grouped on their own
    rows_list = rows.tolist()
    return (list(map(trace.frames.__getitem__, rows_list)), path,
            lambda j: f"device_traces[{trace.device}][{rows_list[j]}].frames", first)


def _ops_of_frames(path: Path, segs: _Segments, rows: np.ndarray) -> tuple[Texts, Texts]:
    picked = rows.tolist()
    return _op_owner_each([segs.frames[i] for i in picked], path, lambda j: f"{segs.where[picked[j]]}.frames")


def _op_owner_each(frames: list[Any], path: Path | None, where: Callable[[int], str],
                   first: np.ndarray | None = None) -> tuple[Texts, Texts]:
    """:func:`op_owner` of each frames list (None: no frames), each distinct stack read once.

    torch gives every trace entry a list of its own but shares the frame dicts among them (a real
    snapshot: ~8k lists, ~170 distinct stacks; the benchmark's 1M entries: 335k allocations over 187
    stacks). :func:`_first_equal` groups the lists by content in C; the stacks are read in order of
    first use, so a bad one is reported where it first occurs, and each frame dict once (``roles``),
    however many stacks share it. ``first``: that grouping where it is known already.
    """
    first = _first_equal(frames) if first is None else first
    reps = np.flatnonzero(first == np.arange(len(first)))  # each stack's first list, in order of first use
    number = np.zeros(len(first), dtype=np.int64)
    number[reps] = np.arange(len(reps))
    roles: dict[int, _Role] = {}
    pairs = [(None, None) if frames[j] is None else op_owner(frames[j], path, where(j), roles) for j in reps.tolist()]
    stack = number[first]
    ops, owners = Texts.of(p[0] for p in pairs), Texts.of(p[1] for p in pairs)
    return Texts(ops.codes[stack], ops.names), Texts(owners.codes[stack], owners.names)


_ROUNDS = 8  # rounds of candidates before what is left is grouped by the identities of its frames
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _first_equal(lists: Sequence[Any]) -> np.ndarray:
    """For each frames list, the index of the first list equal to it (``==``: the same frames).

    Grouping by the identities of the frames costs a Python int per frame (20M for the benchmark's
    1M entries). Here each list is compared instead, in C (identity is checked first, so a shared
    frame costs a pointer comparison), with a candidate: the first list not yet placed with its
    length and its innermost frame. A list equal to its candidate is placed; the others meet the
    next candidate of their kind in the next round. None and empty lists (no frames) are one group;
    a tuple groups as the list of its frames; a value that is no list or tuple never joins a list of
    frame dicts (:func:`op_owner` reports the first such value).

    Lists equal by ``==`` hold the same frames or equal frame dicts (the same name and filename
    strings), so :func:`op_owner` gives them the same answer; only a ``line`` of another type than
    int (1.0 or True for 1) would print as the first list's.
    """
    m = len(lists)
    first = np.arange(m, dtype=np.int64)
    rows: Sequence[Any] = lists  # the lists compared (tuples made lists: a list never equals a tuple)
    try:  # torch's case, all lists: their lengths, in the one pass that proves them lists
        lens = np.fromiter(map(list.__len__, lists), dtype=np.int64, count=m)
        is_seq = np.ones(m, dtype=bool)
    except TypeError:  # None (no frames), tuples, or what op_owner will report: a value of another type
        is_seq = np.fromiter(map(isinstance, lists, repeat((list, tuple))), dtype=bool, count=m)
        tuples = np.flatnonzero(np.fromiter(map(isinstance, lists, repeat(tuple)), dtype=bool, count=m)).tolist()
        if tuples:
            rows = list(lists)
            for i in tuples:
                rows[i] = list(rows[i])
        lens = np.zeros(m, dtype=np.int64)
        at = np.flatnonzero(is_seq)
        lens[at] = np.fromiter(map(len, map(rows.__getitem__, at.tolist())), dtype=np.int64, count=len(at))
    blank = is_seq & (lens == 0)
    if not is_seq.all():
        blank |= np.fromiter(map(operator.is_, lists, repeat(None)), dtype=bool, count=m)
    if blank.any():
        first[blank] = np.flatnonzero(blank)[0]
    def lists_at(at: np.ndarray) -> Iterable[Any]:
        return rows if len(at) == m else map(rows.__getitem__, at.tolist())

    todo = np.flatnonzero(lens > 0)  # the other types: each alone (first = itself)
    heads = np.fromiter(map(id, map(operator.itemgetter(0), lists_at(todo))), dtype=np.uint64, count=len(todo))
    key = lens[todo].astype(np.uint64) * _MIX + heads  # wraps around: a key only proposes, == decides
    for _ in range(_ROUNDS):
        if not len(todo):
            break
        candidate = todo[_first_of_label(key)]  # the first of its kind still to place (itself for that one)
        try:
            same = np.fromiter(map(operator.eq, lists_at(todo), map(rows.__getitem__, candidate.tolist())),
                               dtype=bool, count=len(todo))
        except RecursionError:  # a list that holds itself (only a crafted pickle): what is left goes by identity
            break
        first[todo[same]] = candidate[same]
        todo, key = todo[~same], key[~same]
    seen: dict[tuple[int, ...], int] = {}
    for i in todo.tolist():
        first[i] = seen.setdefault(tuple(map(id, rows[i])), i)
    return first


def _first_of_label(labels: np.ndarray) -> np.ndarray:
    """For each position, the first position with the same label (``np.unique``'s first index, by one
    stable sort)."""
    order = np.argsort(labels, kind="stable")
    ordered = labels[order]
    starts = np.ones(len(order), dtype=bool)
    np.not_equal(ordered[1:], ordered[:-1], out=starts[1:])
    out = np.empty_like(order)
    out[order] = order[starts][np.cumsum(starts) - 1]
    return out


def _int_text(values: np.ndarray) -> Texts:
    """Decimal text of int64 values, each distinct value (a few streams) written once."""
    distinct, at = np.unique(values, return_inverse=True)
    return Texts(at.astype(np.int32).reshape(-1), np.array([str(v) for v in distinct.tolist()], dtype=object))


# What one frame tells: the op it names, the owner it is (a .py frame), the fallback owner it can be.
_Role = tuple[str | None, str | None, str | None]


def op_owner(frames: Any, path: Path | None, where: str,
             roles: dict[int, _Role] | None = None) -> tuple[str | None, str | None]:
    """The innermost ATen op (``at::_ops::X::call`` → ``aten::X``) and the innermost Python frame.

    ``roles``: what each frame dict already read told, by identity (the frames of the stacks read
    in one call of :func:`_op_owner_each` stay alive through it).
    """
    if not isinstance(frames, (list, tuple)):
        raise InputError("frames must be a list", file=path, column=where, expected="an array",
                         found=type(frames).__name__)
    op: str | None = None
    owner: str | None = None
    fallback: str | None = None
    for i, frame in enumerate(frames):
        role = roles.get(id(frame)) if roles is not None else None
        if role is None:
            role = _role(frame, path, f"{where}[{i}]")
            if roles is not None:
                roles[id(frame)] = role
        op = op if op is not None else role[0]
        owner = owner if owner is not None else role[1]
        fallback = fallback if fallback is not None else role[2]
        if op is not None and owner is not None:
            break
    return op, owner or fallback


def _role(frame: Any, path: Path | None, where: str) -> _Role:
    if not isinstance(frame, dict) or not isinstance(frame.get("name"), str) \
            or not isinstance(frame.get("filename"), str) or type(frame.get("line")) is not int:
        raise InputError("malformed stack frame", file=path, column=where,
                         expected="an object with filename, line and name", found=frame)  # errors.show: bounded
    name, filename = frame["name"], frame["filename"]
    op = f"aten::{m.group(1)}" if (m := _OP_FRAME.search(name)) else None
    # the innermost frame in user code: torch's own Python files (under a torch/torch_npu package) are skipped
    owner = f"{filename}:{frame.get('line')}:{name}" if filename.endswith(".py") and not is_torch_file(filename) \
        else None
    fallback = None
    if filename not in ("??", "") and not any(s in name for s in _INTERNAL):
        fallback = f"{filename}:{frame.get('line')}:{name}" if filename != "none" else name
    return op, owner, fallback


_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")


def _steps(path: Path, ann: dict[str, pa.Array | None], t_first: int) -> tuple[Table, str | None]:
    """One row per ``ProfilerStep#N`` (by N): its earliest START and latest END annotation.

    Without any (``_record_memory_history`` without torch.profiler), the optimizer's own annotations
    (``Optimizer.step#AdamW.step``, one START/END per ``optimizer.step()``) mark the steps: step n runs
    from the end of optimizer step n-1 (the first from ``t_first``, the history's first entry) to the
    end of optimizer step n. Returns (steps, the optimizer annotation's name or None)."""
    names, stages = ann["name"], ann["stage"]
    assert names is not None and stages is not None  # required by the schema
    number = pc.extract_regex(names, STEP_NAME.pattern.replace("([0-9]+)", "(?P<n>[0-9]+)"))
    times = _ints(ann["time_us"], len(names)) * 1000
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    end_at: dict[int, int] = {}
    for i, (digits, stage, t) in enumerate(zip(pc.struct_field(number, "n").to_pylist(), stages.to_pylist(),
                                               times.tolist())):
        if digits is None:
            continue
        n = step_number(digits, path, f"external_annotations[{i}].name")
        if stage == "START":
            starts[n] = min(t, starts.get(n, t))
        elif stage == "END" and t >= ends.get(n, t):
            ends[n] = t
            end_at[n] = i
    for n, end in ends.items():
        if n in starts and end < starts[n]:  # a step cannot end before it starts
            raise InputError(f"ProfilerStep#{n} ends before it starts", file=path,
                             column=f"external_annotations[{end_at[n]}].time_us",
                             expected=f"an END at or after its START ({starts[n] // 1000} us)",
                             found=f"{end // 1000} us")
    if not starts and not ends:
        return _optimizer_steps(names.to_pylist(), stages.to_pylist(), times.tolist(), t_first)
    steps = sorted(starts.keys() | ends.keys())
    return Table({"step": Ints.of(steps), "t_start": Ints.of_optional(starts.get(n) for n in steps),
                  "t_end": Ints.of_optional(ends.get(n) for n in steps)}), None


def _note_starts(ann: dict[str, pa.Array | None]) -> dict[str, int]:
    """memgate::note#k START (ns) by k as text (JSON metadata), from the annotations' columns."""
    names, stages, times = ann["name"], ann["stage"], ann.get("time_us")
    if names is None or stages is None or times is None:
        return {}
    starts = note_starts(names.to_pylist(), stages.to_pylist(), (_ints(times, len(names)) * 1000).tolist())
    return {str(k): t for k, t in starts.items()}


def _optimizer_steps(names: list[Any], stages: list[Any], times: list[int], t_first: int) -> tuple[Table, str | None]:
    """Steps bounded by the ends of one optimizer's ``Optimizer.step#...`` annotations (see :func:`_steps`);
    with several optimizers, the first one's (a GAN's two optimizers step once each per training step)."""
    first = next((n for n in names if isinstance(n, str) and _OPTIMIZER_STEP.match(n)), None)
    if first is None:
        return empty_steps(), None
    ends = sorted(t for n, stage, t in zip(names, stages, times) if n == first and stage == "END")
    if not ends:
        return empty_steps(), None
    begins = [min(t_first, ends[0]), *ends[:-1]]
    return Table({"step": Ints.of(range(len(ends))), "t_start": Ints.of(begins), "t_end": Ints.of(ends)}), first


def _is_npu(snapshot: dict[str, Any], parsed: Sequence[_Trace]) -> bool:
    """Whether torch_npu wrote the snapshot (the same format as torch's, labelled ``npu:N``).

    Its signs: an allocator conf named PYTORCH_NPU_ALLOC_CONF, workspace entries (in the first entries
    of a trace), or a stack frame from a file inside a ``torch_npu`` directory (its Python package, its
    C++ sources) — the only sign a snapshot without either carries. ``parsed``: the device traces.
    """
    settings = snapshot.get("allocator_settings")
    if isinstance(settings, dict) and any("NPU" in str(k) for k in settings):
        return True
    traces = [t for t in snapshot.get("device_traces") or [] if isinstance(t, (list, tuple))]
    heads = [[e for e in t[:_SCAN_ENTRIES] if isinstance(e, dict)] for t in traces]
    if any(e.get("action") == "workspace_snapshot" for head in heads for e in head):
        return True
    # The frames: the segments' first, then every entry of every trace, until _SCAN_VISITS frames were
    # read (a torch_npu frame may first show past the first thousand entries, or deep in the segments).
    # That walk reads each list's every frame (20M for the benchmark's 1M entries, ~1.5 s), so it is
    # taken only where a torch_npu frame is somewhere at all: in the segments' frames or in a distinct
    # stack of a trace (a list equal to a stack holds frames with its file names; _first_equal).
    distinct = (p.frames[j] for p in parsed for j in np.flatnonzero(p.first_equal == np.arange(len(p.frames))).tolist())
    if not _has_npu_frames(chain(_segment_frames(snapshot.get("segments")), distinct), bounded=False):
        return False
    return _has_npu_frames(chain(
        _segment_frames(snapshot.get("segments")),
        (e.get("frames") for t in traces for e in t if isinstance(e, dict))))


_SCAN_ENTRIES = 1000  # per trace: workspace entries are inserted at the front
_SCAN_FRAMES = 20_000  # distinct file names looked at most
_SCAN_VISITS = 2_000_000  # frame dicts read at most (a fraction of a second), shared ones counted once
# A path component exactly ``torch_npu`` followed by a separator (POSIX or Windows): a file inside the
# package (…/site-packages/torch_npu/npu/memory.py) or its sources (…/torch_npu/csrc/…), not a
# user's ``torch_npu_helper/`` nor a ``torch_npu.py`` script.
_NPU_PATH = re.compile(r"(?:^|[/\\])torch_npu[/\\]")


def _segment_frames(segments: Any) -> Any:
    """The frames lists of the segments and their blocks (a legacy block's in its history), lazily."""
    for seg in segments if isinstance(segments, (list, tuple)) else ():
        if not isinstance(seg, dict):
            continue
        yield seg.get("frames")
        for block in seg.get("blocks") or ():
            if isinstance(block, dict):
                yield block.get("frames")
                history = block.get("history")
                if isinstance(history, (list, tuple)) and history and isinstance(history[0], dict):
                    yield history[0].get("frames")


def _has_npu_frames(stacks: Any, *, bounded: bool = True) -> bool:
    """Whether a frame of ``stacks`` (frames lists, None where absent) lies in a torch_npu directory.

    Frames lists and frame dicts are read once each by identity: torch shares the dicts among
    entries, so a thousand entries hold a few hundred distinct frames. ``bounded``: False when every
    frame must be read, whatever the _SCAN_FRAMES and _SCAN_VISITS limits.
    """
    seen_lists: set[int] = set()
    seen: set[int] = set()
    names: set[str] = set()  # frames not shared by identity (a re-pickled file) still share their file names
    for frames in stacks:
        if not isinstance(frames, (list, tuple)) or id(frames) in seen_lists:
            continue
        seen_lists.add(id(frames))
        for frame in frames:
            if id(frame) in seen:
                continue
            seen.add(id(frame))
            filename = frame.get("filename") if isinstance(frame, dict) else None
            if isinstance(filename, str) and filename not in names:
                names.add(filename)
                if "torch_npu" in filename and _NPU_PATH.search(filename):
                    return True
            if bounded and (len(names) >= _SCAN_FRAMES or len(seen) >= _SCAN_VISITS):
                return False
    return False


def load_every_frame(path: Path) -> Profile:
    """:func:`load` that checks every frame (``memgate validate``)."""
    return load(path, every_frame=True)


registry.register(registry.Format(FORMAT, claims, load, rank_hint=_rank_of,
                                  named=lambda path: path.suffix.lower() in SUFFIXES and path.is_file(),
                                  load_thorough=load_every_frame))

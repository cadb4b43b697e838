"""PyTorch caching-allocator memory snapshots (``_dump_snapshot`` pickles), every era. docs/formats-reference.md §4.

Eras read: a bare list of segments (oldest); legacy ``history`` blocks without ``address`` (≤ 2.0:
the address is derived from the segment address and the sizes before the block); trace entries
without ``time_us`` (< 2.2); ``time_us`` entries; ``allocator_settings`` / ``external_annotations``;
``compile_context``; several devices; expandable segments; snapshots recorded without history
(empty ``device_traces``); torch_npu files (workspace entries inserted at the *front* of a trace;
labelled ``npu:N``, see :func:`~memgate.loaders.snapshot.snapshot_stacks.is_npu`).

This module tells a snapshot by its first bytes, loads it and assembles the profile from its parts:

- :mod:`~memgate.loaders.snapshot.snapshot_segments`: the final ``segments``, one row per block, and the pool
  they hold at the dump (**dump_state**, with or without history; a snapshot without history
  measures only this: it lacks ``Fact.HISTORY``, so every metric that needs it is not measurable);
- :mod:`~memgate.loaders.snapshot.snapshot_trace`: each device trace, checked and put in time order;
- :mod:`~memgate.loaders.snapshot.snapshot_stacks` (over :mod:`~memgate.loaders.snapshot.stack_groups`): the op and
  owner of each allocation from its stack, and the torch_npu scan;
- :mod:`~memgate.loaders.snapshot.snapshot_device`: what one device becomes: **blocks** (trace allocations,
  frees of earlier ones, blocks live all along) and the **series** ``allocator`` (allocated, active,
  reserved), rebuilt backwards from the final segments;
- :mod:`~memgate.loaders.snapshot.snapshot_steps`: **steps** from the ``external_annotations`` named
  ``ProfilerStep#N`` (START/END), else the optimizer's.

Sizes are the caching allocator's *block* sizes (:mod:`memgate.loaders.snapshot.block_sizes`: the 512 B
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

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from memgate import fastexit
from memgate.errors import InputError, show
from memgate.lazy import arrow_without_pandas
from memgate.loaders import registry
from memgate.loaders.registry import rank_of_file as _rank_of  # the rank a snapshot's file or folder name states
from memgate.loaders.snapshot import block_sizes, snapshot_estimate
from memgate.loaders.snapshot.snapshot_device import SIZE_BASIS, device_model
from memgate.loaders.snapshot.snapshot_segments import Segments, iter_blocks, read_segments
from memgate.loaders.snapshot.snapshot_stacks import is_npu
from memgate.loaders.snapshot.snapshot_steps import note_start_times
from memgate.loaders.snapshot.snapshot_steps import steps as annotated_steps
from memgate.loaders.snapshot.snapshot_trace import (
    ACTIONS,
    MEMORY_ACTIONS,
    Trace,
    action_table,
    empty_trace,
    parse_trace,
)
from memgate.metric_specs import Fact, not_measurable
from memgate.model import NOT_MEASURABLE_BY_DEVICE, DeviceModel, Profile, empty_steps
from memgate.readers import limits, safepickle
from memgate.readers.memory import collector_paused
from memgate.readers.pyrecords import check_records
from memgate.readers.snapshot_columns import TraceColumns
from memgate.readers.snapshot_columns import load as load_columns
from memgate.schemas import load_schema
from memgate.table import Table

FORMAT = "torch_snapshot"
NOTE_STARTS = "note_starts_ns"  # metadata of a load with addresses: memgate::note#k START by k
SCHEMA = "torch_snapshot"
SUFFIXES = (".pickle", ".pkl")
EMPTY = "empty snapshot: no segments and no device traces"  # a dump from a process that never used the device
_EMPTY_DICT, _EMPTY_LIST = 0x7D, 0x5D
# Keys one of which a snapshot's first record names within its first bytes (dict or bare list).
_HEAD_KEYS = (b"segments", b"device_traces", b"total_size")


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
    data = load_columns(path, max_bytes=max_bytes, actions=ACTIONS, moves=MEMORY_ACTIONS)
    traces = data.get("device_traces") if isinstance(data, dict) else None
    entries = sum(len(t) for t in traces if isinstance(t, (list, tuple, TraceColumns))) if isinstance(traces, list) \
        else 0
    profile = build_profile(path, data, every_frame=every_frame, addresses=addresses)
    fastexit.keep(data, path.stat().st_size)  # the memgate command ends without freeing them one by one
    return profile, entries


def build_profile(path: Path, data: Any, *, every_frame: bool = False, addresses: bool = False) -> Profile:
    """The normalized model of an unpickled snapshot (``data`` as ``safepickle.load`` returned it).

    ``every_frame``: check the frames no metric reads too (of frees and other non-alloc entries, and
    of segment blocks not allocated through the window), as ``memgate validate`` asks; a load reads
    the frames of the blocks it attributes (~30 % of a trace's entries), and those are checked.

    The compiled reader's trace columns are released from ``data`` once read into their traces (what
    the traces keep of them stays): the device models are built in the memory they held."""
    schema = load_schema(SCHEMA)
    era, snapshot = _era(path, data, schema)
    tracked = snapshot_estimate.tracked(path, snapshot)  # an estimate's categories need the blocks' addresses
    addresses = addresses or tracked is not None
    segments = read_segments(path, snapshot["segments"], schema)
    if era == "dict" and any(isinstance(b, dict) and "history" in b for b in iter_blocks(snapshot["segments"])):
        era = "legacy_history"
    traces = snapshot.get("device_traces") or []
    _check_trace_lists(path, traces)
    annotations = snapshot.get("external_annotations") or []
    ann = check_records(annotations, schema["$defs"]["annotation"], file=path,
                        where=lambda i: f"external_annotations[{i}]", root=schema) if annotations else {}
    parsed = [parse_trace(path, dev, entries, schema) for dev, entries in enumerate(traces)]
    time_base, t_origin = _clock(path, parsed)
    settings = _allocator_settings(path, snapshot, segments)
    telling = segments.allocated & segments.requested_stated
    pad = block_sizes.pad_shown(segments.size[telling], segments.requested[telling], settings) \
        if settings.caching else None
    npu = is_npu(snapshot, parsed, padded=pad == block_sizes.NPU_PAD)
    history = any(_moves_history(p) for p in parsed)
    if isinstance(traces, list):  # (a comprehension: no loop variable left holding the last trace's columns)
        traces[:] = [None if isinstance(read, TraceColumns) else read for read in traces]
    if npu and settings.caching:  # torch_npu pads every request, except where its blocks show otherwise
        settings = replace(settings, pad=block_sizes.NPU_PAD if pad is None else pad)
    models: list[DeviceModel] = []
    notes: dict[str, Any] = {}
    by_dev = {p.device: p for p in parsed}
    for dev in _devices(path, segments, parsed, len(traces)):
        model, facts = device_model(dev, by_dev.get(dev) or empty_trace(dev), segments, npu, t_origin, path,
                                    _device_settings(snapshot, settings, dev), every_frame, addresses)
        models.append(model)
        notes[model.device] = facts
    steps, steps_source, step_notes = _steps(path, ann, t_origin, time_base)
    metadata: dict[str, Any] = {
        "era": era,
        "time_base": {"time_us": "time_us", "none": "none"}.get(time_base, "trace_index"),
        "size_basis": SIZE_BASIS if settings.caching else "requested",
        **({"request_pad_bytes": settings.pad} if npu and settings.caching else {}),
        "devices": notes,
        **_alloc_conf(snapshot.get("allocator_settings")),
        **step_notes,
        **_not_measurable(notes, history),
    }
    estimated = snapshot_estimate.metadata(path, snapshot.get(snapshot_estimate.KEY))
    if "not_measurable" in estimated:
        estimated["not_measurable"] = {**estimated["not_measurable"], **metadata.get("not_measurable", {})}
    metadata.update(estimated)
    if tracked is not None:
        moments = {int(k): int(t) for k, t in (note_start_times(ann) if ann and time_base == "time_us" else {}).items()}
        models = snapshot_estimate.with_categories(models, tracked, moments, steps)
    if addresses:  # a tracked recording's moments, in the snapshot's clock (none without time_us)
        metadata[NOTE_STARTS] = note_start_times(ann) if ann and time_base == "time_us" else {}
    return Profile(path=str(path), format=FORMAT, rank=_rank_of(path), devices=tuple(models), steps=steps,
                   steps_source=steps_source, metadata=metadata)


def _check_trace_lists(path: Path, traces: Sequence[Any]) -> None:
    """Each device trace is a list of entries (a function: no loop variable keeps a trace alive)."""
    for dev, entries in enumerate(traces):
        if not isinstance(entries, (list, tuple, TraceColumns)):
            raise InputError("a device trace must be a list of entries", file=path, column=f"device_traces[{dev}]",
                             expected="an array", found=type(entries).__name__)


def _era(path: Path, data: Any, schema: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The era of the top-level object ("bare_list" or "dict") and the snapshot dict it stands for."""
    if isinstance(data, list):
        return "bare_list", {"segments": data, "device_traces": []}
    if isinstance(data, dict):
        if "segments" not in data and "device_traces" not in data:  # another pickle named like a snapshot
            first = f", the first {show(next(iter(data)))}" if data else ""
            raise InputError("not a memory snapshot: a pickled dict without 'segments' or 'device_traces'", file=path,
                             column="(top level)", found=f"a dict of {len(data)} keys{first}",
                             expected="what torch.cuda.memory._dump_snapshot() writes: a dict with 'segments' and "
                                      "'device_traces'")
        check_records([data], schema["$defs"]["snapshot"], file=path, where=lambda i: "", root=schema)
        return "dict", data
    raise InputError("not a memory snapshot", file=path, column="(top level)",
                     expected="a dict with 'segments' and 'device_traces' (or a list of segments)",
                     found=type(data).__name__)


def _clock(path: Path, parsed: Sequence[Trace]) -> tuple[str, int]:
    """The clock of all traces ("time_us", "trace_index" or "none": they must agree) and its origin:
    the first time of any trace on the time_us clock, else 0."""
    bases = {p.time_base for p in parsed if p.time_base != "none"}
    time_base = bases.pop() if len(bases) == 1 else ("none" if not bases else "mixed")
    if time_base == "mixed":
        raise InputError("some device traces carry time_us and others do not", file=path, column="device_traces",
                         expected="time_us on every entry of every device, or on none")
    t_origin = min((int(p.t_ns[0]) for p in parsed if len(p.t_ns)), default=0) if time_base == "time_us" else 0
    return time_base, t_origin


def _allocator_settings(path: Path, snapshot: dict[str, Any], segments: Segments) -> block_sizes.Settings:
    """The settings the block sizes follow: the recorded ones, and no caching allocator where a block
    is no multiple of 512 B (expandable: per device, :func:`_device_settings`)."""
    settings = block_sizes.Settings.of(snapshot.get("allocator_settings"), file=path)
    if ((segments.size % block_sizes.MIN_BLOCK) != 0).any():  # no caching allocator hands out such blocks
        settings = replace(settings, caching=False)
    return settings


def _device_settings(snapshot: dict[str, Any], settings: block_sizes.Settings, dev: int) -> block_sizes.Settings:
    """``settings`` for device ``dev``: expandable where one of its segments is (a file that joins the
    dumps of two processes may hold one device's expandable segments beside another's fixed ones)."""
    if any(isinstance(s, dict) and s.get("is_expandable") is True and s.get("device", 0) == dev
           for s in snapshot["segments"]):
        return replace(settings, expandable=True)
    return settings


def _devices(path: Path, segments: Segments, parsed: Sequence[Trace], n_traces: int) -> list[int]:
    """The devices the segments or a trace with entries name (else one per trace); none is an error."""
    devices = sorted({int(d) for d in segments.seg_device} | {p.device for p in parsed if p.n})
    if not devices:
        devices = list(range(n_traces))
    if not devices:  # torch dumps at least the segments the allocator holds, or a trace per device
        raise InputError(EMPTY, file=path, column="segments",
                         expected="a snapshot dumped with torch.cuda.memory._dump_snapshot() after "
                                  "_record_memory_history()", found="[]")
    return devices


def _steps(path: Path, ann: dict[str, Any], t_origin: int, time_base: str) -> tuple[Table, str | None, dict[str, str]]:
    """The steps, where they come from, and the metadata notes about them (``steps_note``,
    ``steps_by_optimizer``)."""
    if not ann:
        return empty_steps(), None, {}
    steps, by_optimizer = annotated_steps(path, ann, t_origin)
    if len(steps) and time_base != "time_us":
        return empty_steps(), None, {
            "steps_note": "ProfilerStep annotations ignored: the trace has no time_us to place them on"}
    if not len(steps):
        return steps, None, {}
    if not by_optimizer:
        return steps, f"{path} (external_annotations)", {}
    note = (f"steps from the {by_optimizer} annotations (the snapshot has no ProfilerStep#N ones): "
            "step n ends where optimizer step n ends, the first starts at the history's first entry")
    return steps, f"{path} (external_annotations)", {"steps_note": note, "steps_by_optimizer": by_optimizer}


def _alloc_conf(raw_settings: Any) -> dict[str, Any]:
    """``alloc_conf``: the ``*ALLOC_CONF`` variables the allocator settings record, where any."""
    if not isinstance(raw_settings, dict):
        return {}
    conf = {k: v for k, v in raw_settings.items()
            if isinstance(k, str) and k.endswith("ALLOC_CONF") and isinstance(v, (str, int, float, bool))}
    return {"alloc_conf": conf} if conf else {}


def _moves_history(trace: Trace) -> bool:
    """Does the trace hold an entry other than the dump's markers (an allocation history)?"""
    return bool((~_MARKERS[trace.code]).any())


_MARKERS = action_table("snapshot", "workspace_snapshot")  # mark the dump, record no allocation


def _not_measurable(notes: dict[str, Any], history: bool) -> dict[str, Any]:
    """``not_measurable``: without any history, every metric that needs it; else, per device whose history
    was truncated (each device has a ring buffer of its own), those its history covers in part."""
    cut = {label: truncated_window(f"{label}: {facts['history_truncated']}") for label, facts in notes.items()
           if facts.get("history_truncated")}
    if not history:
        # Only the final state: no history to find a peak, a growth or a leak in. The pool state at
        # the dump (DeviceModel.dump_state) needs none, so its metrics are never marked here. A legacy
        # recording's one entry (a marker, say) was recorded: what it lost is the reason.
        legacy = [f"{label}: {facts['history_truncated']}" for label, facts in notes.items()
                  if facts.get("history_truncated")]
        why = _truncated_why(legacy[0]) if legacy else (
            "the snapshot has no allocation history (device_traces hold no allocation or free): record with "
            "torch.cuda.memory._record_memory_history() before the run, then _dump_snapshot()")
        # A one-sample series would otherwise read as a peak, and as "reserved never grew".
        return {"not_measurable": not_measurable({Fact.HISTORY: why}, stand_ins=True)}
    return {NOT_MEASURABLE_BY_DEVICE: cut} if cut else {}


def truncated_window(reason: str) -> dict[str, str]:
    """The figures a history that lost its oldest entries covers only in part, each with how to record it all."""
    return not_measurable({Fact.HISTORY: _truncated_why(reason)})


def _truncated_why(reason: str) -> str:
    return (f"{reason}: this figure would cover only the entries kept; record the whole window with a larger "
            "_record_memory_history(max_entries=...) (memgate.record: Recorder(max_entries=...))")


def load_every_frame(path: Path) -> Profile:
    """:func:`load` that checks every frame (``memgate validate``)."""
    return load(path, every_frame=True)


registry.register(registry.Format(FORMAT, claims, load, rank_hint=_rank_of,
                                  named=lambda path: path.suffix.lower() in SUFFIXES and path.is_file(),
                                  load_thorough=load_every_frame))

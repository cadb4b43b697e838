"""A recording: the files of one torch run read as one profile (a snapshot beside a Kineto trace).

``memgate_record`` and :mod:`memgate.record` write ``torch_trace.json``, a ``cuda_snapshot.pickle``
(``npu_snapshot.pickle``) where a GPU (NPU) is, and ``memgate_recording.json`` (what was recorded, the
process's device memory per step); a user's own ``torch.profiler`` trace with a snapshot dumped from
the same process is the same pair. Gated as two profiles, every check would have two rows, and they
could disagree (the snapshot and the trace count different windows and steps). Here they are one
profile, each figure taken from the file that records it exactly:

- a device the snapshot records with history: the snapshot's blocks and series (the allocator's block
  sizes, its pool at the dump, frames), its steps being its own ``ProfilerStep#N`` annotations (the
  snapshot's clock) for the step numbers the trace has (the recorder drops the last, empty step from
  the trace);
- the CPU, and a device the snapshot has no history for: the trace's figures;
- a device the snapshot lists without any allocation in the window (segments cached by earlier
  work): no figures, no row (a CPU test on a GPU host is judged on its CPU figures alone);
- the process's device memory the recorder sampled (NVML): the device's ``APP`` series;
- where the recorder tracked models and optimizers (the manifest's ``tracked``): each device's blocks
  attributed to parameters, buffers, gradients, optimizer state, activations and other, by address and
  lifetime (:mod:`memgate.categories`), in the clock of the file its blocks come from. Such a
  recording is one even without a snapshot (a CPU run: the trace and the manifest).

The figures both files record are cross-checked: over the trace's window, the snapshot's peak
allocated and reserved must be the trace's, to the byte (both count the allocator's blocks); a
disagreement is an error naming both files. The profile's steps are the trace's.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from memgate import categories
from memgate.errors import InputError, show
from memgate.loaders import registry
from memgate.loaders.kineto import kineto
from memgate.loaders.snapshot import snapshot, snapshot_device
from memgate.metric_specs import Fact, regained
from memgate.model import APP_COMPONENT, NOT_MEASURABLE_BY_DEVICE, DeviceModel, OutOfMemory, Profile, Series
from memgate.readers import limits
from memgate.schemas import load_schema
from memgate.table import Ints, Table

FORMAT = "torch_recording"
MANIFEST = "memgate_recording.json"  # memgate.record.RECORDING_MANIFEST (record imports torch lazily; kept apart)
_MAX_MANIFEST_BYTES = 64 << 20  # a manifest holds a few samples per step: far below this
_MAX_DIGITS = 40  # of an integer in a manifest: int64 needs 19
_MESSAGE_CHARS = 160  # a schema message longer than this repeats a value: the value is shown bounded instead
# Clock skew allowed between the snapshot's time_us and the trace's timestamps at the window's edges
# (the two clocks of one process agree within tens of microseconds in every recording seen).
_EDGE_NS = 2_000_000


def _members(path: Path) -> tuple[list[Path], list[Path]]:
    """(Kineto traces, snapshots) directly inside ``path``, by content as their loaders claim them."""
    traces: list[Path] = []
    snapshots: list[Path] = []
    with os.scandir(path) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            file = Path(entry.path)
            if not entry.is_file():
                continue
            if snapshot.claims(file):
                snapshots.append(file)
            elif kineto.claims(file):
                traces.append(file)
    return traces, snapshots


def claims(path: Path) -> bool:
    """A directory holding one Kineto trace and one or two snapshots (a CUDA and an NPU one) side by
    side, or one trace and a manifest that tracked models (``tracked``; a CPU recording has no snapshot) or
    noted an out-of-memory error (``out_of_memory``)."""
    if not path.is_dir():
        return False
    try:
        traces, snapshots = _members(path)
    except OSError:
        return False
    if len(traces) != 1:
        return False
    return 1 <= len(snapshots) <= 2 or (not snapshots and _tracks(path))


def _tracks(path: Path) -> bool:
    """Whether ``path`` holds a manifest with a ``tracked`` record (a bad manifest: the load says why)."""
    file = path / MANIFEST
    try:
        if not file.is_file() or file.stat().st_size > _MAX_MANIFEST_BYTES:
            return False
        doc = _json(file.read_bytes())
    except (OSError, ValueError):  # not UTF-8, not JSON, a number too long: the load names it
        return False
    # a tracked recording, or one an out-of-memory error stopped (its evidence is the manifest's)
    return isinstance(doc, dict) and (isinstance(doc.get("tracked"), dict) or isinstance(doc.get("out_of_memory"), dict))


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The recorder's manifest in ``path``, validated against its schema; None where there is none."""
    file = path / MANIFEST
    if not file.is_file():
        return None
    limits.check_file_size(file, limit=_MAX_MANIFEST_BYTES, why="a manifest holds a few samples per step")
    try:
        doc = _json(file.read_bytes())
    except ValueError as exc:  # not UTF-8, not JSON, or a number longer than any the recorder writes
        line = getattr(exc, "lineno", None)
        raise InputError(f"not valid JSON: {getattr(exc, 'msg', None) or str(exc)[:200]}", file=file, line=line,
                         column=None if line is None else f"column {getattr(exc, 'colno', 0)}",
                         expected="the JSON manifest memgate.record writes") from None
    import jsonschema  # here: only a manifest is checked with it

    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(load_schema("recording")).iter_errors(doc))
    while error is not None and error.validator in ("oneOf", "anyOf") and error.context:
        # "is not valid under any of the given schemas" names no element and repeats the whole value
        # (20,000 samples): the branch that is not null names the element itself
        branches = [e for e in error.context if not (e.validator == "type" and e.validator_value == "null")]
        error = jsonschema.exceptions.best_match(branches or error.context)
    if error is not None:
        message = error.message if len(error.message) <= _MESSAGE_CHARS else f"fails the {error.validator!r} check"
        raise InputError(f"not a memgate recording manifest: {message}", file=file,
                         column=_element(error.absolute_path),
                         expected="the manifest memgate.record writes (schemas/recording.schema.json)",
                         found=error.instance)
    return dict(doc)


def _json(raw: bytes) -> Any:
    """The manifest's JSON value; ValueError for what is no JSON text (an integer of more digits than
    any recorder writes is refused before ``int()`` spends quadratic time on it, or raises past 4300)."""
    def integer(text: str) -> int:
        if len(text) > _MAX_DIGITS:
            raise ValueError(f"an integer of {len(text)} digits (a manifest's are {_MAX_DIGITS} at most)")
        return int(text)

    return json.loads(raw.decode("utf-8"), parse_int=integer)


def _element(parts: Any) -> str:
    """``device_memory.samples[12345].used_bytes``; ``(top level)`` for the document."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(part)):
            out += ("." if out else "") + str(part)
        else:
            out += f"[{show(str(part), 40)}]"
    return out or "(top level)"


def load(path: Path) -> Profile:
    traces, snapshots = _members(path)
    manifest = read_manifest(path)
    tracked = (manifest or {}).get("tracked")
    stopped = isinstance((manifest or {}).get("out_of_memory"), dict)
    if len(traces) != 1 or not (1 <= len(snapshots) <= 2 or (not snapshots and (tracked is not None or stopped))):
        raise InputError("not one recording: expected one Kineto trace and its snapshot side by side", file=path,
                         expected="one *.json trace and one or two snapshot pickles (or a manifest that tracked "
                                  "models)", found=f"{len(traces)} trace(s), {len(snapshots)} snapshot(s)")
    trace_file = traces[0]
    trace, moments = kineto.load_tracked(trace_file) if tracked is not None else (kineto.load(trace_file), {})
    moments_of: dict[str, dict[int, int]] = {}  # device → its clock's moments (a snapshot's own)
    devices: dict[str, DeviceModel] = {d.device: d for d in trace.devices}
    taken_from = {label: trace_file.name for label in devices}
    notes: list[str] = []
    truncated: dict[str, dict[str, str]] = {}  # device → the history metrics its snapshot covers in part
    snapshot_meta: dict[str, Any] = {}
    for file in snapshots:
        try:
            snap = snapshot.load(file, addresses=tracked is not None)
        except InputError as exc:
            if exc.message != snapshot.EMPTY:
                raise
            # dumped by a process that never allocated on the device (a CPU test on a GPU host): no row
            notes.append(f"{file.name} is empty: nothing was allocated on its device while recording")
            continue
        snapshot_meta[file.name] = {k: v for k, v in snap.metadata.items()
                                    if k not in ("not_measurable", NOT_MEASURABLE_BY_DEVICE, snapshot.NOTE_STARTS)}
        snap_moments = {int(k): int(t) for k, t in (snap.metadata.get(snapshot.NOTE_STARTS) or {}).items()}
        if snap.metadata.get("time_base") not in ("time_us", "none"):  # none: no history to place
            raise InputError("a snapshot without time_us cannot be reconciled with a trace: its history has no "
                             "clock to place it in the trace's window", file=file, column="device_traces",
                             expected="a snapshot of torch >= 2.2 (trace entries with time_us)",
                             found=f"time base {snap.metadata.get('time_base')}")
        facts = snap.metadata.get("devices") or {}
        cap = _max_entries(manifest, file.name)
        for device in snap.devices:
            entries = (facts.get(device.device) or {}).get("trace_entries") or 0
            if not entries:
                if device.device not in devices:
                    notes.append(f"{device.device}: nothing was allocated on it while {file.name} recorded "
                                 "(segments cached from earlier work only): no figures for it")
                continue
            before = devices.get(device.device)
            cut = (facts.get(device.device) or {}).get("history_truncated") or (
                f"{entries} entries, the max_entries={cap} the recorder asked for" if cap and entries >= cap else None)
            if cut:
                if before is None:
                    truncated[device.device] = snapshot.truncated_window(f"{file.name} {device.device}: {cut}")
                    devices[device.device] = device
                else:  # the trace records the whole window: its figures, and the snapshot's pool at the dump
                    devices[device.device] = replace(before, dump_state=device.dump_state, ooms=device.ooms)
                    notes.append(f"{device.device}: {file.name} kept only the last part of its history ({cut}): "
                                 f"the figures come from {trace_file.name}, the pool at the dump from the snapshot; "
                                 "record with a larger max_entries for the snapshot's blocks and frames")
                taken_from[device.device] = trace_file.name if before is not None else file.name
                continue
            if before is not None:
                _cross_check(device, before, file, trace_file)
            if snap.metadata.get("steps_by_optimizer") is None:
                device = replace(device, steps=_steps_of_trace(snap.steps, trace.steps))
            devices[device.device] = device
            taken_from[device.device] = file.name
            moments_of[device.device] = snap_moments
    if manifest is not None:
        devices = _with_device_memory(devices, manifest, path / MANIFEST)
        if "out_of_memory" in manifest:  # a recorder that notes an out-of-memory error: none noted is none
            devices = _with_out_of_memory(devices, manifest["out_of_memory"])
    if tracked is not None:
        devices, found = _with_categories(devices, categories.Tracked.of(tracked), moments, moments_of, trace.steps)
        notes += found
    metadata: dict[str, Any] = {
        **trace.metadata,
        "files": {"trace": trace_file.name, "snapshots": [f.name for f in snapshots],
                  **({"manifest": MANIFEST} if manifest is not None else {})},
        "figures_from": dict(sorted(taken_from.items())),
        "snapshots": snapshot_meta,
    }
    recorded = (manifest or {}).get("platform")
    if isinstance(recorded, dict):  # what the recorder asked torch: over what the trace's header says
        known = dict(metadata.get("platform") or {})
        for device, record in recorded.items():
            known[device] = {**(known.get(device) or {}), **{k: v for k, v in record.items() if v is not None}}
        metadata["platform"] = known
    memory = (manifest or {}).get("device_memory")
    if isinstance(memory, dict):
        metadata["device_memory"] = {k: v for k, v in memory.items() if k != "samples"}
    if notes:
        metadata["notes"] = [*metadata.get("notes", []), *notes]
    if truncated:
        metadata[NOT_MEASURABLE_BY_DEVICE] = {**metadata.get(NOT_MEASURABLE_BY_DEVICE, {}), **truncated}
    if "not_measurable" in trace.metadata and set(taken_from.values()) != {trace_file.name}:
        # a snapshot's blocks name their ops from their frames: the trace's lack of op spans is not theirs
        why = regained(trace.metadata["not_measurable"], Fact.OPERATORS)
        metadata.pop("not_measurable")
        if why:
            metadata["not_measurable"] = why
    return Profile(path=str(path), format=FORMAT, rank=trace.rank, devices=tuple(devices.values()),
                   steps=trace.steps, steps_source=trace.steps_source, metadata=metadata)


def _with_out_of_memory(devices: dict[str, DeviceModel], noted: dict[str, Any] | None) -> dict[str, DeviceModel]:
    """The out-of-memory error the recorder noted, on the device it names (naming none: the recording's one device):
    a snapshot's own ``oom`` entry for it wins, given what only the recorder knew (capacity, step, message)."""
    out = {label: device if device.ooms is not None else replace(device, ooms=()) for label, device in devices.items()}
    if noted is None:
        return out
    label = noted.get("device")  # the device the error names; naming none, the recording's one device
    if label is None:
        label = next(iter(out)) if len(out) == 1 else "unknown"
    known = ("requested", "device_free", "allocated", "reserved", "capacity")
    oom = OutOfMemory(t_ns=int(noted["t_ns"]), **{key: noted.get(key) for key in known},
                      source=str(noted.get("source") or "exception"), message=noted.get("message"),
                      step=noted.get("step"))
    device = out.get(label) or DeviceModel(device=label, ooms=())
    assert device.ooms is not None
    if device.ooms:  # the snapshot's entry: the allocator's own figures, with the recorder's words
        last = device.ooms[-1]
        merged = replace(last, capacity=last.capacity if last.capacity is not None else oom.capacity,
                         message=oom.message, step=oom.step, source=last.source)
        out[label] = replace(device, ooms=(*device.ooms[:-1], merged))
    else:
        out[label] = replace(device, ooms=(oom,))
    return out


def _levels(device: DeviceModel, column: str) -> tuple[np.ndarray, np.ndarray]:
    series = device.series.get(snapshot_device.COMPONENT)
    if series is None:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    values = series.frame.ints(column)
    present = values.present()
    return series.frame.ints("t_ns").values[present], values.values[present]


def _cross_check(snap: DeviceModel, trace: DeviceModel, snap_file: Path, trace_file: Path) -> None:
    """The snapshot's peak allocated and reserved over the trace's window are the trace's, to the byte."""
    for column in ("allocated", "reserved"):
        t_trace, v_trace = _levels(trace, column)
        t_snap, v_snap = _levels(snap, column)
        if not len(v_trace) or not len(v_snap):
            continue
        lo, hi = int(t_trace.min()), int(t_trace.max())
        peak = int(v_trace.max())
        outer = v_snap[(t_snap >= lo - _EDGE_NS) & (t_snap <= hi + _EDGE_NS)]
        inner = v_snap[(t_snap >= lo + _EDGE_NS) & (t_snap <= hi - _EDGE_NS)]
        if len(outer) and peak in outer and (not len(inner) or int(inner.max()) <= peak):
            continue
        found = int(outer.max()) if len(outer) else None
        raise InputError(
            f"{snap.device}: {snap_file.name} and {trace_file.name} disagree on the peak {column} over the trace's "
            "window: they are not one recording (another run or process?)", file=snap_file,
            column=f"device_traces ({snap.device})",
            expected=f"peak {column} {peak} bytes, as {trace_file} records it",
            found="no history inside the trace's window" if found is None else f"{found} bytes")


def _steps_of_trace(snap_steps: Table, trace_steps: Table) -> Table | None:
    """The snapshot's own steps (its clock) for the step numbers the trace has; None: the trace's."""
    if not len(snap_steps) or not len(trace_steps):
        return None
    wanted = trace_steps.ints("step").known()
    keep = np.isin(snap_steps.ints("step").values, wanted) & snap_steps.ints("step").present()
    if int(keep.sum()) != len(np.unique(wanted)):
        return None  # the annotations miss some of the trace's steps: the trace's clock for all of them
    return snap_steps.take(keep)


def _with_device_memory(devices: dict[str, DeviceModel], manifest: dict[str, Any],
                        file: Path) -> dict[str, DeviceModel]:
    """Each sampled device's process memory as its ``APP`` series (reserved = bytes in use on the device)."""
    memory = manifest.get("device_memory")
    if not isinstance(memory, dict):
        return devices
    by_device: dict[str, list[tuple[int, int]]] = {}
    for sample in memory.get("samples") or []:
        by_device.setdefault(sample["device"], []).append((sample["t_ns"], sample["used_bytes"]))
    out = dict(devices)
    for label, samples in by_device.items():
        model = out.get(label)
        if model is None:
            continue  # sampled, but nothing allocated on it while recording: no row
        samples.sort()
        n = len(samples)
        frame = Table({"t_ns": Ints.of([t for t, _ in samples]), "allocated": Ints.absent(n),
                       "reserved": Ints.of([b for _, b in samples]), "active": Ints.absent(n)})
        out[label] = replace(model, series={**model.series, APP_COMPONENT: Series(APP_COMPONENT, frame, str(file))})
    return out


def _with_categories(devices: dict[str, DeviceModel], tracked: categories.Tracked, moments: dict[int, int],
                     moments_of: dict[str, dict[int, int]], steps: Table) -> tuple[dict[str, DeviceModel], list[str]]:
    """Each device's blocks attributed to the tracked categories (:mod:`memgate.categories`), in
    the clock its blocks are in (a snapshot's own annotations, else the trace's); and what to note."""
    out, notes = {}, []
    for label, device in devices.items():
        attributed, facts = categories.attribute(device, tracked, moments_of.get(label, moments),
                                                 device.steps if device.steps is not None else steps)
        out[label] = attributed
        if "not attributed" in facts:
            notes.append(f"{label}: no categories: {facts['not attributed']}")
        elif facts.get("storages_without_block"):
            notes.append(f"{label}: {facts['storages_without_block']} tracked storage(s), "
                         f"{facts['bytes_without_block']} bytes, lie in no block of the window (allocated before "
                         "the recording started, or noted only where no block was live): not counted in "
                         "category_bytes_at_peak")
    return out, notes


def _max_entries(manifest: dict[str, Any] | None, name: str) -> int | None:
    """The ``max_entries`` the recorder gave ``_record_memory_history`` for snapshot ``name``."""
    for entry in (manifest or {}).get("snapshots") or []:
        if entry.get("file") == name and isinstance(entry.get("max_entries"), int):
            return int(entry["max_entries"])
    return None


registry.register(registry.Format(FORMAT, claims, load, rank_hint=lambda path: None))

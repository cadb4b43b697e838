"""Kineto / torch.profiler Chrome traces recorded with ``profile_memory=True``. docs/formats-reference.md §5.

``*.json`` or ``*.json.gz``, streamed (:mod:`memgate.readers.traceevents`; never loaded whole). What
is read (:mod:`memgate.loaders.kineto.kineto_events` keeps it, batch by batch):
- ``[memory]`` instant events: one per allocation (``Bytes`` > 0) or free (``Bytes`` < 0), with the
  allocator's ``Total Allocated`` / ``Total Reserved`` after the event. ``Total Allocated`` includes
  memory allocated before profiling started; it becomes each block's ``alloc_total`` so the
  reconciliation recovers that baseline. ``Device Type`` (c10 enum: CPU=0, CUDA=1, PrivateUse1 =
  NPU=20) and ``Device Id`` name the device. The CPU allocator reserves nothing (``Total Reserved``
  is always 0 there), so a CPU device has no reserved values rather than a misleading 0.
- ``ProfilerStep#N`` complete (``X``) events: the steps.
- operator complete events, ``cat`` ``cpu_op`` (``Operator`` in torch <= 1.9, where record_function
  ranges are ``Operator`` spans too): a memory event belongs to the innermost op on the same (pid, tid)
  whose span ``[ts, ts + dur]`` contains its ts; that op names the block. A tid written as a string of
  digits (torch <= 1.9 does so for ops, not for memory events) is that number. A trace without
  operator spans says the op figures are not measurable.
- ``python_function`` complete events (``with_stack=True``; ``with_modules=True`` adds the
  ``nn.Module: Name_k`` spans): the module spans around a memory event on the same (pid, tid),
  outermost first, joined by ``/``, are its block's owner; where none encloses it, the innermost
  frame in user code (``file.py(12): fn`` outside a ``torch``/``torch_npu`` package directory), spelled
  ``fn (file.py:12)`` as every frame owner is (:func:`memgate.owners.frame_owner`).
- ``deviceProperties[]`` (header): ``totalGlobalMem`` of the GPU with that ``id`` becomes
  ``metadata["device_capacity_bytes"][label]``.

A name torch wrote with unescaped quotes (torch 2.13, ``with_stack=True``) is read as its text, and
``metadata["notes"]`` says so.

Time: ``ts`` is µs with 3 decimals, relative to ``baseTimeNanoseconds`` when the trace has it:
``t_ns = baseTimeNanoseconds + ts * 1000``, exact. Events are unsorted in the file; they are ordered
by ts, ties in file order.

The JSON of ``prof.export_memory_timeline`` is :mod:`memgate.loaders.kineto.memory_timeline`'s.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import ijson
import numpy as np

from memgate import hints
from memgate.categories import ADDRESS, moment_of
from memgate.errors import InputError, show
from memgate.lazy import arrow_without_pandas
from memgate.loaders import registry
from memgate.loaders.events import pair_allocs, repeated_action
from memgate.loaders.kineto.kineto_events import I64_MAX, MODULE_PREFIX, Collected, Kept, us_to_ns
from memgate.metric_specs import Fact, not_measurable
from memgate.model import (
    MAX_BYTES,
    MAX_RANK,
    NOT_MEASURABLE_BY_DEVICE,
    DeviceModel,
    Profile,
    Series,
    check_steps,
    empty_steps,
    step_number,
)
from memgate.owners import kineto_frame_owner
from memgate.readers import limits
from memgate.readers.files import check_readable
from memgate.readers.jsonstream import JsonLimitError, guard
from memgate.readers.pyrecords import check_records
from memgate.readers.traceevents import HEADER_OBJECTS, read_events, read_head
from memgate.schemas import load_schema
from memgate.table import Ints, Table, Texts

FORMAT = "kineto"
# The history figures read on blocks (leaks, the blocks live at the peak): a trace without Addr pairs no free with
# its allocation, so none of them (nor left_allocated, which reads leaked_bytes' history) is measurable.
SCHEMA = "kineto"
COMPONENT = "allocator"
UNPAIRED = "allocations without Addr"  # the blocks of a trace whose [memory] events carry no Addr
STEP_NAME = re.compile(r"^ProfilerStep#([0-9]+)\Z")
# c10::DeviceType, lower-cased; PrivateUse1 is torch_npu's NPU (docs/formats-reference.md).
DEVICE_TYPES = {0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip", 7: "fpga",
                8: "maia", 9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps", 14: "meta", 15: "hpu",
                16: "ve", 17: "lazy", 18: "ipu", 19: "mtia", 20: "npu"}
CPU = 0
_BASE_MAX = 9 * 10**18
_NONE = np.array(None, dtype=object)  # np.equal(values, _NONE): where an object array holds None


# ---- detection ------------------------------------------------------------------------------------


def _is_json_name(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith((".json", ".json.gz"))


def _is_trace_name(path: Path) -> bool:
    """The name torch's ``tensorboard_trace_handler`` gives a trace (a file given directly that is
    named so goes to this loader, which says what it is instead)."""
    return path.name.lower().endswith((".pt.trace.json", ".pt.trace.json.gz"))


def claims(path: Path) -> bool:
    """A .json/.json.gz file whose first bytes open an object that has ``traceEvents``.

    torch_npu's trace_view.json is a JSON *array*: not claimed (it belongs to its profile dir).
    """
    if not _is_json_name(path) or not path.is_file():
        return False
    try:
        head = read_head(path)
    except PermissionError:
        return _is_trace_name(path)  # load() says why
    except (OSError, EOFError, zlib.error):
        return False
    body = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return body[:1] == b"{" and b'"traceEvents"' in head


def _head_fields(head: bytes) -> dict[str, Any]:
    """Top-level scalars written before ``traceEvents`` (Kineto's header), plus ``distributedInfo.rank``: the
    time base the events are read with (the whole read's members, :func:`_member_fields`, complete them)."""
    fields: dict[str, Any] = {}
    props: list[dict[str, Any]] = []
    try:
        for prefix, event, value in ijson.parse(guard(io.BytesIO(head))):
            if prefix == "deviceProperties.item" and event == "start_map":
                props.append({})
            elif prefix in _PROPS and props:
                props[-1][prefix.rsplit(".", 1)[1]] = value
            if prefix == "traceEvents":
                fields["traceEvents"] = event  # start_array, or what it is instead
                break
            if event in ("number", "string", "boolean") and ("." not in prefix or prefix == "distributedInfo.rank"):
                fields[prefix] = value
    except (ijson.JSONError, JsonLimitError):
        pass  # the head ends mid-document (or nests absurdly: the full read reports that)
    fields["deviceProperties"] = props
    return fields


_PROP_NAMES = ("id", "totalGlobalMem", "name", "computeMajor", "computeMinor")
_PROPS = tuple(f"deviceProperties.item.{name}" for name in _PROP_NAMES)


def _member_fields(members: dict[str, Any]) -> dict[str, Any]:
    """What :func:`_head_fields` takes from the header, from the top-level members the whole read found
    (before and after ``traceEvents``): the scalars, ``deviceProperties`` and ``distributedInfo.rank``."""
    fields: dict[str, Any] = {key: value for key, value in members.items() if value is not None
                              and not isinstance(value, (dict, list)) and key not in HEADER_OBJECTS}
    props = members.get("deviceProperties")  # (anything but a list of objects lists no device, as in the head)
    if isinstance(props, list):
        fields["deviceProperties"] = [{k: p[k] for k in _PROP_NAMES if k in p and not isinstance(p[k], (dict, list))}
                                      for p in props if isinstance(p, dict)]
    info = members.get("distributedInfo")
    if isinstance(info, dict) and info.get("rank") is not None and not isinstance(info["rank"], (dict, list)):
        fields["distributedInfo.rank"] = info["rank"]
    return fields


def _cuda_release(value: Any) -> str | None:
    """CUDA's version number as its release: 13000 → ``13.0`` (1000 × major + 10 × minor)."""
    return f"{value // 1000}.{value % 1000 // 10}" if type(value) is int and value > 0 else None


def _platforms(fields: dict[str, Any], capacity: dict[str, int]) -> dict[str, Any]:
    """``metadata["platform"]`` (:mod:`memgate.platforms`): each GPU's name, memory and compute capability
    as ``deviceProperties`` lists them by ``id``, and the CUDA driver and runtime the header names. A GPU
    is labelled as the trace's memory events label it (``hip:0`` on ROCm), else ``cuda:<id>``; one without
    memory events (an idle GPU of the node) still gets its memory."""
    out: dict[str, Any] = {}
    driver, runtime = _cuda_release(fields.get("cuda_driver_version")), _cuda_release(fields.get("cuda_runtime_version"))
    labels = {int(number): label for label in capacity
              if (number := label.partition(":")[2]).isascii() and number.isdigit()}
    for p in fields["deviceProperties"]:
        if type(p.get("id")) is not int:
            continue
        device = labels.get(p["id"], f"cuda:{p['id']}")
        major, minor = p.get("computeMajor"), p.get("computeMinor")
        total = p.get("totalGlobalMem")  # (checked by _capacities, as every listed device's)
        out[device] = {"device_name": p["name"] if isinstance(p.get("name"), str) else None,
                       "total_memory": capacity.get(device, total if type(total) is int else None),
                       "compute": f"{major}.{minor}" if type(major) is int and type(minor) is int else None,
                       "driver": driver and f"CUDA driver {driver}", "runtime": runtime and f"CUDA {runtime}"}
    return out


_MANIFEST = "memgate_recording.json"  # memgate.record's manifest beside the trace it wrote (a CPU run's: no snapshot)
_MANIFEST_BYTES = 64 << 20


def _recorded_platforms(path: Path) -> dict[str, Any]:
    """The platform the recorder found (its manifest's ``platform``) for the trace it wrote beside it; {} where
    there is none. The manifest is the recording's file, checked where it is loaded as one: one that cannot
    be read here adds nothing."""
    manifest = path.parent / _MANIFEST
    try:
        if not manifest.is_file() or manifest.stat().st_size > _MANIFEST_BYTES:
            return {}
        doc = json.loads(manifest.read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    recorded = doc.get("platform") if isinstance(doc, dict) else None
    return {k: v for k, v in recorded.items() if isinstance(k, str) and isinstance(v, dict)} \
        if isinstance(recorded, dict) else {}


def _header_int(path: Path, value: Any, column: str, low: int, high: int, what: str) -> int | None:
    """A header value memgate acts on (a rank names the profile, a capacity sizes "92%" budgets):
    None where absent, an InputError where it is no integer from ``low`` to ``high``."""
    if value is None:
        return None
    if type(value) is not int or not low <= value <= high:
        raise InputError(f"{column} out of range" if type(value) is int else f"{column} is not an integer", file=path,
                         column=column, expected=f"{what}: an integer from {low} to {high}", found=show(value, 60))
    return value


def _capacities(path: Path, props: list[dict[str, Any]], devices: list[DeviceModel]) -> dict[str, int]:
    """Each GPU's memory as the trace records it: ``deviceProperties[].totalGlobalMem`` by ``id``.
    A value that is no device index or no byte count a device can hold is an error (a "92%" budget
    of 2**80 bytes would pass anything)."""
    by_id: dict[int, int] = {}
    listed_at: dict[int, int] = {}
    for i, p in enumerate(props):
        device_id = _header_int(path, p.get("id"), f"deviceProperties[{i}].id", 0, MAX_RANK, "a device index")
        total = _header_int(path, p.get("totalGlobalMem"), f"deviceProperties[{i}].totalGlobalMem", 0, MAX_BYTES,
                            "the device's memory in bytes")
        if device_id is not None and total is not None:
            if device_id in by_id and by_id[device_id] != total:  # which one a "50%" budget means: unknowable
                raise InputError(f"device {device_id} is listed twice in deviceProperties with two capacities",
                                 file=path, column=f"deviceProperties[{i}].totalGlobalMem",
                                 expected=f"{by_id[device_id]} bytes, as deviceProperties[{listed_at[device_id]}] "
                                          "lists it (one GPU has one memory size)",
                                 found=f"{total} bytes")
            by_id[device_id] = total
            listed_at.setdefault(device_id, i)
    capacity = {}
    for device in devices:
        kind, _, number = device.device.partition(":")
        if kind != "cpu" and number.isascii() and number.isdigit() and int(number) in by_id:
            capacity[device.device] = by_id[int(number)]
    return capacity


# ---- loading --------------------------------------------------------------------------------------


def load(path: Path) -> Profile:
    # The events are plain Python values (no pandas object): Arrow builds its arrays from them
    # without importing pandas (~0.2 s), as the snapshot loader does.
    with arrow_without_pandas():
        return _load(path)[0]


def load_tracked(path: Path) -> tuple[Profile, dict[int, int]]:
    """A tracked recording's trace: the profile with each block's address (column
    :data:`~memgate.categories.ADDRESS`), and the start (ns) of each ``memgate::note#k`` span by k."""
    with arrow_without_pandas():
        return _load(path, addresses=True)


def _load(path: Path, addresses: bool = False) -> tuple[Profile, dict[int, int]]:
    check_readable(path)
    limits.check_file_size(path)
    gz = path.name.lower().endswith(".gz")
    schema = load_schema(SCHEMA)
    try:
        head = read_head(path)
        body = head.lstrip(b"\xef\xbb\xbf \t\r\n")
        if _ARRAY_FORM.match(body):
            raise InputError("a Chrome trace in the JSON array form (torch's legacy autograd profiler, or Kineto "
                             "before torch 1.8), which records no [memory] events", file=path, line=1,
                             expected="a JSON object with traceEvents, as torch.profiler.profile(..., "
                             "profile_memory=True) exports it since torch 1.8", found="[ {\"ph\": ...}, ...]")
        if body[:1] != b"{":
            raise InputError("not a Chrome trace: the file is not a JSON object", file=path, line=1,
                             expected="'{' with traceEvents (a Kineto trace)", found=repr(head[:20]))
        fields = _head_fields(head)
        base = fields.get("baseTimeNanoseconds", 0)
        valid_base = base if _valid_base(base) else 0  # an invalid one is reported once the events are read
        got, repaired, members = read_events(path, gz, lambda batches: Collected.of(batches, path, schema, valid_base))
    except PermissionError:
        raise InputError("file is not readable (permission denied)", file=path) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"corrupt or truncated gzip stream: {exc}", file=path) from None
    if got.events == 0 and b'"traceEvents"' not in head:
        raise InputError("no traceEvents array in this JSON object", file=path, expected="a Kineto trace")
    if fields.get("traceEvents", "start_array") != "start_array":
        raise InputError("traceEvents is not an array", file=path, column="traceEvents", expected="an array of events",
                         found=str(fields["traceEvents"]).replace("start_map", "an object"))
    fields = {**fields, **_member_fields(members)}  # the header wherever the writer put it (after traceEvents too)
    base = fields.get("baseTimeNanoseconds", 0)
    if not _valid_base(base):
        raise InputError("baseTimeNanoseconds must be a non-negative integer", file=path,
                         column="baseTimeNanoseconds", expected=f"ns since the epoch, at most {_BASE_MAX}",
                         found=repr(base))
    steps = _steps(path, got, schema, base)
    devices = _devices(path, got, base, addresses)
    metadata: dict[str, Any] = {"base_time_ns": base, "trace_events": got.events, "memory_events": got.mem.count,
                                "cpu_ops": got.ops.count}
    lacks: dict[Fact, str] = {}
    cpu_lacks: dict[Fact, str] = {}
    if got.first_addr.keys() == {False}:
        metadata["memory_events_without_addr"] = True
        lacks, cpu_lacks = _unpaired_lacks(got)
    if not got.ops.count:  # no block can name its operator: an empty op_max_block_bytes would read as measured
        lacks.setdefault(Fact.OPERATORS, hints.no_kineto_ops())
    if lacks:
        metadata["not_measurable"] = not_measurable(lacks)
    if cpu_lacks:
        metadata[NOT_MEASURABLE_BY_DEVICE] = {_label(CPU, -1): not_measurable(cpu_lacks)}
    if repaired is not None and repaired.count:
        lines = ", ".join(map(str, repaired.repaired)) + (", ..." if repaired.count > len(repaired.repaired) else "")
        metadata["repaired_names"] = repaired.count
        note = (f"{repaired.count} event name(s) that torch wrote with unescaped quotes (invalid JSON; the "
                f"Python tracer's, with_stack=True) read as their text: line(s) {lines}")
        metadata["notes"] = [note]
    if capacity := _capacities(path, fields["deviceProperties"], devices):
        metadata["device_capacity_bytes"] = capacity
    if platforms := {**_platforms(fields, capacity), **_recorded_platforms(path)}:
        metadata["platform"] = platforms
    if not got.mem.count:
        message, expected = hints.no_kineto_memory_events()
        raise InputError(message, file=path, expected=expected, found=f"{got.events} events, none of them [memory]")
    rank = _header_int(path, fields.get("distributedInfo.rank"), "distributedInfo.rank", -1, MAX_RANK,
                       "the process's rank (-1: not distributed)")
    return Profile(
        path=str(path),
        format=FORMAT,
        rank=str(rank) if rank is not None and rank >= 0 else registry.rank_of_file(path),
        devices=tuple(devices),
        steps=steps,
        steps_source=str(path) if len(steps) else None,
        metadata=metadata,
    ), _note_starts(path, got, schema, base) if addresses else {}


# The trace-event format's other top level: an array of events (the first one's keys include "ph").
_ARRAY_FORM = re.compile(rb'\[\s*\{[^{}\[\]]*"ph"\s*:')


def _valid_base(base: Any) -> bool:
    return isinstance(base, int) and not isinstance(base, bool) and 0 <= base <= _BASE_MAX


def _span_end(start: np.ndarray, durations: list[Any], path: Path) -> np.ndarray:
    dur = us_to_ns(durations, 0)
    if (dur > I64_MAX - start).any():
        raise InputError("ts + dur is past the year 2262 (int64 ns)", file=path, expected="a shorter dur",
                         found=str(durations[int(np.argmax(dur > I64_MAX - start))]))
    return np.asarray(start + dur, dtype=np.int64)


def _steps(path: Path, got: Collected, schema: dict[str, Any], base: int) -> Table:
    if not got.steps:
        return empty_steps()
    cols = check_records(got.steps, schema["$defs"]["x_event"], file=path,
                         where=lambda k: f"traceEvents[{got.step_index[k]}]", root=schema)
    start = us_to_ns([e["ts"] for e in got.steps], base, path)
    end = _span_end(start, [e["dur"] for e in got.steps], path)
    names = cols["name"]
    assert names is not None
    number = [step_number(m.group(1), path, f"traceEvents[{got.step_index[k]}].name")
              if (m := STEP_NAME.match(n)) else None for k, n in enumerate(names.to_pylist())]
    numbered = np.array([n is not None for n in number], dtype=bool)
    if not numbered.any():
        return empty_steps()
    # one row per step number, in order: its earliest start and latest end
    step, group = np.unique(np.array([n for n in number if n is not None], dtype=np.int64), return_inverse=True)
    group = group.reshape(-1)
    t_start = np.full(len(step), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(t_start, group, start[numbered])
    t_end = np.full(len(step), np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(t_end, group, end[numbered])
    steps = Table({"step": Ints.of(step), "t_start": Ints.of(t_start), "t_end": Ints.of(t_end)})
    check_steps(steps, path, column="ProfilerStep")  # one step's spans may repeat; two steps never overlap
    return steps


def _note_starts(path: Path, got: Collected, schema: dict[str, Any], base: int) -> dict[int, int]:
    """The start (ns) of each ``memgate::note#k`` span by k (the earliest, were one written twice)."""
    if not got.notes:
        return {}
    check_records(got.notes, schema["$defs"]["x_event"], file=path,
                  where=lambda k: f"traceEvents[{got.note_index[k]}] (memgate::note)", root=schema)
    start = us_to_ns([e["ts"] for e in got.notes], base, path)
    out: dict[int, int] = {}
    for event, t in zip(got.notes, start.tolist()):
        k = moment_of(str(event["name"]))
        if k is not None:
            out[k] = min(t, out.get(k, t))
    return out


def _devices(path: Path, got: Collected, base: int, addresses: bool = False) -> list[DeviceModel]:
    mem = got.mem
    if not mem.count:
        return []
    if mem.problem is not None:
        raise mem.problem
    if len(got.first_addr) == 2:
        # the odd kind: the fewer (on a tie, the later), named at its first event
        odd = (got.addr_count[True], got.first_addr[False]) < (got.addr_count[False], got.first_addr[True])
        raise InputError(
            f"a [memory] event {'with' if odd else 'without'} Addr among [memory] events "
            f"{'without' if odd else 'with'} one: its allocations and frees cannot be paired", file=path,
            column=f"traceEvents[{got.first_addr[odd]}].args.Addr",
            expected="Addr on every [memory] event (torch >= 1.10) or on none (torch 1.9)",
            found="an Addr" if odd else "no Addr")
    unpaired = False in got.first_addr
    t = _add_base(mem, base, path)
    op = _attribute(path, got, t, mem.column("thread"), base)
    owner = _owners(path, got, t, mem.column("thread"), base)
    nbytes, addr, dtype, event = mem.column("nbytes"), mem.column("addr"), mem.column("dtype"), mem.column("event")
    total_alloc = (mem.column("total_alloc"), mem.column("no_alloc"))
    total_res = (mem.column("total_res"), mem.column("no_res"))

    order = np.lexsort((np.arange(len(t)), t))  # time order, ties in file order
    ids, id_of = np.unique(mem.column("did"), return_inverse=True)
    pairs, pair_of = np.unique(dtype * len(ids) + id_of, return_inverse=True)  # one code per (type, id)
    pair_labels = [_label(int(p) // len(ids), int(ids[int(p) % len(ids)])) for p in pairs]
    labels = sorted(set(pair_labels))
    label_of = np.array([labels.index(label) for label in pair_labels], dtype=np.int64)[pair_of]
    models = []
    for k, label in enumerate(labels):
        rows = order[label_of[order] == k]
        cpu = bool(dtype[rows[0]] == CPU)
        model = (_unpaired_device(path, label, rows, t, nbytes, total_alloc, total_res, op, cpu=cpu) if unpaired
                 else _device(path, label, rows, t, nbytes, addr, total_alloc, total_res, op, cpu=cpu, event=event,
                              addresses=addresses))
        models.append(_with_owners(model, rows, nbytes, owner))
    return models


def _add_base(kept: Kept, base: int, path: Path) -> np.ndarray:
    """The events' ts in ns since the epoch; past int64 (a huge ts on top of a base) is an InputError."""
    if base and kept.latest[0] > I64_MAX - base:
        raise InputError("ts + baseTimeNanoseconds is past the year 2262 (int64 ns)", file=path,
                         expected="ts relative to baseTimeNanoseconds", found=kept.latest[1])
    return kept.column("t") + base


def _label(device_type: int, device_id: int) -> str:
    name = DEVICE_TYPES[device_type]
    return name if device_type == CPU or device_id < 0 else f"{name}:{device_id}"


def _device(path: Path, label: str, rows: np.ndarray, t: np.ndarray, nbytes: np.ndarray, addr: np.ndarray,
            total_alloc: tuple[np.ndarray, np.ndarray], total_res: tuple[np.ndarray, np.ndarray], op: np.ndarray, *,
            cpu: bool, event: np.ndarray, addresses: bool = False) -> DeviceModel:
    """Blocks and the allocator series of one device; ``rows`` are its events in time order, ``event``
    each row's index in traceEvents; ``addresses``: the blocks carry their Addr too."""
    b = nbytes[rows]
    moving = rows[b != 0]
    is_alloc = nbytes[moving] > 0
    pairing = pair_allocs(addr[moving], is_alloc, t[moving])
    if pairing.repeated is not None:
        k = int(moving[pairing.repeated])
        raise repeated_action(path, f"traceEvents[{int(event[k])}]", nbytes[k] > 0,
                              found=f"Addr {int(addr[k])}, Bytes {int(nbytes[k])}",
                              expected="allocs and frees of one address in turn", context=f" (on {label})")
    partner = pairing.partner
    allocs = np.flatnonzero(is_alloc)
    early = np.flatnonzero(~is_alloc & (partner < 0))  # frees of memory allocated before profiling
    freed_at = partner[allocs]
    tm = t[moving]
    size = np.concatenate([nbytes[moving][allocs], -nbytes[moving][early]])
    n_early = len(early)
    t_alloc = Ints.of(np.concatenate([tm[allocs], np.zeros(n_early, np.int64)]),
                      np.concatenate([np.zeros(len(allocs), bool), np.ones(n_early, bool)]))
    t_free = Ints.of(np.concatenate([np.where(freed_at >= 0, tm[np.maximum(freed_at, 0)], 0), tm[early]]),
                     np.concatenate([freed_at < 0, np.zeros(n_early, bool)]))
    totals, no_total = total_alloc[0][moving], total_alloc[1][moving]
    alloc_total = Ints.of(np.concatenate([totals[allocs], np.zeros(n_early, np.int64)]),
                          np.concatenate([no_total[allocs], np.ones(n_early, bool)]))
    ops = op[moving][allocs].tolist() + [None] * n_early
    blocks = Table({
        "size": Ints.of(size),
        "t_alloc": t_alloc,
        "t_free": t_free,
        "op": Texts.of(ops),
        "stream": Texts.repeat(None, len(size)),
        "owner": Texts.repeat(None, len(size)),
        "component": Texts.repeat(COMPONENT, len(size)),
        "alloc_total": alloc_total,
    })
    if addresses:
        blocks = blocks.with_column(ADDRESS, Ints.of(np.concatenate([addr[moving][allocs], addr[moving][early]])))
    series: dict[str, Series] = {}
    if not total_alloc[1][rows].all():
        reserved = Ints.absent(len(rows)) if cpu else Ints.of(total_res[0][rows], total_res[1][rows])
        frame = Table({
            "t_ns": Ints.of(t[rows]),
            "allocated": Ints.of(total_alloc[0][rows], total_alloc[1][rows]),
            "reserved": reserved,
            "active": Ints.absent(len(rows)),
        })
        series[COMPONENT] = Series(COMPONENT, frame, str(path))
    # torch's CPU reporter counts only what was allocated while a profiler ran, and never forgets
    # bytes freed while none ran: its totals are window-relative (see docs/formats-reference.md §5).
    return DeviceModel(device=label, series=series, blocks=blocks, blocks_source=str(path), window_relative=cpu)


def _unpaired_device(path: Path, label: str, rows: np.ndarray, t: np.ndarray, nbytes: np.ndarray,
                     total_alloc: tuple[np.ndarray, np.ndarray], total_res: tuple[np.ndarray, np.ndarray],
                     op: np.ndarray, *, cpu: bool) -> DeviceModel:
    """One device of a trace whose [memory] events carry no Addr (torch 1.9): a free names no
    allocation, so the blocks are the allocations alone, component UNPAIRED, with no free time
    (not "still live": unknown). The series is the totals where the events have them, else the
    running sum of Bytes, window-relative: it starts at 0 whatever the window opened with.
    """
    b = nbytes[rows]
    allocs = rows[b > 0]
    n = len(allocs)
    blocks = Table({
        "size": Ints.of(nbytes[allocs]),
        "t_alloc": Ints.of(t[allocs]),
        "t_free": Ints.absent(n),
        "op": Texts.of(op[allocs].tolist()),
        "stream": Texts.repeat(None, n),
        "owner": Texts.repeat(None, n),
        "component": Texts.repeat(UNPAIRED, n),
        "alloc_total": Ints.absent(n),
    })
    totals = not total_alloc[1][rows].all()
    if totals:
        allocated = Ints.of(total_alloc[0][rows], total_alloc[1][rows])
    else:
        if float(np.abs(b.astype(np.float64)).sum()) >= 2.0**63:
            raise InputError("the Bytes of the [memory] events add up past int64", file=path,
                             expected="a running total of allocated bytes that fits int64",
                             found=f"{len(b)} events of up to {int(np.abs(b).max())} bytes")
        allocated = Ints.of(np.cumsum(b))
    reserved = Ints.of(total_res[0][rows], total_res[1][rows]) if totals and not cpu else Ints.absent(len(rows))
    frame = Table({"t_ns": Ints.of(t[rows]), "allocated": allocated, "reserved": reserved,
                   "active": Ints.absent(len(rows))})
    return DeviceModel(device=label, series={COMPONENT: Series(COMPONENT, frame, str(path))}, blocks=blocks,
                       blocks_source=str(path), window_relative=cpu or not totals)


def _unpaired_lacks(got: Collected) -> tuple[dict[Fact, str], dict[Fact, str]]:
    """What a trace without Addr (torch 1.9) lacks, and what its CPU device lacks beside: fact → why."""
    totals = bool(got.mem.count) and not got.mem.column("no_alloc").all()
    # the blocks live at the peak too: an allocation without its free would count as live ever after
    lacks = {Fact.PAIRING: "its [memory] events carry no Addr (torch 1.9 writes only Bytes, Device Type and Device "
                           "Id): a free cannot be matched to its allocation, so no block is known to be live at a "
                           "moment"}
    if not totals:
        measured = ("step_growth_bytes (from the running sum of Bytes) and op_max_block_bytes are measured"
                    if got.ops.count else "step_growth_bytes (from the running sum of Bytes) is measured")
        lacks[Fact.TOTALS] = ("its [memory] events carry no Total Allocated / Total Reserved (torch 1.9): the level "
                              f"memory stood at when the window opened is unknown, so no peak is; {measured}")
    cpu_lacks: dict[Fact, str] = {}
    if totals and (got.mem.column("dtype") == CPU).any():  # the CPU device's alone: a CUDA total is absolute
        cpu_lacks[Fact.WINDOW_START] = (
            "its CPU totals may carry bytes from before the window (an earlier profiling session), which only "
            "allocations paired with their frees tell apart, and its [memory] events carry no Addr")
    return lacks, cpu_lacks


def _attribute(path: Path, got: Collected, t_mem: np.ndarray, mem_thread: np.ndarray, base: int) -> np.ndarray:
    """The innermost op on the same (pid, tid) whose [ts, ts+dur] contains each memory event."""
    result = np.full(len(t_mem), None, dtype=object)
    spans = _spans(path, got.ops, base) if len(t_mem) else None
    if spans is None:
        return result
    start, end, op_thread, op_name = spans
    names = np.array(got.op_names.values, dtype=object)
    for g in np.unique(mem_thread):
        on_thread = np.flatnonzero(op_thread == g)
        queries = np.flatnonzero(mem_thread == g)
        if not len(on_thread):
            continue
        inner = innermost(start[on_thread], end[on_thread], t_mem[queries])
        hit = inner >= 0
        result[queries[hit]] = names[op_name[on_thread[inner[hit]]]]
    return result


def _spans(path: Path, kept: Kept, base: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """(start, end, thread, name code) of kept complete events, None when there are none."""
    if not kept.count:
        return None
    if kept.problem is not None:
        raise kept.problem
    start = _add_base(kept, base, path)
    dur = kept.column("dur")
    # (checked as the events were read against the base before traceEvents; again against a base after it)
    past = dur > I64_MAX - np.maximum(start, 0)
    if kept.past_end is not None or past.any():
        raise InputError("ts + dur is past the year 2262 (int64 ns)", file=path, expected="a shorter dur",
                         found=kept.past_end or f"{int(dur[int(np.argmax(past))])} ns")
    return start, start + dur, kept.column("thread"), kept.column("name")


def _owners(path: Path, got: Collected, t_mem: np.ndarray, mem_thread: np.ndarray, base: int) -> np.ndarray:
    """Each memory event's owner: the nn.Module spans around it on the same (pid, tid), outermost to
    innermost, joined by ``/`` (``M_0/Encoder_0/Linear_0``: a glob on an outer module covers the inner
    ones); where no module span encloses it, the innermost user-code frame (with_stack); else None."""
    result = np.full(len(t_mem), None, dtype=object)
    spans = _spans(path, got.py, base) if len(t_mem) else None
    if spans is None:
        return result
    start, end, thread, name = spans
    # a frame's owner in memgate's one spelling (memgate.owners), each distinct name spelled once
    names = np.array([v if not isinstance(v, str) or v.startswith(MODULE_PREFIX) else (kineto_frame_owner(v) or v)
                      for v in got.py_names.values], dtype=object)
    is_module = np.array([isinstance(v, str) and v.startswith(MODULE_PREFIX) for v in got.py_names.values] + [False],
                         dtype=bool)[name]
    for g in np.unique(mem_thread):
        queries = np.flatnonzero(mem_thread == g)
        on_thread = thread == g
        for modules in (True, False):  # module spans first; frames for what no module span encloses
            kind = np.flatnonzero(on_thread & (is_module == modules))
            todo = queries[np.equal(result[queries], _NONE)]
            if not len(kind) or not len(todo):
                continue
            inner = innermost(start[kind], end[kind], t_mem[todo])
            hit = inner >= 0
            labels = _module_paths(start[kind], end[kind], names[name[kind]]) if modules else names[name[kind]]
            result[todo[hit]] = labels[inner[hit]]
    return result


def _module_paths(start: np.ndarray, end: np.ndarray, names: np.ndarray) -> np.ndarray:
    """For one thread's nn.Module spans: each span's path of module names, outermost first."""
    order = np.lexsort((-end, start))
    parent = _enclosing(end[order])
    paths = np.empty(len(order), dtype=object)
    for k, i in enumerate(order):  # a parent comes before its children in this order
        own = str(names[i])[len(MODULE_PREFIX):]
        paths[i] = own if parent[k] < 0 else f"{paths[order[parent[k]]]}/{own}"
    return paths


def _with_owners(model: DeviceModel, rows: np.ndarray, nbytes: np.ndarray, owner: np.ndarray) -> DeviceModel:
    """Fill the owner column of the blocks (allocations, in the order _device made them)."""
    if np.equal(owner[rows], _NONE).all():
        return model
    allocs = rows[nbytes[rows] > 0]  # the blocks from allocations come first, in time order
    column = np.full(len(model.blocks), None, dtype=object)
    column[:len(allocs)] = owner[allocs]
    return replace(model, blocks=model.blocks.with_column("owner", Texts.of(column.tolist())))


def innermost(start: np.ndarray, end: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Index of the latest-starting interval with ``start <= t <= end`` per query, -1 if none.

    For properly nested intervals (one thread's ops) that is the innermost one. Vectorized: sort by
    (start, -end), link each interval to its enclosing one (previous with end >= its end, found by
    pointer jumping), then walk each query's candidate outwards until it contains the query.
    """
    order = np.lexsort((-end, start))
    s, e = start[order], end[order]
    parent = _enclosing(e)
    cand = np.searchsorted(s, t, side="right") - 1
    todo = np.flatnonzero(cand >= 0)
    todo = todo[e[cand[todo]] < t[todo]]
    while len(todo):
        cand[todo] = parent[cand[todo]]
        todo = todo[cand[todo] >= 0]
        todo = todo[e[cand[todo]] < t[todo]]
    return np.where(cand >= 0, order[np.maximum(cand, 0)], -1)


def _enclosing(end: np.ndarray) -> np.ndarray:
    """For intervals sorted by (start, -end): the nearest previous one with end >= this end, or -1."""
    n = len(end)
    cand = np.arange(n, dtype=np.int64) - 1
    todo = np.flatnonzero(cand >= 0)
    todo = todo[end[cand[todo]] < end[todo]]
    while len(todo):
        cand[todo] = cand[cand[todo]]
        todo = todo[cand[todo] >= 0]
        todo = todo[end[cand[todo]] < end[todo]]
    return cand


registry.register(registry.Format(FORMAT, claims, load, rank_hint=registry.rank_of_file, named=_is_trace_name))

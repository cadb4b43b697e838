"""Render a ground-truth Trace as a Kineto / torch.profiler Chrome trace (docs/formats-reference.md §5), without memgate.

What the real files (tests/data/samples/torch/cpu_train_*.json) show and this writer reproduces:
- An object with a header (``schemaVersion``, ``deviceProperties``, ``baseTimeNanoseconds``,
  ``displayTimeUnit``) before ``traceEvents`` and ``traceName`` after it; events unsorted.
- One ``[memory]`` instant event per allocation (``Bytes`` > 0) and free (``Bytes`` < 0), with
  ``Addr``, ``Total Allocated`` after the event (*including* memory allocated before profiling:
  the hidden baseline and the blocks allocated before the window), ``Total Reserved`` (0 on CPU),
  ``Device Type`` (CPU 0, CUDA 1, NPU 20) and ``Device Id`` (-1 on CPU).
- ``ProfilerStep#N`` as ``X`` events (``cat: user_annotation``); on GPU also the device-side copy
  (``gpu_user_annotation``, shifted in time), which is not the step.
- Operators as ``cpu_op`` ``X`` events (``legacy_ops``: as torch <= 1.9 wrote them, ``cat: Operator``
  with the tid a string of the number the memory events write): each block's op spans its
  allocation, with an already finished child op inside it (so the innermost op *containing* the
  event is not simply the last one that started). Each block's events are on a thread of their
  own, so the op of an event is unambiguous even when several blocks share an instant; blocks
  without an op have none.
- ``ts``/``dur`` are µs with exactly 3 decimals, written as text the way Kineto formats them
  (``{us}.{ns:03}``): every ns instant is exact, so the comparison tolerance is 0 ns. With
  ``base_time`` they are relative to ``baseTimeNanoseconds``, otherwise µs since the epoch
  (16 integer digits, more than a float64 holds: a reader must not go through float).
- Memory events that share a ts keep their relative order when the events are shuffled (the
  order of the profiler's records is the only tie-break there is).
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from groundtruth import Trace

DEVICE_TYPES = {"cpu": 0, "cuda": 1, "npu": 20}
PID = 4242
CHILD_OP = "aten::t"


@dataclass(frozen=True)
class KinetoOptions:
    device: str = "cuda"  # cpu, cuda or npu
    gz: bool = False
    base_time: bool = True
    shuffle_seed: int | None = 0
    rank: int | None = None  # distributedInfo.rank
    legacy_ops: bool = False  # ops as Kineto wrote them before June 2021: cat Operator, tid "1000"


def device_label(trace: Trace, opts: KinetoOptions) -> str:
    return "cpu" if opts.device == "cpu" else f"{opts.device}:{trace.device_id}"


def writes_ops(trace: Trace) -> bool:
    """Does :func:`render` write an operator span (for a block allocated in the window with an op)?
    A trace without one has no op figures to measure."""
    return any(b.t_alloc is not None and b.op for b in trace.blocks)


def _us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


class _Raw(str):
    """A number already formatted as JSON text (so µs keep their 3 exact decimals)."""


def _dumps(value: Any) -> str:
    if isinstance(value, _Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",\n  ".join(_dumps(v) for v in value) + "]"
    return json.dumps(value)


def render(trace: Trace, opts: KinetoOptions) -> str:
    base = (trace.t_start // 1_000_000_000 - 1) * 1_000_000_000 if opts.base_time else 0

    def ts(t: int) -> _Raw:
        return _Raw(_us(t - base))

    device_type = DEVICE_TYPES[opts.device]
    device_id = -1 if opts.device == "cpu" else trace.device_id
    curve = trace.allocated_curve()
    reserved = trace.reserved_curve()
    index_of = {id(b): i for i, b in enumerate(trace.blocks)}
    memory: list[dict[str, Any]] = []
    for k, (t, kind, delta, block) in enumerate(trace.events()):
        i = index_of[id(block)]
        memory.append({
            "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": PID, "tid": 1000 + i,
            "ts": ts(t),
            "args": {"Total Reserved": 0 if opts.device == "cpu" else reserved[k + 1][1],
                     "Total Allocated": curve[k + 1][1], "Bytes": delta, "Device Id": device_id,
                     "Device Type": device_type, "Addr": 0x5600_0000_0000 + 4096 * i, "finished": False,
                     "Ev Idx": k},
        })
    ops: list[dict[str, Any]] = []
    cat = "Operator" if opts.legacy_ops else "cpu_op"
    for i, b in enumerate(trace.blocks):
        if b.t_alloc is None or not b.op:  # as writes_ops() says
            continue
        tid = str(1000 + i) if opts.legacy_ops else 1000 + i
        ops.append({"ph": "X", "cat": cat, "name": b.op, "pid": PID, "tid": tid, "ts": ts(b.t_alloc - 5),
                    "dur": _Raw("0.010"), "args": {"External id": i, "Ev Idx": i}})
        ops.append({"ph": "X", "cat": cat, "name": CHILD_OP, "pid": PID, "tid": tid,
                    "ts": ts(b.t_alloc - 3), "dur": _Raw("0.002"), "args": {"External id": i, "Ev Idx": i}})
    steps: list[dict[str, Any]] = []
    for n, start, end in trace.steps:
        steps.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "pid": PID, "tid": PID,
                      "ts": ts(start), "dur": _Raw(_us(end - start)), "args": {"External id": n}})
        if opts.device != "cpu":
            steps.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{n}", "pid": 0, "tid": 7,
                          "ts": ts(start + 1_000_000), "dur": _Raw(_us(end - start + 77)), "args": {}})
    other = [
        {"ph": "M", "name": "process_name", "ts": ts(trace.t_start), "pid": PID, "tid": 0, "args": {"name": "python"}},
        {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": ts(trace.t_end)},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
         "ts": ts(trace.t_start), "dur": _Raw(_us(trace.t_end - trace.t_start)), "args": {"Op count": 0}},
    ]
    events = memory + ops + steps + other
    if opts.shuffle_seed is not None:
        events = _shuffle(events, opts.shuffle_seed)
    header: dict[str, Any] = {"schemaVersion": 1, "deviceProperties": []}
    if opts.rank is not None:
        header["distributedInfo"] = {"backend": "nccl", "rank": opts.rank, "world_size": opts.rank + 1}
    header.update({"profile_memory": 1, "displayTimeUnit": "ms"})
    if opts.base_time:
        header["baseTimeNanoseconds"] = base
    body = ", ".join(f"{json.dumps(k)}: {_dumps(v)}" for k, v in header.items())
    return "{\n  " + body + ',\n  "traceEvents": ' + _dumps(events) + ',\n  "traceName": "trace.json"\n}\n'


def _shuffle(events: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """Shuffle, then put memory events that share a ts back in their original relative order."""
    order = list(range(len(events)))
    random.Random(seed).shuffle(order)
    shuffled = [events[k] for k in order]
    groups: dict[str, list[int]] = {}
    for pos, event in enumerate(shuffled):
        if event.get("name") == "[memory]":
            groups.setdefault(str(event["ts"]), []).append(pos)
    for positions in groups.values():
        originals = sorted(order[p] for p in positions)
        for pos, original in zip(sorted(positions), originals):
            shuffled[pos] = events[original]
    return shuffled


def write_trace(trace: Trace, directory: Path, opts: KinetoOptions, name: str = "trace") -> Path:
    text = render(trace, opts)
    if opts.gz:
        path = directory / f"{name}.pt.trace.json.gz"
        path.write_bytes(gzip.compress(text.encode("utf-8")))
    else:
        path = directory / f"{name}.pt.trace.json"
        path.write_text(text, encoding="utf-8")
    return path


# ---- the raw form of export_memory_timeline (torch.profiler._memory_profiler.export_memory_timeline_raw) ----

RAW_PREEXISTING, RAW_CREATE, RAW_DESTROY = 1, 2, 4  # torch.profiler._memory_profiler.Action values


def raw_timeline_rows(trace: Trace) -> list[list[int]]:
    """``[t_ns, action, bytes, category]`` rows as torch writes them, sorted by (t, action): memory from
    before the window (the hidden baseline, blocks allocated before it) as PREEXISTING rows at t = -1,
    each allocation a CREATE, each free a DESTROY of minus its size; categories 0..7 by block."""
    rows = [[-1, RAW_PREEXISTING, trace.hidden_baseline, 7]] if trace.hidden_baseline else []
    for i, b in enumerate(trace.blocks):
        rows.append([-1, RAW_PREEXISTING, b.size, i % 8] if b.t_alloc is None else [b.t_alloc, RAW_CREATE, b.size, i % 8])
        if b.t_free is not None:
            rows.append([b.t_free, RAW_DESTROY, -b.size, i % 8])
    rows.sort(key=lambda r: (r[0], r[1]))
    return rows


def write_raw_timeline(trace: Trace, directory: Path, name: str = "run", gz: bool = True) -> Path:
    """What ``prof.export_memory_timeline("run.raw.json.gz")`` writes (json.dump of the rows)."""
    text = json.dumps(raw_timeline_rows(trace))
    if gz:
        path = directory / f"{name}.raw.json.gz"
        path.write_bytes(gzip.compress(text.encode("utf-8")))
    else:
        path = directory / f"{name}.raw.json"
        path.write_text(text, encoding="utf-8")
    return path

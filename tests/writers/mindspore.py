"""Render a ground-truth Trace as MindSpore profiler output (docs/formats-reference.md §2), without memgate.

Layout: ``{worker}_{ts}_ascend_ms/profiler_info_{rank}.json``, ``ASCEND_PROFILER_OUTPUT/`` with
memory_record.csv (6 columns), operator_memory.csv, npu_module_mem.csv, step_trace_time.csv,
kernel_details.csv, and ``FRAMEWORK/cpu_ms_memory_record_{rank}.txt``. Also the older memory-tracker
files: ``operator_memory_{rank}.csv`` and ``rank_N/memory_block.csv``.

What the MindSpore writer does (mindspore/profiler/analysis/viewer/ascend_memory_viewer.py and
ascend_op_memory_viewer.py, mem_tracker.cc) and this one reproduces:
- memory_record.csv: ``MB = KB / 1000`` with ``KB = float(bytes) / 1024``, Python float text.
  MindSpore rows: ``Decimal(ns) / 1000`` µs (variable decimals, no TAB), ``Device Type NPU:{rank}``.
  GE rows: CANN's KB text and timestamp (3 decimals + TAB), Total Active 0, CANN's ``Device``.
  ``MindSpore+GE`` after every row (sum with the other component's last row, 0 before its first).
  APP rows last: npu_mem's ``memory(KB) / 1000``, Allocated and Active ``0.0``, timestamp without TAB.
  Rows here follow the ground truth's event order (the real writer sorts by time, GE first at ties).
- operator_memory.csv: one row per block MindSpore's allocator saw allocated (no GE, no release-only
  rows); missing = ``N/A``; sizes ``bytes / 1024``; totals ``bytes / 1024**2``; times ``ns / 1000``
  (``float_times``: Python float text as MindSpore writes it, exact only for whole µs; otherwise the
  exact decimal).
- The memory tracker prints with ``std::fixed << std::setprecision(1)``: sizes ``float32(bytes) /
  1024`` with one decimal, integer µs times, a trailing comma on every line.
Each component is its own caching allocator (2 MiB segments), like :meth:`Trace.reserved_by_allocator_curve`.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path

import numpy as np
from groundtruth import RESERVE_GRANULE, Trace, allocated_at

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
MEMORY_RECORD_HEADER = ["Component", "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)",
                        "Total Active(MB)", "Device Type"]
OPERATOR_MEMORY_HEADER = [
    "Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)", "Active Release Time(us)", "Duration(us)",
    "Active Duration(us)", "Allocation Total Allocated(MB)", "Allocation Total Reserved(MB)",
    "Allocation Total Active(MB)", "Release Total Allocated(MB)", "Release Total Reserved(MB)",
    "Release Total Active(MB)", "Stream Ptr", "Device Type",
]
NPU_MODULE_MEM_HEADER = ["Device_id", "Component", "Timestamp(us)", "Total Reserved(KB)", "Device"]
STEP_TRACE_HEADER = ["Step", "Computing", "Communication(Not Overlapped)", "Overlapped", "Communication", "Free",
                     "Stage", "Bubble", "Communication(Not Overlapped and Exclude Receive)", "Preparing"]
KERNEL_HEADER = ["Step ID", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)", "Wait Time(us)",
                 "Block Dim"]
CPU_RECORD_HEADER = ["Timestamp(ns)", "Total Allocated(Byte)", "Total Reserved(Byte)", "Total Active(Byte)"]
TRACKER_BASE = ["Name", "Size(KB)", "Allocation Time(us)", "Duration(us)"]
TRACKER_TOTALS = ["Allocation Total Allocated", "Allocation Total Reserved", "Release Total Allocated",
                  "Release Total Reserved"]
BLOCK_HEADER = ["start_time_stamp", "end_time_stamp", "device_addr", "stream_id", "pool_type", "size",
                "actual_peak_memory", "file_name", "line_num", "type", "producer_task", "task_name", "node_name",
                "graph_name", "user_tasks"]
NEVER_FREED = (1 << 63) - 1
MODULES = ("APP", "HCCL", "RUNTIME", "GE", "DVPP")  # DVPP: -1 (only releases seen)
NA = "N/A"


@dataclass(frozen=True)
class MsOptions:
    rank: int = 0
    memory_record: bool = True
    operator_memory: bool = True
    cpu_record: bool = True  # FRAMEWORK/cpu_ms_memory_record_{rank}.txt
    float_times: bool = False  # operator_memory times as float(ns / 1000) text
    steps: str = "kernel_details"  # "kernel_details", "step_trace_time" or "none"
    crlf: bool = True  # Python's csv module writes CRLF by default
    app_overhead: int = 512 << 20
    app_period_ns: int = 20_000_000


# -- cell text -----------------------------------------------------------------------------------------


def ms_mb(kb_value: float) -> str:
    """MindSpore's MB: ``float(KB) / 1000`` as Python float text."""
    return repr(float(kb_value) / 1000)


def kb(n_bytes: int) -> float:
    return float(n_bytes) / 1024


def us_decimal(t_ns: int) -> str:
    """``Decimal(ns) / 1000`` as MindSpore prints it: variable decimals, no TAB."""
    return str(Decimal(t_ns) / 1000)


def us_cann(t_ns: int, tab: bool = True) -> str:
    return f"{t_ns // 1000}.{t_ns % 1000:03d}" + ("\t" if tab else "")


def us_float(t_ns: int) -> str:
    return repr(t_ns / 1000)


def _roundup(n: int) -> int:
    return -(-n // RESERVE_GRANULE) * RESERVE_GRANULE


# -- simulation: each component its own caching allocator -------------------------------------------


@dataclass(frozen=True)
class State:
    t: int
    kind: int  # 1 alloc, 0 free
    block: int
    component: str
    level: int  # the component's allocated after the event
    high: int  # the component's reserved after the event


def simulate(trace: Trace, one_pool: bool = False) -> list[State]:
    """One state per event, in the ground truth's event order (frees before allocs at an instant).

    ``one_pool``: every block in one allocator (the memory tracker sees MindSpore's single pool).
    """
    if one_pool:
        trace = replace(trace, blocks=tuple(replace(b, component="PTA") for b in trace.blocks))
    events = []
    for i, b in enumerate(trace.blocks):
        if b.t_alloc is not None:
            events.append((b.t_alloc, 1, i))
        if b.t_free is not None:
            events.append((b.t_free, 0, i))
    events.sort(key=lambda e: (e[0], e[1]))
    level = {"PTA": trace.hidden_baseline, "GE": 0}
    for b in trace.blocks:
        if b.t_alloc is None:
            level[b.component] += b.size
    high = {c: _roundup(v) for c, v in level.items()}
    out = []
    for t, kind, i in events:
        c = trace.blocks[i].component
        level[c] += trace.blocks[i].size if kind == 1 else -trace.blocks[i].size
        high[c] = max(high[c], _roundup(level[c]))
        out.append(State(t, kind, i, c, level[c], high[c]))
    return out


def app_samples(trace: Trace, opts: MsOptions) -> list[tuple[int, int]]:
    """(t_ns, APP bytes): every ``app_period_ns``, the reserved of both allocators plus runtime overhead."""
    reserved = trace.reserved_by_allocator_curve()
    out, t = [], trace.t_start
    while t <= trace.t_end:
        out.append((t, allocated_at(reserved, t) + opts.app_overhead))
        t += opts.app_period_ns
    return out


def _write(path: Path, header: list[str], rows: list[list[str]], crlf: bool, trailing_comma: bool = False) -> None:
    eol = "\r\n" if crlf else "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if trailing_comma:  # the C++ writers: every field, header too, followed by a comma
        text = "".join(",".join(r) + "," + eol for r in [header, *rows])
        path.write_text(text, encoding="utf-8", newline="")
        return
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator=eol)
        writer.writerow(header)
        writer.writerows(rows)


# -- the *_ascend_ms directory ----------------------------------------------------------------------------


def profile_dir_name(trace: Trace, opts: MsOptions) -> str:
    return f"worker{opts.rank}_{trace.t_start // 1_000_000}{DIR_SUFFIX}"


DIR_SUFFIX = "_ascend_ms"


def memory_record_rows(trace: Trace, opts: MsOptions) -> list[list[str]]:
    rank_label = f"NPU:{opts.rank}"
    rows: list[list[str]] = []
    last = {"PTA": (0.0, 0.0, 0.0), "GE": (0.0, 0.0, 0.0)}  # (allocated, reserved, active) in KB
    for s in simulate(trace):
        if s.component == "PTA":
            values = (kb(s.level), kb(s.high), kb(s.level))
            t_text = us_decimal(s.t)
            rows.append(["MindSpore", t_text, ms_mb(values[0]), ms_mb(values[1]), ms_mb(values[2]), rank_label])
            time_us = Decimal(t_text)
        else:  # GE: CANN's KB text, taken back through float()
            ge_alloc, ge_res = repr(kb(s.level)), repr(kb(s.high))
            values = (float(ge_alloc), float(ge_res), 0.0)
            t_text = us_cann(s.t)
            rows.append(["GE", t_text, ms_mb(values[0]), ms_mb(values[1]), ms_mb(0), f"NPU:{trace.device_id}"])
            time_us = Decimal(t_text.strip())
        last[s.component] = values
        other = last["GE" if s.component == "PTA" else "PTA"]
        total = [values[k] + other[k] for k in range(3)]
        rows.append(["MindSpore+GE", str(time_us), ms_mb(total[0]), ms_mb(total[1]), ms_mb(total[2]), rank_label])
    for t, app in app_samples(trace, opts):
        rows.append(["APP", us_cann(t, tab=False), "0.0", ms_mb(float(repr(kb(app)))), "0.0", rank_label])
    return rows


def operator_memory_rows(trace: Trace, opts: MsOptions) -> list[list[str]]:
    """One row per MindSpore-allocator block allocated in the window, sorted by allocation time."""
    at_alloc: dict[int, State] = {}
    at_free: dict[int, State] = {}
    for s in simulate(trace):
        (at_alloc if s.kind == 1 else at_free)[s.block] = s
    stamp = us_float if opts.float_times else us_decimal
    rows = []
    order = sorted((i for i, b in enumerate(trace.blocks) if b.component == "PTA" and b.t_alloc is not None),
                   key=lambda i: trace.blocks[i].t_alloc or 0)
    for i in order:
        b = trace.blocks[i]
        a = at_alloc[i]
        assert b.t_alloc is not None
        f = at_free.get(i)
        duration = NA if b.t_free is None else (repr((b.t_free - b.t_alloc) / 1000) if opts.float_times
                                                  else us_decimal(b.t_free - b.t_alloc))
        rows.append([
            b.op, repr(b.size / 1024), stamp(b.t_alloc), NA if b.t_free is None else stamp(b.t_free), NA, duration, NA,
            repr(a.level / 1048576), repr(a.high / 1048576), repr(a.level / 1048576),
            NA if f is None else repr(f.level / 1048576), NA if f is None else repr(f.high / 1048576),
            NA if f is None else repr(f.level / 1048576), str(b.stream), f"NPU:{trace.device_id}",
        ])
    return rows


def write_profile(trace: Trace, root: Path, opts: MsOptions = MsOptions()) -> Path:
    """Write the ``*_ascend_ms`` directory under ``root`` and return it."""
    prof = root / profile_dir_name(trace, opts)
    out = prof / OUTPUT_DIR
    out.mkdir(parents=True)
    info = {"rank_id": opts.rank, "ms_version": "2.5.0", "cann_version": "8.0.RC3",
            "profiler_parameters": {"profile_memory": True, "activities": ["CPU", "NPU"]}}
    (prof / f"profiler_info_{opts.rank}.json").write_text(json.dumps(info, indent=4), encoding="utf-8")
    if opts.memory_record:
        _write(out / "memory_record.csv", MEMORY_RECORD_HEADER, memory_record_rows(trace, opts), opts.crlf)
    if opts.operator_memory:
        _write(out / "operator_memory.csv", OPERATOR_MEMORY_HEADER, operator_memory_rows(trace, opts), opts.crlf)
    module_rows = []
    for t, _ in app_samples(trace, opts):
        for k, name in enumerate(MODULES):
            value = "-1" if name == "DVPP" else repr(kb((k * 37 + 3) << 20))
            module_rows.append([str(trace.device_id), name, us_cann(t), value, f"NPU:{trace.device_id}"])
    _write(out / "npu_module_mem.csv", NPU_MODULE_MEM_HEADER, module_rows, opts.crlf)
    if opts.cpu_record:
        states = [s for s in simulate(trace) if s.component == "PTA"]
        rows = [[str(s.t), str(s.level), str(s.high), str(s.level)] for s in states]
        _write(prof / "FRAMEWORK" / f"cpu_ms_memory_record_{opts.rank}.txt", CPU_RECORD_HEADER, rows, crlf=False)
    steps = sorted(trace.steps)
    if opts.steps in ("kernel_details", "step_trace_time") and steps:
        rows = [[str(n), repr((e - s) / 1000 * 0.7), "0", "0", "0", repr((e - s) / 1000 * 0.3), "0", "0", "0", "0"]
                for n, s, e in steps]
        _write(out / "step_trace_time.csv", STEP_TRACE_HEADER, rows, opts.crlf)
    if opts.steps == "kernel_details" and steps:
        rows = []
        for n, s, e in steps:  # one kernel starting at the step start, one ending at its end
            half = (e - s) // 2
            rows.append([str(n), "MatMul-op1", "MatMul", "AI_CORE", us_decimal(s), us_decimal(half), "0", "8"])
            rows.append([str(n), "Add-op2", "Add", "AI_VECTOR_CORE", us_decimal(s + half), us_decimal(e - s - half),
                         "0", "8"])
        _write(out / "kernel_details.csv", KERNEL_HEADER, rows, opts.crlf)
    elif opts.steps == "kernel_details":  # no schedule: no Step ID column
        _write(out / "kernel_details.csv", KERNEL_HEADER[1:],
               [["Add-op2", "Add", "AI_CORE", us_decimal(trace.t_start), "1.5", "0", "8"]], opts.crlf)
    return prof


# -- memory tracker files ---------------------------------------------------------------------------------


def fixed1(value: float) -> str:
    """``std::fixed << std::setprecision(1)`` of a float32 value."""
    return f"{float(value):.1f}"


def f32_div(n: int, by: int) -> float:
    """``static_cast<float>(n) / by`` in float32."""
    return float(np.float32(np.float32(n) / np.float32(by)))


def write_tracker_dump(trace: Trace, folder: Path, rank: int, unit: str = "KB", cpu_record: bool = False) -> Path:
    """``operator_memory_{rank}.csv`` of MemoryTracker::DumpProfilingMemInfo (one pool, one device)."""
    per = 1024 if unit == "KB" else 1024 * 1024
    at_alloc: dict[int, State] = {}
    at_free: dict[int, State] = {}
    states = simulate(trace, one_pool=True)
    for s in states:
        (at_alloc if s.kind == 1 else at_free)[s.block] = s
    rows = []
    order = sorted((i for i, b in enumerate(trace.blocks) if b.t_alloc is not None),
                   key=lambda i: trace.blocks[i].t_alloc or 0)
    for i in order:
        b = trace.blocks[i]
        assert b.t_alloc is not None
        a, f = at_alloc[i], at_free.get(i)
        start_us = b.t_alloc // 1000
        rows.append([
            b.op, fixed1(f32_div(b.size, 1024)), str(start_us),
            "" if b.t_free is None else str(b.t_free // 1000 - start_us),
            fixed1(f32_div(a.level, per)), fixed1(f32_div(a.high, per)),
            fixed1(f32_div(f.level if f else 0, per)), fixed1(f32_div(f.high if f else 0, per)), "Ascend",
        ])
    header = TRACKER_BASE + [f"{t}({unit})" for t in TRACKER_TOTALS] + ["Device"]
    path = folder / f"operator_memory_{rank}.csv"
    _write(path, header, rows, crlf=False, trailing_comma=True)
    if cpu_record:
        rows = [[str(s.t), str(s.level), str(s.high), str(s.level)] for s in states]
        _write(folder / f"cpu_ms_memory_record_{rank}.txt", CPU_RECORD_HEADER, rows, crlf=False)
    return path


def write_memory_block(trace: Trace, folder: Path, last_user_task: bool = True, somas: bool = True) -> Path:
    """``memory_block.csv`` of MemoryTracker::Dump: logical counters, sizes in bytes, trailing commas.

    The counter ticks once per alloc/free in the ground truth's event order; a live block ends at
    INT64_MAX; every third block is a Somas block followed by two InSideSomas rows (start/end -1).
    """
    order: dict[tuple[int, int], int] = {}
    peak, level = 0, 0
    peaks: dict[int, int] = {}
    for counter, s in enumerate(simulate(trace), start=1):
        order[(s.block, s.kind)] = counter
        level += trace.blocks[s.block].size if s.kind == 1 else -trace.blocks[s.block].size
        peak = max(peak, level)
        if s.kind == 1:
            peaks[s.block] = peak
    header = BLOCK_HEADER + (["last_user_task"] if last_user_task else []) + ["python_stack"]
    rows = []
    for n, i in enumerate(sorted(peaks, key=lambda i: order[(i, 1)])):
        b = trace.blocks[i]
        start = order[(i, 1)]
        end = order.get((i, 0), NEVER_FREED)
        kind = "Somas" if somas and n % 3 == 2 else "Kernel"
        tail = ([str(end if end != NEVER_FREED else start)] if last_user_task else []) + [""]
        rows.append([str(start), str(end), f"0x12c0{i:08x}", str(b.stream % 8), "Ascend", str(b.size),
                     str(peaks[i]), "/ms/runtime/kernel_actor.cc", "214", kind, str(start), b.op, b.op,
                     "kernel_graph_1", f"{{{start}-}}", *tail])
        if kind == "Somas":
            half = b.size // 2
            for part in (half, b.size - half):
                rows.append(["-1", "-1", f"0x12c0{i:08x}", str(b.stream % 8), "Ascend", str(part), "0",
                             "/ms/backend/somas.cc", "88", "InSideSomas", str(start), "inner", "inner",
                             "kernel_graph_1", "{}", *tail])
    path = folder / "memory_block.csv"
    _write(path, header, rows, crlf=False, trailing_comma=True)
    return path

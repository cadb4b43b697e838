"""Render a ground-truth Trace as a torch_npu text export (docs/formats-reference.md §1), without memgate.

Layout written: ``{host}_{pid}_{ts}_ascend_pt/profiler_info[_{rank}].json`` (+ ``profiler_metadata.json``
for 2.6+) and ``ASCEND_PROFILER_OUTPUT/`` with memory_record.csv, operator_memory.csv,
npu_module_mem.csv, step_trace_time.csv and the step sources (trace_view.json and/or
kernel_details.csv).

What the real files (tests/data/samples/ascend) show and this writer reproduces:
- A PTA block's allocated total drops at its *Active Release Time* (the earlier of its two release times
  when no other stream uses it, as here); a second PTA row with no change
  follows at its *Release Time* (``Release Time >= Active Release Time``). GE blocks have one release
  time and empty Active columns.
- ``PTA+GE`` is written after every PTA and GE row: the sum of each component's last written value
  (0 before a component's first row), Total Active and Stream Ptr from PTA.
- ``Allocation/Release Total *`` of an operator_memory row are the block's own component's totals
  right after the event, so PTA's include memory allocated before profiling started.
- Sizes: KB = bytes/1024, MB = bytes/1024/1024, written as Python float text (``repr``): exact for
  integer bytes below 2**53. Timestamps: µs with 3 decimals followed by a TAB (ns exact).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from groundtruth import RESERVE_GRANULE, Block, Trace, allocated_at

OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
GENERATIONS = ("<2.1", "<=2.5", "2.6+")
STEP_SOURCES = ("trace_view", "kernel_details", "both")
CSV_FILES = ("memory_record.csv", "operator_memory.csv", "npu_module_mem.csv", "step_trace_time.csv",
             "kernel_details.csv")

MEMORY_RECORD_HEADER = ["Component", "Timestamp(us)", "Total Allocated(MB)", "Total Reserved(MB)",
                        "Total Active(MB)", "Stream Ptr", "Device Type"]
OPERATOR_MEMORY_HEADER = [
    "Name", "Size(KB)", "Allocation Time(us)", "Release Time(us)", "Active Release Time(us)", "Duration(us)",
    "Active Duration(us)", "Allocation Total Allocated(MB)", "Allocation Total Reserved(MB)",
    "Allocation Total Active(MB)", "Release Total Allocated(MB)", "Release Total Reserved(MB)",
    "Release Total Active(MB)", "Stream Ptr", "Device Type",
]
NPU_MODULE_MEM_HEADER = {"2.6+": ["Device_id", "Component", "Timestamp(us)", "Total Reserved(MB)", "Device"],
                         "<=2.5": ["Component", "Timestamp(us)", "Total Reserved(MB)", "Device"]}
NPU_MODULE_MEM_HEADER["<2.1"] = NPU_MODULE_MEM_HEADER["<=2.5"]
# Before 2.1 torch_npu wrote no Active columns and no Stream Ptr (MemoryViewParser.HEADERS_RECORD /
# HEADERS_OPERATOR of that source), and its times were float text without a TAB.
BEFORE_2_1_ABSENT = frozenset({"Total Active(MB)", "Stream Ptr", "Active Release Time(us)", "Active Duration(us)",
                               "Allocation Total Active(MB)", "Release Total Active(MB)"})
_STEP_TRACE = ["Step", "Computing", "Communication(Not Overlapped)", "Overlapped", "Communication", "Free", "Stage",
               "Bubble", "Communication(Not Overlapped and Exclude Receive)", "Preparing"]
STEP_TRACE_TIME_HEADER = {"2.6+": ["Device_id", *_STEP_TRACE], "<=2.5": _STEP_TRACE, "<2.1": _STEP_TRACE[:-1]}
_KERNEL_TAIL = ["Model ID", "Task ID", "Stream ID", "Name", "Type", "Accelerator Core", "Start Time(us)",
                "Duration(us)", "Wait Time(us)", "Block Dim", "Mix Block Dim", "Input Shapes", "Input Data Types",
                "Input Formats", "Output Shapes", "Output Data Types", "Output Formats"]
MODULES = ("SLOG", "APP", "HCCL")  # of 78 CANN module names; enough to exercise the reader


@dataclass(frozen=True)
class NpuOptions:
    """The writer's free choices (drawn by ``strategies.npu_options``)."""

    rank: int = 0
    generation: str = "2.6+"  # header generation of npu_module_mem / step_trace_time / kernel_details
    step_source: str = "both"  # trace_view.json, kernel_details.csv or both
    memory_record: bool = True  # False: blocks only (operator_memory.csv), no allocator series
    release_delay_ns: int = 0  # Release Time - Active Release Time of PTA blocks
    release_rows: bool = True  # the no-change PTA row at Release Time
    info_suffix: bool = True  # profiler_info_{rank}.json rather than profiler_info.json
    crlf: frozenset[str] = field(default_factory=frozenset)  # CSV files written with CRLF line ends
    app_overhead: int = 512 << 20  # APP (whole process) reserved above the framework's reserved
    app_period_ns: int = 20_000_000  # APP sampling period (~20 ms)


# -- text of one cell ------------------------------------------------------------------------------

def us(t_ns: int) -> str:
    """A timestamp cell: µs with 3 decimals and a TAB, as torch_npu writes it."""
    return f"{t_ns // 1000}.{t_ns % 1000:03d}\t"


def us_plain(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def mb(n_bytes: int) -> str:
    return repr(n_bytes / 1024 / 1024)


def kb(n_bytes: int) -> str:
    return repr(n_bytes / 1024)


def _roundup(n: int) -> int:
    return -(-n // RESERVE_GRANULE) * RESERVE_GRANULE


# -- the simulation shared by memory_record and operator_memory ------------------------------------

@dataclass(frozen=True)
class Rendered:
    """The rows of the two memory files, and the APP samples written (for the tests)."""

    memory_record: list[list[str]]
    operator_memory: list[list[str]]
    app: list[tuple[int, int]]  # (t_ns, APP reserved bytes)


def app_samples(trace: Trace, opts: NpuOptions) -> list[tuple[int, int]]:
    """APP rows: every ``app_period_ns`` over the window, the device reserved plus runtime overhead."""
    reserved = trace.reserved_by_allocator_curve()
    out = []
    t = trace.t_start
    while t <= trace.t_end:
        out.append((t, allocated_at(reserved, t) + opts.app_overhead))
        t += opts.app_period_ns
    return out


def render(trace: Trace, opts: NpuOptions) -> Rendered:
    device = f"NPU:{trace.device_id}"
    blocks = trace.blocks
    # Events in the ground truth's order: time, frees before allocs, then block order.
    events: list[tuple[int, int, int]] = []  # (t, kind, block index)
    for i, b in enumerate(blocks):
        if b.t_alloc is not None:
            events.append((b.t_alloc, 1, i))
        if b.t_free is not None:
            events.append((b.t_free, 0, i))
    events.sort(key=lambda e: (e[0], e[1]))

    level = {"PTA": trace.hidden_baseline, "GE": 0}
    for b in blocks:
        if b.t_alloc is None:
            level[b.component] += b.size
    high = {c: _roundup(v) for c, v in level.items()}
    after_alloc: dict[int, tuple[int, int]] = {}  # block -> (allocated, reserved) of its component
    after_free: dict[int, tuple[int, int]] = {}

    # Records in time order: real events first at an instant, then PTA "release complete" rows.
    records: list[tuple[int, int, int, int, int]] = []  # (t, 0 event | 1 release row, seq, kind, block)
    for seq, (t, kind, i) in enumerate(events):
        records.append((t, 0, seq, kind, i))
        if kind == 0 and blocks[i].component == "PTA" and opts.release_rows:
            records.append((t + release_delay(opts), 1, seq, kind, i))
    records.sort(key=lambda r: (r[0], r[1], r[2]))

    mem_rows: list[list[str]] = []
    last: dict[str, tuple[int, int]] = {}  # component -> (allocated, reserved) last written
    pta_active, pta_stream = "", ""
    for t, release_row, _, kind, i in records:
        b = blocks[i]
        c = b.component
        if not release_row:
            level[c] += b.size if kind == 1 else -b.size
            high[c] = max(high[c], _roundup(level[c]))
            (after_alloc if kind == 1 else after_free)[i] = (level[c], high[c])
        last[c] = (level[c], high[c])
        if c == "PTA":
            pta_active, pta_stream = mb(level[c]), str(b.stream)
            mem_rows.append(["PTA", us(t), mb(level[c]), mb(high[c]), pta_active, pta_stream, device])
        else:
            mem_rows.append([c, us(t), mb(level[c]), mb(high[c]), "", "", device])
        total = sum(v[0] for v in last.values())
        total_reserved = sum(v[1] for v in last.values())
        mem_rows.append(["PTA+GE", us(t), mb(total), mb(total_reserved), pta_active, pta_stream, device])
    app = app_samples(trace, opts)
    app_rows = [["APP", us(t), "", mb(r), "", "", device] for t, r in app]

    op_rows = []
    order = sorted(range(len(blocks)), key=lambda i: (
        blocks[i].component != "PTA",  # PTA rows, then GE rows
        blocks[i].t_alloc is not None,  # release-only rows first
        blocks[i].t_alloc or 0,
    ))
    for i in order:
        op_rows.append(_operator_row(blocks[i], after_alloc.get(i), after_free.get(i), opts, device))
    return Rendered(app_rows + mem_rows, op_rows, app)


def release_delay(opts: NpuOptions) -> int:
    """Release Time - Active Release Time of PTA blocks; before 2.1 the one Release Time is the free."""
    return 0 if opts.generation == "<2.1" else opts.release_delay_ns


def _operator_row(b: Block, alloc: tuple[int, int] | None, free: tuple[int, int] | None,
                  opts: NpuOptions, device: str) -> list[str]:
    ge = b.component == "GE"
    row = dict.fromkeys(OPERATOR_MEMORY_HEADER, "")
    row["Device Type"] = device
    if not ge:
        row["Stream Ptr"] = str(b.stream)
    if b.t_alloc is None:  # allocated before the window: negative size, no Name, no Allocation columns
        row["Size(KB)"] = kb(-b.size)
        if ge and opts.generation == "<2.1":  # GE rows came from CANN with their cann:: name, always
            row["Name"] = b.op
    else:
        assert alloc is not None
        row["Name"] = b.op
        row["Size(KB)"] = kb(b.size)
        row["Allocation Time(us)"] = us(b.t_alloc)
        row["Allocation Total Allocated(MB)"] = mb(alloc[0])
        row["Allocation Total Reserved(MB)"] = mb(alloc[1])
        if not ge:
            row["Allocation Total Active(MB)"] = mb(alloc[0])
    if b.t_free is not None:  # never freed inside the window: every Release column stays empty
        assert free is not None
        if ge:
            row["Release Time(us)"] = us(b.t_free)
            if b.t_alloc is not None:
                row["Duration(us)"] = repr(round((b.t_free - b.t_alloc) / 1000, 3))  # GE: a float, no TAB
        else:
            released = b.t_free + release_delay(opts)
            row["Release Time(us)"] = us(released)
            row["Active Release Time(us)"] = us(b.t_free)
            if b.t_alloc is not None:
                row["Duration(us)"] = us(released - b.t_alloc)
                row["Active Duration(us)"] = us(b.t_free - b.t_alloc)
            row["Release Total Active(MB)"] = mb(free[0])
        row["Release Total Allocated(MB)"] = mb(free[0])
        row["Release Total Reserved(MB)"] = mb(free[1])
    return [row[c] for c in OPERATOR_MEMORY_HEADER]


# -- files ---------------------------------------------------------------------------------------------

def _write_csv(path: Path, header: list[str], rows: list[list[str]], opts: NpuOptions) -> None:
    newline = "\r\n" if path.name in opts.crlf else "\n"
    if opts.generation == "<2.1":  # the columns that writer had, its times without a TAB
        kept = [k for k, column in enumerate(header) if column not in BEFORE_2_1_ABSENT]
        header = [header[k] for k in kept]
        rows = [[row[k].rstrip("\t") for k in kept] for row in rows]
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator=newline)
        writer.writerow(header)
        writer.writerows(rows)


def profile_dir_name(trace: Trace, opts: NpuOptions) -> str:
    return f"host-{opts.rank}_{4000 + opts.rank}_{trace.t_start // 1_000_000}_ascend_pt"


def write_profile(trace: Trace, root: Path, opts: NpuOptions = NpuOptions()) -> Path:
    """Write the profile under ``root`` and return its ``*_ascend_pt`` directory."""
    prof = root / profile_dir_name(trace, opts)
    out = prof / OUTPUT_DIR
    out.mkdir(parents=True)
    new = opts.generation == "2.6+"
    _write_info(prof, trace, opts)
    rendered = render(trace, opts)
    if opts.memory_record:
        _write_csv(out / "memory_record.csv", MEMORY_RECORD_HEADER, rendered.memory_record, opts)
    _write_csv(out / "operator_memory.csv", OPERATOR_MEMORY_HEADER, rendered.operator_memory, opts)

    module_rows = []
    for name_i, name in enumerate(MODULES):
        for t, _ in rendered.app:
            row = [name, us(t), mb((name_i * 37 + 3) << 20), device_label(trace)]
            module_rows.append(([str(trace.device_id)] if new else []) + row)
    _write_csv(out / "npu_module_mem.csv", NPU_MODULE_MEM_HEADER[opts.generation], module_rows, opts)

    step_rows = []
    for number, start, end in sorted(trace.steps) or [(None, trace.t_start, trace.t_end)]:
        length = (end - start) / 1000
        cells = [str(number) if number is not None else "", repr(length * 0.6), repr(length * 0.3),
                 repr(length * 0.1), repr(length * 0.4), repr(length * 0.1), repr(length), "0", repr(length * 0.3),
                 repr(17.5)]
        if opts.generation == "<2.1":  # no Preparing column then
            cells.pop()
        step_rows.append(([str(trace.device_id)] if new else []) + cells)
    _write_csv(out / "step_trace_time.csv", STEP_TRACE_TIME_HEADER[opts.generation], step_rows, opts)

    if opts.step_source in ("trace_view", "both"):
        _write_trace_view(out / "trace_view.json", trace, opts)
    if opts.step_source in ("kernel_details", "both"):
        _write_kernel_details(out / "kernel_details.csv", trace, opts)
    return prof


def device_label(trace: Trace) -> str:
    return f"NPU:{trace.device_id}"


def _write_info(prof: Path, trace: Trace, opts: NpuOptions) -> None:
    new = opts.generation == "2.6+"
    info: dict[str, object] = {
        "config": {
            "common_config": {
                "activities": ["ProfilerActivity.CPU", "ProfilerActivity.NPU"],
                "schedule": {"wait": 0, "active": max(len(trace.steps), 1), "warmup": 1, "repeat": 1,
                             "skip_first": min((s[0] for s in trace.steps), default=1) - 1},
                "record_shapes": True, "profile_memory": True, "with_stack": False, "with_flops": False,
                "with_modules": False,
            },
            "experimental_config": {"_profiler_level": "Level1", "_aic_metrics": "ACL_AICORE_PIPE_UTILIZATION",
                                    "_l2_cache": False, "_data_simplification": True, "record_op_args": False,
                                    "_export_type": ["text"] if new else "text", "_op_attr": False,
                                    "_gc_detect_threshold": None},
        },
        "start_info": {"syscnt_enable": True, "freq": 100, "start_cnt": 470002538790308,
                       "start_monotonic": 4699801002845430},
        "end_info": {"collectionTimeEnd": trace.t_end, "MonotonicTimeEnd": 4699802061975030},
    }
    if new:
        info["torch_npu_version"] = "2.7.1"
        info["cann_version"] = "8.3.RC1"
    info["rank_id"] = str(opts.rank) if new else opts.rank  # a string in 2.7.1, an int before
    name = f"profiler_info_{opts.rank}.json" if opts.info_suffix else "profiler_info.json"
    (prof / name).write_text(json.dumps(info, indent=4), encoding="utf-8")
    if new:
        meta = {"ENV_VARIABLES": {"ASCEND_GLOBAL_LOG_LEVEL": "3", "PYTORCH_NPU_ALLOC_CONF": ""}}
        (prof / "profiler_metadata.json").write_text(json.dumps(meta), encoding="utf-8")


def _write_trace_view(path: Path, trace: Trace, opts: NpuOptions) -> None:
    """A JSON array; ProfilerStep#N are X events with ts a string (µs) and dur a float (µs)."""
    pid = 4000 + opts.rank
    events: list[dict[str, object]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "Python"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "args": {"name": f"Thread {pid}"}},
    ]
    for number, start, end in trace.steps:
        events.append({"ph": "X", "name": f"ProfilerStep#{number}", "pid": pid, "tid": pid, "ts": us_plain(start),
                       "dur": (end - start) / 1000, "cat": "cpu_op", "args": {"Sequence number": -1}})
        events.append({"ph": "X", "name": "aten::mm", "pid": pid, "tid": pid, "ts": us_plain(start),
                       "dur": (end - start) / 2000, "cat": "cpu_op", "args": {"Sequence number": -1}})
    path.write_text(json.dumps(events), encoding="utf-8")


def _write_kernel_details(path: Path, trace: Trace, opts: NpuOptions) -> None:
    """Two kernels per step: one starting at the step start, one ending at the step end."""
    with_steps = bool(trace.steps)
    header = (["Step Id"] if with_steps else []) + (["Device_id"] if opts.generation == "2.6+" else []) + _KERNEL_TAIL
    rows = []
    spans = trace.steps or ((None, trace.t_start, trace.t_end),)
    for number, start, end in spans:
        third = (end - start) // 3
        for k_start, k_dur, name in ((start, third, "aclnnMm_MatMulCommon_MatMulV2"),
                                     (start + third, end - start - third, "aclnnAdd_AddAiCore_Add")):
            row = ([str(number)] if with_steps else []) + ([str(trace.device_id)] if opts.generation == "2.6+" else [])
            row += ["4294967295", "34473", "2", name, name.split("_")[-1], "AI_CORE", us(k_start), us_plain(k_dur),
                    "0", "40", "0", '"1,4096;4096,1024"', "DT_BF16;DT_BF16", "ND;ND", '"1,1024"', "DT_BF16", "ND"]
            rows.append(row)
    _write_csv(path, header, rows, opts)

"""Render ground-truth Traces as a CANN msprof text export (docs/formats-reference.md §3), without memgate.

``PROF_{n}_{ts}_{id}/mindstudio_profiler_output/{kind}_{ts}.csv`` (every device's rows in one set of
files) or ``PROF_*/device_N/summary/{kind}_{ts}.csv`` (one set per device); ``slices > 1`` splits every
file into ``{kind}_slice_{i}_{ts}.csv`` pieces, each with the header.

CANN sees one allocator (GE): every block of the trace is a GE block here, whatever its component,
so the ``GE`` series is the trace's whole allocated curve and reserved is its running maximum in
2 MiB segments (:meth:`Trace.reserved_curve`). Sizes: KB = bytes / 1024 as Python float text
(exact); times: µs with 3 decimals and a TAB. operator_memory has no Release Time: the release is
Allocation Time + Duration (µs, 3 decimals, no TAB).

Conventions (``unfreed``): ``"empty"`` — older CANN: an unfreed block has Duration and both Release
totals empty, and a block allocated before profiling and freed inside it is a release-only row
(negative Size, empty Name and Allocation totals, its release time in Allocation Time);
``"zero"`` — newer CANN: ``0`` in those three cells, and no release-only rows.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from groundtruth import RESERVE_GRANULE, Trace

OPERATOR_MEMORY_HEADER = ["Device_id", "Name", "Size(KB)", "Allocation Time(us)", "Duration(us)",
                          "Allocation Total Allocated(KB)", "Allocation Total Reserved(KB)",
                          "Release Total Allocated(KB)", "Release Total Reserved(KB)", "Device"]
MEMORY_RECORD_HEADER = ["Device_id", "Component", "Timestamp(us)", "Total Allocated(KB)", "Total Reserved(KB)",
                        "Device"]
NPU_MEM_HEADER = ["Device_id", "event", "ddr(KB)", "hbm(KB)", "memory(KB)", "timestamp(us)"]
NPU_MODULE_MEM_HEADER = ["Device_id", "Component", "Timestamp(us)", "Total Reserved(KB)", "Device"]
STATIC_OP_MEM_HEADER = ["Device_id", "Op Name", "Model Name", "Graph ID", "Node Index Start", "Node Index End",
                        "Size(KB)"]
HEADERS = {"operator_memory": OPERATOR_MEMORY_HEADER, "memory_record": MEMORY_RECORD_HEADER,
           "npu_mem": NPU_MEM_HEADER, "npu_module_mem": NPU_MODULE_MEM_HEADER, "static_op_mem": STATIC_OP_MEM_HEADER}
MODULES = ("APP", "HCCL", "RUNTIME", "DRV", "SLOG")
# A static graph: (op, node index start, node index end, bytes); the TOTAL row follows.
STATIC_GRAPH = (("Conv2D", 1, 4, 3 << 20), ("Relu", 3, 6, 1 << 20), ("MatMulV2", 5, 4294967295, 7 << 20))
STATIC_TOTAL = 9 << 20  # planned with reuse: less than the sum of the ops


@dataclass(frozen=True)
class CannOptions:
    layout: str = "mindstudio"  # "mindstudio" or "device"
    slices: int = 1
    unfreed: str = "empty"  # "empty" (older CANN) or "zero" (newer CANN)
    ts: str = "20250114093025"
    static_graph: bool = True
    stale_export: bool = False  # an older export of memory_record next to the latest one
    app_overhead: int = 300 << 20
    device_overhead: int = 2 << 30  # other processes on the device
    crlf: bool = False
    app_period_ns: int = 20_000_000


def kb(n_bytes: int) -> str:
    return repr(n_bytes / 1024)


def us(t_ns: int, tab: bool = True) -> str:
    return f"{t_ns // 1000}.{t_ns % 1000:03d}" + ("\t" if tab else "")


def _roundup(n: int) -> int:
    return -(-n // RESERVE_GRANULE) * RESERVE_GRANULE


def raw_name(op: str) -> str:
    """The name CANN writes (memgate shows it as ``cann::{name}``)."""
    return op.removeprefix("cann::")


def rows_of(trace: Trace, opts: CannOptions) -> dict[str, list[list[str]]]:
    """Every file's rows for one device."""
    dev, label = str(trace.device_id), f"NPU:{trace.device_id}"
    events = []
    for i, b in enumerate(trace.blocks):
        if b.t_alloc is not None:
            events.append((b.t_alloc, 1, i))
        if b.t_free is not None:
            events.append((b.t_free, 0, i))
    events.sort(key=lambda e: (e[0], e[1]))
    level = trace.hidden_baseline + sum(b.size for b in trace.blocks if b.t_alloc is None)
    high = _roundup(level)
    after: dict[tuple[int, int], tuple[int, int]] = {}
    record = []
    for t, kind, i in events:
        level += trace.blocks[i].size if kind == 1 else -trace.blocks[i].size
        high = max(high, _roundup(level))
        after[(i, kind)] = (level, high)
        record.append([dev, "GE", us(t), kb(level), kb(high), label])

    zero = opts.unfreed == "zero"
    operator = []
    for i, b in enumerate(trace.blocks):
        if b.t_alloc is None:
            if zero or b.t_free is None:
                continue  # newer CANN drops release-only rows
            rel = after[(i, 0)]
            operator.append([dev, "", kb(-b.size), us(b.t_free), "", "", "", kb(rel[0]), kb(rel[1]), label])
            continue
        alloc = after[(i, 1)]
        if b.t_free is None:
            duration, rel_a, rel_r = ("0", "0", "0") if zero else ("", "", "")
        else:
            d = b.t_free - b.t_alloc
            duration = f"{d // 1000}.{d % 1000:03d}"
            rel_a, rel_r = kb(after[(i, 0)][0]), kb(after[(i, 0)][1])
        operator.append([dev, raw_name(b.op), kb(b.size), us(b.t_alloc), duration, kb(alloc[0]), kb(alloc[1]),
                         rel_a, rel_r, label])

    npu_mem, modules = [], []
    for t, app in app_samples(trace, opts):
        for event, value in (("APP", app), ("Device", app + opts.device_overhead)):
            npu_mem.append([dev, event, "0.0", kb(value), kb(value), us(t)])
        for k, name in enumerate(MODULES):
            modules.append([dev, name, us(t), "-1" if name == "SLOG" else kb((k * 29 + 5) << 20), label])
    static = []
    if opts.static_graph:
        for op, start, end, size in STATIC_GRAPH:
            static.append([dev, op, "0", "1", str(start), str(end), kb(size)])
        static.append([dev, "TOTAL", "0", "1", "", "", kb(STATIC_TOTAL)])
    return {"operator_memory": operator, "memory_record": record, "npu_mem": npu_mem, "npu_module_mem": modules,
            "static_op_mem": static}


def app_samples(trace: Trace, opts: CannOptions) -> list[tuple[int, int]]:
    """(t_ns, APP bytes): every ``app_period_ns``, the GE reserved plus the runtime overhead."""
    curve = trace.reserved_curve()
    out, t, k, value = [], trace.t_start, 0, curve[0][1]
    while t <= trace.t_end:
        while k < len(curve) and curve[k][0] <= t:
            value = curve[k][1]
            k += 1
        out.append((t, value + opts.app_overhead))
        t += opts.app_period_ns
    return out


def _write(path: Path, header: list[str], rows: list[list[str]], crlf: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\r\n" if crlf else "\n")
        writer.writerow(header)
        writer.writerows(rows)


def _write_kind(folder: Path, kind: str, rows: list[list[str]], opts: CannOptions) -> None:
    if not rows:
        return
    if opts.slices <= 1:
        _write(folder / f"{kind}_{opts.ts}.csv", HEADERS[kind], rows, opts.crlf)
        return
    per = -(-len(rows) // opts.slices)
    for k in range(opts.slices):
        piece = rows[k * per:(k + 1) * per]
        if piece:
            _write(folder / f"{kind}_slice_{k}_{opts.ts}.csv", HEADERS[kind], piece, opts.crlf)


def prof_dir_name(opts: CannOptions) -> str:
    return f"PROF_000001_{opts.ts}123_QWERTYASDFGH"


def write_prof(traces: list[Trace], root: Path, opts: CannOptions = CannOptions()) -> Path:
    """Write one PROF directory holding every trace's device and return it."""
    prof = root / prof_dir_name(opts)
    per_device = [rows_of(t, opts) for t in traces]
    if opts.layout == "mindstudio":
        folders = [(prof / "mindstudio_profiler_output", per_device)]
    else:
        folders = [(prof / f"device_{t.device_id}" / "summary", [rows]) for t, rows in zip(traces, per_device)]
    for folder, parts in folders:
        folder.mkdir(parents=True, exist_ok=True)
        for kind in HEADERS:
            _write_kind(folder, kind, [row for part in parts for row in part[kind]], opts)
        if opts.stale_export:  # an earlier export: must be ignored
            _write(folder / "memory_record_20000101000000.csv", MEMORY_RECORD_HEADER,
                   [[str(traces[0].device_id), "GE", us(traces[0].t_start), kb(1 << 40), kb(1 << 40), "NPU:0"]],
                   opts.crlf)
    (prof / "host").mkdir(exist_ok=True)
    return prof

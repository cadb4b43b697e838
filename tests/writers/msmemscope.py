"""Render a ground-truth :class:`groundtruth.Trace` as an msMemScope dump (docs/formats-reference.md §6).

The trace's blocks are one PTA caching allocator of one process on ``npu:<device_id>``:

- every block → ``MALLOC`` / ``FREE`` rows of Event Type PTA, Attr
  ``{allocation_id:N,addr:0x…,size:S,total:R,used:U}`` (used/total = the pool's allocated /
  reserved after the event, hidden baseline included; reserved = running max of allocated rounded
  up to 2 MiB); addresses are reused like a caching allocator reuses them (latest freed first), so
  a reader must pair by address *in time order*;
- a block with an op → ``OP_LAUNCH`` ``ATEN_START`` / ``ATEN_END`` rows named by the op around its
  MALLOC on the same thread;
- every step → one ``SYSTEM`` ``STEP`` row (Name = step number) at its start; ``START_TRACE`` /
  ``STOP_TRACE`` at the window's ends. msMemScope has no step end: a step ends where the next one
  starts and the last one at STOP_TRACE, so :func:`as_written` gives the trace a reader can see;
- rows come out as the tool writes them: memory rows grouped per allocation (a MALLOC right before
  its FREE, at the FREE's place; never-freed MALLOCs at the end), device-less SYSTEM rows last.

``old=True`` writes the 2025-04 fixture layout: decimal Ptr, no allocation_id, ``owner:`` empty,
negative FREE sizes and 16-digit µs values under ``Timestamp(ns)`` (so the trace's times must be
whole µs). :func:`write_db` writes table ``memscope_dump`` of ``memscope_dump_{ts}.db`` with Attr
as the tool stores it there (JSON, quoted keys and string values).
"""

from __future__ import annotations

import csv
import sqlite3
from dataclasses import dataclass, replace
from pathlib import Path

from groundtruth import RESERVE_GRANULE, Trace

HEADER = ["ID", "Event", "Event Type", "Name", "Timestamp(ns)", "Process Id", "Thread Id", "Device Id", "Ptr", "Attr",
          "Call Stack(Python)", "Call Stack(C)"]
PID = 3101864
TID = 3101864


@dataclass(frozen=True)
class Row:
    id: int
    event: str
    event_type: str
    name: str
    t: int
    device: str
    ptr: str
    attr: dict[str, str] | None
    block: int | None = None  # index of the block a memory row belongs to


def _connect(path: Path) -> sqlite3.Connection:
    """A fresh db; the real writers' journal/fsync settings do not matter to a reader."""
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    return conn


def as_written(trace: Trace) -> Trace:
    """The trace as an msMemScope reader sees it: each step ends where the next starts, the last at
    the window's end."""
    steps = sorted(trace.steps)
    ends = [s[1] for s in steps[1:]] + [trace.t_end]
    return replace(trace, steps=tuple((n, start, end) for (n, start, _), end in zip(steps, ends)))


def rows_of(trace: Trace, *, old: bool = False) -> list[Row]:
    if any(b.component != "PTA" for b in trace.blocks):
        raise ValueError("msMemScope has no GE pool: render PTA-only traces")
    level = trace.hidden_baseline + sum(b.size for b in trace.blocks if b.t_alloc is None)
    high = -(-level // RESERVE_GRANULE) * RESERVE_GRANULE
    dev = str(trace.device_id)
    index = {id(b): i for i, b in enumerate(trace.blocks)}
    address: dict[int, int] = {}
    free_list: list[int] = []
    next_addr = 0x12C041200000
    for i, b in enumerate(trace.blocks):
        if b.t_alloc is None:  # live since before the window: its address is taken
            address[i] = next_addr
            next_addr += 0x200000
    timeline: list[tuple[int, int, str, int | None]] = []  # (t, order, what, block)
    for t, kind, _delta, b in trace.events():
        timeline.append((t, 1 + kind, "alloc" if kind else "free", index[id(b)]))
    for number, start, _end in trace.steps:
        timeline.append((start, 0, f"step:{number}", None))
    timeline.sort(key=lambda e: (e[0], e[1]))
    rows: list[Row] = []
    next_id = 2  # 1 is START_TRACE

    def add(event: str, sub: str, name: str, t: int, device: str, ptr: str, attr: dict[str, str] | None,
            block: int | None = None) -> None:
        nonlocal next_id
        rows.append(Row(next_id, event, sub, name, t, device, ptr, attr, block))
        next_id += 1

    def fmt_ptr(addr: int) -> str:
        return str(addr) if old else f"0x{addr:016x}"

    for t, _order, what, i in timeline:
        if i is None:
            add("SYSTEM", "STEP", what.split(":")[1], t, dev, "N/A", None)
            continue
        b = trace.blocks[i]
        if what == "alloc":
            level += b.size
            high = max(high, -(-level // RESERVE_GRANULE) * RESERVE_GRANULE)
            address[i] = free_list.pop() if free_list else next_addr
            if address[i] == next_addr:
                next_addr += 0x200000
        else:
            level -= b.size
            free_list.append(address[i])
        attr = {} if old else {"allocation_id": str(i + 1)}
        attr["addr"] = fmt_ptr(address[i])
        attr["size"] = str(-b.size if (old and what == "free") else b.size)
        if old:
            attr["owner"] = ""
        attr["total"] = str(high)
        attr["used"] = str(level)
        if what == "alloc" and b.op:
            add("OP_LAUNCH", "ATEN_START", b.op, t, dev, "N/A", None)
        add("MALLOC" if what == "alloc" else "FREE", "PTA", "N/A", t, dev, fmt_ptr(address[i]), attr, i)
        if what == "alloc" and b.op:
            add("OP_LAUNCH", "ATEN_END", b.op, t, dev, "N/A", None)
    rows.insert(0, Row(1, "SYSTEM", "START_TRACE", "N/A", trace.t_start, "N/A", "N/A", None))
    rows.append(Row(next_id, "SYSTEM", "STOP_TRACE", "N/A", trace.t_end, "N/A", "N/A", None))
    return _as_dumped(rows)


def _as_dumped(rows: list[Row]) -> list[Row]:
    """The tool's file order: a MALLOC is written with its FREE; open MALLOCs and device-less rows last."""
    freed = {r.block for r in rows if r.event == "FREE"}
    held: dict[int, Row] = {}
    out: list[Row] = []
    tail: list[Row] = []
    for r in rows:
        if r.event == "MALLOC" and r.block in freed:
            held[r.block] = r  # type: ignore[index]
        elif r.event == "FREE" and r.block in held:
            out += [held.pop(r.block), r]  # type: ignore[arg-type]
        elif r.event == "MALLOC":
            tail.append(r)
        elif r.device == "N/A":
            continue
        else:
            out.append(r)
    shared = [r for r in rows if r.event == "SYSTEM" and r.device == "N/A"]
    return out + tail[::-1] + shared


def attr_text(attr: dict[str, str] | None, *, json_style: bool = False) -> str:
    if attr is None:
        return ""
    if json_style:
        return "{" + ",".join(f'"{k}":"{v}"' for k, v in attr.items()) + "}"
    return "{" + ",".join(f"{k}:{v}" for k, v in attr.items()) + "}"


def timestamp(t: int, old: bool) -> int:
    if old:
        if t % 1000:
            raise ValueError("the old layout writes µs: the trace's times must be whole µs")
        return t // 1000
    return t


def write_csv(trace: Trace, path: Path, *, old: bool = False) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(HEADER)
        for r in rows_of(trace, old=old):
            writer.writerow([r.id, r.event, r.event_type, r.name, timestamp(r.t, old), PID, TID, r.device, r.ptr,
                             attr_text(r.attr), "", ""])
    return path


def write_db(trace: Trace, path: Path) -> Path:
    conn = _connect(path)
    try:
        conn.execute('CREATE TABLE memscope_dump ("ID" INTEGER, "Event" TEXT, "Event Type" TEXT, "Name" TEXT, '
                     '"Timestamp(ns)" INTEGER, "Process Id" INTEGER, "Thread Id" INTEGER, "Device Id" TEXT, '
                     '"Ptr" TEXT, "Attr" TEXT)')
        conn.executemany("INSERT INTO memscope_dump VALUES (?,?,?,?,?,?,?,?,?,?)", [
            (r.id, r.event, r.event_type, r.name, r.t, PID, TID, r.device, r.ptr, attr_text(r.attr, json_style=True))
            for r in rows_of(trace)
        ])
        conn.commit()
    finally:
        conn.close()
    return path

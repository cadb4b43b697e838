"""Render a ground-truth Trace as a PyTorch memory snapshot pickle (docs/formats-reference.md §4), without memgate.

Three eras, as real files have them:
- ``modern``: ``time_us`` on every entry, ``free_requested`` then ``free_completed``, blocks with
  ``address``/``frames``, one expandable segment that grows by ``segment_map`` entries,
  ``allocator_settings`` and ``ProfilerStep#N`` START/END ``external_annotations``.
- ``no_time``: the same without ``time_us`` and without annotations (torch 2.0/2.1).
- ``legacy``: no ``time_us``, the single ``free`` action, blocks without ``address`` that carry
  ``history: [{addr, real_size, frames}]``, a plain segment reserved before the window.

How the truth maps onto the file:
- One trace entry per ground-truth event, in :meth:`Trace.events` order (frees before allocs at the
  same instant). Allocation and free sizes are the requested sizes (the block sizes of the truth).
- Blocks allocated before the window appear only as frees; ``hidden_baseline`` is one
  ``active_allocated`` block of the final segment that the trace never mentions; blocks live at
  the end are ``active_allocated`` blocks of the final segment at the address of their ``alloc``.
- Reserved (the truth's 2 MiB-granule running max) is the segment's mapped size: mapped before the
  window up to the first level, then one ``segment_map`` right after each allocation that raises
  it (legacy: the whole peak is reserved before the window, so only the peak is comparable).
- ``op``: ATen ops become a C++ frame ``at::_ops::<name>::call(...)`` (what the CUDA allocator's
  stacks show); other names (``npu::``, ``atb::``, ``cann::``) have no such frame and are not
  recoverable from a snapshot. :func:`recoverable_ops` says which are.
- Time: ``time_us`` is whole µs. :func:`on_microsecond_grid` moves a trace's instants onto a 1 µs
  grid keeping their order and ties, which changes none of its metrics (they depend on order only),
  so the file holds every instant exactly.
- torch_npu (``device="npu"``): ``PYTORCH_NPU_ALLOC_CONF`` in ``allocator_settings``, a
  ``workspace_snapshot`` marker and, with ``front_workspace``, the GE blocks' entries moved to the
  *front* of the trace (the loader must sort by ``time_us``); only entries at an instant no other
  event shares are moved, as a real workspace allocation is never tied with a PTA one.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from groundtruth import Trace

ERAS = ("modern", "no_time", "legacy")
SEGMENT_ADDRESS = 0x7F00_0000_0000
SCRATCH_ADDRESS = 0x7E00_0000_0000  # where blocks freed inside the window lived


@dataclass(frozen=True)
class SnapshotOptions:
    era: str = "modern"
    device: str = "cuda"  # or "npu"
    front_workspace: bool = False
    protocol: int = 4
    markers: bool = True  # a final 'snapshot' marker entry, and compile_context on every entry (newest torch)


def on_microsecond_grid(trace: Trace) -> Trace:
    """The same trace with every distinct instant moved to a whole µs, order and ties kept."""
    instants = {trace.t_start, trace.t_end}
    for b in trace.blocks:
        instants.update(t for t in (b.t_alloc, b.t_free) if t is not None)
    for _, start, end in trace.steps:
        instants.update((start, end))
    origin = (min(instants) // 1_000_000) * 1_000_000
    grid = {t: origin + 1000 * (k + 1) for k, t in enumerate(sorted(instants))}

    def move(t: int | None) -> int | None:
        return None if t is None else grid[t]

    blocks = tuple(replace(b, t_alloc=move(b.t_alloc), t_free=move(b.t_free)) for b in trace.blocks)
    steps = tuple((n, grid[s], grid[e]) for n, s, e in trace.steps)
    return replace(trace, blocks=blocks, steps=steps, t_start=grid[trace.t_start], t_end=grid[trace.t_end])


def recoverable_ops(trace: Trace) -> dict[str, int]:
    """op → largest block, for the ops a snapshot's frames can name (ATen ops)."""
    ops: dict[str, int] = {}
    for b in trace.blocks:
        if b.t_alloc is not None and b.op.startswith("aten::"):
            ops[b.op] = max(ops.get(b.op, 0), b.size)
    return ops


def frames_for(op: str) -> list[dict[str, Any]]:
    """A CUDA-allocator-like stack: allocator internals, the ATen op, then Python frames."""
    frames: list[dict[str, Any]] = [
        {"name": "torch::unwind::unwind()", "filename": "??", "line": 0},
        {"name": "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, unsigned long, "
                 "CUstream_st*)", "filename": "CUDACachingAllocator.cpp", "line": 0},
    ]
    if op.startswith("aten::"):
        name = op[len("aten::"):]
        frames.append({"name": f"at::_ops::{name}::call(at::Tensor const&)", "filename": "??", "line": 0})
    frames.append({"name": "forward", "filename": "/work/model.py", "line": 42})
    return frames


def write_snapshot(trace: Trace, directory: Path, opts: SnapshotOptions, name: str = "snapshot.pickle") -> Path:
    path = directory / name
    path.write_bytes(pickle.dumps(render(trace, opts), protocol=opts.protocol))
    return path


def render(trace: Trace, opts: SnapshotOptions) -> dict[str, Any]:
    timed = opts.era == "modern"
    legacy = opts.era == "legacy"
    blocks = trace.blocks
    address: dict[int, int] = {}
    live_at_end = [i for i, b in enumerate(blocks) if b.t_free is None and b.t_alloc is not None]
    # The final segment: hidden baseline block, then the blocks still live, then free space.
    cursor = SEGMENT_ADDRESS + trace.hidden_baseline
    for i in live_at_end:
        address[i] = cursor
        cursor += blocks[i].size
    scratch = SCRATCH_ADDRESS
    for i, b in enumerate(blocks):
        if i not in address:
            address[i] = scratch
            scratch += b.size + 512
    index_of = {id(b): i for i, b in enumerate(blocks)}

    reserved = trace.reserved_curve()
    high = max(r for _, r in reserved)
    entries: list[dict[str, Any]] = []
    front: list[dict[str, Any]] = []
    event_times = [t for t, *_ in trace.events()]
    shared = {t for t in event_times if event_times.count(t) > 1}
    mapped = reserved[0][1] if not legacy else high
    for k, (t, kind, _, block) in enumerate(trace.events()):
        i = index_of[id(block)]
        base: dict[str, Any] = {"addr": address[i], "size": block.size, "stream": block.stream}
        if timed:
            base["time_us"] = t // 1000
        if kind == 1:
            new = [{"action": "alloc", **base, "frames": frames_for(block.op)}]
        elif legacy:
            new = [{"action": "free", **base, "frames": []}]
        else:
            new = [{"action": "free_requested", **base, "frames": []},
                   {"action": "free_completed", **base, "frames": []}]
        if opts.markers and timed:
            for entry in new:
                entry["compile_context"] = "N/A"
        target = front if (opts.front_workspace and timed and block.component == "GE" and t not in shared) else entries
        target.extend(new)
        level = reserved[k + 1][1]
        if not legacy and level > mapped:
            grow = {"action": "segment_map", "addr": SEGMENT_ADDRESS + mapped, "size": level - mapped,
                    "stream": block.stream, "frames": []}
            if timed:
                grow["time_us"] = t // 1000
            entries.append(grow)
            mapped = level
    if opts.markers:
        marker: dict[str, Any] = {"action": "snapshot", "addr": 0, "size": 0, "stream": 0}
        if timed:
            marker["time_us"] = trace.t_end // 1000
        entries.append(marker)
    if opts.device == "npu":
        workspace: dict[str, Any] = {"action": "workspace_snapshot", "addr": 0, "size": 0, "stream": 0}
        if timed:
            workspace["time_us"] = trace.t_start // 1000
        front.insert(0, workspace)
    trace_entries = front + entries

    segments = []
    if high:
        seg_blocks: list[dict[str, Any]] = []

        def block_entry(addr: int, size: int, state: str, frames: list[dict[str, Any]]) -> dict[str, Any]:
            if legacy:
                return {"size": size, "requested_size": size, "state": state,
                        "history": [{"addr": addr, "real_size": size, "frames": frames}] if state != "inactive" else []}
            return {"address": addr, "size": size, "requested_size": size, "state": state, "frames": frames}

        if trace.hidden_baseline:
            seg_blocks.append(block_entry(SEGMENT_ADDRESS, trace.hidden_baseline, "active_allocated", []))
        for i in live_at_end:
            seg_blocks.append(block_entry(address[i], blocks[i].size, "active_allocated", frames_for(blocks[i].op)))
        used = cursor - SEGMENT_ADDRESS
        if high > used:
            seg_blocks.append(block_entry(cursor, high - used, "inactive", []))
        active = used
        segment: dict[str, Any] = {
            "device": trace.device_id, "address": SEGMENT_ADDRESS, "total_size": high, "allocated_size": active,
            "active_size": active, "requested_size": active, "stream": trace.blocks[0].stream if trace.blocks else 0,
            "segment_type": "large", "blocks": seg_blocks,
        }
        if not legacy:
            segment.update({"segment_pool_id": (0, 0), "is_expandable": True, "frames": []})
        segments.append(segment)
    snapshot: dict[str, Any] = {
        "segments": segments,
        "device_traces": [[] for _ in range(trace.device_id)] + [trace_entries],
    }
    if not legacy:
        conf = "PYTORCH_NPU_ALLOC_CONF" if opts.device == "npu" else "PYTORCH_CUDA_ALLOC_CONF"
        snapshot["allocator_settings"] = {conf: "expandable_segments:True", "max_split_size": -1,
                                          "expandable_segments": True}
    if timed:
        snapshot["external_annotations"] = [
            {"name": f"ProfilerStep#{n}", "stage": stage, "device": trace.device_id, "time_us": t // 1000}
            for n, start, end in trace.steps for stage, t in (("START", start), ("END", end))
        ]
    return snapshot


def expected_block_count(trace: Trace) -> int:
    """Blocks memgate should list: every truth block, plus one for the hidden baseline when there is one."""
    return len(trace.blocks) + (1 if trace.hidden_baseline else 0)


__all__ = ["ERAS", "SnapshotOptions", "expected_block_count", "frames_for", "on_microsecond_grid",
           "recoverable_ops", "render", "write_snapshot"]

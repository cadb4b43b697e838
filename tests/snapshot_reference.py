"""An independent reading of a PyTorch memory snapshot for the snapshot tests (plain loops over the raw
pickle, never memgate's code): the memory viewer's reconstruction, the caching allocator's block sizes
replayed (:func:`block_replay`), the samples by era."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

from helpers import SAMPLES, sample_pickle

TORCH = Path(__file__).parent / "data" / "samples" / "torch"
CUDA_LEAK = SAMPLES / "torch_cuda" / "h200_snapshot_leak" / "snapshot.pickle"
PICKLES = sorted(TORCH.glob("*.pickle"))
MODERN = TORCH / "snapshot_modern_small_cs336.pickle"
LEGACY = TORCH / "snapshot_legacy_history_flexgen.pickle"
EORNN = TORCH / "snapshot_mid_timeus_noallocsettings_eornn.pickle"
MULTI = TORCH / "snapshot_multidevice_expandable_notrace.pickle"


raw = sample_pickle  # the name the other snapshot tests import


# ---- an independent reading of a snapshot (plain loops) -----------------------------------------


def requested_size(block: dict[str, Any]) -> int:
    if block.get("requested_size") is not None:
        return int(block["requested_size"])
    if block.get("history"):
        return int(block["history"][0]["real_size"])
    return int(block["size"])


def final_active(data: dict[str, Any], dev: int, *, blocks: bool = False) -> dict[int, int]:
    """address → requested size (``blocks``: the allocator's block size) of every active_allocated block of
    the device's final segments."""
    out = {}
    for seg in data["segments"]:
        if seg["device"] != dev:
            continue
        addr = seg["address"]
        for block in seg["blocks"]:
            where = block.get("address", addr)
            if block["state"] == "active_allocated":
                out[where] = block["size"] if blocks else requested_size(block)
            addr += block["size"]
    return out


def _in_time_order(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    moving = [e for e in entries if e["action"] not in ("snapshot", "oom", "workspace_snapshot")]
    if moving and all("time_us" in e for e in moving):
        return sorted(moving, key=lambda e: e["time_us"])
    return moving


# The caching allocator's rules (c10/cuda/CUDACachingAllocator.cpp), written out here: what
# torch.cuda.memory_allocated() counts is the block each request got, not the request.
_MIB = 1 << 20  # kSmallSize: a rounded request up to it comes from the small pool (2 MiB segments)


def torch_round(size: int, divisions: list[int]) -> int:
    """round_size: below 512 B → 512; up to a multiple of 512; with roundup_power2_divisions ``n`` > 1 for
    the size's interval ([1 MiB, 2 MiB) is interval 0, and everything below it too), up to the next of
    ``n`` equal parts of the size's power-of-two range (a power of two stays)."""
    if size < 512:
        return 512
    log2 = size.bit_length() - 1
    n = divisions[min(max(log2 - 20, 0), len(divisions) - 1)]
    if n > 1 and size > 512 * n:
        if size & (size - 1) == 0:
            return size
        part = (1 << log2) >> (n.bit_length() - 1)
        return -(-size // part) * part if part else 2 << log2
    return -(-size // 512) * 512


def allocator_rules(data: dict[str, Any]) -> tuple[list[int], int, bool]:
    """(divisions per interval, max_split_size, expandable) from the snapshot's allocator_settings."""
    settings = data.get("allocator_settings") or {}
    divisions = [0] * 16
    for mib, n in (settings.get("roundup_power2_divisions") or {}).items():  # keyed by the interval's start in MiB
        divisions[int(mib).bit_length() - 1] = n
    split = settings.get("max_split_size")
    expandable = settings.get("expandable_segments") is True or any(s.get("is_expandable") for s in data["segments"])
    return divisions, split if isinstance(split, int) and split > 0 else 1 << 62, expandable


def block_replay(data: dict[str, Any], dev: int) -> list[tuple[dict[str, Any], int | None]]:
    """(entry, the allocator block it allocates or frees; None for other entries) of the device's trace in
    time order. A request rounded to at most 1 MiB, or in expandable segments, gets its rounded size; a
    larger one gets the free block that starts at its address in the large pool, less the rest when that
    rest is over 1 MiB and the request is below max_split_size. The large pool is replayed from the
    window's start: the final segments, less those the trace allocates, plus those it frees, occupied by
    the blocks that no trace alloc accounts for (their final size) and free elsewhere; a block freed at
    free_completed merges with its free neighbours."""
    divisions, max_split, expandable = allocator_rules(data)
    traces = data.get("device_traces") or []
    entries = _in_time_order(list(traces[dev]) if dev < len(traces) else [])
    if not allocator_written(data):  # no caching allocator's file: its sizes are the blocks, nothing rounds
        moves = ("alloc", "free_requested", "free_completed", "free")
        return [(e, e["size"] if e["action"] in moves else None) for e in entries]
    allocated_here = {e["addr"] for e in entries if e["action"] == "alloc"}
    segments = {s["address"]: s for s in data["segments"] if s["device"] == dev}
    for e in reversed(entries):
        if e["action"] == "segment_alloc":
            segments.pop(e["addr"], None)
        elif e["action"] == "segment_free":
            segments[e["addr"]] = {"address": e["addr"], "total_size": e["size"], "blocks": []}
    layout: dict[int, dict[int, list[Any]]] = {}  # large segment → block start → [size, free]
    for start, seg in segments.items():
        kind = seg.get("segment_type")
        if seg.get("is_expandable") or (kind == "small" if kind else seg["total_size"] <= 2 * _MIB):
            continue
        blocks, cursor = {}, start
        for b in seg["blocks"]:
            at = b.get("address", cursor)
            if b["state"].startswith("active") and at not in allocated_here:
                blocks[at] = [b["size"], False]
            cursor += b["size"]
        cursor = start
        for at in sorted(blocks):  # the gaps between them are free blocks
            if at > cursor:
                blocks[cursor] = [at - cursor, True]
            cursor = at + blocks[at][0]
        if cursor < start + seg["total_size"]:
            blocks[cursor] = [start + seg["total_size"] - cursor, True]
        layout[start] = blocks

    def segment_of(addr: int) -> dict[int, list[Any]] | None:
        for start, blocks in layout.items():
            if start <= addr < start + sum(size for size, _ in blocks.values()):
                return blocks
        return None

    out: list[tuple[dict[str, Any], int | None]] = []
    held: dict[int, int] = {}
    for e in entries:
        action, addr = e["action"], e["addr"]
        block: int | None = None
        if action == "alloc":
            block = torch_round(e["size"], divisions)
            if block > _MIB and not expandable:
                blocks = segment_of(addr)
                assert blocks is not None and blocks.get(addr, [0, False])[1], f"no free block at {addr:#x}"
                whole = blocks[addr][0]
                assert whole >= block, (whole, block)
                if block < max_split and whole - block > _MIB:
                    blocks[addr + block] = [whole - block, True]
                else:
                    block = whole
                blocks[addr] = [block, False]
            held[addr] = block
        elif action in ("free_requested", "free_completed", "free"):
            if addr not in held:  # allocated before the window: its extent is known only in the small pool
                block = torch_round(e["size"], divisions)
                assert block <= _MIB or expandable, "a large block from before the window: replay the whole history"
                held[addr] = block
            block = held[addr]
            if action != "free_requested":
                del held[addr]
                blocks = segment_of(addr)
                if blocks is not None and addr in blocks and not blocks[addr][1]:
                    blocks[addr][1] = True
                    starts = sorted(blocks)
                    i = starts.index(addr)
                    if i + 1 < len(starts) and blocks[starts[i + 1]][1]:
                        blocks[addr][0] += blocks.pop(starts[i + 1])[0]
                    if i > 0 and blocks[starts[i - 1]][1]:
                        blocks[starts[i - 1]][0] += blocks.pop(addr)[0]
        elif action == "segment_alloc" and e["size"] > 2 * _MIB and not expandable:
            layout[addr] = {addr: [e["size"], True]}
        elif action == "segment_free":
            layout.pop(addr, None)
        out.append((e, block))
    return out


def _op(entry: dict[str, Any]) -> str | None:
    for frame in entry.get("frames", []):
        name = frame["name"]
        if name.startswith("at::_ops::") and ("::call(" in name or "::redispatch(" in name):
            return "aten::" + name[len("at::_ops::"):].split("::")[0]
    return None


def level_curves(data: dict[str, Any], dev: int) -> dict[str, Any]:
    """The device's levels at the window's start and after each entry of :func:`block_replay`:
    ``allocated`` in the allocator's blocks (the blocks live through the window at their final size),
    ``requested`` by the memory viewer's reconstruction (the requested sizes), ``reserved`` rebuilt from
    the final segments; ``at_peak``: the blocks live when ``allocated`` first peaks; the block count and ops
    (largest block)."""
    replayed = block_replay(data, dev)
    opened: set[int] = set()
    early: dict[int, tuple[int, int]] = {}  # address → (block, requested) of the frees without an alloc
    count = 0
    ops: dict[str, int] = {}
    for e, block in replayed:
        if e["action"] == "alloc":
            opened.add(e["addr"])
            count += 1
            if (op := _op(e)) is not None:
                ops[op] = max(ops.get(op, 0), block)
        elif e["action"] in ("free_requested", "free"):
            if e["addr"] in opened:
                opened.remove(e["addr"])
            else:
                early[e["addr"]] = (block, e["size"])
                count += 1
    final, final_blocks = final_active(data, dev), final_active(data, dev, blocks=True)
    through = [a for a in final if a not in opened]
    requested = sum(r for _, r in early.values()) + sum(final[a] for a in through)
    holders = {("early", a): b for a, (b, _) in early.items()}
    holders.update({("through", a): final_blocks[a] for a in through})
    total = sum(s["total_size"] for s in data["segments"] if s["device"] == dev)
    sign_of = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}
    reserved = total - sum(sign_of.get(e["action"], 0) * e["size"] for e, _ in replayed)
    level = sum(holders.values())
    out: dict[str, Any] = {"allocated": [level], "requested": [requested], "reserved": [reserved],
                           "at_peak": sorted(holders.values()), "blocks": count + len(through), "ops": ops}
    key_of: dict[int, Any] = {a: ("early", a) for a in early}
    best = level
    for n, (e, block) in enumerate(replayed):
        action, addr = e["action"], e["addr"]
        if action == "alloc":
            key_of[addr] = ("trace", n)
            holders[key_of[addr]] = block
            level += block
            requested += e["size"]
        elif action in ("free_requested", "free"):
            del holders[key_of.pop(addr)]
            level -= block
            requested -= e["size"]
        reserved += sign_of.get(action, 0) * e["size"]
        if level > best:
            best, out["at_peak"] = level, sorted(holders.values())
        out["allocated"].append(level)
        out["requested"].append(requested)
        out["reserved"].append(reserved)
    return out


def reference(data: dict[str, Any], dev: int) -> dict[str, Any]:
    """Peaks, block count, ops, the level at the end and the blocks live at the (first) allocated peak:
    ``peak_requested_bytes`` and ``end_requested`` by the memory viewer's reconstruction (the requested
    sizes), the others in the allocator's blocks (:func:`level_curves`)."""
    levels = level_curves(data, dev)
    return {"peak_allocated_bytes": max(levels["allocated"]), "peak_requested_bytes": max(levels["requested"]),
            "peak_reserved_bytes": max(levels["reserved"]), "blocks": levels["blocks"], "ops": levels["ops"],
            "end_allocated": levels["allocated"][-1], "end_requested": levels["requested"][-1],
            "at_peak": levels["at_peak"]}


def allocator_written(data: dict[str, Any]) -> bool:
    """Whether the final blocks are the caching allocator's (multiples of 512 B); _profile_to_snapshot
    (kineto_cpu_profile_to_snapshot.pickle) writes the requested sizes of a CPU profile instead."""
    return all(b["size"] % 512 == 0 for s in data["segments"] for b in s["blocks"])


def as_dict(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else {"segments": data, "device_traces": []}


def devices_of(data: dict[str, Any]) -> list[int]:
    devs = {s["device"] for s in data["segments"]} | {i for i, t in enumerate(data.get("device_traces") or []) if t}
    return sorted(devs)


def has_history(data: dict[str, Any]) -> bool:
    """Whether any device trace records an event (a lone 'snapshot' marker is not history)."""
    return any(e.get("action") != "snapshot" for t in data.get("device_traces") or [] for e in t)


def assert_no_history(m: Any) -> None:
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation", "step_growth_bytes", "leaked_bytes"):
        assert m.values[key] is None, key
        assert "_record_memory_history" in m.missing[key], m.missing[key]
    assert m.values["top_at_peak"] == []
    assert (m.peak_t_ns, m.peak_step) == (None, None)  # no peak: no moment or step of it either
    # the pools break fragmentation down: at the dump alone 1 - allocated/reserved is the cache kept
    assert m.pools == {} and m.pool_of == {}


# ---- written cases ----------------------------------------------------------------------------------


def block_dict(size: int, state: str, requested: int | None = None) -> dict[str, Any]:
    return {"size": size, "state": state, "requested_size": size if requested is None else requested}


def segment_dict(device: int, address: int, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    at = address
    for block in blocks:
        block["address"] = at
        at += block["size"]
    # the small pool's segments are 2 MiB, the large pool's larger
    return {"device": device, "address": address, "total_size": at - address, "stream": 0,
            "segment_type": "small" if at - address <= 2 << 20 else "large", "blocks": blocks}


def write_pickle(tmp_path: Path, data: Any, name: str = "snap.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(data))
    return path

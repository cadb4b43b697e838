"""Generate large, realistic profiler output for the benchmarks by scaling the real samples' shapes.

    python benchmarks/generate.py [--out /tmp/memgate-bench] [--scale 1.0] [--only csv,trace_view,...] [--force]

What ``--scale 1`` writes under ``OUT/scale-1/`` (each item is generated once and reused; a stamp
file records the parameters it was made with):

- ``csv/``: one torch_npu profile (``*_ascend_pt/ASCEND_PROFILER_OUTPUT/``) with a
  ``memory_record.csv`` of 10M rows (APP rows first, then PTA / PTA+GE pairs with repeated
  timestamps) and an ``operator_memory.csv`` of 5M rows (15 columns, op names drawn with the
  frequencies of the torch_npu 2.7.1 sample, 1% never freed, allocation and release totals the
  allocator's running total, as real blocks agree on one baseline); µs text with 3 decimals and a TAB,
  MB/KB as exact decimals of byte counts, like torch_npu writes them.
- ``trace_view/``: a torch_npu profile whose ``trace_view.json`` is a 1 GB JSON array: the
  torch_npu 2.1 sample's 8,375 events (cpu_op / python_function spans, flows, ``NPU MEM`` counters,
  ``ProfilerStep#N``) repeated with shifted times and step numbers, metadata events once.
- ``kineto/rank0.pt.trace.json``: a 1 GB Kineto trace (object with ``traceEvents``), the torch 2.13
  CPU sample's events (``[memory]`` instants, cpu_ops, ``ProfilerStep#N``) repeated the same way,
  in Kineto's indented layout.
- ``snapshot/snapshot_rank0.pickle``: a caching-allocator snapshot with 1M trace entries
  (alloc / free_requested / free_completed cycles on recycled addresses, segment_alloc first,
  ProfilerStep annotations, one frames list per entry over shared frame dicts, as in torch's own
  pickles) whose final ``segments`` agree with the trace.
- ``ranks64/``: 64 torch_npu rank directories with 50k memory_record and 25k operator_memory rows
  each.

Everything is written column-wise with numpy and pyarrow (no per-row Python) except the snapshot's
trace entries, which are Python dicts by nature (one list comprehension, ~1 s per million).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import pickle
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "tests" / "data" / "samples"
PTA271 = SAMPLES / "ascend" / "msinsight_st_pta271_level2_rank0"
TRACE_VIEW_SAMPLE = SAMPLES / "ascend" / "msinsight_pta21_level0_rank0" / "trace_view.json"
KINETO_SAMPLE = SAMPLES / "torch" / "cpu_train_profile_memory.json"
SNAPSHOT_SAMPLES = (SAMPLES / "torch" / "snapshot_newest_compile_context_windows_decomfl.pickle",
                    SAMPLES / "torch" / "snapshot_mid_timeus_noallocsettings_eornn.pickle")
DEFAULT_OUT = Path("/tmp/memgate-bench")
GENERATOR_VERSION = 1
# snapshot 2: one frames list per trace entry, like torch's own pickles; csv and ranks64 2: operator_memory's
# allocation and release totals are the allocator's (blocks and totals agree, as in real profiles)
ITEM_VERSIONS = {"snapshot": 3, "csv": 2, "ranks64": 2, "kineto": 2}
ITEMS = ("csv", "trace_view", "kineto", "snapshot", "ranks64")

# Full-scale sizes (× --scale).
MEMORY_RECORD_ROWS = 10_000_000
OPERATOR_MEMORY_ROWS = 5_000_000
TRACE_VIEW_BYTES = 1 << 30
KINETO_BYTES = 1 << 30
SNAPSHOT_ENTRIES = 1_000_000
RANKS = 64
RANK_MEMORY_RECORD_ROWS = 50_000
RANK_OPERATOR_MEMORY_ROWS = 25_000

MEMORY_RECORD_HEADER = ("Component,Timestamp(us),Total Allocated(MB),Total Reserved(MB),Total Active(MB),"
                        "Stream Ptr,Device Type")
OPERATOR_MEMORY_HEADER = ("Name,Size(KB),Allocation Time(us),Release Time(us),Active Release Time(us),Duration(us),"
                          "Active Duration(us),Allocation Total Allocated(MB),Allocation Total Reserved(MB),"
                          "Allocation Total Active(MB),Release Total Allocated(MB),Release Total Reserved(MB),"
                          "Release Total Active(MB),Stream Ptr,Device Type")
T0_NS = 1_764_246_877_074_330_300  # the 2.7.1 sample's first PTA timestamp
BASE_ALLOCATED = 4304 * (1 << 20)  # bytes allocated before the window, as in the 2.7.1 sample
CHUNK_ROWS = 1 << 20


# ---- exact decimal text, vectorized ---------------------------------------------------------------


def _s(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def us_text(t_ns: np.ndarray, tab: bool = True) -> pa.Array:
    """ns → ``"1764246877082702.440\\t"`` (µs, 3 decimals, TAB as torch_npu writes it)."""
    frac = pc.utf8_lpad(_s(t_ns % 1000), 3, "0")
    text = pc.binary_join_element_wise(_s(t_ns // 1000), frac, ".")
    return pc.binary_join_element_wise(text, pa.scalar(""), "\t") if tab else text


def unit_text(nbytes: np.ndarray, shift: int) -> pa.Array:
    """Bytes → the exact decimal of ``bytes / 2**shift`` (MB: shift 20, KB: shift 10); bytes are multiples of 512.

    ``k / 2**e`` = ``k * 5**e / 10**e``: the fraction is an e-digit integer, trailing zeros trimmed.
    """
    units = nbytes >> 9
    e = shift - 9
    whole = units >> e
    frac = (units & ((1 << e) - 1)) * (5 ** e)
    digits = pc.utf8_rtrim(pc.utf8_lpad(_s(frac), e, "0"), "0")
    digits = pc.if_else(pc.equal(digits, ""), "0", digits)
    sign = np.where(nbytes < 0, "-", "")
    text = pc.binary_join_element_wise(_s(np.abs(whole) if (nbytes < 0).any() else whole), digits, ".")
    return pc.binary_join_element_wise(pa.array(sign), text, "") if (nbytes < 0).any() else text


def _null_where(text: pa.Array, mask: np.ndarray) -> pa.Array:
    return pc.if_else(pa.array(mask), pa.nulls(len(text), pa.string()), text) if mask.any() else text


def write_csv(path: Path, header: str, n: int, chunk: Callable[[int, int], dict[str, pa.Array]]) -> None:
    """Write ``n`` rows produced ``CHUNK_ROWS`` at a time by ``chunk(start, stop)`` (text columns, null = empty)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(header.encode() + b"\n")
        options = pacsv.WriteOptions(include_header=False, quoting_style="none", batch_size=1 << 16)
        for start in range(0, n, CHUNK_ROWS):
            columns = chunk(start, min(n, start + CHUNK_ROWS))
            pacsv.write_csv(pa.table(columns), fh, options)
    tmp.replace(path)


# ---- torch_npu CSVs -------------------------------------------------------------------------------


def _op_names(rng: np.random.Generator, n: int) -> np.ndarray:
    """Op names with the frequencies of the 2.7.1 sample's operator_memory.csv (plus rare unnamed rows)."""
    import csv

    with open(PTA271 / "operator_memory.csv", newline="", encoding="utf-8-sig") as fh:
        counts = collections.Counter(row["Name"] for row in csv.DictReader(fh))
    names = np.array(list(counts), dtype=object)
    weights = np.array(list(counts.values()), dtype=np.float64)
    return names[rng.choice(len(names), size=n, p=weights / weights.sum())]


def memory_record(path: Path, n: int, seed: int, device: int = 0) -> None:
    """APP rows (every 20 ms) first, then PTA / PTA+GE pairs with the same values and timestamp."""
    rng = np.random.default_rng(seed)
    n_app = max(1, n // 450)  # the 2.7.1 sample: 41 APP rows in 18,659
    n_pairs = (n - n_app) // 2
    n_app = n - 2 * n_pairs
    gaps = rng.exponential(110_000, n_pairs).astype(np.int64) // 10 * 10 + 10  # ns, 10 ns resolution
    t = T0_NS + np.cumsum(gaps)
    step = rng.integers(1, 8192, n_pairs) * 512 * rng.choice([-1, 1], n_pairs, p=[0.49, 0.51])
    allocated = np.maximum(BASE_ALLOCATED + np.cumsum(step), 0)
    reserved = ((np.maximum.accumulate(allocated) >> 21) + 1) << 21  # 2 MiB segments, never shrinks
    t_app = T0_NS + 8_000_000 + np.arange(n_app, dtype=np.int64) * 20_000_000 + 10
    app_reserved = np.full(n_app, 11925 << 20, dtype=np.int64) + (rng.integers(0, 64, n_app) << 20)
    device_type = f"NPU:{device}"

    def chunk(start: int, stop: int) -> dict[str, pa.Array]:
        # rows [0, n_app) are APP; row n_app + 2i and n_app + 2i + 1 are pair i (PTA, PTA+GE)
        rows = np.arange(start, stop)
        app = rows < n_app
        pair = np.where(app, 0, (rows - n_app) // 2)
        ts = np.where(app, t_app[np.minimum(rows, n_app - 1)], t[pair])
        alloc = _null_where(unit_text(allocated[pair], 20), app)
        res = unit_text(np.where(app, app_reserved[np.minimum(rows, n_app - 1)], reserved[pair]), 20)
        component = np.where(app, "APP", np.where((rows - n_app) % 2 == 0, "PTA", "PTA+GE"))
        return {
            "Component": pa.array(component),
            "Timestamp(us)": us_text(ts),
            "Total Allocated(MB)": alloc,
            "Total Reserved(MB)": res,
            "Total Active(MB)": alloc,
            "Stream Ptr": _null_where(pa.array(np.full(len(rows), "2")), app),
            "Device Type": pa.array(np.full(len(rows), device_type)),
        }

    write_csv(path, MEMORY_RECORD_HEADER, n, chunk)


def _allocator_totals(size: np.ndarray, t_alloc: np.ndarray, t_free: np.ndarray,
                      freed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The allocated total right after each block's allocation and right after its release (0 where
    never freed), as the allocator counts them: the bytes allocated before the window plus the blocks
    live then, frees first at the same ns. A real profile's blocks agree on that one baseline."""
    n_freed = int(freed.sum())
    times = np.concatenate([t_free[freed], t_alloc])
    order = np.argsort(times, kind="stable")
    running = np.empty(len(times), dtype=np.int64)
    running[order] = BASE_ALLOCATED + np.cumsum(np.concatenate([-size[freed], size])[order])
    release_total = np.zeros(len(size), dtype=np.int64)
    release_total[freed] = running[:n_freed]
    return running[n_freed:], release_total


def operator_memory(path: Path, n: int, seed: int, device: int = 0) -> None:
    """One block per row, allocation times increasing; 1% never freed (Release columns empty)."""
    rng = np.random.default_rng(seed + 1)
    names = _op_names(rng, n)
    names[rng.random(n) < 0.003] = None  # torch_npu leaves Name empty for a few blocks
    size = (np.exp(rng.normal(4.0, 2.5, n)).astype(np.int64) + 1) * 512  # bytes, 512-byte blocks
    size = np.minimum(size, 1 << 31)
    t_alloc = T0_NS + np.cumsum(rng.exponential(220_000, n).astype(np.int64) // 10 * 10 + 10)
    duration = (rng.exponential(300_000_000, n).astype(np.int64) // 10 * 10) + 10
    active_duration = np.maximum(duration - rng.integers(1, 400, n) * 10, 10)
    open_ = rng.random(n) < 0.01
    # each allocator's own running total, GE's (cann:: blocks) and PTA's (the others); a block's bytes
    # go back at its Active Release Time (torch_npu's Release Time is when the cache records it)
    total, release_total = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    is_ge = np.char.startswith(names.astype(str), "cann::")
    for rows in (is_ge, ~is_ge):
        total[rows], release_total[rows] = _allocator_totals(size[rows], t_alloc[rows],
                                                             (t_alloc + active_duration)[rows], ~open_[rows])
    reserved = ((np.maximum.accumulate(total) >> 21) + 1) << 21
    device_type = f"NPU:{device}"

    def chunk(start: int, stop: int) -> dict[str, pa.Array]:
        s = slice(start, stop)
        k = stop - start
        gone = open_[s]
        t_free = t_alloc[s] + duration[s]
        alloc_total = unit_text(total[s], 20)
        return {
            "Name": pa.array(names[s], type=pa.string()),
            "Size(KB)": unit_text(size[s], 10),
            "Allocation Time(us)": us_text(t_alloc[s]),
            "Release Time(us)": _null_where(us_text(t_free), gone),
            "Active Release Time(us)": _null_where(us_text(t_alloc[s] + active_duration[s]), gone),
            "Duration(us)": _null_where(us_text(duration[s]), gone),
            "Active Duration(us)": _null_where(us_text(active_duration[s]), gone),
            "Allocation Total Allocated(MB)": alloc_total,
            "Allocation Total Reserved(MB)": unit_text(reserved[s], 20),
            "Allocation Total Active(MB)": alloc_total,
            "Release Total Allocated(MB)": _null_where(unit_text(release_total[s], 20), gone),
            "Release Total Reserved(MB)": _null_where(unit_text(reserved[s], 20), gone),
            "Release Total Active(MB)": _null_where(unit_text(release_total[s], 20), gone),
            "Stream Ptr": pa.array(np.full(k, "2")),
            "Device Type": pa.array(np.full(k, device_type)),
        }

    write_csv(path, OPERATOR_MEMORY_HEADER, n, chunk)


def profiler_info(profile_dir: Path, rank: int) -> None:
    info = json.loads((PTA271 / "profiler_info_0.json").read_text())
    info["rank_id"] = str(rank)
    (profile_dir / f"profiler_info_{rank}.json").write_text(json.dumps(info, indent=4))
    shutil.copyfile(PTA271 / "profiler_metadata.json", profile_dir / "profiler_metadata.json")


def ascend_pt(root: Path, rank: int) -> Path:
    return root / f"worker-{rank}_{37000 + rank}_20251127082740123_ascend_pt"


def make_csv(target: Path, scale: float) -> dict[str, Any]:
    profile = ascend_pt(target, 0)
    out = profile / "ASCEND_PROFILER_OUTPUT"
    n_rec, n_op = _n(MEMORY_RECORD_ROWS, scale), _n(OPERATOR_MEMORY_ROWS, scale)
    memory_record(out / "memory_record.csv", n_rec, seed=1)
    operator_memory(out / "operator_memory.csv", n_op, seed=2)
    profiler_info(profile, 0)
    return {"path": str(profile), "memory_record_rows": n_rec, "operator_memory_rows": n_op,
            "files": [str(out / "memory_record.csv"), str(out / "operator_memory.csv")]}


def make_ranks(target: Path, scale: float) -> dict[str, Any]:
    n_rec, n_op = _n(RANK_MEMORY_RECORD_ROWS, scale, 200), _n(RANK_OPERATOR_MEMORY_ROWS, scale, 100)
    for rank in range(RANKS):
        profile = ascend_pt(target, rank)
        out = profile / "ASCEND_PROFILER_OUTPUT"
        memory_record(out / "memory_record.csv", n_rec, seed=100 + rank, device=rank % 8)
        operator_memory(out / "operator_memory.csv", n_op, seed=100 + rank, device=rank % 8)
        profiler_info(profile, rank)
    return {"path": str(target), "ranks": RANKS, "memory_record_rows": n_rec, "operator_memory_rows": n_op}


# ---- JSON traces ----------------------------------------------------------------------------------

_TS, _STEP = "@@TS@@", "@@STEP@@"


class _Templates:
    """Events as text split around their ``ts`` and step number: ``a + slot1 + b + slot2 + c``.

    A slot holds the ts, the step number or nothing, in whichever order the event's keys put them.
    """

    _NONE, _T, _S = 0, 1, 2

    def __init__(self, events: list[dict[str, Any]], dump: Callable[[dict[str, Any]], str], ts_quoted: bool) -> None:
        parts: list[list[str]] = [[], [], []]
        kinds: list[list[int]] = [[], []]
        ts, step = [], []
        ts_marker = f'"{_TS}"'
        for event in events:
            event = dict(event)
            t = event.get("ts")
            ts.append(-1 if t is None else _ns(t))
            if t is not None:
                event["ts"] = _TS
            head, hit, number_text = str(event.get("name", "")).partition("ProfilerStep#")
            number = int(number_text) if hit and not head and number_text.isdigit() else -1
            step.append(number)
            if number >= 0:
                event["name"] = f"ProfilerStep#{_STEP}"
            text = dump(event)
            found = sorted((text.find(m), m) for m in (ts_marker, _STEP) if m in text)
            pieces, slots, at = [], [], 0
            for pos, marker in found:
                pieces.append(text[at:pos])
                slots.append(self._T if marker == ts_marker else self._S)
                at = pos + len(marker)
            pieces.append(text[at:])
            while len(pieces) < 3:
                pieces.append("")
                slots.append(self._NONE)
            for i in range(3):
                parts[i].append(pieces[i])
            for i in range(2):
                kinds[i].append(slots[i])
        self.parts = [pa.array(p) for p in parts]
        self.kinds = [np.array(k, dtype=np.int8) for k in kinds]
        self.ts = np.array(ts, dtype=np.int64)
        self.step = np.array(step, dtype=np.int64)
        self.ts_quoted = ts_quoted
        timed = self.ts[self.ts >= 0]
        self.span = int(timed.max() - timed.min()) + 1_000_000 if len(timed) else 1
        steps = self.step[self.step >= 0]
        self.step_stride = int(steps.max() - steps.min() + 1) if len(steps) else 1
        self.nbytes = sum(len(x) for p in parts for x in p) + int((self.ts >= 0).sum()) * 22

    def render(self, reps: np.ndarray, sep: str) -> pa.Array:
        """The events of replicas ``reps``, each followed by ``sep``."""
        n = len(self.ts)
        take = np.tile(np.arange(n), len(reps))
        idx = pa.array(take)
        k = np.repeat(reps, n)
        ts = self.ts[take]
        t = np.where(ts >= 0, ts, 0) + k * self.span
        ts_text = us_text(t, tab=False)
        if self.ts_quoted:
            ts_text = pc.binary_join_element_wise(pa.scalar('"'), ts_text, pa.scalar('"'), "")
        step_text = _s(np.maximum(self.step[take], 0) + k * self.step_stride)
        slots = []
        for kind in self.kinds:
            which = kind[take]
            slots.append(pc.if_else(pa.array(which == self._T), ts_text,
                                    pc.if_else(pa.array(which == self._S), step_text, "")))
        a, b, c = (p.take(idx) for p in self.parts)
        return pc.binary_join_element_wise(a, slots[0], b, slots[1], c, pa.scalar(sep), "")


def _ns(value: Any) -> int:
    from decimal import Decimal

    return int(Decimal(str(value)) * 1000)


def _write_strings(fh: Any, arr: pa.Array, drop_tail: int = 0) -> int:
    """Write the concatenated bytes of a string array (its data buffer between the first and last offset)."""
    arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32 if arr.type == pa.string() else np.int64)
    start, stop = int(offsets[arr.offset]), int(offsets[arr.offset + len(arr)]) - drop_tail
    fh.write(memoryview(arr.buffers()[2])[start:stop])
    return stop - start


def _repeat_events(fh: Any, once: _Templates, repeated: _Templates, target_bytes: int, sep: str) -> dict[str, int]:
    reps = max(1, math.ceil((target_bytes - once.nbytes) / max(repeated.nbytes, 1)))
    per_chunk = max(1, (64 << 20) // max(repeated.nbytes, 1))
    written = _write_strings(fh, once.render(np.zeros(1, dtype=np.int64), sep)) if len(once.ts) else 0
    for first in range(0, reps, per_chunk):
        block = np.arange(first, min(reps, first + per_chunk), dtype=np.int64)
        last = block[-1] == reps - 1
        written += _write_strings(fh, repeated.render(block, sep), drop_tail=len(sep) if last else 0)
    return {"replicas": reps, "events": len(once.ts) + reps * len(repeated.ts), "bytes": written}


def make_trace_view(target: Path, scale: float) -> dict[str, Any]:
    events = json.loads(TRACE_VIEW_SAMPLE.read_bytes())
    dump = lambda e: json.dumps(e, ensure_ascii=False)
    once = _Templates([e for e in events if e.get("ph") == "M"], dump, ts_quoted=True)
    repeated = _Templates([e for e in events if e.get("ph") != "M"], dump, ts_quoted=True)
    profile = ascend_pt(target, 0)
    path = profile / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        fh.write(b"[")
        stats = _repeat_events(fh, once, repeated, int(TRACE_VIEW_BYTES * scale), ", ")
        fh.write(b"]")
    tmp.replace(path)
    return {"path": str(profile), "file": str(path), **stats, "size": path.stat().st_size}


def _self_contained(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events without the [memory] events the window cuts: allocs never freed in it and frees of
    memory allocated before it. Replicas of what is left reuse their addresses as a real trace does
    (every block is freed before the next replica allocates at its address); replicas of the whole
    sample would allocate an address the previous replica never freed."""
    from memgate.loaders.events import pair_allocs

    memory = [i for i, e in enumerate(events) if e.get("name") == "[memory]" and e["args"].get("Bytes")]
    memory.sort(key=lambda i: _ns(events[i]["ts"]))  # stable: ties in file order
    keys: dict[tuple[Any, ...], int] = {}
    where = np.array([keys.setdefault((events[i]["args"].get("Device Type"), events[i]["args"].get("Device Id"),
                                       events[i]["args"]["Addr"]), len(keys)) for i in memory], dtype=np.int64)
    is_alloc = np.array([events[i]["args"]["Bytes"] > 0 for i in memory])
    t = np.array([_ns(events[i]["ts"]) for i in memory], dtype=np.int64)
    pairing = pair_allocs(where, is_alloc, t)
    assert pairing.repeated is None, "the Kineto sample repeats an address's action"
    cut = {memory[k] for k in np.flatnonzero(pairing.partner < 0).tolist()}
    return [e for i, e in enumerate(events) if i not in cut]


def make_kineto(target: Path, scale: float) -> dict[str, Any]:
    doc = json.loads(KINETO_SAMPLE.read_bytes())
    events = _self_contained(doc["traceEvents"])

    def dump(e: dict[str, Any]) -> str:  # Kineto's layout: one key per line, events indented by 2
        return "  " + json.dumps(e, indent=2).replace("\n", "\n  ")

    once = _Templates([e for e in events if e.get("ph") == "M"], dump, ts_quoted=False)
    repeated = _Templates([e for e in events if e.get("ph") != "M"], dump, ts_quoted=False)
    keys = list(doc)
    head = {k: doc[k] for k in keys[: keys.index("traceEvents")]}
    tail = {k: doc[k] for k in keys[keys.index("traceEvents") + 1:]}
    path = target / "rank0.pt.trace.json"
    target.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        fh.write(b"{\n")
        fh.writelines(f"  {json.dumps(key)}: {json.dumps(value)},\n".encode() for key, value in head.items())
        fh.write(b'  "traceEvents": [\n')
        stats = _repeat_events(fh, once, repeated, int(KINETO_BYTES * scale), ",\n")
        fh.write(b"\n  ]")
        fh.writelines(f',\n  {json.dumps(key)}: {json.dumps(value)}'.encode() for key, value in tail.items())
        fh.write(b"\n}\n")
    tmp.replace(path)
    return {"path": str(path), **stats, "size": path.stat().st_size}


# ---- snapshot -------------------------------------------------------------------------------------


def make_snapshot(target: Path, scale: float) -> dict[str, Any]:
    """1M trace entries: alloc i, then free_requested + free_completed of alloc i - LAG, on recycled slots."""
    rng = np.random.default_rng(7)
    n_entries = max(300, _n(SNAPSHOT_ENTRIES, scale))
    frame_pool: list[list[dict[str, Any]]] = []
    settings: dict[str, Any] = {}
    for sample in SNAPSHOT_SAMPLES:
        with open(sample, "rb") as fh:
            data = pickle.load(fh)
        settings = settings or data.get("allocator_settings", {})
        frame_pool += [e["frames"] for t in data["device_traces"] for e in t if e.get("action") == "alloc"]
    pool = [frame_pool[i] for i in rng.choice(len(frame_pool), size=min(4000, len(frame_pool)), replace=False)]

    slots, lag = 8192, 3000
    slot_size = 2 << 20  # 2 MiB per slot
    per_segment = 64  # 128 MiB segments
    n_segments = slots // per_segment
    base = 0x7F00_0000_0000
    seg_addr = base + np.arange(n_segments, dtype=np.int64) * (slot_size * per_segment + (64 << 20))
    n_alloc = (n_entries - n_segments + 2 * lag) // 3 + 1
    slot = np.arange(n_alloc) % slots
    addr = seg_addr[slot // per_segment] + (slot % per_segment) * slot_size
    size = np.minimum(np.exp(rng.normal(11, 2.5, n_alloc)).astype(np.int64) + 1, slot_size)
    frames_of = rng.integers(0, len(pool), n_alloc)
    # the order of events: per i, alloc i then (i >= lag) free_requested and free_completed of i - lag
    kind = np.concatenate([np.zeros(n_alloc, np.int8), np.ones(n_alloc - lag, np.int8), np.full(n_alloc - lag, 2, np.int8)])
    who = np.concatenate([np.arange(n_alloc), np.arange(n_alloc - lag), np.arange(n_alloc - lag)])
    when = np.concatenate([np.arange(n_alloc) * 3, np.arange(lag, n_alloc) * 3 + 1, np.arange(lag, n_alloc) * 3 + 2])
    order = np.argsort(when, kind="stable")
    kind, who = kind[order], who[order]
    kind, who = kind[: n_entries - n_segments], who[: n_entries - n_segments]
    time_us = 1_763_324_225_770_010 + np.cumsum(rng.integers(5, 60, len(kind)))
    actions = ("alloc", "free_requested", "free_completed")
    a_list, w_list, t_list = kind.tolist(), who.tolist(), time_us.tolist()
    addr_l, size_l, frames_l = addr.tolist(), size.tolist(), frames_of.tolist()
    t_first = int(time_us[0]) - n_segments - 1  # the segments, then the allocs: in time order, as torch records
    trace: list[dict[str, Any]] = [
        {"action": "segment_alloc", "addr": int(seg_addr[s]), "size": slot_size * per_segment, "stream": 0,
         "time_us": t_first + s, "frames": pool[0]} for s in range(n_segments)
    ]
    # torch gives every entry its own frames list, sharing the frame dicts (as the real pickles do)
    trace += [{"action": actions[k], "addr": addr_l[w], "size": size_l[w], "stream": 0, "time_us": t,
               "frames": list(pool[frames_l[w]])} for k, w, t in zip(a_list, w_list, t_list)]
    # final state: a slot is live when its last event is an alloc
    last_state = np.full(slots, -1, dtype=np.int64)  # index of the alloc that holds the slot, -1 free
    alive = np.zeros(n_alloc, dtype=bool)
    alive[who[kind == 0]] = True
    alive[who[kind == 1]] = False
    holders = np.flatnonzero(alive)
    last_state[slot[holders]] = holders
    segments = []
    for s in range(n_segments):
        blocks = []
        for j in range(per_segment):
            holder = int(last_state[s * per_segment + j])
            live = holder >= 0
            blocks.append({"address": int(seg_addr[s]) + j * slot_size, "size": slot_size,
                           "requested_size": int(size[holder]) if live else 0,
                           "state": "active_allocated" if live else "inactive",
                           "frames": pool[frames_l[holder]] if live else []})
        allocated = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
        segments.append({"device": 0, "address": int(seg_addr[s]), "total_size": slot_size * per_segment,
                         "allocated_size": allocated, "active_size": allocated,
                         "requested_size": sum(b["requested_size"] for b in blocks), "stream": 0,
                         "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
                         "frames": [], "blocks": blocks})
    step_every = max(1, len(t_list) // 200)
    annotations = []
    for n, at in enumerate(range(0, len(t_list) - step_every, step_every)):
        annotations.append({"name": f"ProfilerStep#{n}", "stage": "START", "device": 0, "time_us": t_list[at]})
        annotations.append({"name": f"ProfilerStep#{n}", "stage": "END", "device": 0,
                            "time_us": t_list[at + step_every - 1]})
    snapshot = {"segments": segments, "device_traces": [trace], "allocator_settings": settings,
                "external_annotations": annotations}
    path = target / "snapshot_rank0.pickle"
    target.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        pickle.dump(snapshot, fh, protocol=4)
    tmp.replace(path)
    return {"path": str(path), "trace_entries": len(trace), "size": path.stat().st_size}


# ---- driver ---------------------------------------------------------------------------------------


def _n(full: int, scale: float, minimum: int = 1000) -> int:
    return max(minimum, int(full * scale))


MAKERS: dict[str, Callable[[Path, float], dict[str, Any]]] = {
    "csv": make_csv, "trace_view": make_trace_view, "kineto": make_kineto, "snapshot": make_snapshot,
    "ranks64": make_ranks,
}


def scale_dir(out: Path, scale: float) -> Path:
    return out / f"scale-{scale:g}"


def generate(out: Path = DEFAULT_OUT, scale: float = 1.0, only: tuple[str, ...] = ITEMS, force: bool = False,
             log: Callable[[str], None] = print) -> dict[str, dict[str, Any]]:
    """Make (or reuse) every item in ``only``; return each item's description (paths, rows, bytes)."""
    root = scale_dir(out, scale)
    result = {}
    for item in only:
        target = root / item
        stamp = root / f".{item}.done.json"
        params = {"generator": ITEM_VERSIONS.get(item, GENERATOR_VERSION), "scale": scale, "item": item}
        if not force and stamp.exists():
            done = json.loads(stamp.read_text())
            if done.get("params") == params and Path(done["info"]["path"]).exists():
                result[item] = done["info"]
                continue
        if target.exists():
            shutil.rmtree(target)
        started = time.perf_counter()
        info = MAKERS[item](target, scale)
        info["generate_s"] = round(time.perf_counter() - started, 2)
        root.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps({"params": params, "info": info}, indent=2))
        log(f"generated {item} in {info['generate_s']} s: {_describe(info)}")
        result[item] = info
    return result


def _describe(info: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in info.items() if k not in ("files", "generate_s"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"cache directory (default {DEFAULT_OUT})")
    parser.add_argument("--scale", type=float, default=1.0, help="size factor (0.01 for a quick run)")
    parser.add_argument("--only", default=",".join(ITEMS), help=f"comma-separated subset of {','.join(ITEMS)}")
    parser.add_argument("--force", action="store_true", help="regenerate even when cached")
    args = parser.parse_args(argv)
    only = tuple(x for x in args.only.split(",") if x)
    unknown = set(only) - set(ITEMS)
    if unknown:
        parser.error(f"unknown item(s): {', '.join(sorted(unknown))}")
    for item, info in generate(args.out, args.scale, only, args.force).items():
        print(f"{item}: {info['path']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

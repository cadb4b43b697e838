"""Kineto / torch.profiler Chrome traces recorded with ``profile_memory=True``. FORMATS.md §5.

``*.json`` or ``*.json.gz``, streamed with ijson (never loaded whole; gzip decompressed as a
stream). What is read:
- ``[memory]`` instant events: one per allocation (``Bytes`` > 0) or free (``Bytes`` < 0), with the
  allocator's ``Total Allocated`` / ``Total Reserved`` after the event. ``Total Allocated`` includes
  memory allocated before profiling started; it becomes each block's ``alloc_total`` so the
  reconciliation recovers that baseline. ``Device Type`` (c10 enum: CPU=0, CUDA=1, PrivateUse1 =
  NPU=20) and ``Device Id`` name the device. The CPU allocator reserves nothing (``Total Reserved``
  is always 0 there), so a CPU device has no reserved values rather than a misleading 0.
- ``ProfilerStep#N`` complete (``X``) events: the steps.
- ``cpu_op`` complete events: a memory event belongs to the innermost op on the same (pid, tid)
  whose span ``[ts, ts + dur]`` contains its ts; that op names the block.

Time: ``ts`` is µs with 3 decimals, relative to ``baseTimeNanoseconds`` when the trace has it.
ijson hands non-integers over as ``Decimal``, so ``t_ns = baseTimeNanoseconds + ts * 1000`` is
exact (sub-ns digits, which Kineto never writes, are dropped). Events are unsorted in the file;
they are ordered by ts, ties in file order.

Also the JSON written by ``prof.export_memory_timeline("*.json")`` (``[times_us, sizes]``, sizes by
category): claimed only by its name (``*memory_timeline*.json``) *and* its ``[[`` header. It does
not record the device it was exported for, so its device is ``unknown``.
"""

from __future__ import annotations

import gc
import gzip
import io
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import ijson
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from memgate import convert, discover, limits
from memgate.csvtable import check_readable
from memgate.errors import InputError
from memgate.loaders.jsonstream import JsonLimitError, guard, syntax_error
from memgate.loaders.snapshot import pair_allocs
from memgate.model import BLOCK_COLUMNS, DeviceModel, Profile, Series, empty_steps
from memgate.pyrecords import check_column, check_records, missing_int64, nullable_int64, resolve
from memgate.schemas import load_schema

FORMAT = "kineto"
TIMELINE_FORMAT = "torch_memory_timeline"
SCHEMA = "kineto"
COMPONENT = "allocator"
HEAD_BYTES = 1 << 16
STEP_NAME = re.compile(r"^ProfilerStep#(\d+)$")
# c10::DeviceType, lower-cased; PrivateUse1 is torch_npu's NPU (FORMATS.md).
DEVICE_TYPES = {0: "cpu", 1: "cuda", 2: "mkldnn", 3: "opengl", 4: "opencl", 5: "ideep", 6: "hip", 7: "fpga",
                8: "maia", 9: "xla", 10: "vulkan", 11: "metal", 12: "xpu", 13: "mps", 14: "meta", 15: "hpu",
                16: "ve", 17: "lazy", 18: "ipu", 19: "mtia", 20: "npu"}
CPU = 0
_BASE_MAX = 9 * 10**18
_I64_MAX = (1 << 63) - 1


# ---- detection ------------------------------------------------------------------------------------


def _is_json_name(path: Path) -> bool:
    name = path.name.lower()
    return name.endswith((".json", ".json.gz"))


def claims(path: Path) -> bool:
    """A .json/.json.gz file whose first bytes open an object that has ``traceEvents``.

    torch_npu's trace_view.json is a JSON *array*: not claimed (it belongs to its profile dir).
    """
    if not _is_json_name(path) or not path.is_file():
        return False
    try:
        head = read_head(path)
    except PermissionError:
        return path.name.lower().endswith((".pt.trace.json", ".pt.trace.json.gz"))  # load() says why
    except (OSError, EOFError, zlib.error):
        return False
    body = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    return body[:1] == b"{" and b'"traceEvents"' in head


def claims_timeline(path: Path) -> bool:
    """``prof.export_memory_timeline`` JSON: the name says so and the file starts with ``[[``."""
    if "memory_timeline" not in path.name.lower() or not _is_json_name(path) or not path.is_file():
        return False
    try:
        head = read_head(path, 256)
    except (OSError, EOFError, zlib.error):
        return False
    return re.match(rb"\s*\[\s*\[\s*(\d|\])", head) is not None


def read_head(path: Path, size: int = HEAD_BYTES) -> bytes:
    with _open(path) as fh:
        return fh.read(size)


@contextmanager
def _open(path: Path) -> Iterator[IO[bytes]]:
    if path.name.lower().endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            yield fh  # type: ignore[misc]
    else:
        with open(path, "rb") as fh:
            yield fh


# ---- streaming ------------------------------------------------------------------------------------


class _Collected:
    """The events memgate needs, pulled out of the stream (everything else is dropped as it passes)."""

    def __init__(self) -> None:
        self.mem: list[dict[str, Any]] = []
        self.mem_index: list[int] = []
        self.op_index: list[int] = []
        self.op_name: list[Any] = []
        self.op_ts: list[Any] = []
        self.op_dur: list[Any] = []
        self.op_pid: list[Any] = []
        self.op_tid: list[Any] = []
        self.steps: list[dict[str, Any]] = []
        self.step_index: list[int] = []
        self.events = 0


def _collect(path: Path, fh: IO[bytes], gz: bool) -> _Collected:
    out = _Collected()
    index = -1
    try:
        max_rows = limits.current().max_rows
        for index, event in enumerate(ijson.items(guard(fh, path), "traceEvents.item")):
            if index >= max_rows:
                limits.check_rows(path, index + 1, what="trace events", column=f"traceEvents[{index}]")
            if type(event) is not dict:
                raise InputError("trace event is not an object", file=path, column=f"traceEvents[{index}]",
                                 expected="an object", found=type(event).__name__)
            ph = event.get("ph")
            if ph == "i":
                if event.get("name") == "[memory]":
                    out.mem.append(event)
                    out.mem_index.append(index)
            elif ph == "X":
                name = event.get("name")
                cat = event.get("cat")
                if type(name) is str and name.startswith("ProfilerStep#"):
                    if cat != "gpu_user_annotation":  # the GPU-side copy runs on device time
                        out.steps.append(event)
                        out.step_index.append(index)
                elif cat == "cpu_op":
                    out.op_index.append(index)
                    out.op_name.append(name)
                    out.op_ts.append(event.get("ts"))
                    out.op_dur.append(event.get("dur"))
                    out.op_pid.append(event.get("pid"))
                    out.op_tid.append(event.get("tid"))
        out.events = index + 1
    except JsonLimitError as exc:
        raise InputError(exc.message, file=path, column=f"traceEvents[{index + 1}] ({exc.column})",
                         expected=exc.expected, found=exc.found) from None
    except ijson.JSONError as exc:
        if gz:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(f"invalid JSON: {reason}", file=path, column=f"traceEvents[{index + 1}]") from None
        raise syntax_error(path, exc, index + 1, prefix="traceEvents.item") from None
    except UnicodeDecodeError:
        raise InputError("file is not UTF-8 text", file=path, column=f"traceEvents[{index + 1}]") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"corrupt or truncated gzip stream: {exc}", file=path,
                         column=f"traceEvents[{index + 1}]", expected="a complete .json.gz") from None
    except RecursionError:
        raise InputError("JSON nested too deeply", file=path) from None
    return out


def _head_fields(head: bytes) -> dict[str, Any]:
    """Top-level scalars written before ``traceEvents`` (Kineto's header), plus ``distributedInfo.rank``."""
    fields: dict[str, Any] = {}
    try:
        for prefix, event, value in ijson.parse(guard(io.BytesIO(head))):
            if prefix == "traceEvents":
                fields["traceEvents"] = event  # start_array, or what it is instead
                break
            if event in ("number", "string", "boolean") and (prefix.count(".") == 0 or prefix == "distributedInfo.rank"):
                fields[prefix] = value
    except (ijson.JSONError, JsonLimitError):
        pass  # the head ends mid-document (or nests absurdly: the full read reports that)
    return fields


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while the stream builds millions of event dicts: its generation passes
    over them cost a quarter of the load (1 GB trace: 32.3 s with GC, 24.7 s without). Collection
    is only delayed, never skipped.
    """
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


# ---- loading --------------------------------------------------------------------------------------


def load(path: Path) -> Profile:
    check_readable(path)
    limits.check_file_size(path)
    gz = path.name.lower().endswith(".gz")
    try:
        head = read_head(path)
        if head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] != b"{":
            raise InputError("not a Chrome trace: the file is not a JSON object", file=path, line=1,
                             expected="'{' with traceEvents (a Kineto trace)", found=repr(head[:20]))
        with _open(path) as fh, _gc_paused():
            got = _collect(path, fh, gz)
    except PermissionError:
        raise InputError("file is not readable (permission denied)", file=path) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"corrupt or truncated gzip stream: {exc}", file=path) from None
    if got.events == 0 and b'"traceEvents"' not in head:
        raise InputError("no traceEvents array in this JSON object", file=path, expected="a Kineto trace")
    fields = _head_fields(head)
    if fields.get("traceEvents", "start_array") != "start_array":
        raise InputError("traceEvents is not an array", file=path, column="traceEvents", expected="an array of events",
                         found=str(fields["traceEvents"]).replace("start_map", "an object"))
    schema = load_schema(SCHEMA)
    base = fields.get("baseTimeNanoseconds", 0)
    if not isinstance(base, int) or isinstance(base, bool) or not 0 <= base <= _BASE_MAX:
        raise InputError("baseTimeNanoseconds must be a non-negative integer", file=path,
                         column="baseTimeNanoseconds", expected=f"ns since the epoch, at most {_BASE_MAX}",
                         found=repr(base))
    steps = _steps(path, got, schema, base)
    devices = _devices(path, got, schema, base)
    metadata: dict[str, Any] = {"base_time_ns": base, "trace_events": got.events, "memory_events": len(got.mem),
                                "cpu_ops": len(got.op_index)}
    if not got.mem:
        raise InputError("no [memory] events: the trace was recorded without profile_memory=True", file=path,
                         expected="re-run torch.profiler.profile(..., profile_memory=True) and export the trace",
                         found=f"{got.events} events, none of them [memory]")
    rank = fields.get("distributedInfo.rank")
    return Profile(
        path=str(path),
        format=FORMAT,
        rank=str(rank) if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 else _rank_of(path),
        devices=tuple(devices),
        steps=steps,
        steps_source=str(path) if len(steps) else None,
        metadata=metadata,
    )


def us_to_ns(values: list[Any], base: int, path: Path | None = None) -> np.ndarray:
    """Validated µs values (int or Decimal, <= 9e15 by the schema) → exact int64 ns + ``base``.

    Vectorized through decimal text; a sum past int64 (a huge ts on top of a base) is an InputError.
    """
    if not values:
        return np.zeros(0, dtype=np.int64)
    try:
        text = pc.cast(pa.array(values, type=pa.decimal128(38, 9)), pa.string())
        ns = np.asarray(convert.us_text_to_ns(text).to_numpy(dtype=np.int64), dtype=np.int64)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # > 9 decimals or floats: exact per value
        ns = np.array([int((Decimal(v) * 1000).to_integral_value()) for v in values], dtype=np.int64)
    if base and (ns > _I64_MAX - base).any():
        raise InputError("ts + baseTimeNanoseconds is past the year 2262 (int64 ns)", file=path,
                         expected="ts relative to baseTimeNanoseconds", found=str(values[int(np.argmax(ns))]))
    return ns + base


def _span_end(start: np.ndarray, durations: list[Any], path: Path) -> np.ndarray:
    dur = us_to_ns(durations, 0)
    if (dur > _I64_MAX - start).any():
        raise InputError("ts + dur is past the year 2262 (int64 ns)", file=path, expected="a shorter dur",
                         found=str(durations[int(np.argmax(dur > _I64_MAX - start))]))
    return np.asarray(start + dur, dtype=np.int64)


def _steps(path: Path, got: _Collected, schema: dict[str, Any], base: int) -> pd.DataFrame:
    if not got.steps:
        return empty_steps()
    cols = check_records(got.steps, schema["$defs"]["x_event"], file=path,
                         where=lambda k: f"traceEvents[{got.step_index[k]}]", root=schema)
    start = us_to_ns([e["ts"] for e in got.steps], base, path)
    end = _span_end(start, [e["dur"] for e in got.steps], path)
    names = cols["name"]
    assert names is not None
    number = [int(m.group(1)) if (m := STEP_NAME.match(n)) else None for n in names.to_pylist()]
    frame = pd.DataFrame({"step": number, "t_start": start, "t_end": end}).dropna(subset=["step"])
    if frame.empty:
        return empty_steps()
    frame = frame.groupby("step", sort=True).agg(t_start=("t_start", "min"), t_end=("t_end", "max")).reset_index()
    return frame.astype("Int64")


def _devices(path: Path, got: _Collected, schema: dict[str, Any], base: int) -> list[DeviceModel]:
    if not got.mem:
        return []
    cols = check_records(got.mem, schema["$defs"]["memory_event"], file=path,
                         where=lambda k: f"traceEvents[{got.mem_index[k]}]", root=schema)
    n = len(got.mem)
    t = us_to_ns([e["ts"] for e in got.mem], base, path)
    nbytes = _ints(cols["args.Bytes"], n)
    addr = _ints(cols["args.Addr"], n)
    dtype = _ints(cols["args.Device Type"], n)
    did = _ints(cols["args.Device Id"], n)
    total_alloc = _nullable(cols.get("args.Total Allocated"), n)
    total_res = _nullable(cols.get("args.Total Reserved"), n)
    op = _attribute(path, got, schema, t, base)

    order = np.lexsort((np.arange(n), t))  # time order, ties in file order
    labels = np.array([_label(int(ty), int(i)) for ty, i in zip(dtype.tolist(), did.tolist())], dtype=object)
    models = []
    for label in sorted(set(labels.tolist())):
        rows = order[labels[order] == label]
        models.append(_device(path, label, rows, t, nbytes, addr, total_alloc, total_res, op,
                              cpu=bool(dtype[rows[0]] == CPU)))
    return models


def _label(device_type: int, device_id: int) -> str:
    name = DEVICE_TYPES[device_type]
    return name if device_type == CPU or device_id < 0 else f"{name}:{device_id}"


def _ints(arr: pa.Array | None, n: int) -> np.ndarray:
    if arr is None or pa.types.is_null(arr.type):
        return np.zeros(n, dtype=np.int64)
    return np.asarray(pc.fill_null(arr, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _nullable(arr: pa.Array | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, missing mask) of an optional integer column."""
    if arr is None or pa.types.is_null(arr.type):
        return np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)
    return _ints(arr, n), np.asarray(arr.is_null(), dtype=bool)


def _device(path: Path, label: str, rows: np.ndarray, t: np.ndarray, nbytes: np.ndarray, addr: np.ndarray,
            total_alloc: tuple[np.ndarray, np.ndarray], total_res: tuple[np.ndarray, np.ndarray], op: np.ndarray, *,
            cpu: bool) -> DeviceModel:
    """Blocks and the allocator series of one device; ``rows`` are its events in time order."""
    b = nbytes[rows]
    moving = rows[b != 0]
    is_alloc = nbytes[moving] > 0
    partner = pair_allocs(addr[moving], is_alloc)
    allocs = np.flatnonzero(is_alloc)
    early = np.flatnonzero(~is_alloc & (partner < 0))  # frees of memory allocated before profiling
    freed_at = partner[allocs]
    tm = t[moving]
    size = np.concatenate([nbytes[moving][allocs], -nbytes[moving][early]])
    n_early = len(early)
    t_alloc = nullable_int64(np.concatenate([tm[allocs], np.zeros(n_early, np.int64)]),
                             np.concatenate([np.zeros(len(allocs), bool), np.ones(n_early, bool)]))
    t_free = nullable_int64(np.concatenate([np.where(freed_at >= 0, tm[np.maximum(freed_at, 0)], 0), tm[early]]),
                            np.concatenate([freed_at < 0, np.zeros(n_early, bool)]))
    totals, no_total = total_alloc[0][moving], total_alloc[1][moving]
    alloc_total = nullable_int64(np.concatenate([totals[allocs], np.zeros(n_early, np.int64)]),
                                 np.concatenate([no_total[allocs], np.ones(n_early, bool)]))
    ops = list(op[moving][allocs]) + [None] * n_early
    nothing = pd.array([None] * len(size), dtype="string")
    blocks = pd.DataFrame({
        "size": nullable_int64(size),
        "t_alloc": t_alloc,
        "t_free": t_free,
        "op": pd.array(ops, dtype="string"),
        "stream": nothing,
        "owner": nothing.copy(),
        "component": pd.array([COMPONENT] * len(size), dtype="string"),
        "alloc_total": alloc_total,
    })[list(BLOCK_COLUMNS)]
    series: dict[str, Series] = {}
    if not total_alloc[1][rows].all():
        reserved = missing_int64(len(rows)) if cpu else nullable_int64(total_res[0][rows], total_res[1][rows])
        frame = pd.DataFrame({
            "t_ns": nullable_int64(t[rows]),
            "allocated": nullable_int64(total_alloc[0][rows], total_alloc[1][rows]),
            "reserved": reserved,
            "active": missing_int64(len(rows)),
        })
        series[COMPONENT] = Series(COMPONENT, frame, str(path))
    return DeviceModel(device=label, series=series, blocks=blocks, blocks_source=str(path))


def _attribute(path: Path, got: _Collected, schema: dict[str, Any], t_mem: np.ndarray, base: int) -> np.ndarray:
    """The innermost cpu_op on the same (pid, tid) whose [ts, ts+dur] contains each memory event."""
    n = len(got.mem)
    result = np.full(n, None, dtype=object)
    if not got.op_index or not n:
        return result
    props = resolve(schema["$defs"]["x_event"], schema)["properties"]

    def where(k: int) -> str:
        return f"traceEvents[{got.op_index[k]}]"

    for name, values in (("name", got.op_name), ("ts", got.op_ts), ("dur", got.op_dur), ("pid", got.op_pid),
                         ("tid", got.op_tid)):
        _, problem = check_column(values, resolve(props[name], schema), name=name, where=where,
                                  required=name in ("name", "ts", "dur"))
        if problem is not None:
            raise problem.error(path)
    start = us_to_ns(got.op_ts, base, path)
    end = _span_end(start, got.op_dur, path)
    names = np.array(got.op_name, dtype=object)
    mem_pid = [e.get("pid") for e in got.mem]
    mem_tid = [e.get("tid") for e in got.mem]
    codes = _thread_codes(got.op_pid + mem_pid, got.op_tid + mem_tid)
    op_group, mem_group = codes[: len(start)], codes[len(start):]
    for g in np.unique(mem_group):
        ops = np.flatnonzero(op_group == g)
        queries = np.flatnonzero(mem_group == g)
        if not len(ops):
            continue
        inner = innermost(start[ops], end[ops], t_mem[queries])
        hit = inner >= 0
        result[queries[hit]] = names[ops[inner[hit]]]
    return result


def _thread_codes(pids: list[Any], tids: list[Any]) -> np.ndarray:
    """One integer per distinct (pid, tid); ids may be ints or strings (Kineto writes both)."""
    def codes(values: list[Any]) -> tuple[np.ndarray, int]:
        keyed = np.empty(len(values), dtype=object)
        keyed[:] = [(type(v).__name__, v) for v in values]  # 1 and "1" are different threads
        found, uniques = pd.factorize(keyed)
        return found.astype(np.int64), len(uniques)

    p, _ = codes(pids)
    t, n_t = codes(tids)
    return np.asarray(p * (n_t + 1) + t, dtype=np.int64)


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


_RANK = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


def _rank_of(path: Path) -> str:
    m = _RANK.search(path.name) or _RANK.search(path.parent.name)
    return str(int(m.group(1))) if m else "0"


# ---- export_memory_timeline -----------------------------------------------------------------------


def load_timeline(path: Path) -> Profile:
    check_readable(path)
    schema = load_schema(SCHEMA)
    items: list[Any] = []
    try:
        with _open(path) as fh:
            for index, item in enumerate(ijson.items(guard(fh, path), "item")):
                if index >= 2:
                    raise InputError("a memory timeline has exactly two arrays", file=path, column=f"[{index}]",
                                     expected="[times_us, sizes]", found="a third element")
                items.append(item)
    except JsonLimitError as exc:
        raise InputError(exc.message, file=path, column=f"[{len(items)}] ({exc.column})", expected=exc.expected,
                         found=exc.found) from None
    except ijson.JSONError as exc:
        raise syntax_error(path, exc, len(items)) from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(f"corrupt or truncated gzip stream: {exc}", file=path) from None
    if len(items) != 2 or not all(isinstance(i, list) for i in items):
        raise InputError("not a memory timeline", file=path, column="(top level)", expected="[times_us, sizes]",
                         found=f"{len(items)} element(s)")
    times, sizes = items
    prefix = resolve(schema["$defs"]["memory_timeline"], schema)["prefixItems"]
    arr, problem = check_column(times, prefix[0]["items"], name="", where=lambda i: f"[0][{i}]", required=True)
    if problem is not None:
        raise problem.error(path)
    if len(sizes) != len(times):
        raise InputError("sizes and times differ in length", file=path, column="[1]",
                         expected=f"{len(times)} rows (one per time)", found=f"{len(sizes)} rows")
    _, problem = check_column(sizes, {"type": "array"}, name="", where=lambda i: f"[1][{i}]", required=True)
    if problem is not None:
        raise problem.error(path)
    width = len(sizes[0]) if sizes else 0
    odd = next((i for i, row in enumerate(sizes) if len(row) != width), None)
    if odd is not None:
        raise InputError("rows of sizes differ in width", file=path, column=f"[1][{odd}]",
                         expected=f"{width} values (one per category)", found=f"{len(sizes[odd])} values")
    flat = [v for row in sizes for v in row]
    _, problem = check_column(flat, prefix[1]["items"]["items"], name="",
                              where=lambda i: f"[1][{i // width}][{i % width}]", required=True)
    if problem is not None:
        raise problem.error(path)
    totals = np.asarray(flat, dtype=np.int64).reshape(len(sizes), width).sum(axis=1) if width else \
        np.zeros(len(sizes), dtype=np.int64)
    t = _ints(arr, len(times)) * 1000
    frame = pd.DataFrame({
        "t_ns": nullable_int64(t),
        "allocated": nullable_int64(totals),
        "reserved": missing_int64(len(t)),
        "active": missing_int64(len(t)),
    })
    device = DeviceModel(device="unknown", series={COMPONENT: Series(COMPONENT, frame, str(path))})
    return Profile(path=str(path), format=TIMELINE_FORMAT, rank=_rank_of(path), devices=(device,),
                   metadata={"categories": width, "note": "export_memory_timeline does not record the device"})


discover.register(discover.Format(FORMAT, claims, load, rank_hint=_rank_of))
discover.register(discover.Format(TIMELINE_FORMAT, claims_timeline, load_timeline))

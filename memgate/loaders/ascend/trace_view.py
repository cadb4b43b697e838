"""torch_npu ``trace_view.json``: ProfilerStep#N spans and the "NPU MEM" counters, streamed.

Numbers are exact: :func:`memgate.readers.jsonstream.iter_array` hands a number with a fraction
over as a ``Decimal``, so a ``ts`` written as a number (``1736405443863674.401``, which a float
rounds by ~100 ns) converts to its exact ns, as the text form does; KB become bytes exactly.
An event that repeats a key with another value is an InputError (iter_array).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import numpy as np

from memgate.errors import InputError, show
from memgate.model import empty_steps, step_number
from memgate.readers.jsonstream import iter_array, top_level_kind
from memgate.table import Ints, Table

STEP_NAME = re.compile(r"^ProfilerStep#([0-9]+)\Z")
I64_MAX = (1 << 63) - 1
MEMORY_COUNTERS = ("APP/DDR", "APP/HBM", "APP/Memory", "Device/DDR", "Device/HBM", "Device/Memory")

# The NPU MEM process's pid says which device it is. torch_npu merges CANN msprof's timeline, whose
# TraceViewManager.get_format_pid packs a device-level process's pid as
#     format_pid = (pid << 10) | (sort_index << 5) | device_id        (device_id 31 = the host)
# since msprof's fix of Dec 2023 for pids that overflowed uint32, and before it as
#     format_pid = pid * 10000 + sort_index * 100 + device_id          (device_id 64 = unknown)
# sort_index being the layer's, which msprof also writes as the process's ``process_sort_index``.
# So a layout is the pid's when its sort_index field equals that metadata (the real level0 sample:
# pid 3089232480 = 3016828 << 10 | 19 << 5 | 0, sort index 19, the Python process 3016828, device 0);
# without the metadata the current layout is assumed.
_PID_INDEX_SHIFT = 5
_PID_FIELD = (1 << _PID_INDEX_SHIFT) - 1  # 5 bits each: device_id, sort_index
_HOST_DEVICE = 31
_DECIMAL_UNKNOWN_DEVICE = 64


def device_of_pid(pid: Any, sort_index: Any) -> int | None:
    """The device id msprof packed into a timeline process id; None where the pid names none."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
        return None
    known = isinstance(sort_index, int) and not isinstance(sort_index, bool)
    if not known or (pid >> _PID_INDEX_SHIFT) & _PID_FIELD == sort_index:
        device = pid & _PID_FIELD
        return device if device != _HOST_DEVICE else None
    if (pid // 100) % 100 == sort_index:
        device = pid % 100
        return device if device < _DECIMAL_UNKNOWN_DEVICE else None
    return None


@dataclass
class TraceView:
    steps: Table = field(default_factory=empty_steps)  # step, t_start, t_end; by step
    # device id (None: the pid names none) -> counter name -> table (t_ns, reserved) in time order
    counters: dict[int | None, dict[str, Table]] = field(default_factory=dict)


def us_to_ns(value: Any, path: Path, where: str) -> int:
    """µs as a JSON string or number → exact int ns (0 ≤ ns < 2**63, i.e. before the year 2262)."""
    try:
        us = Decimal(str(value).strip()) if isinstance(value, (str, int, float, Decimal)) and \
            not isinstance(value, bool) else Decimal("NaN")
        # adjusted() first: int(Decimal("1e999999999")) would build a billion-digit integer
        ns = (int(us * 1000) if us.adjusted() < 20 else I64_MAX + 1) if us.is_finite() else None
    except (InvalidOperation, ValueError, OverflowError):  # text
        ns = None
    if ns is None:
        raise InputError("malformed time", file=path, column=where, expected="µs as a number or numeric string",
                         found=show(value, 40))
    if not 0 <= ns <= I64_MAX:
        raise InputError("time out of range", file=path, column=where,
                         expected="µs >= 0 that fit int64 ns (before the year 2262)", found=show(value, 40))
    return ns


def read_trace_view(path: Path) -> TraceView:
    kind = top_level_kind(path)
    if kind != "array":
        raise InputError("trace_view.json must be a JSON array of events", file=path, line=1,
                         expected="a JSON array of events", found="a JSON object" if kind == "object" else "no JSON array")
    steps: list[tuple[int, int, int]] = []
    samples: dict[tuple[Any, str], list[tuple[int, int]]] = {}
    mem_pids: set[Any] = set()
    sort_index: dict[Any, Any] = {}  # pid -> its process_sort_index
    for index, event in enumerate(iter_array(path)):
        if not isinstance(event, dict):
            raise InputError("event is not an object", file=path, column=f"[{index}]", expected="a JSON object",
                             found=type(event).__name__)
        ph = event.get("ph")
        name = event.get("name")
        if ph == "X" and isinstance(name, str) and (m := STEP_NAME.match(name)):
            start = us_to_ns(event.get("ts"), path, f"[{index}].ts")
            duration = us_to_ns(event.get("dur"), path, f"[{index}].dur")
            if start + duration > I64_MAX:
                raise InputError("step end out of range", file=path, column=f"[{index}].dur",
                                 expected="ts + dur before the year 2262 (int64 ns)", found=show(event.get("dur"), 40))
            steps.append((step_number(m.group(1), path, f"[{index}].name"), start, start + duration))
        elif ph == "C" and name in MEMORY_COUNTERS:
            args = event.get("args")
            kb = args.get("KB") if isinstance(args, dict) else None
            if not isinstance(kb, (int, float, Decimal)) or isinstance(kb, bool) \
                    or not (exact := Decimal(kb)).is_finite():
                raise InputError("memory counter without a finite KB value", file=path,
                                 column=f"[{index}].args.KB", expected="a number", found=kb)
            if not (exact.adjusted() <= 18 and 0 <= exact * 1024 <= I64_MAX):  # (past 1e18: no product)
                raise InputError("memory counter out of range" + (": its bytes overflow int64" if kb > 0 else ""),
                                 file=path, column=f"[{index}].args.KB", expected="KB >= 0 that fit int64 bytes",
                                 found=kb)
            t = us_to_ns(event.get("ts"), path, f"[{index}].ts")
            samples.setdefault((event.get("pid"), name), []).append((t, round(exact * 1024)))
        elif ph == "M" and name == "process_name":
            args = event.get("args")
            if isinstance(args, dict) and args.get("name") == "NPU MEM":
                mem_pids.add(event.get("pid"))
        elif ph == "M" and name == "process_sort_index":
            args = event.get("args")
            if isinstance(args, dict):
                sort_index[event.get("pid")] = args.get("sort_index")
    result = TraceView()
    if steps:
        result.steps = _sorted_table(("step", "t_start", "t_end"), steps)
    for (pid, name), rows in samples.items():
        if mem_pids and pid not in mem_pids:
            continue  # a counter of the same name from another process is not device memory
        # Keyed by device: counters of different devices are never merged into one series.
        counters = result.counters.setdefault(device_of_pid(pid, sort_index.get(pid)), {})
        previous = counters.get(name)
        if previous is not None:  # the same counter of another pid naming the same device: one series
            rows = list(zip(previous.ints("t_ns").values.tolist(), previous.ints("reserved").values.tolist())) + rows
        counters[name] = _sorted_table(("t_ns", "reserved"), rows)
    return result


def _sorted_table(names: tuple[str, ...], rows: Sequence[tuple[int, ...]]) -> Table:
    """int64 columns ``names`` of ``rows``, sorted stably by the first column."""
    data = np.array(rows, dtype=np.int64).reshape(len(rows), len(names))
    data = data[np.argsort(data[:, 0], kind="stable")]
    return Table({name: Ints.of(np.ascontiguousarray(data[:, k])) for k, name in enumerate(names)})

"""The JSON that ``prof.export_memory_timeline`` writes (torch.profiler), in its two forms.

- ``*memory_timeline*.json`` (``.json.gz``): ``[times_us, sizes]``, the sizes of each category at
  each time (:func:`load_timeline`); claimed only by its name *and* its ``[[`` header.
- ``*.raw.json.gz`` (Holistic Trace Analysis keeps it as ``*.raw.gz``): ``[t_ns, action, bytes,
  category]`` rows (:func:`load_raw_timeline`).

Neither records the device it was exported for, so the device is ``unknown``, nor which allocation a
free releases nor which operator allocated it: the allocator series is all they give (the Kineto trace
of the same run has the rest). docs/formats-reference.md §5.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import ijson
import numpy as np

from memgate.errors import InputError
from memgate.loaders import registry
from memgate.metric_specs import Fact, not_measurable
from memgate.model import DeviceModel, Profile, Series
from memgate.readers import convert, limits
from memgate.readers.files import check_readable
from memgate.readers.jsonstream import JsonLimitError, guard, syntax_error
from memgate.readers.pyrecords import check_column, resolve
from memgate.readers.traceevents import ijson_errors, open_trace, read_head
from memgate.schemas import load_schema
from memgate.table import Ints, Table

TIMELINE_FORMAT = "torch_memory_timeline"
RAW_TIMELINE_FORMAT = "torch_memory_timeline_raw"
SCHEMA = "kineto"  # the [times_us, sizes] form is a $def of the Kineto trace's schema
RAW_SCHEMA = "torch_memory_timeline_raw"
COMPONENT = "allocator"
_RAW_BATCH = 1 << 16  # rows checked and converted at once
PREEXISTING, CREATE, INCREMENT_VERSION, DESTROY = 1, 2, 3, 4  # torch.profiler._memory_profiler.Action
_TIMELINE_GAPS = not_measurable({
    Fact.BLOCKS: "the memory timeline records sizes by category, not which allocation a free releases nor which "
                 "operator allocated it (the Kineto trace of the same run has both)"})


# ---- detection ------------------------------------------------------------------------------------


def _is_json_name(path: Path) -> bool:
    return path.name.lower().endswith((".json", ".json.gz"))


_TIMELINE_HEAD = rb"\s*\[\s*\[\s*([0-9]|\])"  # [times, sizes]: an array of arrays of numbers


def claims_timeline(path: Path) -> bool:
    """``prof.export_memory_timeline`` JSON: the name says so and the file starts with ``[[``
    (a ``*.raw.json`` name is claimed_raw_timeline's, whichever form it holds)."""
    if "memory_timeline" not in path.name.lower() or not _is_json_name(path) or _is_raw_name(path):
        return False
    return _head_matches(path, _TIMELINE_HEAD)


def is_timeline_content(path: Path) -> bool:
    """A JSON file of any other name that starts as ``export_memory_timeline``'s ``[times, sizes]`` does
    (torch lets a user name it anything); asked of a file given by name only: in a folder, an array of
    arrays may be any data."""
    return _is_json_name(path) and not _is_raw_name(path) and _head_matches(path, _TIMELINE_HEAD)


def _is_raw_name(path: Path) -> bool:
    # torch writes the raw form for a path ending "raw.json.gz" (any other: the [times, sizes] form);
    # Holistic Trace Analysis keeps it as "memory_timeline.raw.gz"
    name = path.name.lower()
    return name.endswith(("raw.json.gz", ".raw.json", ".raw.gz"))


def claims_raw_timeline(path: Path) -> bool:
    """``prof.export_memory_timeline("*.raw.json.gz")``: the name says so and the file is a JSON
    array that is empty or starts with an array of numbers."""
    return _is_raw_name(path) and _head_matches(path, rb"(\xef\xbb\xbf)?\s*\[\s*(\]|\[\s*-?[0-9])")


def _head_matches(path: Path, pattern: bytes) -> bool:
    """A file whose first 256 bytes (decompressed) start with ``pattern``; False where they cannot be read."""
    if not path.is_file():
        return False
    try:
        head = read_head(path, 256)
    except (OSError, EOFError, zlib.error):
        return False
    return re.match(pattern, head) is not None


# ---- export_memory_timeline -----------------------------------------------------------------------


def load_timeline(path: Path) -> Profile:
    check_readable(path)
    limits.check_file_size(path)
    schema = load_schema(SCHEMA)
    items: list[Any] = []
    try:
        with open_trace(path) as fh:
            for index, item in enumerate(ijson.items(guard(fh, path), "item")):
                if index >= 2:
                    raise InputError("a memory timeline has exactly two arrays", file=path, column=f"[{index}]",
                                     expected="[times_us, sizes]", found="a third element")
                items.append(item)
    except JsonLimitError as exc:
        raise exc.located(path, f"[{len(items)}]") from None
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
    t = convert.int64_or_zero(arr, len(times)) * 1000
    frame = Table({
        "t_ns": Ints.of(t),
        "allocated": Ints.of(totals),
        "reserved": Ints.absent(len(t)),
        "active": Ints.absent(len(t)),
    })
    device = DeviceModel(device="unknown", series={COMPONENT: Series(COMPONENT, frame, str(path))})
    return Profile(path=str(path), format=TIMELINE_FORMAT, rank=registry.rank_of_file(path), devices=(device,),
                   metadata={"categories": width, "note": "export_memory_timeline does not record the device",
                             "not_measurable": dict(_TIMELINE_GAPS)})


# ---- export_memory_timeline, raw form -------------------------------------------------------------


def load_raw_timeline(path: Path) -> Profile:
    """``*.raw.json.gz`` of ``prof.export_memory_timeline``: ``[t_ns, action, bytes, category]`` rows.

    The allocator series is the running sum of bytes, one sample per row in time order (rows of
    memory that existed before profiling, t = -1, at the first time of the file). The device is not
    recorded: ``unknown``. A ``*.raw.json`` holding the ``[times, sizes]`` form (what torch writes
    for that name without ``.gz``) is read as that form.
    """
    check_readable(path)
    limits.check_file_size(path)
    if _coalesced_form(path):
        return load_timeline(path)
    props = resolve(load_schema(RAW_SCHEMA)["$defs"]["row"], load_schema(RAW_SCHEMA))["prefixItems"]
    columns: list[list[np.ndarray]] = [[], [], [], []]
    batch: list[Any] = []
    done = 0
    max_rows = limits.current().max_rows
    gz = path.name.lower().endswith(".gz")
    with open_trace(path) as fh, ijson_errors(path, gz, lambda: f"[{done + len(batch)}]", "item",
                                              lambda: done + len(batch)):
        for row in ijson.items(guard(fh, path), "item"):
            batch.append(row)
            if len(batch) == _RAW_BATCH:
                _raw_rows(path, batch, done, props, columns, max_rows)
                done += len(batch)
                batch = []
    _raw_rows(path, batch, done, props, columns, max_rows)
    t, action, nbytes, _ = (np.concatenate(c) if c else np.zeros(0, np.int64) for c in columns)
    frame, note = _raw_series(path, t, action, nbytes)
    device = DeviceModel(device="unknown", series={COMPONENT: Series(COMPONENT, frame, str(path))})
    metadata = {"rows": len(t), "note": "export_memory_timeline does not record the device",
                "not_measurable": dict(_TIMELINE_GAPS)}
    if note:
        metadata["times_note"] = note
    return Profile(path=str(path), format=RAW_TIMELINE_FORMAT, rank=registry.rank_of_file(path), devices=(device,),
                   metadata=metadata)


def _coalesced_form(path: Path) -> bool:
    """Does the file hold ``[times, sizes]`` (its second element an array of arrays, or empty)
    rather than rows? Read until the second element's first token; a malformed file is left to the
    raw reader, which names its error."""
    try:
        with open_trace(path) as fh:
            elements = 0
            for prefix, event, _ in ijson.parse(guard(fh, path)):
                if prefix == "item" and event in ("start_array", "end_array") and elements == 2:
                    return bool(event == "end_array")  # [[], []]: the [times, sizes] of an empty timeline
                if prefix == "item.item" and elements == 2:
                    return bool(event == "start_array")
                if prefix == "item" and event == "start_array":
                    elements += 1
                elif prefix == "" and event == "end_array":
                    return False
    except (ijson.JSONError, InputError, EOFError, OSError, zlib.error, UnicodeDecodeError, RecursionError):
        return False
    return False


def _raw_rows(path: Path, rows: list[Any], first: int, props: list[Mapping[str, Any]],
              columns: list[list[np.ndarray]], max_rows: int) -> None:
    """Check a batch of rows (row ``first`` the first) against the schema; append its columns as int64."""
    if not rows:
        return
    if first + len(rows) > max_rows:
        limits.check_rows(path, first + len(rows), what="timeline rows", column=f"[{max_rows}]")
    bad = next((i for i, row in enumerate(rows) if type(row) is not list or len(row) != 4), None) \
        if set(map(type, rows)) != {list} or set(map(len, rows)) != {4} else None
    if bad is not None:
        row = rows[bad]
        raise InputError("a raw memory timeline row is [t, action, bytes, category]", file=path,
                         column=f"[{first + bad}]", expected="an array of 4 integers",
                         found=f"an array of {len(row)}" if isinstance(row, list) else row)
    problems = []
    arrays = []
    for k, values in enumerate(zip(*rows, strict=True)):
        arr, problem = check_column(list(values), props[k], name="", where=partial(_cell, first, k), required=True)
        if problem is not None:
            problems.append(problem)
        arrays.append(arr)
    if problems:
        raise min(problems, key=lambda p: p.index).error(path)
    for k, arr in enumerate(arrays):
        columns[k].append(convert.int64_or_zero(arr, len(rows)))


def _cell(first: int, column: int, i: int) -> str:
    return f"[{first + i}][{column}]"


def _raw_series(path: Path, t: np.ndarray, action: np.ndarray, nbytes: np.ndarray) -> tuple[Table, str | None]:
    """The allocator series of raw rows (checked against the file's own rules), and a note on its times."""
    def fail(mask: np.ndarray, message: str, expected: str, column: int) -> None:
        hits = np.flatnonzero(mask)
        if len(hits):
            row = int(hits[0])
            raise InputError(message, file=path, column=f"[{row}][{column}]", expected=expected,
                             found=f"[{t[row]}, {action[row]}, {nbytes[row]}, ...]")

    fail((t == -1) != (action == PREEXISTING), "t is -1 exactly for PREEXISTING rows (memory from before profiling)",
         "t = -1 with action 1 (PREEXISTING), a time in ns with the others", 0)
    fail(((action == PREEXISTING) | (action == CREATE)) & (nbytes < 0), "a PREEXISTING or CREATE row frees bytes",
         "bytes >= 0", 2)
    fail((action == DESTROY) & (nbytes > 0), "a DESTROY row allocates bytes", "bytes <= 0", 2)
    versions = np.flatnonzero(action == INCREMENT_VERSION)  # pairs: -n in the old version's category, +n in the new
    old, new = versions[0::2], versions[1::2]
    odd = np.zeros(len(t), dtype=bool)
    if len(old) > len(new):
        odd[old[-1]] = True
    k = min(len(old), len(new))
    broken = (new[:k] != old[:k] + 1) | (t[new[:k]] != t[old[:k]]) | (nbytes[new[:k]] != -nbytes[old[:k]]) | \
        (nbytes[old[:k]] > 0)
    odd[old[:k][broken]] = True
    fail(odd, "an INCREMENT_VERSION row without its pair", "INCREMENT_VERSION rows in pairs at one t: -bytes, then "
         "+bytes", 2)
    if float(np.abs(nbytes.astype(np.float64)).sum()) >= 2.0**63:
        raise InputError("the bytes of the rows add up past int64", file=path,
                         expected="a running total that fits int64", found=f"{len(nbytes)} rows")
    timed = t[t >= 0]
    note = None
    if len(timed):
        start = int(timed.min())
    else:
        start, note = 0, "no row has a time (only PREEXISTING rows): every sample is at t = 0"
    t_ns = np.where(t >= 0, t, start)
    order = np.argsort(t_ns, kind="stable")
    allocated = np.cumsum(nbytes[order])
    below = np.flatnonzero(allocated < 0)
    if len(below):
        row = int(order[below[0]])
        raise InputError("memory below zero: a row frees bytes the timeline never allocated", file=path,
                         column=f"[{row}][2]", expected="a running total of bytes >= 0 (PREEXISTING rows hold what "
                         "existed before profiling)", found=f"{int(allocated[below[0]])} bytes after this row")
    frame = Table({"t_ns": Ints.of(t_ns[order]), "allocated": Ints.of(allocated),
                   "reserved": Ints.absent(len(t)), "active": Ints.absent(len(t))})
    return frame, note



registry.register(registry.Format(RAW_TIMELINE_FORMAT, claims_raw_timeline, load_raw_timeline))
registry.register(registry.Format(TIMELINE_FORMAT, claims_timeline, load_timeline))

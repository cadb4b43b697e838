"""CANN msprof text export (docs/formats-reference.md §3): ``PROF_*/mindstudio_profiler_output/*_{ts}.csv``.

Where the files are: ``PROF_*/mindstudio_profiler_output/`` (all devices in one set of files), else
``PROF_*/device_N/mindstudio_profiler_output/`` or ``PROF_*/device_N/summary/`` (one set per
device). A file is ``{kind}_{ts}.csv`` or, when msprof split it, ``{kind}_slice_{N}_{ts}.csv``: the
slices of one export are concatenated in slice order (each has its own header). When a folder holds
several exports of a kind, the latest ``{ts}`` is read and the others are listed in the metadata.

One ``PROF_*`` directory is one profile; each ``Device_id`` in its files is a device ``npu:N`` of it
(a PROF directory written for one process has one device; the rank is a ``rank_N`` in the directory
names, else that device's id).

Mapping (all sizes KB = bytes / 1024, timestamps µs text → exact int ns):
- ``memory_record_*`` → the ``GE`` series (CANN records only GE; it is the framework series here).
- ``npu_mem_*`` → ``APP`` (event APP, ``memory(KB)``) and ``NPU MEM Device/Memory`` (event Device).
- ``npu_module_mem_*`` → ``module:{Component}`` series (``-1`` = only releases seen: no value).
- ``operator_memory_*`` → blocks of component ``GE``, op ``cann::{Name}`` (as torch_npu names them, so
  one ``cann::*`` cap covers both). There is no Release Time column: release = Allocation Time +
  Duration. A **negative Size** is a release-only row (allocated before profiling); its only time,
  ``Allocation Time`` (+ Duration when given), is taken as the release time. **Not freed in the
  window**: older CANN leaves Duration and the Release totals empty; newer CANN writes ``0`` in all
  three. A row is unfreed when Duration is empty, or when Duration is 0 *and* both Release totals are
  0/empty (a real release leaves the pool's reserved total above 0, so a freed block never has both).
  Which convention a file used is reported in ``metadata["unfreed_marked_by"]``.
- ``static_op_mem_*`` (static graph memory, planned at compile time on a logical node-index clock)
  is a fact, not blocks: ``metadata["static_op_mem"]`` lists per device and graph the TOTAL bytes,
  the op count and the largest op.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from memgate.errors import InputError, read_errors_named
from memgate.loaders import registry
from memgate.loaders.ascend.crossfile import cross_file_facts
from memgate.model import (
    BLOCK_COLUMNS,
    SERIES_COLUMNS,
    DeviceModel,
    Profile,
    Series,
    empty_blocks,
    int_table,
    typed_blocks,
)
from memgate.readers import convert
from memgate.readers.csvtable import CsvTable, read_csv
from memgate.schemas import load_schema
from memgate.table import Table

FORMAT = "cann"
OUTPUT_DIR = "mindstudio_profiler_output"
KIB = 1 << 10
KINDS = ("operator_memory", "memory_record", "npu_mem", "npu_module_mem", "static_op_mem")
FRAMEWORK_SERIES = "GE"
DEVICE_SERIES = "NPU MEM Device/Memory"
STATIC_TOTAL = "TOTAL"
_FILE = re.compile(
    r"^(?P<kind>npu_module_mem|operator_memory|memory_record|static_op_mem|npu_mem)"
    r"(?:_slice_(?P<slice>[0-9]+))?_(?P<tail>[0-9][0-9_]*)\.csv$"
)
_DEVICE_DIR = re.compile(r"^device_([0-9]+)$")


# ---- where the files are ---------------------------------------------------------------------------


def _exports(folder: Path) -> tuple[dict[str, list[Path]], list[str]]:
    """Per kind, the files of the latest export in slice order; and the names of older exports."""
    found: dict[str, dict[str, list[tuple[int, Path]]]] = defaultdict(lambda: defaultdict(list))
    if not folder.is_dir():
        return {}, []
    for path in folder.iterdir():
        if (m := _FILE.match(path.name)) and path.is_file():
            piece = int(m.group("slice")) if m.group("slice") is not None else -1
            found[m.group("kind")][m.group("tail")].append((piece, path))
    chosen: dict[str, list[Path]] = {}
    ignored: list[str] = []
    for kind, by_tail in found.items():
        tails = sorted(by_tail, key=lambda t: tuple(int(x) for x in t.split("_") if x))
        chosen[kind] = [p for _, p in sorted(by_tail[tails[-1]], key=lambda sp: (sp[0], sp[1].name))]
        ignored += [p.name for t in tails[:-1] for _, p in sorted(by_tail[t])]
    return chosen, sorted(ignored)


def source_dirs(path: Path) -> list[Path]:
    """The folders holding the CSVs of a PROF directory (or the output folder itself)."""
    if path.name == OUTPUT_DIR:
        return [path]
    top = path / OUTPUT_DIR
    if _exports(top)[0]:
        return [top]
    devices = sorted((d for d in path.iterdir() if _DEVICE_DIR.match(d.name) and d.is_dir()),
                     key=lambda d: int(d.name.split("_")[1])) if path.is_dir() else []
    out = []
    for device in devices:
        for inner in (device / OUTPUT_DIR, device / "summary"):
            if _exports(inner)[0]:
                out.append(inner)
                break
    return out


def claims(path: Path) -> bool:
    try:
        if not path.is_dir():
            return False
        if path.name.startswith("PROF_"):
            return True
        return path.name == OUTPUT_DIR and bool(_exports(path)[0])
    except OSError:
        return False


# ---- the files ----------------------------------------------------------------------------------------


def _device(table: CsvTable) -> pd.Series:
    """``Device_id`` (validated digits) → ``npu:N``."""
    ids = pc.cast(pa.array(table.parse_ints("Device_id"), type=pa.int64()), pa.string())  # parse_ints(): names a too-long id
    return convert.text(pc.binary_join_element_wise("npu:", ids, ""))


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def read_operator_memory(path: Path) -> tuple[pd.DataFrame, set[str]]:
    """Blocks (with a ``device`` column) and how unfreed blocks were marked ('empty' / 'zero')."""
    table = read_csv(path, load_schema("cann.operator_memory"))
    size = table.parse_bytes("Size(KB)", KIB)
    when = table.parse_ns_from_us("Allocation Time(us)")
    duration = table.parse_ns_from_us("Duration(us)")
    rel_alloc = table.parse_bytes("Release Total Allocated(KB)", KIB)
    rel_reserved = table.parse_bytes("Release Total Reserved(KB)", KIB)
    release_only = (size < 0).to_numpy(dtype=bool)
    no_time = when.isna().to_numpy(dtype=bool)
    if no_time.any():
        row = _first(no_time)
        raise InputError(
            "a row needs an Allocation Time (in a release-only row, the time of the release)",
            file=path, line=table.line_of(row), column="Allocation Time(us)", expected="a timestamp",
            found="an empty cell",
        )
    empty_duration = duration.isna().to_numpy(dtype=bool)
    zero_release = ((rel_alloc.fillna(0) == 0) & (rel_reserved.fillna(0) == 0)).to_numpy(dtype=bool)
    zero_duration = (duration == 0).fillna(False).to_numpy(dtype=bool)
    unfreed_empty = empty_duration & ~release_only
    unfreed_zero = zero_duration & zero_release & ~release_only
    unfreed = unfreed_empty | unfreed_zero
    t_free = when + duration.fillna(0)
    t_free[unfreed] = pd.NA
    t_alloc = when.copy()
    t_alloc[release_only] = pd.NA
    name = convert.text(table.column("Name"))
    op = name.where(name.isna() | name.str.startswith("cann::"), "cann::" + name)
    blocks = pd.DataFrame(
        {
            "size": size.abs(),
            "t_alloc": t_alloc,
            "t_free": t_free,
            "op": op,
            "stream": pd.Series(pd.NA, index=range(table.num_rows), dtype="string"),
            "owner": pd.Series(pd.NA, index=range(table.num_rows), dtype="string"),
            "component": pd.Series(FRAMEWORK_SERIES, index=range(table.num_rows), dtype="string"),
            "alloc_total": table.parse_bytes("Allocation Total Allocated(KB)", KIB),
        }
    )[list(BLOCK_COLUMNS)]
    blocks["device"] = _device(table)
    marks = ({"empty"} if unfreed_empty.any() else set()) | ({"zero"} if (unfreed_zero & ~unfreed_empty).any() else set())
    return blocks, marks


def _series_frame(table: CsvTable, key: pd.Series, t_column: str, allocated: pd.Series | None,
                  reserved: pd.Series) -> pd.DataFrame:
    n = table.num_rows
    return pd.DataFrame(
        {
            "device": _device(table),
            "key": key,
            "t_ns": table.parse_ns_from_us(t_column),
            "allocated": allocated if allocated is not None else pd.Series(pd.NA, index=range(n), dtype="Int64"),
            "reserved": reserved,
            "active": pd.Series(pd.NA, index=range(n), dtype="Int64"),
        }
    )


def read_memory_record(path: Path) -> pd.DataFrame:
    table = read_csv(path, load_schema("cann.memory_record"))
    return _series_frame(table, convert.text(table.column("Component")), "Timestamp(us)",
                         table.parse_bytes("Total Allocated(KB)", KIB),
                         table.parse_bytes("Total Reserved(KB)", KIB))


def read_npu_mem(path: Path) -> pd.DataFrame:
    table = read_csv(path, load_schema("cann.npu_mem"))
    event = convert.text(table.column("event"))
    key = event.map({"APP": "APP", "Device": DEVICE_SERIES}).astype("string")
    return _series_frame(table, key, "timestamp(us)", None,
                         table.parse_bytes("memory(KB)", KIB))


def read_npu_module_mem(path: Path) -> pd.DataFrame:
    table = read_csv(path, load_schema("cann.npu_module_mem"))
    reserved = table.parse_bytes("Total Reserved(KB)", KIB)
    reserved[reserved < 0] = pd.NA  # -1: the module only showed releases, no level
    return _series_frame(table, "module:" + convert.text(table.column("Component")), "Timestamp(us)", None, reserved)


def read_static_op_mem(path: Path) -> pd.DataFrame:
    table = read_csv(path, load_schema("cann.static_op_mem"))
    return pd.DataFrame(
        {
            "device": _device(table),
            "op": convert.text(table.column("Op Name")),
            "model": convert.text(table.column("Model Name")),
            "graph": convert.text(table.column("Graph ID")),
            "size": table.parse_bytes("Size(KB)", KIB),
        }
    )


def static_facts(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Per (device, model, graph): the TOTAL row's bytes, the op count and the largest op."""
    facts = []
    keys = ["device", "model", "graph"]
    for (device, model, graph), group in frame.fillna({"model": "", "graph": ""}).groupby(keys, sort=True):
        ops = group[group["op"] != STATIC_TOTAL]
        total = group.loc[group["op"] == STATIC_TOTAL, "size"]
        largest = ops.loc[ops["size"].idxmax()] if len(ops) else None
        facts.append({
            "device": str(device), "model_name": str(model), "graph_id": str(graph),
            "total_bytes": int(total.iloc[-1]) if len(total) else None,
            "ops": len(ops),
            "largest_op": None if largest is None else str(largest["op"]),
            "largest_op_bytes": None if largest is None else int(largest["size"]),
        })
    return facts


READERS = {"memory_record": read_memory_record, "npu_mem": read_npu_mem, "npu_module_mem": read_npu_module_mem}


# ---- the profile ----------------------------------------------------------------------------------------


def _check_entries(folder: Path) -> None:
    """An export file's name on something that is not a file (a directory, a symlink loop): an error,
    not a silently missing part of the export."""
    for entry in folder.iterdir():
        if _FILE.match(entry.name) and not entry.is_file():
            raise InputError("not a regular file", file=entry, expected="a CSV file of the msprof export",
                             found="a broken symlink or a symlink loop" if entry.is_symlink() else "a directory")


@read_errors_named
def load(path: Path) -> Profile:
    folders = source_dirs(path)
    files: dict[str, list[Path]] = defaultdict(list)
    ignored: list[str] = []
    for folder in folders:
        _check_entries(folder)
        chosen, older = _exports(folder)
        for kind, paths in chosen.items():
            files[kind] += paths
        ignored += [str(folder / name) for name in older]
    if not files:
        raise InputError(
            "no CANN memory data in this PROF directory",
            file=path,
            expected="mindstudio_profiler_output/ or device_N/summary/ with operator_memory_*, memory_record_*, "
                     "npu_mem_* or npu_module_mem_*.csv (msprof --sys-hardware-mem=on, export summary)",
        )
    series: dict[str, dict[str, Series]] = defaultdict(dict)
    for kind, reader in READERS.items():
        if not files.get(kind):
            continue
        frame = pd.concat([reader(p) for p in files[kind]], ignore_index=True)
        source = ", ".join(str(p) for p in files[kind])
        for (device, key), group in frame.groupby(["device", "key"], sort=True):
            part = group[list(SERIES_COLUMNS)].sort_values("t_ns", kind="stable")
            series[str(device)][str(key)] = Series(str(key), int_table(part, SERIES_COLUMNS), source)

    blocks: dict[str, Table] = {}
    blocks_source: str | None = None
    marks: set[str] = set()
    if files.get("operator_memory"):
        read = [read_operator_memory(p) for p in files["operator_memory"]]
        frame = pd.concat([b for b, _ in read], ignore_index=True)
        marks = set().union(*(m for _, m in read))
        blocks_source = ", ".join(str(p) for p in files["operator_memory"])
        for device, group in frame.groupby("device", sort=True):
            blocks[str(device)] = typed_blocks(group)

    metadata: dict[str, Any] = {"units": "KB = bytes/1024"}
    devices = set(series) | set(blocks)
    if files.get("static_op_mem"):
        static = pd.concat([read_static_op_mem(p) for p in files["static_op_mem"]], ignore_index=True)
        metadata["static_op_mem"] = static_facts(static)
        devices |= set(static["device"].dropna().astype(str))
    if marks:
        metadata["unfreed_marked_by"] = sorted(marks)
    if ignored:
        metadata["older_exports_ignored"] = sorted(ignored)

    ordered = sorted(devices, key=lambda d: int(d.split(":")[1]))
    models = tuple(
        DeviceModel(
            device=device,
            series=series.get(device, {}),
            blocks=blocks.get(device, empty_blocks()),
            blocks_source=blocks_source if device in blocks else None,
        )
        for device in ordered
    )
    metadata["cross_file"] = cross_file_facts(models, path)
    return Profile(path=str(path), format=FORMAT, rank=rank_of(path, ordered), devices=models, metadata=metadata)


def rank_of(path: Path, devices: list[str]) -> str:
    """A ``rank_N`` in the directory names, else the device id (ids joined with '+' for several)."""
    ids = [d.split(":")[1] for d in devices]
    return rank_hint(path) or ("+".join(ids) if ids else "0")


def rank_hint(path: Path) -> str | None:
    """A ``rank_N`` directory names the rank; otherwise only the device ids inside can (a load)."""
    prof = path.parent if path.name == OUTPUT_DIR else path
    return registry.rank_in_names(prof.name, prof.parent.name)


registry.register(registry.Format(FORMAT, claims, load, rank_hint=rank_hint))

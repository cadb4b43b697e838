"""Do the files of one profile belong together? (torch_npu / MindSpore / CANN directories)

A profile directory holds several files written from the same run: the allocator's totals
(``memory_record``), its blocks (``operator_memory``), module totals, counters. Copied together by
hand or by a pipeline, they can come from different runs, windows or devices, and each still loads.
:func:`cross_file_facts` states what each file covers (its devices and its time window: the figures
the report shows under ``metadata["cross_file"]``) and refuses what cannot be one profile:

- blocks on a device no file records allocator totals for, while the totals are recorded for others
  (``operator_memory.csv`` of ``npu:1`` beside a ``memory_record.csv`` of ``npu:0``): the allocator
  writes a total with every block, so a real export has both on every device with blocks;
- blocks whose time window does not overlap the allocator totals' window at all on a device (the
  same allocations are written to both files, so their windows always overlap in a real export);
- steps (``kernel_details``, ``step_trace_time``, ``STEP_TIME``) that all end before the first memory
  record: the profiler records both in the same active steps (steps after the last record stand: a
  graph-mode run allocates before its steps).

How far overlapping files agree (the share of the blocks' window the totals cover, the share of
blocks whose recorded total matches the series) is :mod:`memgate.reconcile`'s consistency figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memgate.errors import InputError
from memgate.model import DeviceModel
from memgate.table import Ints, Table

# The allocator series whose rows are written from the same allocations as the blocks.
ALLOCATOR_SERIES = ("PTA", "GE", "PTA+GE", "MindSpore", "MindSpore+GE", "allocator")


def _where(source: str) -> tuple[str, str | None]:
    """(file, db table or None) of a ``Series.source`` / ``blocks_source`` (``path``, ``path:TABLE``,
    or several slice files joined by ", ": the first names the export)."""
    first = source.split(", ")[0]
    if not Path(first).exists() and ":" in first:
        path, table = first.rsplit(":", 1)
        return path, table
    return first, None


def _span(values: Sequence[Ints]) -> tuple[int, int] | None:
    lo: int | None = None
    hi: int | None = None
    for column in values:
        times = column.known()
        if len(times):
            lo = int(times.min()) if lo is None else min(lo, int(times.min()))
            hi = int(times.max()) if hi is None else max(hi, int(times.max()))
    return None if lo is None or hi is None else (lo, hi)


def _blocks_span(model: DeviceModel) -> tuple[int, int] | None:
    return _span([model.blocks.ints("t_alloc"), model.blocks.ints("t_free")]) if len(model.blocks) else None


def _allocator_span(model: DeviceModel) -> tuple[tuple[int, int], str] | None:
    """The allocator series' window on a device and the file it comes from."""
    parts = [s for name, s in sorted(model.series.items()) if name in ALLOCATOR_SERIES]
    span = _span([s.frame.ints("t_ns") for s in parts])
    return None if span is None else (span, parts[0].source)


def _ns(span: tuple[int, int]) -> str:
    return f"{span[0]}..{span[1]} ns"


def cross_file_facts(models: Sequence[DeviceModel], root: Path, steps: Table | None = None,
                     steps_source: str | None = None) -> dict[str, Any]:
    """Per file (named relative to the profile ``root``): the devices it names and its time window (ns,
    the steps' file too); InputError when the files cannot be one profile (see the module docstring)."""
    devices: dict[str, set[str]] = {}
    windows: dict[str, tuple[int, int]] = {}

    def note(source: str | None, device: str, span: tuple[int, int] | None) -> None:
        if source is None:
            return
        name = _where(source)[0]
        devices.setdefault(name, set()).add(device)
        if span is not None:
            old = windows.get(name)
            windows[name] = span if old is None else (min(old[0], span[0]), max(old[1], span[1]))

    for model in models:
        for series in model.series.values():
            note(series.source, model.device, _span([series.frame.ints("t_ns")]))
        note(model.blocks_source, model.device, _blocks_span(model))

    allocator = {m.device: _allocator_span(m) for m in models}  # each device's totals, computed once
    with_totals = [m for m in models if allocator[m.device] is not None]
    untotalled = [m for m in models if len(m.blocks) and allocator[m.device] is None]
    if untotalled and with_totals:  # the allocator writes a total with every block: one file is another's
        blocks_file, table = _where(str(untotalled[0].blocks_source))
        totals = allocator[with_totals[0].device]
        assert totals is not None
        totals_file, _ = _where(totals[1])
        where = ", ".join(m.device for m in untotalled)
        recorded = ", ".join(m.device for m in with_totals)
        raise InputError(
            f"the files of this profile name different devices: the blocks on {where} have no allocator totals, "
            f"{Path(totals_file).name} records them for {recorded} only (files of another rank or run?)",
            file=blocks_file, column=table, expected=f"blocks on the device(s) {totals_file} records: {recorded}",
            found=f"blocks on {where}")
    for model in models:
        blocks_span = _blocks_span(model)
        totals = allocator[model.device]
        if blocks_span is None or totals is None:
            continue
        span, source = totals
        if blocks_span[1] < span[0] or span[1] < blocks_span[0]:
            blocks_file, table = _where(str(model.blocks_source))
            totals_file, _ = _where(source)
            raise InputError(
                f"{model.device}: the blocks and the allocator totals of {Path(totals_file).name} do not overlap in "
                "time: they come from different runs or profiling windows", file=blocks_file, column=table,
                expected=f"blocks inside the window of {totals_file} ({_ns(span)})",
                found=f"blocks from {_ns(blocks_span)}")
    if steps is not None and steps_source is not None:
        steps_span = _span([steps.ints("t_start"), steps.ints("t_end")])
        if steps_span is not None:
            _check_steps_meet(steps_span, _where(steps_source)[0], windows)
            windows[_where(steps_source)[0]] = steps_span
    base = root if root.is_dir() else root.parent

    def short(name: str) -> str:
        return Path(name).relative_to(base).as_posix() if Path(name).is_relative_to(base) else name

    return {
        "devices_by_file": {short(name): sorted(labels) for name, labels in sorted(devices.items())},
        "window_ns_by_file": {short(name): list(span) for name, span in sorted(windows.items())},
    }


def _check_steps_meet(steps_span: tuple[int, int], steps_file: str, windows: dict[str, tuple[int, int]]) -> None:
    """Steps that all end before the first memory record come from another run: each step would measure
    memory it never saw (an empty step reads as zero growth). Steps after the last record are a run
    that allocated nothing more while they ran (graph mode allocates at compile time): those stand."""
    if not windows:
        return
    lo, hi = min(span[0] for span in windows.values()), max(span[1] for span in windows.values())
    if steps_span[1] < lo:
        files = ", ".join(sorted(Path(name).name for name in windows))
        raise InputError(
            f"the steps of {Path(steps_file).name} all end before the memory records ({files}) begin: they come "
            "from another run or profiling window", file=steps_file,
            expected=f"steps that meet the memory records' window ({_ns((lo, hi))})", found=f"steps from {_ns(steps_span)}")

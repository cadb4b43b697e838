"""A snapshot's steps, from its ``external_annotations``: ``ProfilerStep#N`` (START/END), else the
optimizer's ``Optimizer.step#...`` annotations (``_record_memory_history`` without torch.profiler)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from memgate.categories import note_starts
from memgate.errors import InputError
from memgate.model import empty_steps, step_number
from memgate.readers.pyrecords import int_column
from memgate.table import Ints, Table

STEP_NAME = re.compile(r"^ProfilerStep#([0-9]+)$")  # also read by RE2 (Arrow), where $ is the end
_OPTIMIZER_STEP = re.compile(r"^Optimizer\.step#")


def steps(path: Path, ann: dict[str, pa.Array | None], t_first: int) -> tuple[Table, str | None]:
    """One row per ``ProfilerStep#N`` (by N): its earliest START and latest END annotation.

    Without any (``_record_memory_history`` without torch.profiler), the optimizer's own annotations
    (``Optimizer.step#AdamW.step``, one START/END per ``optimizer.step()``) mark the steps: step n runs
    from the end of optimizer step n-1 (the first from ``t_first``, the history's first entry) to the
    end of optimizer step n. Returns (steps, the optimizer annotation's name or None)."""
    names, stages = ann["name"], ann["stage"]
    assert names is not None and stages is not None  # required by the schema
    number = pc.extract_regex(names, STEP_NAME.pattern.replace("([0-9]+)", "(?P<n>[0-9]+)"))
    times = int_column(ann["time_us"], len(names)) * 1000
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    end_at: dict[int, int] = {}
    for i, (digits, stage, t) in enumerate(zip(pc.struct_field(number, "n").to_pylist(), stages.to_pylist(),
                                               times.tolist())):
        if digits is None:
            continue
        n = step_number(digits, path, f"external_annotations[{i}].name")
        if stage == "START":
            starts[n] = min(t, starts.get(n, t))
        elif stage == "END" and t >= ends.get(n, t):
            ends[n] = t
            end_at[n] = i
    for n, end in ends.items():
        if n in starts and end < starts[n]:  # a step cannot end before it starts
            raise InputError(f"ProfilerStep#{n} ends before it starts", file=path,
                             column=f"external_annotations[{end_at[n]}].time_us",
                             expected=f"an END at or after its START ({starts[n] // 1000} us)",
                             found=f"{end // 1000} us")
    if not starts and not ends:
        return _optimizer_steps(names.to_pylist(), stages.to_pylist(), times.tolist(), t_first)
    numbers = sorted(starts.keys() | ends.keys())
    return Table({"step": Ints.of(numbers), "t_start": Ints.of_optional(starts.get(n) for n in numbers),
                  "t_end": Ints.of_optional(ends.get(n) for n in numbers)}), None


def _optimizer_steps(names: list[Any], stages: list[Any], times: list[int], t_first: int) -> tuple[Table, str | None]:
    """Steps bounded by the ends of one optimizer's ``Optimizer.step#...`` annotations (see :func:`steps`);
    with several optimizers, the first one's (a GAN's two optimizers step once each per training step)."""
    first = next((n for n in names if isinstance(n, str) and _OPTIMIZER_STEP.match(n)), None)
    if first is None:
        return empty_steps(), None
    ends = sorted(t for n, stage, t in zip(names, stages, times) if n == first and stage == "END")
    if not ends:
        return empty_steps(), None
    begins = [min(t_first, ends[0]), *ends[:-1]]
    return Table({"step": Ints.of(range(len(ends))), "t_start": Ints.of(begins), "t_end": Ints.of(ends)}), first


def note_start_times(ann: dict[str, pa.Array | None]) -> dict[str, int]:
    """memgate::note#k START (ns) by k as text (JSON metadata), from the annotations' columns."""
    names, stages, times = ann["name"], ann["stage"], ann.get("time_us")
    if names is None or stages is None or times is None:
        return {}
    starts = note_starts(names.to_pylist(), stages.to_pylist(), (int_column(times, len(names)) * 1000).tolist())
    return {str(k): t for k, t in starts.items()}

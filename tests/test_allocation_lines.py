"""memgate.allocation_lines: each torch call of the user's code runs inside a span naming its lines, so a
block is placed on the line that allocated it (real torch, CPU)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from memgate.allocation_lines import SPAN_PREFIX, span_frames

torch = pytest.importorskip("torch")

from memgate.record import Recorder, allocation_stacks


def test_span_names_round_trip() -> None:
    assert span_frames(SPAN_PREFIX + "f (a.py:3) <- g (b.py:40)") == ["f (a.py:3)", "g (b.py:40)"]
    assert span_frames("memgate::note#3") is None and span_frames("aten::empty") is None


def _allocate(n: int) -> object:
    return torch.empty(n, dtype=torch.uint8)  # the allocating line: _allocate's first body line


def test_a_block_is_placed_on_the_line_that_allocated_it(tmp_path: Path) -> None:
    kept = []
    with Recorder(tmp_path, snapshots=False) as rec:
        for _ in range(2):
            kept.append(_allocate(300_007))
            rec.step()
    trace = tmp_path / "torch_trace.json"
    data = json.loads(trace.read_text(), parse_float=Decimal)  # ts in µs with 3 decimals: exact ns
    base = data.get("baseTimeNanoseconds") or 0
    allocs = [e for e in data["traceEvents"] if e.get("name") == "[memory]" and e["args"].get("Bytes") == 300_007]
    assert len(allocs) == 2
    holders = [{"size": 300_007, "t_alloc": base + int(e["ts"] * 1000)} for e in allocs]
    line = _allocate.__code__.co_firstlineno + 1
    caller = test_a_block_is_placed_on_the_line_that_allocated_it.__code__.co_firstlineno + 4
    here = Path(__file__).relative_to(Path.cwd()) if Path(__file__).is_relative_to(Path.cwd()) else Path(__file__)
    for stack in allocation_stacks(trace, holders):
        assert stack[:2] == [f"_allocate ({here}:{line})",
                             f"test_a_block_is_placed_on_the_line_that_allocated_it ({here}:{caller})"]


def test_without_allocation_lines_a_block_is_placed_in_its_function(tmp_path: Path) -> None:
    kept = []
    with Recorder(tmp_path, snapshots=False, allocation_lines=False) as rec:
        kept.append(_allocate(300_007))
        rec.step()
    data = json.loads((tmp_path / "torch_trace.json").read_text())
    assert not any(str(e.get("name", "")).startswith(SPAN_PREFIX) for e in data["traceEvents"])

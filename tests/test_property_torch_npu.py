"""Properties: a ground-truth trace written as a torch_npu text export reads back to its own metrics.

The writer (tests/writers/torch_npu.py) follows docs/formats-reference.md §1 and the real samples; the expected
values come from tests/groundtruth.py, which does not import memgate. Every comparison is exact:
the writer's only rounding is bytes → KB/MB float text and ns → µs text with 3 decimals, and both
are lossless (bytes/1024**k is an exact binary fraction for integer bytes < 2**53 and ``repr``
round-trips it; integer ns have exactly 3 decimals in µs). Fragmentation and step growth are then
computed from identical integers by the same formula, so they match to the last bit too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from groundtruth import Block, Trace, expected_metrics, live_blocks_at, peak_moment
from hypothesis import given
from hypothesis import strategies as st
from strategies import npu_options, traces
from writers.torch_npu import NpuOptions, app_samples, write_profile

from memgate.discover import discover, load
from memgate.metrics import TOP_HOLDERS, DeviceMetrics, MetricOptions, profile_metrics
from memgate.model import Profile

COMPARED = ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation", "external_fragmentation", "step_growth_bytes", "leaked_bytes", "leak_undetermined_bytes",
            "op_max_block_bytes")


def _read(prof: Path, warmup: int = 1) -> tuple[Profile, DeviceMetrics]:
    found = discover(prof)
    assert [f.format.name for f in found] == ["torch_npu"]
    assert found[0].path == prof
    profile = load(found[0])
    metrics = profile_metrics(profile, MetricOptions(warmup_steps=warmup))
    assert len(metrics) == 1
    return profile, metrics[0]


def _block_key(size: int, op: str | None, t_alloc: int | None, component: str | None, stream: str | None) -> tuple:
    return (size, op or "", t_alloc, component, stream)


def _expected_top(trace: Trace, t: int, opts: NpuOptions) -> list[tuple]:
    live = sorted(live_blocks_at(trace, t), key=lambda b: -b.size)
    no_stream = opts.generation == "<2.1"  # no Stream Ptr column before 2.1
    return [_block_key(b.size, b.op, b.t_alloc, b.component,
                       None if b.component == "GE" or no_stream else str(b.stream)) for b in live]


def _check_top(top: list[dict[str, Any]], trace: Trace, t: int, opts: NpuOptions) -> None:
    """The N largest blocks live at ``t``: sizes in order, and each one a real live block."""
    expected = _expected_top(trace, t, opts)
    assert [e["size"] for e in top] == [k[0] for k in expected[:TOP_HOLDERS]]
    got = Counter(_block_key(e["size"], e["op"], e["t_alloc"], e["component"], e["stream"]) for e in top)
    assert not got - Counter(expected), "a block at the peak that is not live then"


def _steps_containing(trace: Trace, t: int) -> set[int]:
    return {n for n, start, end in trace.steps if start <= t <= end}


def _check_metrics(values: dict[str, Any], expected: dict[str, object], keys: tuple[str, ...] = COMPARED) -> None:
    for key in keys:
        assert values[key] == expected[key], key
        assert type(values[key]) is type(expected[key]), key  # an int stays an int (exact bytes)


@given(trace=traces(), opts=npu_options(memory_record=True), warmup=st.integers(0, 2))
def test_series_metrics_equal_ground_truth(trace: Trace, opts: NpuOptions, warmup: int) -> None:
    """memory_record.csv present: every metric comes from the PTA+GE series and equals the truth."""
    with tempfile.TemporaryDirectory() as tmp:
        prof = write_profile(trace, Path(tmp), opts)
        profile, m = _read(prof, warmup)
    expected = expected_metrics(trace, warmup_steps=warmup, separate_allocators=True)
    assert profile.rank == str(opts.rank)
    assert m.device == f"npu:{trace.device_id}"
    assert m.component == "PTA+GE"
    _check_metrics(m.values, expected)
    assert m.values["peak_app_reserved_bytes"] == max(r for _, r in app_samples(trace, opts))

    # Steps: numbers and exact ns bounds from trace_view.json / kernel_details.csv.
    steps = profile.steps.to_pandas().dropna().astype("int64")
    assert sorted(map(tuple, steps[["step", "t_start", "t_end"]].to_numpy().tolist())) == sorted(trace.steps)

    # Who holds the peak: the first instant the truth reaches its maximum.
    peak = peak_moment(trace)
    assert m.peak_t_ns == peak
    assert (m.peak_step is None) == (not _steps_containing(trace, peak))
    assert m.peak_step is None or m.peak_step in _steps_containing(trace, peak)
    _check_top(m.values["top_at_peak"], trace, peak, opts)

    # Reconciliation: the hidden baseline is recovered and every allocation row agrees with it --
    # identical timestamps included, because torch_npu (and the writer) record the total right after
    # each event in the order memgate replays them: frees before allocations, allocations in row order.
    pta = m.facts.components["PTA"]
    assert pta.baseline_bytes == trace.hidden_baseline
    assert pta.consistency == 1.0
    assert m.facts.curves["PTA"].start == trace.hidden_baseline + sum(
        b.size for b in trace.blocks if b.t_alloc is None and b.component == "PTA")
    assert trace.pre_window_bytes() == pta.baseline_bytes + sum(
        b.size for b in trace.blocks if b.t_alloc is None)
    assert pta.pre_window_blocks == sum(1 for b in trace.blocks if b.t_alloc is None)
    assert pta.open_blocks == sum(1 for b in trace.blocks if b.t_free is None and b.component == "PTA")
    if any(b.component == "GE" for b in trace.blocks):
        ge = m.facts.components["GE"]
        assert (ge.baseline_bytes, ge.consistency) == (0, 1.0)
    if "PTA+GE" in m.facts.sum_checks:
        assert m.facts.sum_checks["PTA+GE"] == 1.0


@given(trace=traces(), opts=npu_options(memory_record=False))
def test_blocks_only_reconciles_the_baseline(trace: Trace, opts: NpuOptions) -> None:
    """operator_memory.csv alone: the baseline reconciled from the Allocation totals restores the peak."""
    with tempfile.TemporaryDirectory() as tmp:
        prof = write_profile(trace, Path(tmp), opts)
        _, m = _read(prof)
    expected = expected_metrics(trace, separate_allocators=True)
    assert m.component == "blocks"
    _check_metrics(m.values, expected, ("peak_allocated_bytes", "step_growth_bytes", "leaked_bytes",
                                        "op_max_block_bytes"))
    assert m.values["peak_reserved_bytes"] is None and "peak_reserved_bytes" in m.missing
    assert m.values["peak_app_reserved_bytes"] is None
    assert m.facts.components["PTA"].baseline_bytes == trace.hidden_baseline
    assert m.peak_t_ns == peak_moment(trace)
    _check_top(m.values["top_at_peak"], trace, peak_moment(trace), opts)


def test_cli_subprocess_inspect_json(tmp_path: Path) -> None:
    """The installed entry point, once, on a hand-made trace whose metrics are worked out below."""
    t0 = 1_764_246_877_074_330_300
    ms = 1_000_000
    trace = Trace(
        device_id=3,
        hidden_baseline=4_514_000_000,
        blocks=(
            Block(1 << 20, t0, t0 + 50 * ms, "aten::mm"),
            Block(3 << 20, None, t0 + 5 * ms, ""),  # allocated before the window, freed inside it
            Block(8 << 20, t0 + 12 * ms, None, "aten::empty_strided"),  # leaked in step 14
            Block(8 << 20, t0 + 22 * ms, None, "aten::empty_strided"),  # leaked in step 15
            Block(513, t0 + 22 * ms, t0 + 23 * ms, "aten::add"),  # identical timestamp, odd size
            Block(2 << 20, t0 + 40 * ms, t0 + 41 * ms, "cann::MatMulV2", component="GE"),
        ),
        steps=((13, t0, t0 + 10 * ms), (14, t0 + 10 * ms, t0 + 20 * ms), (15, t0 + 20 * ms, t0 + 30 * ms)),
        t_start=t0,
        t_end=t0 + 60 * ms,
    )
    write_profile(trace, tmp_path, NpuOptions(rank=3, crlf=frozenset({"memory_record.csv"})))
    proc = subprocess.run([sys.executable, "-m", "memgate", "inspect", str(tmp_path), "--json"],
                          capture_output=True, text=True, env={**os.environ, "MEMGATE_DEBUG": ""}, check=False)
    assert proc.returncode == 0, proc.stderr
    [dev] = json.loads(proc.stdout)["profiles"][0]["devices"]
    m = dev["metrics"]
    base = 4_514_000_000 + (3 << 20) + (1 << 20)  # after the first allocation
    # Peak: after both 8 MiB leaks, the 513 B block and the 2 MiB GE block (3 MiB freed at 5 ms).
    peak = 4_514_000_000 + (1 << 20) + (16 << 20) + (2 << 20)
    assert m["peak_allocated_bytes"] == peak > base
    assert m["leaked_bytes"] == 8 << 20  # step 14 (13 is the warm-up step; 15 is within the leak horizon)
    assert m["leak_undetermined_bytes"] == 8 << 20  # step 15's block could still be freed after the window
    assert m["step_growth_bytes"] is None  # 2 counted steps: a jump and a trend look alike
    assert "needs at least 5 counted steps" in dev["not_measurable"]["step_growth_bytes"]
    assert m["op_max_block_bytes"] == {"aten::mm": 1 << 20, "aten::empty_strided": 8 << 20, "aten::add": 513,
                                       "cann::MatMulV2": 2 << 20}
    assert [b["size"] for b in m["top_at_peak"]] == [8 << 20, 8 << 20, 2 << 20, 1 << 20]
    assert dev["reconciliation"]["components"]["PTA"]["baseline_bytes"] == 4_514_000_000
    assert m == {**m, **{k: v for k, v in expected_metrics(trace, separate_allocators=True).items() if k in m}}


T0 = 1_736_408_883_694_238_150


def test_blocks_only_window_that_opens_with_a_free(tmp_path: Path) -> None:
    """From blocks alone the peak can be the opening level (baseline + blocks live before the window)."""
    trace = Trace(
        device_id=0, hidden_baseline=1 << 30,
        blocks=(Block(4 << 30, None, T0 + 1_000, ""),  # freed first: the window's highest moment is its start
                Block(512, T0 + 2_000, None, "aten::empty"),
                Block(1 << 20, T0 + 2_000, T0 + 3_000, "aten::mm")),
        steps=(), t_start=T0, t_end=T0 + 5_000,
    )
    prof = write_profile(trace, tmp_path, NpuOptions(memory_record=False))
    _, m = _read(prof)
    assert m.values["peak_allocated_bytes"] == (1 << 30) + (4 << 30) == expected_metrics(trace)["peak_allocated_bytes"]
    assert m.peak_t_ns is not None and m.peak_t_ns < T0 + 1_000
    assert [b["size"] for b in m.values["top_at_peak"]] == [4 << 30]


def test_pta_blocks_free_at_active_release_time(tmp_path: Path) -> None:
    """A PTA block releases its bytes at Active Release Time; Release Time comes later (a no-change row).

    Block B (1 GiB) is actively released 0.5 ms before block C (2 GiB) is allocated, but its Release
    Time is 0.5 ms after: the peak is C + A, and B is not live then.
    """
    ms = 1_000_000
    trace = Trace(
        device_id=0, hidden_baseline=0,
        blocks=(Block(1 << 20, T0, None, "aten::empty"),
                Block(1 << 30, T0 + 1 * ms, T0 + 2 * ms, "aten::mm"),
                Block(2 << 30, T0 + 2 * ms + 500_000, None, "aten::add")),
        steps=(), t_start=T0, t_end=T0 + 5 * ms,
    )
    opts = NpuOptions(memory_record=False, release_delay_ns=1 * ms)
    prof = write_profile(trace, tmp_path, opts)
    _, m = _read(prof)
    assert m.values["peak_allocated_bytes"] == (2 << 30) + (1 << 20) == expected_metrics(trace)["peak_allocated_bytes"]
    assert [b["op"] for b in m.values["top_at_peak"]] == ["aten::add", "aten::empty"]

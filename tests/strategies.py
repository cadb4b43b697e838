"""Hypothesis strategies for the property tests, in one module.

:func:`traces` draws ground-truth allocation traces (:class:`groundtruth.Trace`) shaped like what a
profiler sees on one device: allocs and frees on several streams, several ProfilerSteps whose
numbers are the profiler's counter (never 0/1-based), a per-step leak sometimes, a window that cuts
blocks at both ends (blocks allocated before it and freed inside it; blocks still live at its end),
a hidden baseline (memory held before the window by blocks that never show up as rows), GE blocks,
and epoch timestamps (~1.7e18 ns = 1.7e15 µs) on a coarse or fine tick so identical timestamps occur.

Sizes: any whole number of bytes. torch_npu writes ``bytes / 1024`` (KB) and ``bytes / 1024**2``
(MB) as Python float text; for integer bytes below 2**53 both are exact binary fractions and
``repr`` round-trips them, so a reader that multiplies back recovers the bytes exactly. Sizes are
multiples of 512 (what the caching allocator hands out), odd (requested sizes) and large.

Shape guarantees the writers rely on (each one is what a real profile window looks like, and each
is needed for a metric to be observable at all from the files):
- the first event of the window is a PTA allocation at ``t_start``: the allocator series has rows
  only at events, so a window that opens with a free would hide the opening level;
- every free is strictly after ``t_start`` and strictly after its block's allocation;
- GE blocks are allocated inside the window: torch_npu's ``PTA+GE`` counts GE as 0 until GE's
  first row, so GE memory from before the window is invisible in that series;
- no block is both allocated before the window and still live at its end (such a block has no row
  in any file: it is part of ``hidden_baseline``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from groundtruth import Block, Trace
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from writers.torch_npu import CSV_FILES, GENERATIONS, STEP_SOURCES, NpuOptions

PTA_OPS = ("aten::empty_strided", "aten::mm", "aten::add", "aten::_convolution", "aten::matmul",
           "npu::npu_format_cast", "atb::SelfAttentionOperation", "")
GE_OPS = ("cann::trans_TransData_0", "cann::Conv2D1", "cann::MatMulV2", "cann::trans_Cast_12")
STREAMS = (2, 897357296, 187651234567)

EPOCH_NS = st.integers(1_700_000_000_000_000_000, 1_800_000_000_000_000_000)
# Tick of the clock in ns: 10 ns like the real files, 1 µs and 1 ms (coarse: many identical stamps).
TICKS = st.sampled_from((10, 1_000, 1_000_000))

sizes = st.one_of(
    st.integers(1, 1 << 15).map(lambda k: k * 512),  # what the caching allocator hands out
    st.integers(1, 1 << 24),  # odd, requested sizes
    st.integers(1, 16).map(lambda k: k << 28),  # large blocks (256 MiB .. 4 GiB)
)
# Release Time - Active Release Time of PTA blocks (real files have 0.3-2 µs): the allocated total
# drops at Active Release Time, and the block's t_free must too.
RELEASE_DELAYS_NS = (0, 10, 480, 2_080, 1_000_000)
hidden_baselines = st.one_of(st.just(0), st.integers(1, 40 << 30), st.integers(1, 1 << 16).map(lambda k: k << 20))


@st.composite
def steps(draw: st.DrawFn, tick: int, t0: int, max_steps: int = 9) -> tuple[tuple[int, int, int], ...]:
    """Consecutive ProfilerStep numbers (the profiler's counter), back to back or with gaps."""
    n = draw(st.integers(0, max_steps))
    first = draw(st.integers(2, 100_000))
    at = t0 + draw(st.integers(0, 50)) * tick
    out = []
    for i in range(n):
        length = draw(st.integers(1, 200)) * tick
        out.append((first + i, at, at + length))
        at += length + draw(st.sampled_from((0, 0, 1, 7))) * tick
    return tuple(out)


@st.composite
def traces(
    draw: st.DrawFn,
    *,
    max_blocks: int = 30,
    ge: bool | None = None,
    pre_window: bool | None = None,
    max_steps: int = 9,  # 5 counted steps measure step_growth
) -> Trace:
    """A ground-truth trace of one device (see the module docstring for its shape).

    ``ge`` / ``pre_window``: force GE blocks / blocks allocated before the window on (True) or off
    (False); None lets Hypothesis choose.
    """
    tick = draw(TICKS)
    t0 = draw(EPOCH_NS)
    step_list = draw(steps(tick, t0, max_steps))
    last = step_list[-1][2] if step_list else t0 + draw(st.integers(1, 400)) * tick
    t_end = last + draw(st.integers(0, 30)) * tick
    span = (t_end - t0) // tick  # window length in ticks, >= 1
    use_ge = draw(st.booleans()) if ge is None else ge
    use_pre = draw(st.booleans()) if pre_window is None else pre_window
    stream_pool = draw(st.lists(st.sampled_from(STREAMS), min_size=1, max_size=3, unique=True))

    def at(k: int) -> int:
        return t0 + k * tick

    # Block 0: the allocation that opens the window.
    first_free = draw(st.one_of(st.none(), st.integers(1, span)))
    blocks = [Block(draw(sizes), t0, None if first_free is None else at(first_free), draw(st.sampled_from(PTA_OPS)),
                    stream_pool[0], "PTA")]
    kinds = ["freed", "open"] + (["pre"] if use_pre else []) + (["ge"] if use_ge else [])
    for _ in range(draw(st.integers(0, max_blocks))):
        kind = draw(st.sampled_from(kinds))
        size = draw(sizes)
        if kind == "pre":  # allocated before the window, freed inside it
            blocks.append(Block(size, None, at(draw(st.integers(1, span))), "", draw(st.sampled_from(stream_pool)), "PTA"))
            continue
        alloc = draw(st.integers(0, span - 1) if kind != "open" else st.integers(0, span))
        free = None if kind == "open" or (kind == "ge" and draw(st.booleans())) else draw(st.integers(alloc + 1, span))
        if kind == "ge":
            blocks.append(Block(size, at(alloc), None if free is None else at(free), draw(st.sampled_from(GE_OPS)),
                                stream_pool[0], "GE"))
        else:
            blocks.append(Block(size, at(alloc), None if free is None else at(free), draw(st.sampled_from(PTA_OPS)),
                                draw(st.sampled_from(stream_pool)), "PTA"))
    leak = draw(st.one_of(st.just(0), st.just(0), sizes))
    if leak:  # one block per step, allocated inside it and never freed: a steady leak
        for number, start, end in step_list:
            k = draw(st.integers((start - t0) // tick, (end - t0) // tick))
            blocks.append(Block(leak, at(k), None, "aten::leaky_cache", stream_pool[0], "PTA"))
    return Trace(
        device_id=draw(st.integers(0, 15)),
        hidden_baseline=draw(hidden_baselines),
        blocks=tuple(blocks),
        steps=step_list,
        t_start=t0,
        t_end=t_end,
    )


def npu_options(*, memory_record: bool | None = None) -> st.SearchStrategy[NpuOptions]:
    """The torch_npu writer's free choices: header generation, step source, line endings, rank, ..."""
    return st.builds(
        NpuOptions,
        rank=st.integers(0, 15),
        generation=st.sampled_from(GENERATIONS),
        step_source=st.sampled_from(STEP_SOURCES),
        memory_record=st.booleans() if memory_record is None else st.just(memory_record),
        release_delay_ns=st.sampled_from(RELEASE_DELAYS_NS),
        release_rows=st.booleans(),
        info_suffix=st.booleans(),
        crlf=st.frozensets(st.sampled_from(CSV_FILES)),
        app_overhead=st.integers(0, 4096).map(lambda k: k << 20),
        app_period_ns=st.sampled_from((20_000_000, 1_000_000)),
    )


def secondary_examples() -> settings:
    """Settings for a per-format property whose ground-truth comparison the cross-format property
    (tests/test_cross_format.py, the profile's full example count) already repeats for every writer:
    fewer examples keep the suite inside its time budget."""
    return settings(max_examples=min(50, settings.default.max_examples))


# Fuzz and guard properties set their own example counts (the suite's time budget), not the profile's.
CI = bool(os.environ.get("CI")) or os.environ.get("HYPOTHESIS_PROFILE") in ("ci", "thorough")
SCALE = max(1, int(os.environ.get("MEMGATE_FUZZ_SCALE", "1") or 1))


def fuzz_settings(ci: int, dev: int) -> Callable[[Any], Any]:
    """Example counts set by the test (not by the profile): ``ci`` under CI, ``dev`` elsewhere, derandomized
    there; ``MEMGATE_FUZZ_SCALE=20`` multiplies them for a long hunt."""
    return settings(max_examples=(ci if CI else dev) * SCALE, deadline=None, derandomize=not CI and SCALE == 1,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])

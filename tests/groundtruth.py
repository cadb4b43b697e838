"""Ground-truth allocation traces and their metrics, computed independently of memgate.

Test-side writers (``tests/writers/``) render a :class:`Trace` in each documented format; the
property tests read the files back through memgate and compare with :func:`expected_metrics`.
Nothing here imports memgate: the reference definitions are plain loops over the trace, written
from DESIGN.md's metric table.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from statistics import median

RESERVE_GRANULE = 2 << 20  # the simulated caching allocator reserves in 2 MiB segments


@dataclass(frozen=True)
class Block:
    size: int  # bytes, > 0
    t_alloc: int | None  # ns since the epoch; None = allocated before the profiling window
    t_free: int | None  # ns; None = still live when the window ends
    op: str  # enclosing operator name, e.g. "aten::mm"; "" when none
    stream: int = 2
    component: str = "PTA"  # "PTA" (framework allocator) or "GE" (graph engine)


@dataclass(frozen=True)
class Trace:
    """One device's allocations during a profiling window."""

    device_id: int
    hidden_baseline: int  # bytes held before the window by blocks that never appear in it
    blocks: tuple[Block, ...]
    steps: tuple[tuple[int, int, int], ...]  # (ProfilerStep number, t_start ns, t_end ns)
    t_start: int  # window start, ns
    t_end: int  # window end, ns

    def events(self) -> list[tuple[int, int, int, Block]]:
        """(t, kind, delta, block): frees (kind 0) before allocs (kind 1) at the same instant."""
        out = []
        for b in self.blocks:
            if b.t_alloc is not None:
                out.append((b.t_alloc, 1, b.size, b))
            if b.t_free is not None:
                out.append((b.t_free, 0, -b.size, b))
        out.sort(key=lambda e: (e[0], e[1]))
        return out

    def pre_window_bytes(self) -> int:
        return self.hidden_baseline + sum(b.size for b in self.blocks if b.t_alloc is None)

    def allocated_curve(self, component: str | None = None) -> list[tuple[int, int]]:
        """(t, allocated after the event) for every event, starting at the window start."""
        blocks_ok = (lambda b: True) if component is None else (lambda b: b.component == component)
        level = (self.hidden_baseline if component in (None, "PTA") else 0) + sum(
            b.size for b in self.blocks if b.t_alloc is None and blocks_ok(b)
        )
        curve = [(self.t_start, level)]
        for t, _, delta, b in self.events():
            if blocks_ok(b):
                level += delta
                curve.append((t, level))
        return curve

    def reserved_curve(self, component: str | None = None) -> list[tuple[int, int]]:
        """Reserved = running max of allocated, rounded up to whole 2 MiB segments (never released)."""
        out, high = [], 0
        for t, allocated in self.allocated_curve(component):
            high = max(high, -(-allocated // RESERVE_GRANULE) * RESERVE_GRANULE)
            out.append((t, high))
        return out

    def reserved_by_allocator_curve(self) -> list[tuple[int, int]]:
        """Reserved when each component is its own caching allocator (torch_npu PTA and GE).

        Every component reserves its own 2 MiB segments (running max of its own allocated, rounded
        up); the device total after each event is their sum. Equals :meth:`reserved_curve` when all
        blocks belong to one component.
        """
        names = sorted({"PTA", *(b.component for b in self.blocks)})
        level = {c: (self.hidden_baseline if c == "PTA" else 0) for c in names}
        for b in self.blocks:
            if b.t_alloc is None:
                level[b.component] += b.size
        high = {c: -(-level[c] // RESERVE_GRANULE) * RESERVE_GRANULE for c in names}
        out = [(self.t_start, sum(high.values()))]
        for t, _, delta, b in self.events():
            level[b.component] += delta
            high[b.component] = max(high[b.component], -(-level[b.component] // RESERVE_GRANULE) * RESERVE_GRANULE)
            out.append((t, sum(high.values())))
        return out


def peak_moment(trace: Trace) -> int:
    """The first instant at which the whole-device allocated curve reaches its maximum."""
    curve = trace.allocated_curve()
    top = max(level for _, level in curve)
    return next(t for t, level in curve if level == top)


def live_blocks_at(trace: Trace, t: int) -> list[Block]:
    """Blocks that hold memory after every event at instant ``t`` (allocated at or before ``t``, or
    before the window, and not freed at or before ``t``)."""
    return [
        b for b in trace.blocks
        if (b.t_alloc is None or b.t_alloc <= t) and (b.t_free is None or b.t_free > t)
    ]


def allocated_at(curve: list[tuple[int, int]], t: int) -> int:
    value = curve[0][1]
    for when, level in curve:
        if when <= t:
            value = level
        else:
            break
    return value


def theil_sen(xs: list[int], ys: list[int]) -> Fraction:
    slopes = [Fraction(ys[j] - ys[i], xs[j] - xs[i]) for i in range(len(xs)) for j in range(i + 1, len(xs)) if xs[j] != xs[i]]
    return Fraction(median(slopes)) if slopes else Fraction(0)


def expected_metrics(trace: Trace, warmup_steps: int = 1, *, separate_allocators: bool = False) -> dict[str, object]:
    """DESIGN.md's metrics of the whole device (all components together), by the definitions.

    ``separate_allocators``: reserved is the sum of each component's own reserved curve (torch_npu
    ``PTA+GE`` = PTA + GE), see :meth:`Trace.reserved_by_allocator_curve`.
    """
    curve = trace.allocated_curve()
    reserved = trace.reserved_by_allocator_curve() if separate_allocators else trace.reserved_curve()
    peak_allocated = max(level for _, level in curve)
    peak_reserved = max(level for _, level in reserved)
    counted = sorted(trace.steps)[warmup_steps:]
    growth: object = None
    # DESIGN: memory rows that never fall inside any step (another window or run) measure no growth.
    overlap = any(start <= t <= end for t, *_ in trace.events() for _, start, end in trace.steps)
    if len(counted) >= 2 and overlap:
        slope = theil_sen([s[0] for s in counted], [allocated_at(curve, s[2]) for s in counted])
        growth = int(slope) if slope.denominator == 1 else float(slope)
    leaked: object = None
    if counted and trace.blocks:
        leaked = sum(
            b.size for b in trace.blocks
            if b.t_free is None and b.t_alloc is not None and any(s[1] <= b.t_alloc <= s[2] for s in counted)
        )
    ops: dict[str, int] = {}
    for b in trace.blocks:
        if b.t_alloc is not None and b.op:
            ops[b.op] = max(ops.get(b.op, 0), b.size)
    return {
        "peak_allocated_bytes": peak_allocated,
        "peak_reserved_bytes": peak_reserved,
        "fragmentation": (1 - peak_allocated / peak_reserved) if peak_reserved else None,
        "step_growth_bytes": growth,
        "leaked_bytes": leaked,
        "op_max_block_bytes": ops,
    }

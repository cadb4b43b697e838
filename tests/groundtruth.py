"""Ground-truth allocation traces and their metrics, computed independently of memgate.

Test-side writers (``tests/writers/``) render a :class:`Trace` in each documented format; the
property tests read the files back through memgate and compare with :func:`expected_metrics`.
Nothing here imports memgate: the reference definitions are plain loops over the trace, written
from docs/design.md's metric table.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def end_of_instants(curve: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The level after every event of each instant (a point between events of one instant is no real moment)."""
    out: list[tuple[int, int]] = []
    for t, level in curve:
        if out and out[-1][0] == t:
            out[-1] = (t, level)
        else:
            out.append((t, level))
    return out


def persistent_growth(floors: list[int]) -> int:
    """DESIGN: the slowest average growth, over runs of (n-1)//2 steps, of the level memory never goes below again."""
    kept = [min(floors[i:]) for i in range(len(floors))]
    w = (len(kept) - 1) // 2
    return min(kept[i + w] - kept[i] for i in range(len(kept) - w)) // w


def pool_figures(allocated: list[tuple[int, int]], reserved: list[tuple[int, int]]) -> tuple[float | None, float]:
    """(fragmentation, external_fragmentation) of one pool from its curves (one point per event, same times).

    The first point is the window start, which no writer records as a row: a growth is seen only
    between two recorded events.
    """
    peak_a = max(level for _, level in allocated)
    peak_r = max(level for _, level in reserved)
    external = 0.0
    for i in range(2, len(reserved)):
        if reserved[i][1] > reserved[i - 1][1]:
            external = max(external, (reserved[i - 1][1] - allocated[i - 1][1]) / reserved[i][1])
    return (1 - peak_a / peak_r if peak_r else None), external


def expected_metrics(trace: Trace, warmup_steps: int = 1, *, separate_allocators: bool = False,
                     leak_horizon_steps: int = 1) -> dict[str, object]:
    """docs/design.md's metrics of the whole device (all components together), by the definitions.

    ``separate_allocators``: each component is its own pool (torch_npu PTA and GE), and reserved is
    the sum of each component's own reserved curve (``PTA+GE`` = PTA + GE), see
    :meth:`Trace.reserved_by_allocator_curve`.
    """
    curve = trace.allocated_curve()
    reserved = trace.reserved_by_allocator_curve() if separate_allocators else trace.reserved_curve()
    peak_allocated = max(level for _, level in curve)
    peak_reserved = max(level for _, level in reserved)
    if separate_allocators:
        pools = [pool_figures(trace.allocated_curve(c), trace.reserved_curve(c))
                 for c in sorted({"PTA", *(b.component for b in trace.blocks)})]
    else:
        pools = [pool_figures(curve, reserved)]
    fragmentation = max((f for f, _ in pools if f is not None), default=None)
    external = max(e for f, e in pools if f is not None) if fragmentation is not None else None
    counted = sorted(trace.steps)[warmup_steps:]
    growth: object = None
    # DESIGN: memory rows that never fall inside any step (another window or run) measure no growth.
    overlap = any(start <= t <= end for t, *_ in trace.events() for _, start, end in trace.steps)
    if len(counted) >= 5 and overlap:
        instants = end_of_instants(curve)
        floors = [min([allocated_at(instants, start)] + [level for t, level in instants if start < t <= end])
                  for _, start, end in counted]
        growth = persistent_growth(floors)
    leaked: object = None
    undetermined: object = None
    if len(counted) > leak_horizon_steps and trace.blocks:
        decided = len(counted) - leak_horizon_steps
        leaked = undetermined = 0
        last_end = max(s[2] for s in counted)
        for b in trace.blocks:
            # live when the last counted step ends (freed after it, it was held through every step)
            if (b.t_free is None or b.t_free > last_end) and b.t_alloc is not None:
                # the counted step it was allocated in; at a boundary two steps share, the later one
                holders = [i for i, s in enumerate(counted) if s[1] <= b.t_alloc <= s[2]]
                if holders:
                    i = max(holders, key=lambda k: counted[k][1])
                    if i < decided:
                        leaked += b.size
                    else:
                        undetermined += b.size
    ops: dict[str, int] = {}
    for b in trace.blocks:
        if b.t_alloc is not None and b.op:
            ops[b.op] = max(ops.get(b.op, 0), b.size)
    return {
        "peak_allocated_bytes": peak_allocated,
        "peak_reserved_bytes": peak_reserved,
        "fragmentation": fragmentation,
        "external_fragmentation": external,
        "step_growth_bytes": growth,
        "leaked_bytes": leaked,
        "leak_undetermined_bytes": undetermined,
        "op_max_block_bytes": ops,
    }

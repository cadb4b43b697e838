"""What one judged check says: its :class:`Outcome`, the verdict line, and the detail under a failure
(the holders at the peak, grouped; the series and file the value came from). Pure text, no judging.

A failure line fits a JUnit ``message=``:
``peak_allocated 25.10 GiB exceeds budget 24.00 GiB by 1.10 GiB (+4.6%) — rank 3 npu:3, step 120``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from memgate.errors import printable
from memgate.sizes import format_size

if TYPE_CHECKING:
    from memgate.metrics import DeviceMetrics
    from memgate.model import ProfileInfo


@dataclass(frozen=True)
class Blocks:
    """Blocks that explain a failed check, under one heading: what grew or was left (the cause), or
    what was live at the peak. ``holders`` keeps the largest; ``count`` and ``total`` are all of them."""

    heading: str  # e.g. "left allocated at the end of the window (cpu)"
    holders: tuple[dict[str, Any], ...]
    count: int
    total: int | None = None  # bytes of all ``count`` blocks, where known
    intro: tuple[str, ...] = ()  # lines before the heading (an out-of-memory error: what did not fit)
    categories: dict[str, int] = field(default_factory=dict)  # bytes of all of them by category (a tracked recording)

    def lines(self, top: int) -> list[str]:
        groups = holder_groups(self.holders, by_size=True)[:top]  # count × size: a leak per step reads as one
        shown = sum(len(g) for g in groups)
        count = max(self.count, len(self.holders))
        total = f" = {format_size(self.total)}" if self.total is not None else ""
        out = list(self.intro)
        if not count and self.intro:
            return out
        out.append(f"{self.heading}: {count} block(s){total}, the largest {shown} grouped:" if shown < count
                   else f"{self.heading}: {count} block(s){total}:")
        if self.categories:
            out.append("  by category: " + ", ".join(f"{name} {format_size(size)}"
                                                     for name, size in self.categories.items()))
        for group in groups:
            out.extend(_group_lines(group))
        return out


@dataclass(frozen=True)
class Outcome:
    profile_path: str
    rank: str
    budget: str
    metric: str  # budget key or op_caps[glob]
    limit: int | float
    value: int | float | None
    passed: bool
    device: str | None
    step: int | None
    message: str  # the one-line verdict
    holders: tuple[dict[str, Any], ...]  # the largest live blocks at the peak of the worst device
    where: str  # the series and file the value came from
    share: float | None = None  # the limit as a share of the device's capacity, where written so
    live_count: int | None = None  # blocks live at the peak (holders keeps only the largest)
    categories: dict[str, int] = field(default_factory=dict)  # bytes at the peak by category (a tracked recording)
    # What caused a growth, leak or left-allocated failure: the blocks that grew or were left, shown
    # before the holders at the peak (None: a check measured at the peak, or blocks that say nothing)
    cause: Blocks | None = None

    def detail(self, top: int = 5) -> str:
        """The section under the failure line: the cause first (the blocks that grew or were left), then
        the peak by category (a tracked recording's), ``top`` groups of holders at the peak (identical
        holders grouped, :func:`holder_groups`), then the source."""
        lines = self.cause.lines(top) if self.cause is not None else []
        if self.categories:
            lines.append(f"at the peak by category ({self.device}): " + ", ".join(
                f"{name} {format_size(size)}" for name, size in self.categories.items()))
        if self.holders:
            groups = holder_groups(self.holders)[:top]
            shown = sum(len(g) for g in groups)
            live = max(self.live_count or 0, len(self.holders))
            lines.append(f"top {shown} of {live} live blocks at the peak ({self.device}):")
            for group in groups:
                lines.extend(_group_lines(group))
        return "\n".join([*map(printable, lines), self.where])  # one line each, whatever a name holds

    def with_holders(self, holders: tuple[dict[str, Any], ...], cause: tuple[dict[str, Any], ...]) -> Outcome:
        """The outcome with its holders (at the peak) and its cause's blocks replaced (their allocating
        Python functions added): a new value, the judged one and its metrics stay as they were."""
        new_cause = replace(self.cause, holders=cause) if self.cause is not None else None
        return replace(self, holders=holders, cause=new_cause)


def _group_lines(group: list[dict[str, Any]]) -> list[str]:
    """One group of identical holders: its bytes and what it is, then the Python functions that allocated it."""
    block = group[0]
    what = block.get("op") or block.get("owner") or "(no op)"
    owner = f"  owner {block['owner']}" if block.get("op") and block.get("owner") else ""
    category = f"  {block['category']}" if block.get("category") else ""
    stream = f"  stream {block['stream']}" if block.get("stream") else ""
    sizes = [int(b["size"]) for b in group]
    if len(group) == 1:
        amount = f"{format_size(sizes[0]):>12}"
    elif len(set(sizes)) == 1:
        amount = f"{len(group)} × {format_size(sizes[0])} = {format_size(sum(sizes))}"
    else:
        amount = f"{len(group)} blocks = {format_size(sum(sizes))} (largest {format_size(max(sizes))})"
    lines = [f"  {amount}  {what}{owner}{category}{stream}"]
    stack = [str(f) for f in block.get("stack") or ()]
    if stack and stack != [block.get("owner")]:  # the Python functions running at the allocation, innermost first
        lines.append(f"  {'':>12}  in {' <- '.join(stack)}")
    return lines


def holder_groups(holders: Sequence[dict[str, Any]], *, by_size: bool = False) -> list[list[dict[str, Any]]]:
    """The holders grouped by what they are (op, owner, stack, stream; ``by_size``: and their size), the
    group holding the most bytes first (equal totals: the one with the larger block, as ``holders`` lists
    them, first): one line per group instead of identical lines."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for block in holders:
        key = (block.get("op"), block.get("owner"), tuple(str(f) for f in block.get("stack") or ()), block.get("stream"),
               block.get("category"), block.get("size") if by_size else None)
        groups.setdefault(key, []).append(block)
    return sorted(groups.values(), key=lambda g: -sum(int(b["size"]) for b in g))  # stable: ties keep their order


def format_value(value: float, kind: str) -> str:
    """A measured value or limit as a verdict prints it: IEC size text, a count, or a ratio with 3 decimals."""
    if kind == "count":
        return str(int(value))
    return format_size(value) if kind == "size" else f"{value:.3f}"


def oom_sentence(oom: dict[str, Any], device: str | None) -> str:
    """``out of memory: a request of 2.00 GiB did not fit, 1.10 GiB free of 80.00 GiB on cuda:0 (allocated
    76.20 GiB, reserved 78.90 GiB) in step 3``: one out-of-memory error (an entry of ``ooms``) in words."""
    def size(key: str) -> str | None:
        value = oom.get(key)
        return format_size(value) if isinstance(value, int) and not isinstance(value, bool) else None

    request = f"a request of {size('size')}" if size("size") else "a request"
    free = size("device_free")
    capacity = f" of {size('capacity')}" if size("capacity") else ""
    where = f" on {device}" if device else ""
    room = f", {free} free{capacity}{where}" if free else where
    levels = [f"{word} {size(key)}" for word, key in (("allocated", "allocated"), ("reserved", "reserved")) if size(key)]
    held = f" ({', '.join(levels)})" if levels else ""
    step = f" in step {oom['step']}" if oom.get("step") is not None else ""
    op = f" by {oom['op']}" if oom.get("op") else ""
    return printable(f"out of memory: {request}{op} did not fit{room}{held}{step}")


def oom_cause(oom: dict[str, Any], device: str | None) -> Blocks:
    """An out-of-memory error as a failure's cause: what did not fit, then the blocks live at that moment."""
    return Blocks(f"live at the out-of-memory error ({device})", tuple(oom.get("holders") or ()),
                  int(oom.get("live_count") or 0), oom.get("live_bytes"), intro=(oom_sentence(oom, device),),
                  categories=dict(oom.get("categories") or {}))


def verdict_line(metric: str, kind: str, value: float, limit: float, where: str) -> str:
    """``peak_allocated 25.10 GiB exceeds budget 24.00 GiB by 1.10 GiB (+4.6%) — rank 3 npu:3, step 120``."""
    if value <= limit:
        head = f"{metric} {format_value(value, kind)} within budget {format_value(limit, kind)}"
    else:
        over = value - limit
        pct = f" (+{over / limit * 100:.1f}%)" if limit else ""
        head = (f"{metric} {format_value(value, kind)} exceeds budget {format_value(limit, kind)} "
                f"by {format_value(over, kind)}{pct}")
    return printable(f"{head} — {where}")  # one line: ``where`` names devices, ops, owners, categories


def source_lines(metrics: DeviceMetrics, profile: ProfileInfo) -> str:
    """Where a value came from: the series and its file, then the profile."""
    lines = []
    if metrics.component:
        lines.append(f"series: {metrics.component} from {metrics.source}")
    lines.append(f"profile: {profile.path} ({profile.format}, rank {profile.rank})")
    return "\n".join(map(printable, lines))

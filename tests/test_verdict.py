"""memgate.verdict: the failure line at the budget boundary, and the detail under it (identical holders
at the peak grouped, the most bytes first, each name kept to one printable line)."""

from __future__ import annotations

from typing import Any

from memgate.verdict import Outcome, holder_groups, verdict_line

MIB = 1 << 20


def _outcome(holders: list[dict[str, Any]], live: int | None = None) -> Outcome:
    return Outcome("p", "0", "b", "peak_allocated", 1, 2, False, "cuda:0", 3, "m", tuple(holders),
                   "profile: p (kineto, rank 0)", live_count=live)


def test_the_verdict_line_within_at_and_over_the_limit() -> None:
    assert verdict_line("peak_allocated", "size", 1024, 1024, "rank 0 cpu") == (
        "peak_allocated 1.00 KiB within budget 1.00 KiB — rank 0 cpu")
    assert verdict_line("peak_allocated", "size", 1536, 1024, "rank 3 npu:3, step 120") == (
        "peak_allocated 1.50 KiB exceeds budget 1.00 KiB by 512 B (+50.0%) — rank 3 npu:3, step 120")
    assert verdict_line("fragmentation", "ratio", 0.25, 0, "rank 0 cpu") == (
        "fragmentation 0.250 exceeds budget 0.000 by 0.250 — rank 0 cpu")  # no percentage of a 0 limit


def test_identical_holders_are_one_group_the_most_bytes_first() -> None:
    mm = {"op": "aten::mm", "size": 64 * MIB, "stack": ["f.py:1:step"]}
    big = {"op": "aten::empty", "size": 100 * MIB}
    groups = holder_groups([big, mm, dict(mm), {**mm, "stack": ["g.py:2:other"]}])
    assert [(g[0]["op"], len(g)) for g in groups] == [("aten::mm", 2), ("aten::empty", 1), ("aten::mm", 1)]


def test_the_detail_counts_what_it_shows_of_what_was_live() -> None:
    holders = [{"op": "aten::mm", "size": 64 * MIB, "owner": "model.fc"}] * 2 + [
        {"op": None, "owner": "enc", "size": 3 * MIB, "stream": 7},
        {"op": "aten::cat", "size": MIB, "stack": ["a.py:1:f", "b.py:2:g"]},
        {"op": "aten::cat", "size": 2 * MIB, "stack": ["a.py:1:f", "b.py:2:g"]}]
    lines = _outcome(holders, live=40).detail(top=3).splitlines()
    assert lines == [
        "top 5 of 40 live blocks at the peak (cuda:0):",
        "  2 × 64.00 MiB = 128.00 MiB  aten::mm  owner model.fc",
        "      3.00 MiB  enc  stream 7",
        "  2 blocks = 3.00 MiB (largest 2.00 MiB)  aten::cat",
        "                in a.py:1:f <- b.py:2:g",
        "profile: p (kineto, rank 0)",
    ]


def test_a_name_with_control_characters_stays_on_its_line() -> None:
    [first, line, _] = _outcome([{"op": "aten::mm\n::error::x\x1b[31m", "size": 1}]).detail().splitlines()
    assert first == "top 1 of 1 live blocks at the peak (cuda:0):" and "::error::x" in line and "\x1b" not in line

"""Window-relative CPU totals, with real torch: two profiling sessions in one process.

torch's CPU memory reporter (c10 ProfiledCPUMemoryReporter) adds a block to its table and running
total only when it is allocated while a profiler records, and takes it out only when it is freed
while a profiler records. A block allocated in one session and freed after it stopped stays in
both: the next session of the process starts with its bytes in ``Total Allocated`` although the
memory is free (docs/formats-reference.md §5). memgate marks CPU Kineto devices window-relative, measures what the
totals carry in from before the trace that no block of the trace accounts for
(``carried_over_bytes``) and leaves it out of ``peak_allocated_bytes``.

The sessions (tests/torchloops.py, record_two_sessions) are built so that every number is known:

- first session (fresh process): ProfilerStep#2..#4 of a training loop whose iterations free what
  they allocate; #4 also keeps ``STALE_SIZES`` buffers, dropped after the profiler stopped.
- second session (a new profiler, same process): ProfilerStep#2..#5 of the same loop; #3 also holds
  a ``HOLD_BYTES`` buffer. Nothing allocated before it is freed inside it.

Expected values come from that construction and from the raw ``[memory]`` events, never from memgate.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torchloops as tl
from torchloops import memory_events, raw_trace, step_spans

from memgate import cli
from memgate.discover import discover, load
from memgate.metrics import DeviceMetrics, MetricOptions, profile_metrics
from memgate.sizes import format_size

STALE = sum(tl.STALE_SIZES)  # 357_350: what the first session leaves in the reporter's total
HOLD = tl.HOLD_BYTES  # 123_457
CUDA_RESERVED = 2 * 1024 * 1024  # one 2 MiB segment of the caching allocator holds every block


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both recordings, each call in a fresh process: the two sessions, and the stale-address case."""
    out = tmp_path_factory.mktemp("window_relative")
    paths = {name: out / f"{name}.pt.trace.json" for name in ("first", "second", "reuse_first", "reuse_second")}
    _, reused = tl.call_isolated([
        ("record_two_sessions", {"first": str(paths["first"]), "second": str(paths["second"])}),
        ("record_stale_reuse", {"first": str(paths["reuse_first"]), "second": str(paths["reuse_second"])}),
    ])
    return {**paths, "reused": reused}


def metrics(path: Path) -> DeviceMetrics:
    [found] = discover(path)
    [m] = profile_metrics(load(found), MetricOptions(warmup_steps=1, leak_horizon_steps=1))
    return m


# ---------------------------------------------------------------------------------------------
# The raw trace, without memgate


def _memory(trace: dict[str, Any]) -> list[dict[str, Any]]:
    """The ``[memory]`` events' args in time order (file order on a tie), with their ts."""
    return [{**e["args"], "ts": Decimal(e["ts"])} for e in memory_events(trace)]


class Window:
    """What one trace's ``[memory]`` events say, computed here from the raw events.

    The blocks a window accounts for are those it has an event for: a block allocated in it (its
    allocation event gives the size), and a block freed in it whose allocation is not in it (live at
    the window start; its free event gives the size). So the memory of the window's own blocks is

        live[k] = start + Bytes[0] + ... + Bytes[k],  start = the sizes of the frees without allocation

    and the window's true peak is max(start, max_k live[k]). Memory allocated before the window and
    not freed in it is not in a CPU trace at all (window-relative). ``Total Allocated`` is not that:
    it also holds what the reporter carried in (``Total Allocated[k] - live[k]``, constant when the
    totals are consistent), bytes no event of the window accounts for.
    """

    def __init__(self, trace: dict[str, Any]) -> None:
        self.events = _memory(trace)
        allocated: dict[int, int] = {}
        self.unmatched_frees: list[int] = []
        for e in self.events:
            if e["Bytes"] > 0:
                allocated[e["Addr"]] = e["Bytes"]
            elif allocated.pop(e["Addr"], None) is None:
                self.unmatched_frees.append(-e["Bytes"])
        self.start = sum(self.unmatched_frees)
        self.live: list[int] = []
        running = self.start
        for e in self.events:
            running += e["Bytes"]
            self.live.append(running)
        self.still_live = sorted(allocated.values())  # allocated in the window, not freed in it
        self.carried = {e["Total Allocated"] - live for e, live in zip(self.events, self.live, strict=True)}
        self.peak = max(self.start, *self.live)
        self.max_total = max(e["Total Allocated"] for e in self.events)

    def peak_in(self, span: tuple[Decimal, Decimal]) -> int:
        """The window's own live memory at its highest during ``span``, from the level just before it."""
        before = [live for e, live in zip(self.events, self.live, strict=True) if e["ts"] < span[0]]
        inside = [live for e, live in zip(self.events, self.live, strict=True) if span[0] <= e["ts"] <= span[1]]
        return max(before[-1] if before else self.start, *inside)


# ---------------------------------------------------------------------------------------------
# 1. The recordings are what the sessions did


def test_first_session_ends_with_exactly_the_buffers_it_kept(traces: dict[str, Any]) -> None:
    trace = raw_trace(traces["first"])
    steps, w = step_spans(trace), Window(trace)
    assert sorted(steps) == [2, 3, 4]
    assert all(e["Device Type"] == 0 and e["Total Reserved"] == 0 for e in w.events)
    # A fresh process: nothing carried in, no free without its allocation, Total Allocated is the
    # exact running sum of the events from 0.
    assert w.carried == {0} and w.unmatched_frees == [] and w.start == 0
    # Every iteration frees what it allocates: what the window leaves live is exactly the kept
    # buffers, allocated in #4 (the last active iteration), one event of each size.
    assert w.still_live == sorted(tl.STALE_SIZES)
    a, b = steps[4]
    assert sorted(e["Bytes"] for e in w.events if a <= e["ts"] <= b and e["Bytes"] in tl.STALE_SIZES) \
        == sorted(tl.STALE_SIZES)
    assert w.events[-1]["Total Allocated"] == STALE


def test_second_session_starts_with_the_stale_bytes(traces: dict[str, Any]) -> None:
    trace = raw_trace(traces["second"])
    steps, w = step_spans(trace), Window(trace)
    assert sorted(steps) == [2, 3, 4, 5]  # a new profiler numbers its steps from 0 again
    # The buffers the first session kept were freed while no profiler recorded: the reporter's total
    # still holds them. The very first event's total is its own bytes plus exactly their sum, and
    # every later total is the window's running sum plus that same amount.
    first = w.events[0]
    assert first["Total Allocated"] - first["Bytes"] == STALE
    # Nothing allocated before the window is freed in it: every free has its allocation, so the
    # window accounts for no block live at its start (start = 0) and the carried bytes are all stale.
    assert w.unmatched_frees == [] and w.start == 0
    assert w.carried == {STALE}
    assert w.still_live == []  # every iteration freed what it allocated, the held buffer included
    # The held buffer: one allocation and its free, both in #3.
    a, b = steps[3]
    assert [e["Bytes"] for e in w.events if abs(e["Bytes"]) == HOLD] == [HOLD, -HOLD]
    assert all(a <= e["ts"] <= b for e in w.events if abs(e["Bytes"]) == HOLD)
    # The same training step each iteration: #3's peak is #2's plus the held buffer, which is the
    # window's peak; the highest total is that plus the stale bytes.
    assert w.peak == w.peak_in(steps[3]) == w.peak_in(steps[2]) + HOLD
    assert w.peak_in(steps[2]) == w.peak_in(steps[4]) == w.peak_in(steps[5])
    assert w.max_total == STALE + w.peak


# ---------------------------------------------------------------------------------------------
# 1. memgate: carried_over_bytes and the window-relative peak


def test_fresh_process_carries_nothing(traces: dict[str, Any]) -> None:
    w = Window(raw_trace(traces["first"]))
    m = metrics(traces["first"])
    assert m.device == "cpu"
    assert m.carried_over_bytes == 0
    assert m.values["peak_allocated_bytes"] == w.peak == w.max_total == STALE  # the kept buffers, at the end
    assert m.peak_step == 4
    note = m.notes["peak_allocated_bytes"]
    assert note.startswith("window-relative")
    assert "carried in" not in note  # nothing carried: the note does not name an amount
    doc = m.as_json()
    assert (doc["window_relative"], doc["carried_over_bytes"]) == (True, 0)


def test_second_session_leaves_the_stale_bytes_out(traces: dict[str, Any]) -> None:
    w = Window(raw_trace(traces["second"]))
    m = metrics(traces["second"])
    assert m.device == "cpu"
    assert m.carried_over_bytes == STALE == 357_350
    assert m.facts.components["allocator"].baseline_bytes == STALE
    assert m.values["peak_allocated_bytes"] == w.peak == w.max_total - STALE
    assert w.peak != w.max_total
    assert m.peak_step == 3
    note = m.notes["peak_allocated_bytes"]
    assert note.startswith("window-relative")
    assert format_size(STALE) in note and format_size(STALE) == "348.97 KiB"
    # Nothing is live at the end of the window: no leak, nothing undetermined (the stale bytes are
    # not blocks, so they cannot show up there either).
    assert m.values["leaked_bytes"] == 0 and m.values["leak_undetermined_bytes"] == 0
    doc = m.as_json()
    assert (doc["window_relative"], doc["carried_over_bytes"]) == (True, STALE)


def test_a_stale_address_freed_in_the_window_is_accounted_for(traces: dict[str, Any]) -> None:
    """A block allocated between the sessions at a stale address and freed in the second window: the
    reporter reports that free with the stale entry's size (BIG_STALE, not the block's BIG_REUSE),
    and takes it out of its total. The trace accounts for that block (a free without allocation: live
    at the start), so only the other stale buffer (SMALL_STALE) is carried over."""
    if not traces["reused"]:
        pytest.skip("malloc gave the pre-window buffer another address: no stale address to hit")
    first = Window(raw_trace(traces["reuse_first"]))
    assert first.carried == {0} and first.still_live == sorted((tl.BIG_STALE, tl.SMALL_STALE))
    trace = raw_trace(traces["reuse_second"])
    w = Window(trace)
    assert [e["Bytes"] for e in w.events] == [tl.WINDOW_BUFFER, -tl.BIG_STALE, -tl.WINDOW_BUFFER]
    assert w.events[0]["Total Allocated"] - tl.WINDOW_BUFFER == tl.BIG_STALE + tl.SMALL_STALE
    assert w.unmatched_frees == [tl.BIG_STALE] and w.start == tl.BIG_STALE
    assert w.carried == {tl.SMALL_STALE}
    assert w.peak == tl.BIG_STALE + tl.WINDOW_BUFFER
    m = metrics(traces["reuse_second"])
    assert m.carried_over_bytes == tl.SMALL_STALE
    assert m.values["peak_allocated_bytes"] == w.peak == w.max_total - tl.SMALL_STALE
    assert format_size(tl.SMALL_STALE) in m.notes["peak_allocated_bytes"]


# ---------------------------------------------------------------------------------------------
# 2. A CUDA device's totals are absolute


def as_cuda(src: Path, dst: Path) -> None:
    """The trace with its ``[memory]`` events relabelled CUDA device 0, ``Total Reserved`` at one
    2 MiB segment (every total of these traces is below it). A text edit of those three values in
    each event's args: every other byte stays as torch wrote it."""
    text = src.read_text()

    def relabel(match: re.Match[str]) -> str:
        args = json.loads(match.group(1))
        assert args["Device Type"] == 0 and args["Total Reserved"] == 0 and args["Total Allocated"] < CUDA_RESERVED
        args.update({"Device Type": 1, "Device Id": 0, "Total Reserved": CUDA_RESERVED})
        return f'"args": {json.dumps(args)}'

    edited, count = re.subn(r'"args": (\{[^{}]*"Device Type"[^{}]*\})', relabel, text)
    assert count == text.count('"name": "[memory]"') > 0
    dst.write_text(edited)


def test_cuda_totals_are_not_window_relative(traces: dict[str, Any], tmp_path: Path) -> None:
    cuda = tmp_path / "cuda.pt.trace.json"
    as_cuda(traces["second"], cuda)
    w = Window(raw_trace(cuda))
    assert {(e["Device Type"], e["Device Id"], e["Total Reserved"]) for e in w.events} == {(1, 0, CUDA_RESERVED)}
    assert w.carried == {STALE}  # the same events: the totals hold 357_350 B before the first one
    m = metrics(cuda)
    assert m.device == "cuda:0"
    assert m.carried_over_bytes is None
    # On CUDA the allocator's total is absolute: memory allocated before the window is live, and
    # counts. The peak is the highest total, the baseline included.
    assert m.values["peak_allocated_bytes"] == w.max_total == STALE + w.peak
    assert m.facts.components["allocator"].baseline_bytes == STALE  # reconciled, and kept in
    assert m.values["peak_reserved_bytes"] == CUDA_RESERVED
    assert "peak_allocated_bytes" not in m.notes
    doc = m.as_json()
    assert (doc["window_relative"], doc["carried_over_bytes"]) == (False, None)


# ---------------------------------------------------------------------------------------------
# 3. The CLI


def test_inspect_json_shows_the_carried_bytes(traces: dict[str, Any]) -> None:
    w = Window(raw_trace(traces["second"]))
    done = subprocess.run([sys.executable, "-m", "memgate", "inspect", str(traces["second"]), "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    [entry] = json.loads(done.stdout)["profiles"]
    [dev] = entry["devices"]
    assert dev["device"] == "cpu"
    assert dev["window_relative"] is True
    assert dev["carried_over_bytes"] == STALE
    assert dev["metrics"]["peak_allocated_bytes"] == w.peak
    assert dev["notes"]["peak_allocated_bytes"].startswith("window-relative")


def test_inspect_text_shows_the_note(traces: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    w = Window(raw_trace(traces["second"]))
    assert cli.main(["inspect", str(traces["second"])]) == cli.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    [at] = [i for i, line in enumerate(lines) if line.split()[:1] == ["peak_allocated_bytes"]]
    assert lines[at].split() == ["peak_allocated_bytes", *format_size(w.peak).split(), f"({w.peak}", "B)"]
    note = lines[at + 1].strip()
    assert note.startswith("note: window-relative") and format_size(STALE) in note


def test_inspect_json_of_cuda_is_absolute(traces: dict[str, Any], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    cuda = tmp_path / "cuda.pt.trace.json"
    as_cuda(traces["second"], cuda)
    assert cli.main(["inspect", str(cuda), "--json"]) == cli.EXIT_OK
    [dev] = json.loads(capsys.readouterr().out)["profiles"][0]["devices"]
    assert (dev["device"], dev["window_relative"], dev["carried_over_bytes"]) == ("cuda:0", False, None)
    assert dev["metrics"]["peak_allocated_bytes"] == Window(raw_trace(cuda)).max_total

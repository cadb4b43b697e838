"""Real H200 runs (tests/data/samples/torch_cuda, PROVENANCE.md there): memgate's figures equal torch.cuda's
own counters (``truth.json``, taken during the same run), and a recording is one profile with one verdict.
(How the recording loader reads a trace and its snapshot as one profile: tests/test_recording.py.)
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from helpers import SAMPLES, ring_buffer_cut, run_cli, sample_pickle

from memgate.discover import discover, load
from memgate.metrics import profile_metrics

CUDA = SAMPLES / "torch_cuda"
TRUTH = json.loads((CUDA / "truth.json").read_text())
FOLDERS = sorted(p.name for p in CUDA.iterdir() if p.is_dir())


def _cuda(folder: str) -> dict[str, object]:
    """The one profile's cuda:0 metric values, after checking the folder is exactly one profile."""
    found = discover(CUDA / folder)
    assert len(found) == 1, [str(f.path) for f in found]
    profile = load(found[0])
    [metrics] = [m for m in profile_metrics(profile) if m.device == "cuda:0"]
    return dict(metrics.values)


@pytest.mark.parametrize("folder", FOLDERS)
def test_peaks_equal_torch_cuda_counters(folder: str) -> None:
    truth = TRUTH[folder]
    values = _cuda(folder)
    if "peak_allocated" in truth:  # torch.cuda.max_memory_allocated() / max_memory_reserved() over the window
        assert values["peak_allocated_bytes"] == truth["peak_allocated"]
        assert values["peak_reserved_bytes"] == truth["peak_reserved"]
    at_dump = truth.get("allocated_at_dump", truth.get("allocated_end"))
    if at_dump is not None and values["allocated_at_dump_bytes"] is not None:  # memory_allocated() at the dump
        assert values["allocated_at_dump_bytes"] == at_dump
        assert values["reserved_at_dump_bytes"] == truth.get("reserved_at_dump", truth.get("reserved_end"))


@pytest.mark.parametrize("folder", FOLDERS)
def test_step_growth_is_the_leak_per_step(folder: str) -> None:
    # every leak is 3149824 B, a multiple of 512: the allocator's rounded leak is the request itself
    assert _cuda(folder)["step_growth_bytes"] == TRUTH[folder]["leak_per_step"]


def test_requested_peak_is_kept_beside_the_allocator_peak() -> None:
    values = _cuda("h200_record_leak")
    requested = values["peak_requested_bytes"]
    assert isinstance(requested, int) and requested < TRUTH["h200_record_leak"]["peak_allocated"]


def test_leaks_freed_before_the_dump_still_count() -> None:
    # the kept list is freed when the training function returns, inside the recording
    values = _cuda("h200_marker_test_leaks")
    assert values["step_growth_bytes"] == 3149824
    assert values["leaked_bytes"] is not None and values["leaked_bytes"] >= 5 * 3149824


def test_a_recording_is_checked_once_per_budget_row(tmp_path: Path) -> None:
    budgets = tmp_path / "memgate.toml"
    budgets.write_text('[[budgets]]\nname = "gpu"\ndevices = "cuda:*"\npeak_allocated = "1 GiB"\nstep_growth = "1 MiB"\n')
    report = tmp_path / "report.json"
    result = run_cli(["check", CUDA / "h200_record_leak", "--budgets", budgets, "--json", report])
    assert result.rc == 1, result.stderr
    rows = json.loads(report.read_text())["budgets"]
    assert [(r["metric"], r["passed"]) for r in rows] == [("peak_allocated", True), ("step_growth", False)]
    assert rows[0]["value"] == TRUTH["h200_record_leak"]["peak_allocated"]


def test_the_marker_fails_the_leaking_recording(pytester: pytest.Pytester) -> None:
    profile = pytester.path / "rec"
    shutil.copytree(CUDA / "h200_marker_test_leaks", profile)
    pytester.makepyfile(test_gpu="""
import pytest

@pytest.mark.memgate(step_growth="1 MiB", devices="cuda:*", profile="rec")
def test_leaks():
    pass
""")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*step_growth 3.00 MiB exceeds budget 1.00 MiB by 2.00 MiB*cuda:0*"])
    result.stdout.no_fnmatch_line("*trace.json*step_growth*")


def test_a_filled_ring_buffer_is_said_and_not_judged(tmp_path: Path) -> None:
    cut = tmp_path / "cut.pickle"
    ring_buffer_cut(CUDA / "h200_record_leak" / "cuda_snapshot.pickle", cut)
    result = run_cli(["inspect", cut])
    assert result.rc == 0, result.stderr
    assert "peak_allocated_bytes     not measurable: cuda:0: 1 free_completed entry without the free_requested" \
        in result.stdout
    assert "max_entries" in result.stdout
    assert "allocated_at_dump_bytes  478.13 MiB (501354496 B)" in result.stdout  # the dump needs no history


def _one_entry(tmp_path: Path, *, frames: bool) -> Path:
    """The leak run's snapshot as torch's legacy ``_record_memory_history(True)`` leaves it: of the whole
    run, the trace keeps its last entry (``trace_alloc_max_entries=1``), here an alloc of a block still
    live at the dump, without frames (``trace_alloc_record_context=False``) unless ``frames``."""
    data = sample_pickle(CUDA / "h200_record_leak" / "cuda_snapshot.pickle")
    live = {b["address"] for s in data["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    last = next(e for e in reversed(data["device_traces"][0]) if e["action"] == "alloc" and e["addr"] in live)
    data["device_traces"][0] = [{**last, "frames": last["frames"] if frames else []}]
    path = tmp_path / ("framed.pickle" if frames else "legacy.pickle")
    path.write_bytes(pickle.dumps(data))
    return path


def test_a_history_of_one_entry_without_frames_is_said_and_not_judged(tmp_path: Path) -> None:
    """What the legacy API keeps is no history of the run: its peak would be the state at the dump."""
    [metrics] = profile_metrics(load(discover(_one_entry(tmp_path, frames=False))[0]))
    assert metrics.values["peak_allocated_bytes"] is None
    why = metrics.missing["peak_allocated_bytes"]
    assert "the history holds one entry, without frames" in why and "trace_alloc_max_entries=1" in why
    assert "max_entries" in why.split("trace_alloc_max_entries=1")[1]  # how to record the whole window
    assert metrics.values["allocated_at_dump_bytes"] == 501354496  # the dump needs no history


def test_a_legacy_history_of_the_dump_marker_alone_says_so(tmp_path: Path) -> None:
    """The legacy recording may keep only the dump's own ``snapshot`` entry, without frames or a time (a real
    file in a public repository holds exactly that): the reason given is that recording, not "no history"."""
    data = sample_pickle(CUDA / "h200_record_leak" / "cuda_snapshot.pickle")
    data["device_traces"][0] = [{"action": "snapshot", "addr": 0, "size": 11840159744, "stream": 0}]
    path = tmp_path / "marker.pickle"
    path.write_bytes(pickle.dumps(data))
    [metrics] = profile_metrics(load(discover(path)[0]))
    assert metrics.values["peak_allocated_bytes"] is None
    why = metrics.missing["peak_allocated_bytes"]
    assert "the history holds one entry, without frames" in why and "no allocation history" not in why
    assert "max_entries" in why.split("trace_alloc_max_entries=1")[1]
    assert metrics.values["allocated_at_dump_bytes"] == 501354496


def test_a_history_of_one_entry_with_frames_is_judged(tmp_path: Path) -> None:
    """The current API records stacks: a trace of one framed entry is a run that allocated once."""
    [metrics] = profile_metrics(load(discover(_one_entry(tmp_path, frames=True))[0]))
    assert metrics.values["peak_allocated_bytes"] == metrics.values["allocated_at_dump_bytes"] == 501354496


def test_one_devices_filled_ring_buffer_leaves_the_others_figures(tmp_path: Path) -> None:
    """Each device's allocator keeps a ring buffer of its own: a process on two GPUs whose second filled
    its buffer still has the first one's whole history, and its figures."""
    whole, cut = tmp_path / "whole.pickle", tmp_path / "cut.pickle"
    ring_buffer_cut(CUDA / "h200_record_leak" / "cuda_snapshot.pickle", cut)
    data = sample_pickle(CUDA / "h200_record_leak" / "cuda_snapshot.pickle")
    second = sample_pickle(cut)
    data["segments"] += [{**s, "device": 1} for s in second["segments"]]
    data["device_traces"].append(second["device_traces"][0])
    whole.write_bytes(pickle.dumps(data))
    by_device = {m.device: m for m in profile_metrics(load(discover(whole)[0]))}
    assert by_device["cuda:0"].values["peak_allocated_bytes"] == TRUTH["h200_record_leak"]["peak_allocated"]
    assert "peak_allocated_bytes" not in by_device["cuda:0"].missing
    assert by_device["cuda:1"].values["peak_allocated_bytes"] is None
    assert by_device["cuda:1"].missing["peak_allocated_bytes"].startswith("cuda:1: 1 free_completed entry")
    assert by_device["cuda:1"].values["allocated_at_dump_bytes"] == by_device["cuda:0"].values["allocated_at_dump_bytes"]

"""Real H200 runs (tests/data/samples/torch_cuda, PROVENANCE.md there): memgate's figures equal torch.cuda's
own counters (``truth.json``, taken during the same run), and a recording is one profile with one verdict.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers import SAMPLES, run_cli

from memgate.discover import discover, load
from memgate.metrics import profile_metrics

CUDA = SAMPLES / "torch_cuda"
TRUTH = json.loads((CUDA / "truth.json").read_text())
FOLDERS = sorted(p.name for p in CUDA.iterdir() if p.is_dir())
RECORDINGS = ("h200_marker_test_leaks", "h200_record_clean", "h200_record_leak")


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


@pytest.mark.parametrize("folder", RECORDINGS)
def test_a_recording_is_one_profile_taking_each_figure_from_its_file(folder: str) -> None:
    [found] = discover(CUDA / folder)
    profile = load(found)
    assert profile.format == "torch_recording"
    assert sorted(d.device for d in profile.devices) == ["cpu", "cuda:0"]
    assert profile.metadata["figures_from"] == {"cpu": "torch_trace.json", "cuda:0": "cuda_snapshot.pickle"}
    # the steps are the trace's: the recorder's last, empty ProfilerStep is in the snapshot only
    assert profile.steps.ints("step").tolist() == list(range(8))
    [cuda] = [d for d in profile.devices if d.device == "cuda:0"]
    assert cuda.steps is not None and cuda.steps.ints("step").tolist() == list(range(8))


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


def test_snapshot_and_trace_that_disagree_are_an_error_naming_both(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(CUDA / "h200_record_leak" / "torch_trace.json", mixed / "torch_trace.json")
    shutil.copy(CUDA / "h200_record_clean" / "cuda_snapshot.pickle", mixed / "cuda_snapshot.pickle")
    result = run_cli(["inspect", mixed])
    assert result.rc == 2
    assert "cuda_snapshot.pickle" in result.stderr and "torch_trace.json" in result.stderr
    assert "Traceback" not in result.stderr


def _ring_buffer_cut(source: Path, into: Path) -> None:
    """``source``'s snapshot as a filled ring buffer leaves it: the oldest entries gone, up to and including
    a free_requested whose free_completed stays."""
    import pickle

    data = pickle.loads(source.read_bytes())  # our own sample (tests/data), not untrusted input
    trace = data["device_traces"][0]
    cut = next(i for i in range(20, len(trace) - 1) if trace[i]["action"] == "free_requested"
               and trace[i + 1]["action"] == "free_completed" and trace[i + 1]["addr"] == trace[i]["addr"])
    data["device_traces"][0] = trace[cut + 1:]
    into.write_bytes(pickle.dumps(data))


def test_a_filled_ring_buffer_is_said_and_not_judged(tmp_path: Path) -> None:
    cut = tmp_path / "cut.pickle"
    _ring_buffer_cut(CUDA / "h200_record_leak" / "cuda_snapshot.pickle", cut)
    result = run_cli(["inspect", cut])
    assert result.rc == 0, result.stderr
    assert "peak_allocated_bytes     not measurable: cuda:0: 1 free_completed entry without the free_requested" \
        in result.stdout
    assert "max_entries" in result.stdout
    assert "allocated_at_dump_bytes  478.13 MiB (501354496 B)" in result.stdout  # the dump needs no history


def test_a_recording_whose_snapshot_filled_takes_the_trace_figures(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    shutil.copytree(CUDA / "h200_record_leak", rec)
    _ring_buffer_cut(CUDA / "h200_record_leak" / "cuda_snapshot.pickle", rec / "cuda_snapshot.pickle")
    profile = load(discover(rec)[0])
    assert profile.metadata["figures_from"]["cuda:0"] == "torch_trace.json"
    assert any("kept only the last part of its history" in note for note in profile.metadata["notes"])
    [m] = [m for m in profile_metrics(profile) if m.device == "cuda:0"]
    assert m.values["peak_allocated_bytes"] == TRUTH["h200_record_leak"]["peak_allocated"]
    assert m.values["allocated_at_dump_bytes"] == TRUTH["h200_record_leak"]["allocated_end"]


def test_a_recorder_manifest_at_max_entries_means_a_cut_history(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    shutil.copytree(CUDA / "h200_record_leak", rec)
    manifest = {"memgate_recording": 1, "steps": 8, "trace": "torch_trace.json",
                "snapshots": [{"file": "cuda_snapshot.pickle", "device_type": "cuda", "max_entries": 559}],
                "device_memory": {"source": "nvml", "scope": "process", "samples": [
                    {"device": "cuda:0", "t_ns": 1795846942684249063 + i, "used_bytes": 1_300_000_000 + i}
                    for i in range(3)]}}
    (rec / "memgate_recording.json").write_text(json.dumps(manifest))
    profile = load(discover(rec)[0])
    assert profile.metadata["figures_from"]["cuda:0"] == "torch_trace.json"
    [m] = [m for m in profile_metrics(profile) if m.device == "cuda:0"]
    # the process's device memory the recorder sampled is the APP series
    assert m.values["peak_app_reserved_bytes"] == 1_300_000_002
    assert profile.metadata["device_memory"] == {"source": "nvml", "scope": "process"}


def test_a_bad_manifest_is_an_error_naming_it(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    shutil.copytree(CUDA / "h200_record_clean", rec)
    (rec / "memgate_recording.json").write_text('{"memgate_recording": 1, "steps": -1}')
    result = run_cli(["inspect", rec])
    assert result.rc == 2
    assert "memgate_recording.json" in result.stderr and "steps" in result.stderr


def test_a_cpu_test_on_a_gpu_host_is_judged_on_its_cpu_figures(tmp_path: Path) -> None:
    import pickle

    rec = tmp_path / "rec"
    shutil.copytree(CUDA / "h200_record_leak", rec)
    # the snapshot of a process whose test allocated nothing on the device: cached segments, no history
    data = pickle.loads((rec / "cuda_snapshot.pickle").read_bytes())
    data["device_traces"] = [[]]
    (rec / "cuda_snapshot.pickle").write_bytes(pickle.dumps(data))
    profile = load(discover(rec)[0])
    assert [d.device for d in profile.devices] == ["cpu", "cuda:0"]  # the trace's own cuda rows stay
    # and a dump of a process that never touched the device at all
    (rec / "cuda_snapshot.pickle").write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    profile = load(discover(rec)[0])
    assert "cuda_snapshot.pickle is empty" in " ".join(profile.metadata["notes"])

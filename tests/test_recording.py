"""memgate.loaders.recording: a Kineto trace and the snapshot dumped from the same process, side by side, read
as one profile (each figure from the file that records it exactly), on the real H200 recordings
(tests/data/samples/torch_cuda); the recorder's manifest read and checked; the two files cross-checked.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest
from helpers import SAMPLES, ring_buffer_cut, run_cli

from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.loaders import recording
from memgate.metrics import profile_metrics

CUDA = SAMPLES / "torch_cuda"
TRUTH = json.loads((CUDA / "truth.json").read_text())
RECORDINGS = ("h200_marker_test_leaks", "h200_record_clean", "h200_record_leak")


def test_a_folder_is_a_recording_with_one_trace_and_its_snapshot(tmp_path: Path) -> None:
    assert recording.claims(CUDA / "h200_record_clean")
    assert not recording.claims(CUDA / "h200_trace_leak")  # a trace alone
    assert not recording.claims(CUDA / "h200_snapshot_leak")  # a snapshot alone
    assert not recording.claims(CUDA / "h200_record_clean" / "torch_trace.json")  # a file
    two = tmp_path / "two"
    shutil.copytree(CUDA / "h200_record_clean", two)
    shutil.copyfile(CUDA / "h200_record_leak" / "torch_trace.json", two / "other_trace.json")
    assert not recording.claims(two)
    with pytest.raises(InputError) as info:
        recording.load(two)
    assert (info.value.message, info.value.found) == (
        "not one recording: expected one Kineto trace and its snapshot side by side", "2 trace(s), 1 snapshot(s)")


@pytest.mark.parametrize(("manifest", "column", "says"), [
    ('{"memgate_recording": 1, "steps": 8', "column 36", "not valid JSON: Expecting ',' delimiter"),
    ('{"memgate_recording": 1, "steps": -1}', "steps", "not a memgate recording manifest: -1 is less than the minimum of 0"),
    ("[]", "(top level)", "not a memgate recording manifest: [] is not of type 'object'"),
    ('{"memgate_recording": 2, "steps": 8}', "memgate_recording", "not a memgate recording manifest: 1 was expected"),
])
def test_the_manifest_is_checked_against_its_schema(tmp_path: Path, manifest: str, column: str, says: str) -> None:
    assert recording.read_manifest(tmp_path) is None  # none: the recording is read without one
    (tmp_path / recording.MANIFEST).write_text('{"memgate_recording": 1, "steps": 8}')
    assert recording.read_manifest(tmp_path) == {"memgate_recording": 1, "steps": 8}
    (tmp_path / recording.MANIFEST).write_text(manifest)
    with pytest.raises(InputError) as info:
        recording.read_manifest(tmp_path)
    assert (info.value.file, info.value.column, info.value.message) == (str(tmp_path / recording.MANIFEST), column, says)


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


def test_snapshot_and_trace_that_disagree_are_an_error_naming_both(tmp_path: Path) -> None:
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    shutil.copy(CUDA / "h200_record_leak" / "torch_trace.json", mixed / "torch_trace.json")
    shutil.copy(CUDA / "h200_record_clean" / "cuda_snapshot.pickle", mixed / "cuda_snapshot.pickle")
    result = run_cli(["inspect", mixed])
    assert result.rc == 2
    assert "cuda_snapshot.pickle" in result.stderr and "torch_trace.json" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_recording_whose_snapshot_filled_takes_the_trace_figures(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    shutil.copytree(CUDA / "h200_record_leak", rec)
    ring_buffer_cut(CUDA / "h200_record_leak" / "cuda_snapshot.pickle", rec / "cuda_snapshot.pickle")
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


def test_a_trace_without_op_spans_leaves_the_snapshots_ops_measured(tmp_path: Path) -> None:
    """The trace's "no operator spans" is its own: the snapshot's blocks name their ops from their frames."""
    rec = tmp_path / "rec"
    shutil.copytree(CUDA / "h200_record_clean", rec)
    trace = rec / "torch_trace.json"
    text = trace.read_bytes()
    assert text.count(b'"cat": "cpu_op"') > 0
    trace.write_bytes(text.replace(b'"cat": "cpu_op"', b'"cat": "not_an_op"'))
    for alone in profile_metrics(load(discover(trace)[0])):  # the trace alone: no op figures, and it says so
        assert alone.values["op_max_block_bytes"] is None and "no operator spans" in alone.missing["op_max_block_bytes"]
    got = {m.device: m for m in profile_metrics(load(discover(rec)[0]))}
    full = {m.device: m for m in profile_metrics(load(discover(CUDA / "h200_record_clean")[0]))}
    assert got["cuda:0"].values["op_max_block_bytes"] == full["cuda:0"].values["op_max_block_bytes"] != {}
    assert "op_max_block_bytes" not in got["cuda:0"].missing


def test_a_bad_manifest_is_an_error_naming_it(tmp_path: Path) -> None:
    rec = tmp_path / "rec"
    shutil.copytree(CUDA / "h200_record_clean", rec)
    (rec / "memgate_recording.json").write_text('{"memgate_recording": 1, "steps": -1}')
    result = run_cli(["inspect", rec])
    assert result.rc == 2
    assert "memgate_recording.json" in result.stderr and "steps" in result.stderr


def test_a_cpu_test_on_a_gpu_host_is_judged_on_its_cpu_figures(tmp_path: Path) -> None:

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


# ---- a hostile manifest: one bounded error at the element -----------------------------------------

_SAMPLES = 20_000


def _device_memory(bad: int, **sample: object) -> str:
    samples = [{"device": "cuda:0", "t_ns": i, "used_bytes": 5 << 20} for i in range(_SAMPLES)]
    samples[bad].update(sample)
    return json.dumps({"memgate_recording": 1, "steps": 8, "device_memory": {
        "source": "nvml", "scope": "process", "samples": samples}})


@pytest.mark.parametrize(("manifest", "column", "says"), [
    (_device_memory(12345, used_bytes=float("inf")), "device_memory.samples[12345].used_bytes",
     "inf is not of type 'integer'"),
    (_device_memory(7, t_ns=float("nan")), "device_memory.samples[7].t_ns", "nan is not of type 'integer'"),
    (_device_memory(19999, device="cuda:" + "0" * 100_000), "device_memory.samples[19999].device",
     "fails the 'pattern' check"),
    (_device_memory(3, used_bytes=-1), "device_memory.samples[3].used_bytes", "-1 is less than the minimum of 0"),
    ('{"memgate_recording": 1, "steps": ' + "9" * 5000 + "}", None,
     "not valid JSON: an integer of 5000 digits (a manifest's are 40 at most)"),
    ('{"memgate_recording": 1, "steps": 8, "device_memory": {"source": "nvml", "samples": [], "scope": "'
     + "k" * 100_000 + '"}}', "device_memory.scope", "fails the 'enum' check"),
])
def test_a_hostile_manifest_is_one_bounded_error_at_its_element(tmp_path: Path, manifest: str, column: str | None,
                                                                says: str) -> None:
    """One Infinity among 20,000 samples gave a 1.5-million-character line pointing at device_memory."""
    (tmp_path / recording.MANIFEST).write_text(manifest)
    with pytest.raises(InputError) as info:
        recording.read_manifest(tmp_path)
    assert (info.value.column, info.value.message) == (column, f"not a memgate recording manifest: {says}"
                                                       if column is not None else says)
    assert len(info.value.one_line()) < 400
    assert not recording._tracks(tmp_path)  # discovery's glance at it raises nothing either

"""Files whose parts contradict each other: one clear error naming the file and where, never a quiet
figure (a false "not measurable", a step that ends before it starts, a capacity picked at random)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
from helpers import SAMPLES, run_cli

from memgate.errors import InputError
from memgate.loaders.kineto import kineto
from memgate.loaders.snapshot import snapshot

CUDA = SAMPLES / "torch_cuda"
LEAK_SNAPSHOT = CUDA / "h200_record_leak" / "cuda_snapshot.pickle"
TRACE = CUDA / "h200_trace_leak" / "train.1795846944832606968.pt.trace.json"


def _snapshot(tmp_path: Path, edit: object) -> Path:
    data = pickle.loads(LEAK_SNAPSHOT.read_bytes())  # the repository's own data-only sample
    edit(data)  # type: ignore[operator]
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(data))
    return path


def test_a_trace_that_maps_more_than_the_segments_hold_is_an_error(tmp_path: Path) -> None:
    def map_more(data: dict) -> None:  # type: ignore[type-arg]
        trace = data["device_traces"][0]
        trace.insert(1, {**trace[0], "action": "segment_map", "addr": 1 << 40, "size": 8 << 30})

    path = _snapshot(tmp_path, map_more)
    with pytest.raises(InputError, match="maps more segment memory than the final segments hold") as info:
        snapshot.load(path)
    assert info.value.column == "device_traces[0]"
    assert "below zero" in str(info.value.found)
    result = run_cli(["inspect", path])
    assert result.rc == 2 and "snap.pickle" in result.stderr and "Traceback" not in result.stderr


def test_a_step_that_ends_before_it_starts_is_an_error(tmp_path: Path) -> None:
    def swap(data: dict) -> None:  # type: ignore[type-arg]
        notes = data["external_annotations"]
        start = next(a for a in notes if a["name"] == "ProfilerStep#3" and a["stage"] == "START")
        end = next(a for a in notes if a["name"] == "ProfilerStep#3" and a["stage"] == "END")
        start["time_us"], end["time_us"] = end["time_us"], start["time_us"]

    path = _snapshot(tmp_path, swap)
    data = pickle.loads(path.read_bytes())
    at = next(i for i, a in enumerate(data["external_annotations"])
              if a["name"] == "ProfilerStep#3" and a["stage"] == "END")
    with pytest.raises(InputError, match="ProfilerStep#3 ends before it starts") as info:
        snapshot.load(path)
    assert info.value.column == f"external_annotations[{at}].time_us"


def test_a_gpu_listed_twice_with_two_capacities_is_an_error(tmp_path: Path) -> None:
    doc = json.loads(TRACE.read_text())
    first = doc["deviceProperties"][0]
    doc["deviceProperties"].append({**first, "totalGlobalMem": first["totalGlobalMem"] // 2})
    path = tmp_path / "two.pt.trace.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError, match="listed twice in deviceProperties with two capacities") as info:
        kineto.load(path)
    assert info.value.column == f"deviceProperties[{len(doc['deviceProperties']) - 1}].totalGlobalMem"
    assert str(first["totalGlobalMem"]) in str(info.value.expected)


def test_a_gpu_listed_twice_alike_is_read(tmp_path: Path) -> None:
    doc = json.loads(TRACE.read_text())
    doc["deviceProperties"].append(dict(doc["deviceProperties"][0]))
    path = tmp_path / "twice.pt.trace.json"
    path.write_text(json.dumps(doc))
    capacity = kineto.load(path).metadata["device_capacity_bytes"]
    assert capacity == {"cuda:0": doc["deviceProperties"][0]["totalGlobalMem"]}


def test_inspect_takes_several_paths_and_names_the_one_that_is_no_profile() -> None:
    mindspore = SAMPLES / "mindspore"
    result = run_cli(["inspect", mindspore / "ms210_cpu_graph_old", mindspore / "PROVENANCE.md",
                      CUDA / "h200_record_clean"])
    assert result.rc == 2
    assert "[mindspore, rank 0]" in result.stdout and "[torch_recording, rank 0]" in result.stdout
    assert result.stderr.count("\n") == 1 and "PROVENANCE.md: not a profile file" in result.stderr


def test_an_unreadable_baseline_to_ratchet_is_said_and_kept(pytester: pytest.Pytester) -> None:
    import shutil

    from helpers import REPO

    shutil.copytree(REPO / "examples" / "profiles", pytester.path / "profiles")
    shutil.copy(REPO / "examples" / "memgate.toml", pytester.path / "memgate.toml")
    baseline = pytester.path / "base.json"
    baseline.write_text('{"memgate_baseline": ')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memgate=profiles",
                                           "--memgate-save-baseline=base.json", "--memgate-ratchet")
    result.stdout.fnmatch_lines(["memgate: error: *base.json*(the baseline was not rewritten)"])
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    assert result.ret != 0
    assert baseline.read_text() == '{"memgate_baseline": '

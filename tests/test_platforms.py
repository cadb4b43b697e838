"""Each device's platform (memgate/platforms.py): read from every sample family, kept in reports, saved
runs and baselines, and history compared within a platform unless asked (--memgate-compare-platform)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import skip_without_torch

from memgate.baselines import for_platform, ratchet
from memgate.cli import main
from memgate.discover import discover, load
from memgate.platforms import Platform, device_platform, entry_platform

SAMPLES = Path(__file__).parent / "data" / "samples"
H200 = Platform("NVIDIA H200", 150109880320, "9.0", "CUDA driver 13.0", "CUDA 13.0", None, "")


def _platforms(path: Path) -> dict[str, Platform]:
    [found] = discover(path)
    profile = load(found)
    return {d.device: device_platform(profile.metadata, d.device) for d in profile.devices}


# ---- the rule ------------------------------------------------------------------------------------


def test_the_same_platform_is_device_memory_framework_release_and_allocator() -> None:
    a = Platform("NVIDIA H200", 150109880320, "9.0", "NVIDIA driver 570.86", "CUDA 12.8", "torch 2.11.0+cu128", "")
    assert a.label() == "NVIDIA H200 / torch 2.11"
    assert a.same_as(Platform("NVIDIA H200", 150109880320, "9.0", "NVIDIA driver 570.99", "CUDA 12.9",
                              "torch 2.11.1", ""))  # a driver or patch release: the same history
    assert not a.same_as(Platform("NVIDIA A100-SXM4-80GB", 85899345920, framework="torch 2.11.0"))
    assert not a.same_as(Platform("NVIDIA H200", 150109880320, framework="torch 2.12.0"))
    assert not a.same_as(Platform("NVIDIA H200", 150109880320, framework="torch 2.11.0",
                                  allocator="expandable_segments:True"))
    assert a.same_as(Platform())  # unknown: a saved run from before platforms were recorded
    assert Platform().label() == "unknown"
    assert Platform.of(a.as_json()) == a
    assert Platform.of({"device_name": "unknown", "total_memory": -1}) == Platform()


# ---- each sample family --------------------------------------------------------------------------


def test_a_kineto_trace_names_its_gpu_and_cuda() -> None:
    found = _platforms(SAMPLES / "torch_cuda" / "h200_trace_leak" / "train.1795846944832606968.pt.trace.json")
    assert found["cuda:0"] == Platform("NVIDIA H200", 150109880320, "9.0", "CUDA driver 13.0", "CUDA 13.0")
    assert found["cpu"] == Platform()  # the header says nothing of the host


def test_a_recording_adds_its_snapshots_allocator_conf() -> None:
    found = _platforms(SAMPLES / "torch_cuda" / "h200_record_clean")
    assert found["cuda:0"] == H200
    assert found["cuda:0"].label() == "NVIDIA H200 / unknown framework"


def test_a_snapshot_carries_its_allocator_settings_only() -> None:
    found = _platforms(SAMPLES / "torch" / "snapshot_multidevice_expandable_notrace.pickle")
    assert found["cuda:1"] == Platform(allocator="expandable_segments:True,max_split_size_mb:128")
    assert _platforms(SAMPLES / "torch" / "snapshot_legacy_history_flexgen.pickle")["cuda:0"] == Platform()


def test_torch_npu_profiler_info_and_metadata_name_the_release_cann_and_allocator() -> None:
    found = _platforms(SAMPLES / "ascend" / "msinsight_st_pta271_level2_rank0")
    assert found["npu:0"] == Platform(runtime="CANN 8.3.RC1", framework="torch_npu 2.7.1",
                                      allocator="expandable_segments:True")
    assert _platforms(SAMPLES / "ascend" / "msinsight_pta21_level1_rank0")["npu:0"] == Platform()


@pytest.mark.parametrize("sample", ["msmemscope/leaks_dump_2025.db", "torch_npu_snapshot/npu_snapshot_expandable.pkl",
                                    "ascend/msinsight_msprof_db_2024_enum_memory", "mindspore/ms210_cpu_graph_old"])
def test_what_carries_nothing_is_unknown(sample: str) -> None:
    assert set(_platforms(SAMPLES / sample).values()) == {Platform()}


def test_the_recorder_writes_the_platform_at_the_start(tmp_path: Path) -> None:
    skip_without_torch()
    import torch

    from memgate.record import record

    with record(tmp_path / "rec", allocation_lines=False) as rec:
        x = torch.ones(1024)
        rec.step()
        del x
    manifest = json.loads((tmp_path / "rec" / "memgate_recording.json").read_text())
    cpu = manifest["platform"]["cpu"]
    assert cpu["framework"] == f"torch {torch.__version__}" and cpu["device_name"].endswith(" CPU")


# ---- history per platform ------------------------------------------------------------------------


def _baseline(platform: Platform | None, peak: int) -> dict[str, Any]:
    device: dict[str, Any] = {"metrics": {"peak_allocated_bytes": peak}, "pool_of": {}}
    if platform is not None:
        device["platform"] = platform.as_json()
    return {"memgate_baseline": 1, "memgate_version": "0",
            "profiles": {"0": {"rank": "0", "path": "p", "key": {"format": "kineto"}, "devices": {"cuda:0": device}}}}


def test_a_baseline_of_another_platform_is_no_history_unless_any() -> None:
    a100 = Platform("NVIDIA A100", 85899345920, framework="torch 2.11.0")
    assert for_platform(_baseline(a100, 1), H200) == (None, "")
    kept, note = for_platform(_baseline(a100, 1), H200, "any")
    assert kept is not None and note.startswith("compared across platforms")
    kept, note = for_platform(_baseline(None, 1), H200)  # saved before platforms were recorded
    assert kept is not None and note.startswith("platform unknown")


def test_the_ratchet_keeps_one_baseline_per_platform() -> None:
    a100 = Platform("NVIDIA A100", 85899345920, framework="torch 2.11.0")
    merged = ratchet(_baseline(a100, 100), _baseline(H200, 500))
    assert sorted((k, p["devices"]["cuda:0"]["metrics"]["peak_allocated_bytes"]) for k, p in merged["profiles"].items()) \
        == [("0", 500), ("0@NVIDIA A100 / torch 2.11", 100)]  # neither judged by the other
    again = ratchet(merged, _baseline(H200, 700))  # the H200's own history ratchets, the A100's is kept
    assert sorted(p["devices"]["cuda:0"]["metrics"]["peak_allocated_bytes"] for p in again["profiles"].values()) \
        == [100, 500]
    assert entry_platform({"devices": [{"device": "cuda:0", "platform": H200.as_json()}]}) == H200


TRAIN = """
import pytest
import torch


@pytest.mark.memgate(peak_allocated="1 GiB")
def test_train(memgate_record):
    for _ in range(2):
        x = torch.ones(4096)
        memgate_record.step()
        del x
"""


def test_two_platforms_histories_compare_only_when_asked(pytester: pytest.Pytester,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A run recorded here (torch on the CPU) and the same test's saved run from the H200 sample's platform,
    its peak a tenth of this one's: never compared by default, compared with --memgate-compare-platform=any."""
    skip_without_torch()
    pytester.makepyfile(test_model=TRAIN)
    args = ("-p", "no:cacheprovider")
    pytester.runpytest_subprocess(*args, "--memgate-autosave").assert_outcomes(passed=1)
    [here] = list((pytester.path / ".memgate").rglob("0001_*.json"))
    doc = json.loads(here.read_text())
    [profile] = doc["profiles"].values()
    [(device, values)] = profile["devices"].items()
    cpu = Platform.of(values["platform"])
    assert cpu.known and cpu.framework is not None and cpu.framework.startswith("torch ")
    h200 = _platforms(SAMPLES / "torch_cuda" / "h200_record_clean")["cuda:0"]
    values["platform"] = h200.as_json()
    values["metrics"]["peak_allocated_bytes"] //= 10
    doc["memgate_run"]["id"] = 2
    there = here.with_name(here.name.replace("0001_", "0002_"))
    there.write_text(json.dumps(doc))
    here.unlink()  # only the other platform's history is left

    compare = (*args, "--memgate-compare", "--memgate-compare-fail=peak_allocated:5%")
    result = pytester.runpytest_subprocess(*compare)
    result.assert_outcomes(passed=1, warnings=1)  # the missing-baseline policy: warn
    result.stdout.fnmatch_lines([(f"*no history for {cpu.label()} in the saved runs of configuration *(it holds: "
                                 "NVIDIA H200 / unknown framework;*nothing compared for test_model.py::test_train*")])

    result = pytester.runpytest_subprocess(*compare, "--memgate-compare-platform=any")
    result.assert_outcomes(failed=1)  # asked: compared, and the peak is ten times the H200's
    result.stdout.fnmatch_lines([("*compared across platforms (--memgate-compare-platform=any): history on "
                                 f"NVIDIA H200 / unknown framework, this run on {cpu.label()}*")])

    # an old saved run without platforms still compares (with a note)
    values.pop("platform")
    there.write_text(json.dumps(doc))
    result = pytester.runpytest_subprocess(*compare)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*platform unknown on one side*"])

    # memgate runs and memgate diff show the platform; diff keeps platforms apart unless asked
    values["platform"] = h200.as_json()
    there.write_text(json.dumps(doc))
    pytester.runpytest_subprocess(*args, "--memgate-autosave").assert_outcomes(passed=1)
    monkeypatch.chdir(pytester.path)
    capsys.readouterr()
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert "NVIDIA H200 / unknown framework" in out and cpu.label() in out
    assert main(["diff", "0002", "0003", "--fail", "peak_allocated:5%"]) == 0
    out = capsys.readouterr().out
    assert f"no history for {cpu.label()}: the base was measured on NVIDIA H200 / unknown framework" in out
    assert "FAILED" not in out
    assert main(["diff", "0002", "0003", "--fail", "peak_allocated:5%", "--compare-platform", "any"]) == 1
    out = capsys.readouterr().out
    assert "base measured on NVIDIA H200 / unknown framework" in out
    assert "FAILED peak_allocated 16.00 KiB exceeds baseline 1.60 KiB" in out
    assert device == "cpu"

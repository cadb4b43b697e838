"""An out-of-memory error is a result: a snapshot's ``oom`` trace entries (as torch's caching allocator writes
them: ``device_free`` instead of ``addr``, the request's size, its frames) are counted (``oom_count``), each
with the request, the free memory, the allocated and reserved levels then, its step and the blocks live at it;
``oom = 0`` fails naming them; a peak of such a window says it is a lower bound."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from memgate import cli
from memgate.budgets import budget_from_mapping
from memgate.errors import ConfigError
from memgate.session import measure

GiB = 1 << 30
MiB = 1 << 20
SEG_A = 0x7F00_0000_0000  # the weights' segment, allocated before the window
SEG_B = 0x7F10_0000_0000  # the activations' segment, mapped in the window
T0 = 1_764_000_000_000_000  # µs


def _frames(op: str, file: str = "train.py", line: int = 10) -> list[dict[str, Any]]:
    return [{"filename": "??", "line": 0, "name": f"at::_ops::{op}::call(at::Tensor const&)"},
            {"filename": file, "line": line, "name": "forward"}]


def _block(address: int, size: int, state: str, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"address": address, "size": size, "requested_size": size, "state": state, "frames": frames}


def _segment(address: int, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    total = sum(b["size"] for b in blocks)
    active = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    return {"device": 0, "address": address, "total_size": total, "allocated_size": active, "active_size": active,
            "requested_size": active, "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
            "is_expandable": False, "frames": [], "blocks": blocks}


def oom_snapshot(*, ooms: int = 1, annotations: bool = True) -> dict[str, Any]:
    """What ``torch.cuda.memory._snapshot()`` returns in an out-of-memory observer: 3 GiB of weights from
    before the window, a 2 GiB activation allocated in step 3, then a 4 GiB request that did not fit (torch
    first frees its cached segments, then writes the ``oom`` entry)."""
    weights = _block(SEG_A, 3 * GiB, "active_allocated", _frames("empty_strided", "model.py", 5))
    act = _block(SEG_B, 2 * GiB, "active_allocated", _frames("mm"))
    trace: list[dict[str, Any]] = [
        {"action": "segment_alloc", "addr": SEG_B, "size": 2 * GiB, "stream": 0, "time_us": T0 + 10,
         "frames": _frames("mm")},
        {"action": "alloc", "addr": SEG_B, "size": 2 * GiB, "stream": 0, "time_us": T0 + 10, "frames": _frames("mm")},
    ]
    for k in range(ooms):
        trace.append({"action": "oom", "device_free": 1536 * MiB - k * MiB, "size": 4 * GiB, "stream": 0,
                      "time_us": T0 + 20 + k, "frames": _frames("cat", line=12)})
    snap: dict[str, Any] = {
        "segments": [_segment(SEG_A, [weights]), _segment(SEG_B, [act])],
        "device_traces": [trace],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1,
                               "garbage_collection_threshold": 0.0, "expandable_segments": False,
                               "pinned_num_register_threads": 1, "release_lock_on_malloc": False,
                               "pinned_use_host_register": False, "roundup_power2_divisions": {}},
    }
    if annotations:  # step 3 started; the error ended it before its END was written
        snap["external_annotations"] = [
            {"name": "ProfilerStep#2", "stage": "START", "device": 0, "time_us": T0 - 10},
            {"name": "ProfilerStep#2", "stage": "END", "device": 0, "time_us": T0 - 5},
            {"name": "ProfilerStep#3", "stage": "START", "device": 0, "time_us": T0},
        ]
    return snap


def write(tmp_path: Path, snap: dict[str, Any], name: str = "oom_snapshot.pickle") -> Path:
    path = tmp_path / name
    path.write_bytes(pickle.dumps(snap, protocol=4))
    return path


def _device(path: Path) -> Any:
    (measured,) = measure(path)
    (device,) = measured.devices
    return device


def test_oom_entry_is_counted_with_its_request_free_memory_levels_step_and_holders(tmp_path: Path) -> None:
    device = _device(write(tmp_path, oom_snapshot()))
    assert device.values["oom_count"] == 1
    (oom,) = device.values["ooms"]
    assert (oom["size"], oom["device_free"]) == (4 * GiB, 1536 * MiB)
    assert (oom["allocated"], oom["reserved"]) == (5 * GiB, 5 * GiB)  # replayed: weights + the activation
    assert oom["step"] == 3
    assert oom["op"] == "aten::cat"
    assert [(h["size"], h["op"]) for h in oom["holders"]] == [(3 * GiB, "aten::empty_strided"), (2 * GiB, "aten::mm")]
    assert (oom["live_count"], oom["live_bytes"]) == (2, 5 * GiB)


def test_a_peak_of_a_window_that_ended_in_an_oom_is_a_lower_bound(tmp_path: Path) -> None:
    device = _device(write(tmp_path, oom_snapshot()))
    assert device.notes["peak_allocated_bytes"].startswith(
        "the window ended in an out-of-memory error (a request of 4.00 GiB did not fit): the peak is a lower bound "
        "of what the run needed")
    assert "lower bound" in device.notes["peak_reserved_bytes"]


def test_a_snapshot_without_oom_entries_counts_none_and_says_nothing_of_its_peak(tmp_path: Path) -> None:
    device = _device(write(tmp_path, oom_snapshot(ooms=0)))
    assert device.values["oom_count"] == 0
    assert device.values["ooms"] == []
    assert "lower bound" not in device.notes.get("peak_allocated_bytes", "")


def test_two_ooms_are_both_counted(tmp_path: Path) -> None:
    device = _device(write(tmp_path, oom_snapshot(ooms=2)))
    assert device.values["oom_count"] == 2
    assert [o["device_free"] for o in device.values["ooms"]] == [1536 * MiB, 1535 * MiB]
    assert "holds 2 out-of-memory errors" in device.notes["peak_allocated_bytes"]


def test_a_snapshot_without_history_cannot_say_whether_an_oom_happened(tmp_path: Path) -> None:
    snap = oom_snapshot()
    snap["device_traces"] = [[]]
    device = _device(write(tmp_path, snap))
    assert device.values["oom_count"] is None
    assert "oom entries" in device.missing["oom_count"]


def test_inspect_json_reports_the_oom(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, oom_snapshot())
    assert cli.main(["inspect", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (dev,) = report["profiles"][0]["devices"]
    assert dev["metrics"]["oom_count"] == 1
    oom = dev["metrics"]["ooms"][0]
    assert (oom["size"], oom["device_free"], oom["step"]) == (4 * GiB, 1536 * MiB, 3)
    assert oom["holders"][0]["size"] == 3 * GiB


def test_inspect_text_shows_the_oom(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, oom_snapshot())
    assert cli.main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "oom_count                1" in out
    assert ("out of memory: a request of 4.00 GiB by aten::cat did not fit, 1.50 GiB free on cuda:0 "
            "(allocated 5.00 GiB, reserved 5.00 GiB) in step 3") in out
    assert "at the OOM:     3.00 GiB  aten::empty_strided" in out


def test_budget_oom_zero_fails_in_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, oom_snapshot())
    budgets = tmp_path / "memgate.toml"
    budgets.write_text('[[budgets]]\nname = "train"\noom = 0\n', "utf-8")
    assert cli.main(["check", str(path), "--budgets", str(budgets)]) == 1
    out = capsys.readouterr().out
    assert "oom 1 exceeds budget 0 by 1 — rank 0 cuda:0, step 3, a request of 4.00 GiB did not fit" in out
    assert "0 cuda:0  train   oom     1         0      FAIL" in out


def test_budget_oom_zero_fails_naming_request_free_memory_and_holders(pytester: pytest.Pytester) -> None:
    path = write(pytester.path, oom_snapshot())
    pytester.makefile(".toml", memgate='[[budgets]]\nname = "train"\noom = 0\n')
    result = pytester.runpytest(f"--memgate={path}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*oom 1 exceeds budget 0 by 1 — rank 0 cuda:0, step 3, a request of 4.00 GiB did not fit",
        ("*out of memory: a request of 4.00 GiB by aten::cat did not fit, 1.50 GiB free on cuda:0 "
        "(allocated 5.00 GiB, reserved 5.00 GiB) in step 3"),
        "*live at the out-of-memory error (cuda:0): 2 block(s) = 5.00 GiB:",
        "*3.00 GiB  aten::empty_strided  owner forward (model.py:5)*",
        "*2.00 GiB  aten::mm  owner forward (train.py:10)*",
    ])


def test_budget_oom_passes_a_window_without_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, oom_snapshot(ooms=0))
    budgets = tmp_path / "memgate.toml"
    budgets.write_text('[[budgets]]\nname = "train"\noom = 0\n', "utf-8")
    assert cli.main(["check", str(path), "--budgets", str(budgets)]) == 0
    assert "0 cuda:0  train   oom     0         0      pass" in capsys.readouterr().out


def test_a_peak_check_of_a_window_that_ended_in_an_oom_says_so(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, oom_snapshot())
    budgets = tmp_path / "memgate.toml"
    budgets.write_text('[[budgets]]\nname = "train"\npeak_allocated = "4 GiB"\n', "utf-8")
    assert cli.main(["check", str(path), "--budgets", str(budgets)]) == 1
    assert "the window ended in an out-of-memory error" in capsys.readouterr().out


@pytest.mark.parametrize("value", [-1, 0.5, True, "0"])
def test_oom_budget_is_a_count(value: object) -> None:
    with pytest.raises(ConfigError, match=r"invalid b\.oom"):
        budget_from_mapping({"name": "b", "oom": value}, origin="memgate.toml")


def test_oom_budget_alone_is_a_limit() -> None:
    budget = budget_from_mapping({"name": "b", "oom": 0}, origin="memgate.toml")
    assert budget.checks() == ["oom"]
    assert budget.declared_limit("oom") == 0


# ---- a recording an out-of-memory error stops ----------------------------------------------------

# torch's message for a CUDA out-of-memory error (c10/cuda/CUDACachingAllocator.cpp), raised here by a
# patched allocation: the recorder on CPU sees what it would see on a GPU without its observer
CUDA_MESSAGE = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 80.00 GiB of which "
                "1.10 GiB is free. Of the allocated memory 76.20 GiB is allocated by PyTorch, and 2.70 GiB is "
                "reserved by PyTorch but unallocated.")

INJECTED = """
import pytest
import torch

MESSAGE = {message!r}


def test_train(memgate_record, monkeypatch):
    held = []
    real_empty = torch.empty

    def empty(*args, **kwargs):
        if args and args[0] == 1 << 28:  # the allocation that does not fit
            raise torch.OutOfMemoryError(MESSAGE)
        return real_empty(*args, **kwargs)

    monkeypatch.setattr(torch, "empty", empty)
    for _ in range(3):
        held.append(real_empty(1 << 20, dtype=torch.uint8))  # 1 MiB held per step
        memgate_record.step()
    torch.empty(1 << 28, dtype=torch.uint8)
"""


def test_parse_out_of_memory_reads_torchs_messages() -> None:
    from memgate.record import parse_out_of_memory

    assert parse_out_of_memory(CUDA_MESSAGE) == {"requested": 2 * GiB, "device": "cuda:0", "capacity": 80 * GiB,
                                                 "device_free": round(1.10 * GiB)}
    npu = ("NPU out of memory. Tried to allocate 512.00 MiB (NPU 3; 60.97 GiB total capacity; 58.36 GiB already "
           "allocated; 58.36 GiB current active; 200.00 MiB free; 59.26 GiB reserved in total by PyTorch)")
    assert parse_out_of_memory(npu) == {"requested": 512 * MiB, "device": "npu:3",
                                        "capacity": round(60.97 * GiB), "device_free": 200 * MiB}


def test_an_out_of_memory_error_is_recognised() -> None:
    torch = pytest.importorskip("torch")
    from memgate.record import is_out_of_memory

    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory."))
    assert is_out_of_memory(RuntimeError("NPU out of memory. Tried to allocate 2.00 GiB"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


def test_an_injected_oom_in_memgate_record_fails_as_memgate_with_the_recording_kept(pytester: pytest.Pytester) -> None:
    pytest.importorskip("torch")
    pytester.makepyfile(test_oom_run=INJECTED.format(message=CUDA_MESSAGE))
    kept = pytester.path / "kept"
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--memgate-keep-traces={kept}",
                                           f"--memgate-json={report}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*out of memory: a request of 2.00 GiB did not fit, 1.10 GiB free of 80.00 GiB on cuda:0 in step 3",
        "*recording kept in *kept*",
        "*the error: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB*",
    ])
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    (folder,) = [p for p in kept.rglob("memgate_recording.json")]
    manifest = json.loads(folder.read_text("utf-8"))
    oom = manifest["out_of_memory"]
    assert (oom["source"], oom["device"], oom["requested"], oom["step"]) == ("exception", "cuda:0", 2 * GiB, 3)
    assert oom["message"].startswith("OutOfMemoryError: CUDA out of memory.")
    (row,) = [o for o in json.loads(report.read_text("utf-8"))["budgets"] if o["metric"] == "oom"]
    assert (row["value"], row["limit"], row["passed"], row["device"]) == (1, 0, False, "cuda:0")
    # the kept recording reads back with the error on it
    (measured,) = measure(folder.parent)
    devices = {m.device: m for m in measured.devices}
    assert devices["cuda:0"].values["oom_count"] == 1
    assert devices["cpu"].values["oom_count"] == 0


def test_record_context_manager_keeps_the_recording_and_reraises(tmp_path: Path) -> None:
    """An error naming no device is the recording's one device's (here the CPU's): its holders are the blocks
    live when the error reached the recorder."""
    torch = pytest.importorskip("torch")
    from memgate.record import RECORDING_MANIFEST, record

    held = []
    with pytest.raises(torch.OutOfMemoryError) as info, record(tmp_path / "prof") as rec:
        for _ in range(2):
            held.append(torch.empty(1 << 20, dtype=torch.uint8))
            rec.step()
        raise torch.OutOfMemoryError("out of memory. Tried to allocate 2.00 GiB")
    assert info.value.memgate_recording == str(tmp_path / "prof")  # type: ignore[attr-defined]
    assert f"memgate: the recording up to this out-of-memory error is kept in {tmp_path / 'prof'}" in (
        info.value.__notes__)
    manifest = json.loads((tmp_path / "prof" / RECORDING_MANIFEST).read_text("utf-8"))
    assert (manifest["out_of_memory"]["step"], manifest["out_of_memory"]["device"]) == (2, None)
    (measured,) = measure(tmp_path / "prof")
    (device,) = measured.devices
    oom = device.values["ooms"][0]
    assert (device.device, oom["size"], oom["step"]) == ("cpu", 2 * GiB, 2)
    assert [(h["size"], h["op"]) for h in oom["holders"]] == [(1 << 20, "aten::empty")] * 2

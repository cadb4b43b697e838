"""memgate.record's manifest (``memgate_recording.json``) and its CUDA device-memory samples.

No GPU here: a real CPU recording shows the manifest without device memory; fake ``torch.cuda`` and
``pynvml`` show the sampling (scopes, sample counts, an NVML error mid-run).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import jsonschema
import pytest
from helpers import NEEDS_TORCH

import memgate
from memgate.discover import discover
from memgate.record import (
    RECORDING_MANIFEST,
    TORCH_SOURCE,
    TRACE_NAME,
    DeviceMemorySampler,
    Recorder,
    record,
)
from memgate.schemas import load_schema

MiB = 1 << 20


def check_schema(manifest: dict[str, Any]) -> None:
    """Valid against the loader's schema, where this checkout ships it."""
    try:
        schema = load_schema("recording")
    except FileNotFoundError:
        return
    jsonschema.validate(manifest, schema, cls=jsonschema.Draft202012Validator)


def read_manifest(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / RECORDING_MANIFEST).read_text(encoding="utf-8"))
    check_schema(data)
    return data


def not_a_profile(directory: Path) -> bool:
    """Discovery finds the recording's profile(s), never the manifest as one."""
    found = {f.path.name for f in discover(directory)}
    return bool(found) and RECORDING_MANIFEST not in found


def test_cpu_recording_writes_its_manifest(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4)
    x = torch.randn(8, 16)
    with record(tmp_path / "prof") as rec:
        for _ in range(3):
            model(x).sum().backward()
            rec.step()
    directory = tmp_path / "prof"
    assert rec.files == [directory / TRACE_NAME, directory / RECORDING_MANIFEST]
    assert rec.stop() == rec.files  # idempotent: written once
    assert read_manifest(directory) == {
        "memgate_recording": 1,
        "memgate_version": memgate.__version__,
        "torch": str(torch.__version__),
        "steps": 3,
        "trace": TRACE_NAME,
        "snapshots": [],  # no CUDA: no snapshot
        "device_memory": None,  # CUDA never initialized: nothing sampled
        "out_of_memory": None,  # no out-of-memory error stopped it
        "platform": {"cpu": {"device_name": f"{platform.processor() or platform.machine()} CPU",
                             "framework": f"torch {torch.__version__}"}},  # the host's: no GPU initialized
    }
    assert sorted(p.name for p in directory.iterdir()) == [RECORDING_MANIFEST, TRACE_NAME]  # no .tmp left
    assert not_a_profile(directory)


# ---- fake torch.cuda and pynvml --------------------------------------------------------------------

class FakeNVMLError(Exception):
    pass


class FakeNvml:
    """A ``pynvml`` module over fake GPUs: NVML index n has UUID ``GPU-uuid-n``, ``used[n]`` bytes in
    use, and ``processes[n]`` (pid, usedGpuMemory) entries; ``fail_at``: the memory query that raises."""

    def __init__(self, used: list[int], processes: list[list[tuple[int, int | None]]]) -> None:
        self.used = used
        self.processes = processes
        self.inits = self.shutdowns = self.memory_queries = 0
        self.fail_at: int | None = None
        self.uuids_asked: list[str] = []
        module = ModuleType("pynvml")
        module.NVMLError = FakeNVMLError  # type: ignore[attr-defined]
        for name in ("nvmlInit", "nvmlShutdown", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetHandleByIndex",
                     "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetComputeRunningProcesses"):
            setattr(module, name, getattr(self, name))
        self.module = module

    def nvmlInit(self) -> None:  # pynvml's names
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> int:
        self.uuids_asked.append(uuid)
        if not uuid.startswith("GPU-uuid-"):
            raise FakeNVMLError("Not Found")
        return int(uuid.rsplit("-", 1)[1])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        self.memory_queries += 1
        if self.fail_at is not None and self.memory_queries >= self.fail_at:
            raise FakeNVMLError("GPU is lost")
        self.used[handle] += MiB  # each query sees one more MiB in use: samples differ
        return SimpleNamespace(total=80 << 30, used=self.used[handle], free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=size) for pid, size in self.processes[handle]]


class FakeCuda:
    """``torch.cuda`` with ``count`` devices; torch's device i is NVML's ``order[i]`` (CUDA_VISIBLE_DEVICES)."""

    def __init__(self, order: list[int], *, initialized: bool = True) -> None:
        self.order = order
        self.initialized = initialized
        self.used_queries: list[int] = []

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return len(self.order)

    def get_device_properties(self, index: int) -> SimpleNamespace:
        return SimpleNamespace(name="Fake GPU", uuid=f"uuid-{self.order[index]}")  # torch prints no "GPU-"

    def device_memory_used(self, index: int) -> int:
        self.used_queries.append(index)
        return 7 * MiB


def fake_torch(cuda: FakeCuda) -> Any:
    return SimpleNamespace(__version__="2.13.0", cuda=cuda)


def run(sampler: DeviceMemorySampler, steps: int) -> dict[str, Any] | None:
    """What a recorder does: a sample at the start, one per step, one at the stop; then the manifest."""
    for _ in range(steps + 2):
        sampler.sample()
    sampler.close()
    manifest = sampler.manifest()
    check_schema({"memgate_recording": 1, "steps": steps, "device_memory": manifest})
    return manifest


PID = os.getpid()


def test_nvml_attributes_memory_to_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # torch's cuda:0 is NVML's GPU 1 and cuda:1 NVML's GPU 0 (CUDA_VISIBLE_DEVICES=1,0); this process
    # holds 300 MiB on NVML's GPU 1 and nothing on GPU 0, where another process holds 5 GiB
    nvml = FakeNvml(used=[10 << 30, 20 << 30], processes=[[(PID + 1, 5 << 30)], [(PID + 1, 1 << 30), (PID, 300 * MiB)]])
    monkeypatch.setitem(sys.modules, "pynvml", nvml.module)
    manifest = run(DeviceMemorySampler(fake_torch(FakeCuda([1, 0]))), steps=3)
    assert manifest is not None
    assert manifest["source"] == "nvml" and manifest["scope"] == "process" and "note" not in manifest
    samples = manifest["samples"]
    assert len(samples) == (1 + 3 + 1) * 2  # start, each step, stop; per device
    assert [s["device"] for s in samples] == ["cuda:0", "cuda:1"] * 5
    assert [s["used_bytes"] for s in samples] == [300 * MiB, 0] * 5  # this process's own, not the device's
    assert all(isinstance(s["t_ns"], int) for s in samples)
    assert [s["t_ns"] for s in samples] == sorted(s["t_ns"] for s in samples)
    assert nvml.uuids_asked == ["GPU-uuid-1", "GPU-uuid-0"]  # by UUID, once per device
    assert (nvml.inits, nvml.shutdowns) == (1, 1)
    assert list(manifest) == ["source", "scope", "samples"]


@pytest.mark.parametrize(("processes", "why"), [
    ([[(PID, None)]] * 5, "reports no usedGpuMemory"),  # a container: NVML knows the pid, not its bytes
    ([[(PID + 1, MiB)]] * 5, "is not among the devices' compute processes"),  # a PID namespace hides it
    # attributed at first, not later: every sample of the recording is the device's figure
    ([[(PID, 64 * MiB)]] * 2 + [[(PID, None)]] * 3, "reports no usedGpuMemory"),
])
def test_device_scope_where_nvml_cannot_attribute_memory(monkeypatch: pytest.MonkeyPatch,
                                                         processes: list[list[tuple[int, int | None]]],
                                                         why: str) -> None:
    nvml = FakeNvml(used=[1 << 30], processes=[[]])
    calls = iter(processes)
    nvml.module.nvmlDeviceGetComputeRunningProcesses = lambda handle: [  # type: ignore[attr-defined]
        SimpleNamespace(pid=pid, usedGpuMemory=size) for pid, size in next(calls)]
    monkeypatch.setitem(sys.modules, "pynvml", nvml.module)
    manifest = run(DeviceMemorySampler(fake_torch(FakeCuda([0]))), steps=3)
    assert manifest is not None
    assert (manifest["source"], manifest["scope"]) == ("nvml", "device")
    assert why in manifest["note"] and "other processes on it included" in manifest["note"]
    assert [s["used_bytes"] for s in manifest["samples"]] == [(1 << 30) + k * MiB for k in range(1, 6)]


def test_an_nvml_error_stops_sampling_and_keeps_the_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(used=[0, 0], processes=[[(PID, 10 * MiB)], [(PID, 20 * MiB)]])
    nvml.fail_at = 6  # the 2nd device of the 3rd sample
    monkeypatch.setitem(sys.modules, "pynvml", nvml.module)
    sampler = DeviceMemorySampler(fake_torch(FakeCuda([0, 1])))
    manifest = run(sampler, steps=4)
    assert manifest is not None
    assert manifest["scope"] == "process"
    assert [(s["device"], s["used_bytes"]) for s in manifest["samples"]] == \
        [("cuda:0", 10 * MiB), ("cuda:1", 20 * MiB)] * 2 + [("cuda:0", 10 * MiB)]
    assert manifest["note"] == "Sampling stopped after 5 sample(s): nvml failed (FakeNVMLError: GPU is lost)."
    assert nvml.memory_queries == 6  # none after the error
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_no_sample_before_cuda_is_initialized(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(used=[0], processes=[[(PID, MiB)]])
    monkeypatch.setitem(sys.modules, "pynvml", nvml.module)
    cuda = FakeCuda([0], initialized=False)
    sampler = DeviceMemorySampler(fake_torch(cuda))
    sampler.sample()
    assert sampler.manifest() is None and nvml.inits == 0  # NVML not even started
    cuda.initialized = True  # the run's first CUDA tensor
    sampler.sample()
    sampler.close()
    manifest = sampler.manifest()
    assert manifest is not None and len(manifest["samples"]) == 1
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_without_pynvml_torch_device_memory_used_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    cuda = FakeCuda([0, 1])
    manifest = run(DeviceMemorySampler(fake_torch(cuda)), steps=1)
    assert manifest is not None
    assert (manifest["source"], manifest["scope"]) == (TORCH_SOURCE, "device")
    assert "cannot attribute memory to this process" in manifest["note"]
    assert [(s["device"], s["used_bytes"]) for s in manifest["samples"]] == [("cuda:0", 7 * MiB), ("cuda:1", 7 * MiB)] * 3
    assert cuda.used_queries == [0, 1] * 3

    older = FakeCuda([0])
    older.device_memory_used = None  # type: ignore[assignment,method-assign]  # torch before 2.5
    assert run(DeviceMemorySampler(fake_torch(older)), steps=1) is None


def test_nvml_that_cannot_start_falls_back_or_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml(used=[0], processes=[[]])

    def no_driver() -> None:
        raise FakeNVMLError("NVML Shared Library Not Found")

    nvml.module.nvmlInit = no_driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", nvml.module)
    manifest = run(DeviceMemorySampler(fake_torch(FakeCuda([0]))), steps=1)
    assert manifest is not None and manifest["source"] == TORCH_SOURCE and len(manifest["samples"]) == 3
    assert "NVML failed to start (FakeNVMLError: NVML Shared Library Not Found)" in manifest["note"]

    older = FakeCuda([0])
    older.device_memory_used = None  # type: ignore[assignment,method-assign]
    manifest = run(DeviceMemorySampler(fake_torch(older)), steps=1)
    assert manifest == {"source": "nvml", "scope": "device", "samples": [],
                        "note": "NVML failed to start (FakeNVMLError: NVML Shared Library Not Found): no sample taken."}
    assert nvml.shutdowns == 0  # never started


def test_a_recording_on_fake_cuda_samples_at_start_each_step_and_stop(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The real Recorder (a CPU trace) with fake CUDA devices: the manifest holds their samples; an NVML
    error on the way leaves the recording whole."""
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    cuda = FakeCuda([0])
    for name in ("is_available", "is_initialized", "device_count", "get_device_properties"):
        monkeypatch.setattr(torch.cuda, name, getattr(cuda, name))
    x = torch.randn(4, 4)
    for fail_at, expected in ((None, 1 + 3 + 1), (3, 2)):
        nvml = FakeNvml(used=[0], processes=[[(PID, 42 * MiB)]])
        nvml.fail_at = fail_at
        monkeypatch.setitem(sys.modules, "pynvml", nvml.module)
        directory = tmp_path / f"fail_at_{fail_at}"
        with Recorder(directory, snapshots=False) as rec:  # snapshots would call the real CUDA allocator
            for _ in range(3):
                (x @ x).sum()
                rec.step()
        manifest = read_manifest(directory)
        assert rec.files == [directory / TRACE_NAME, directory / RECORDING_MANIFEST]
        assert (manifest["steps"], manifest["trace"], manifest["snapshots"]) == (3, TRACE_NAME, [])
        memory = manifest["device_memory"]
        assert (memory["source"], memory["scope"]) == ("nvml", "process")
        assert [s["used_bytes"] for s in memory["samples"]] == [42 * MiB] * expected
        assert ("note" in memory) == (fail_at is not None)
        assert (nvml.inits, nvml.shutdowns) == (1, 1)
        assert not_a_profile(directory)


class _NoUuidCuda(FakeCuda):
    def get_device_properties(self, index: int) -> SimpleNamespace:
        return SimpleNamespace(name="Fake GPU", uuid="")  # no UUID from torch: CUDA_VISIBLE_DEVICES decides


@pytest.mark.parametrize(("visible", "asked"), [("1", []), ("²", ["²"]), ("\u0661", ["\u0661"]), ("GPU-uuid-1", ["GPU-uuid-1"])])
def test_cuda_visible_devices_index_is_ascii_digits(monkeypatch: pytest.MonkeyPatch, visible: str,
                                                    asked: list[str]) -> None:
    """'²'.isdigit() is True and int('²') raises: an entry that is not ASCII digits is a UUID for NVML to judge."""
    nvml = FakeNvml(used=[1 << 30, 2 << 30], processes=[[], [(PID, 64 * MiB)]])
    monkeypatch.setitem(sys.modules, "pynvml", nvml.module)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    manifest = run(DeviceMemorySampler(fake_torch(_NoUuidCuda([1]))), steps=1)
    assert nvml.uuids_asked == asked
    assert manifest is not None
    if visible in ("1", "GPU-uuid-1"):  # NVML's GPU 1, this process's 64 MiB on it
        assert [s["used_bytes"] for s in manifest["samples"]] == [64 * MiB] * 3
    else:  # no such GPU: said in the manifest, no sample, no crash
        assert manifest["samples"] == [] and "Not Found" in manifest.get("note", "")

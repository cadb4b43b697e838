"""A real CUDA out-of-memory error inside a recording (skips without a CUDA device, conftest.py): the process is
held to 1 GiB by ``torch.cuda.set_per_process_memory_fraction``, three steps hold 256 MiB each, then a 2 GiB
request fails. torch's out-of-memory observer dumps the snapshot at the error; the recording is kept and reads
back with the error on it: the request, the device's free memory, the allocated level, the step and the holders.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memgate.record import CUDA_SNAPSHOT, RECORDING_MANIFEST, record
from memgate.session import measure

MiB = 1 << 20
GiB = 1 << 30
ALLOWED = GiB


@pytest.fixture
def limited_cuda(fresh_cuda: Any) -> Iterator[Any]:
    """torch, with this process allowed 1 GiB of device 0 (given back afterwards)."""
    torch = fresh_cuda
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(ALLOWED / total, 0)
    try:
        yield torch
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)


def test_a_real_oom_is_recorded_with_its_evidence(limited_cuda: Any, tmp_path: Path) -> None:
    torch = limited_cuda
    held = []
    with pytest.raises(torch.OutOfMemoryError) as info, record(tmp_path / "prof") as rec:
        for _ in range(3):
            held.append(torch.empty(256 * MiB, dtype=torch.uint8, device="cuda"))
            rec.step()
        torch.empty(2 * GiB, dtype=torch.uint8, device="cuda")
    assert info.value.memgate_recording == str(tmp_path / "prof")
    manifest = json.loads((tmp_path / "prof" / RECORDING_MANIFEST).read_text("utf-8"))
    noted = manifest["out_of_memory"]
    assert (noted["source"], noted["device"], noted["requested"], noted["step"]) == ("observer", "cuda:0", 2 * GiB, 3)
    assert noted["allocated"] == 3 * 256 * MiB
    assert (tmp_path / "prof" / CUDA_SNAPSHOT).is_file()
    (measured,) = measure(tmp_path / "prof")
    cuda = {m.device: m for m in measured.devices}["cuda:0"]
    assert cuda.values["oom_count"] == 1
    (oom,) = cuda.values["ooms"]
    assert (oom["size"], oom["step"], oom["allocated"]) == (2 * GiB, 3, 3 * 256 * MiB)
    assert oom["device_free"] is not None and oom["capacity"] is not None
    assert [h["size"] for h in oom["holders"]] == [256 * MiB] * 3
    assert "lower bound" in cuda.notes["peak_allocated_bytes"]
    print("OOM", {k: oom[k] for k in ("size", "device_free", "allocated", "reserved", "capacity", "step", "op")})
    held.clear()


TEST = """
import torch

def test_train(memgate_record):
    held = []
    for _ in range(3):
        held.append(torch.empty(256 << 20, dtype=torch.uint8, device="cuda"))
        memgate_record.step()
    torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
"""

CONFTEST = """
import pytest
import torch

@pytest.fixture(autouse=True)
def _one_gib():
    torch.cuda.set_per_process_memory_fraction((1 << 30) / torch.cuda.get_device_properties(0).total_memory, 0)
    yield
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
"""


def test_a_real_oom_fails_a_memgate_record_test_as_memgate(cuda_torch: Any, pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_oom_run=TEST)
    pytester.makeconftest(CONFTEST)
    kept = pytester.path / "kept"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--memgate-keep-traces={kept}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        ("*out of memory: a request of 2.00 GiB*did not fit, * free of 1.00 GiB on cuda:0 (allocated 768.00 MiB*) "
         "in step 3"),
        "*live at the out-of-memory error (cuda:0): 3 block(s) = 768.00 MiB:",
        "*3 × 256.00 MiB = 768.00 MiB*",
        "*recording kept in *kept*",
        "*the error: OutOfMemoryError: CUDA out of memory*",
    ])
    assert list(kept.rglob(CUDA_SNAPSHOT))

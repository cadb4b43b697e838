"""Shared by the CUDA truth tests (tests/gpu): every test here skips unless torch sees a CUDA device.

Without an NVIDIA driver on a Linux machine the tests skip without importing torch (collection and the
skips take well under a second); elsewhere torch is imported once, by the session fixture below, and
``torch.cuda.is_available()`` decides. Nothing here runs at collection, so a machine without torch
collects these tests too.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest

# Where the NVIDIA driver shows itself on Linux (bare metal, containers, WSL2): without any, there is no CUDA.
_DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl", "/dev/dxg")


def why_no_cuda() -> str | None:
    """Why these tests cannot run here, or None where torch sees a CUDA device."""
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (pip install 'pytest-memgate[torch]')"
    if sys.platform == "linux" and not any(os.path.exists(p) for p in _DRIVER_PATHS):
        return "no NVIDIA driver on this machine (no CUDA device)"
    torch = importlib.import_module("torch")
    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no CUDA device, or a CPU-only torch build)"
    return None


@pytest.fixture(scope="session")
def _cuda_skip_reason() -> str | None:
    return why_no_cuda()


@pytest.fixture(autouse=True)
def _require_cuda(_cuda_skip_reason: str | None) -> None:
    """Every test in tests/gpu: skipped at setup where there is no CUDA device (before any other fixture)."""
    if _cuda_skip_reason is not None:
        pytest.skip(_cuda_skip_reason)


@pytest.fixture
def cuda_torch(_require_cuda: None) -> ModuleType:
    """The torch module, on a machine where it sees a CUDA device."""
    return importlib.import_module("torch")


def settle(torch: ModuleType) -> None:
    """No kernel in flight, no cached segment, the peak counters reset: torch.cuda's counters start afresh."""
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


@pytest.fixture
def fresh_cuda(cuda_torch: ModuleType) -> Iterator[ModuleType]:
    """torch, with CUDA settled before the test (:func:`settle`); afterwards any memory history a failed test
    left on is switched off and what it cached is given back, so the next test starts from the same place."""
    torch = cuda_torch
    settle(torch)
    yield torch
    torch.cuda.memory._record_memory_history(enabled=None)
    settle(torch)

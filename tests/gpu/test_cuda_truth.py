"""memgate's CUDA figures against torch.cuda's own counters, rebuilt live on a CUDA machine.

The scenarios of tests/data/samples/torch_cuda (PROVENANCE.md, make_cuda_samples.py there) and a few more
(bf16 + fused AdamW, activation checkpointing, expandable segments, roundup_power2_divisions, a filled
history ring buffer, the pytest marker): each runs a small model on ``cuda``, records it, and compares
memgate's ``cuda:0`` figures with what torch.cuda said during the same run, taken the way the samples'
truth was taken: ``synchronize``, ``empty_cache`` and ``reset_peak_memory_stats`` right before recording,
``max_memory_allocated()`` / ``max_memory_reserved()`` (the window's peaks) and ``memory_allocated()`` /
``memory_reserved()`` read at the end, before the dump. These counters count the caching allocator's
blocks, the sizes memgate reports.

Every leak keeps ``LEAK`` = 3 MiB + 4096 B per step: a multiple of 512 B above 1 MiB, so the allocator's
block is the request itself (the allocator rounds to 512 B, and a large-pool block it does not split is a
one-time jump that step_growth ignores); step_growth is then exactly ``LEAK``, and 0 without a leak. Where
torch gave a leak a larger block, the expected figure is the definition's for the blocks torch reported
(:func:`planted_growth`).

All of it skips without a CUDA device (conftest.py). torch is imported inside the tests, never at import
time. Settings that must be in place before CUDA initializes (``PYTORCH_CUDA_ALLOC_CONF``) run in a child
Python that imports this module and runs :func:`recorded_run`; the parent checks what it wrote.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import H200_MARKER_TESTS

from memgate.discover import discover, load
from memgate.metrics import profile_metrics
from memgate.model import Profile

LEAK = 3 * 1024 * 1024 + 4096  # 3149824 B, as in the H200 samples
DEV = "cuda"
HERE = Path(__file__).resolve().parent
FIGURES = ("peak_allocated_bytes", "peak_reserved_bytes", "allocated_at_dump_bytes", "reserved_at_dump_bytes",
           "step_growth_bytes")


# ---- the models (torch imported when one is built) ---------------------------------------------------

def _mlp() -> tuple[Any, Any, Any]:
    """MLP 2048→8192→2048 + AdamW on a batch of 512 (the samples' model)."""
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)).to(DEV)
    return model, torch.optim.AdamW(model.parameters()), torch.randn(512, 2048, device=DEV)


def _transformer_bf16() -> tuple[Any, Any, Any]:
    """A small nn.TransformerEncoder with bf16 parameters, trained by the fused AdamW."""
    import torch
    from torch import nn

    layer = nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).to(DEV, torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    return model, opt, torch.randn(16, 256, 512, device=DEV, dtype=torch.bfloat16)


def _checkpointed() -> tuple[Any, Any, Any]:
    """Four MLP blocks, each under torch.utils.checkpoint (non-reentrant): activations recomputed in backward."""
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(2048, 4096), nn.GELU(), nn.Linear(4096, 2048))
                                        for _ in range(4))

        def forward(self, x: Any) -> Any:
            for block in self.blocks:
                x = checkpoint(block, x, use_reentrant=False)
            return x

    model = Checkpointed().to(DEV)
    return model, torch.optim.AdamW(model.parameters()), torch.randn(512, 2048, device=DEV)


MODELS: dict[str, Callable[[], tuple[Any, Any, Any]]] = {
    "mlp": _mlp, "transformer_bf16": _transformer_bf16, "checkpointed": _checkpointed}


def _train_step(model: Any, opt: Any, x: Any) -> None:
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _counters(torch: Any) -> dict[str, int]:
    """torch.cuda's counters now: the peaks since the last reset, the levels now."""
    torch.cuda.synchronize()
    return {"peak_allocated": torch.cuda.max_memory_allocated(), "peak_reserved": torch.cuda.max_memory_reserved(),
            "allocated_end": torch.cuda.memory_allocated(), "reserved_end": torch.cuda.memory_reserved()}


def recorded_run(directory: str, model: str, *, leak: bool, steps: int = 8,
                 max_entries: int = 100_000) -> dict[str, Any]:
    """``model`` trained ``steps`` steps under memgate.record into ``directory`` (keeping ``LEAK`` bytes per
    step when ``leak``); returns torch.cuda's counters over the recording, read before the dump, and the
    block each leak got (``leak_blocks``: memory_allocated() after its allocation minus before)."""
    import torch

    from memgate.record import record

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(0)
    net, opt, x = MODELS[model]()
    kept: list[Any] = []
    blocks: list[int] = []
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    rec = record(directory, max_entries=max_entries).start()
    try:
        for _ in range(steps):
            _train_step(net, opt, x)
            if leak:
                before = torch.cuda.memory_allocated()
                kept.append(torch.empty(LEAK, dtype=torch.uint8, device=DEV))
                blocks.append(torch.cuda.memory_allocated() - before)
            rec.step()
        truth: dict[str, Any] = _counters(torch)
    finally:
        rec.stop()
    truth["leak_blocks"] = blocks
    truth["steps"] = steps
    return truth


# ---- reading memgate's figures ---------------------------------------------------------------------

def _one_profile(path: Path) -> Profile:
    found = discover(path)
    assert len(found) == 1, [f"{f.format} {f.path}" for f in found]
    return load(found[0])


def _cuda0(profile: Profile) -> dict[str, Any]:
    rows = [m for m in profile_metrics(profile) if m.device == "cuda:0"]
    assert len(rows) == 1, [m.device for m in profile_metrics(profile)]
    return dict(rows[0].values)


def planted_growth(blocks: list[int], warmup: int = 1) -> int:
    """docs/metrics.md's step growth of a run whose only lasting growth is the block kept in each step
    (``blocks[s]``, torch's block for step ``s``'s leak): the counted steps are ``warmup`` on, the growth
    between the floors of two counted steps is the block kept in the earlier one, and over runs of
    ``w = (n - 1) // 2`` intervals the slowest run's growth ``// w``. All blocks ``LEAK``: ``LEAK``. An
    unsplit block (a larger one now and then, the allocator's choice) is a one-time jump only where some
    run of ``w`` intervals misses it: two of them closer than ``w`` steps raise the figure."""
    intervals = blocks[warmup:-1]
    w = (len(blocks) - warmup - 1) // 2
    return min(sum(intervals[i:i + w]) for i in range(len(intervals) - w + 1)) // w


def _check_figures(values: dict[str, Any], truth: dict[str, Any], growth: int) -> None:
    """memgate's cuda:0 figures (left) equal torch.cuda's counters and the planted growth (right): the
    definition's figure for the blocks torch gave the leaks, where it recorded them (``growth`` is what
    that is when every leak got a block of its own size)."""
    got = {key: values.get(key) for key in FIGURES}
    if growth and truth.get("leak_blocks"):
        growth = planted_growth(truth["leak_blocks"])
    want = {"peak_allocated_bytes": truth["peak_allocated"], "peak_reserved_bytes": truth["peak_reserved"],
            "allocated_at_dump_bytes": truth["allocated_end"], "reserved_at_dump_bytes": truth["reserved_end"],
            "step_growth_bytes": growth}
    assert got == want, f"memgate (left) vs torch.cuda (right); torch's block per leak: {truth.get('leak_blocks')}"


def _check_recording(directory: Path, truth: dict[str, Any], growth: int) -> Profile:
    """A memgate.record directory: one torch_recording profile, its cuda:0 figures from the snapshot, its
    steps the recorded ones, every figure torch's."""
    profile = _one_profile(directory)
    assert profile.format == "torch_recording"
    assert profile.metadata["figures_from"].get("cuda:0") == "cuda_snapshot.pickle", profile.metadata
    assert profile.steps.ints("step").tolist() == list(range(truth["steps"]))
    _check_figures(_cuda0(profile), truth, growth)
    return profile


# ---- 1. memgate.record: leak and clean ----------------------------------------------------------------

@pytest.mark.parametrize("leak", [True, False], ids=["leak", "clean"])
def test_record_mlp(fresh_cuda: Any, tmp_path: Path, leak: bool) -> None:
    truth = recorded_run(str(tmp_path / "rec"), "mlp", leak=leak)
    _check_recording(tmp_path / "rec", truth, LEAK if leak else 0)


# ---- 2. a plain _record_memory_history + _dump_snapshot ---------------------------------------------------

def test_plain_snapshot_leak(fresh_cuda: Any, tmp_path: Path) -> None:
    """No profiler: the snapshot alone, its steps from the optimizer's ``Optimizer.step#AdamW.step`` annotations."""
    torch = fresh_cuda
    torch.manual_seed(0)
    model, opt, x = _mlp()
    _train_step(model, opt, x)  # the optimizer state exists before history starts
    kept = []
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=200_000)
    try:
        for _ in range(8):
            _train_step(model, opt, x)
            kept.append(torch.empty(LEAK, dtype=torch.uint8, device=DEV))
        truth = _counters(torch)
        torch.cuda.memory._dump_snapshot(str(tmp_path / "snapshot.pickle"))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    profile = _one_profile(tmp_path)
    assert profile.format != "torch_recording"
    assert profile.metadata.get("steps_by_optimizer", "").startswith("Optimizer.step#"), profile.metadata
    _check_figures(_cuda0(profile), truth, LEAK)
    del kept


# ---- 3, 4. bf16 transformer with fused AdamW; activation checkpointing ---------------------------------

@pytest.mark.parametrize("leak", [True, False], ids=["leak", "clean"])
@pytest.mark.parametrize("model", ["transformer_bf16", "checkpointed"])
def test_record_other_models(fresh_cuda: Any, tmp_path: Path, model: str, leak: bool) -> None:
    truth = recorded_run(str(tmp_path / "rec"), model, leak=leak)
    _check_recording(tmp_path / "rec", truth, LEAK if leak else 0)


# ---- 5, 6. allocator settings: a child Python with PYTORCH_CUDA_ALLOC_CONF ---------------------------------

CHILD = """
import json, sys
sys.path.insert(0, {here!r})
import torch
assert torch.cuda.is_available()
import test_cuda_truth
truth = test_cuda_truth.recorded_run({directory!r}, "mlp", leak=True)
with open({out!r}, "w") as fh:
    json.dump(truth, fh)
"""


def _run_child(tmp_path: Path, alloc_conf: str) -> dict[str, Any]:
    """The MLP leak run recorded by a child Python whose caching allocator runs with ``alloc_conf``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    out = tmp_path / "truth.json"
    script = CHILD.format(here=str(HERE), directory=str(tmp_path / "rec"), out=str(out))
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    truth: dict[str, Any] = json.loads(out.read_text())
    return truth


def _snapshot_data(directory: Path) -> dict[str, Any]:
    # the snapshot the child wrote in this test (trusted): its segments say how the allocator ran
    data: dict[str, Any] = pickle.loads((directory / "cuda_snapshot.pickle").read_bytes())
    return data


def test_expandable_segments(cuda_torch: Any, tmp_path: Path) -> None:
    truth = _run_child(tmp_path, "expandable_segments:True")
    segments = _snapshot_data(tmp_path / "rec")["segments"]
    assert any(s.get("is_expandable") for s in segments), "the child's allocator did not use expandable segments"
    _check_recording(tmp_path / "rec", truth, LEAK)


def _roundup(size: int, divisions: int) -> int:
    """The caching allocator's block size for ``size`` under ``roundup_power2_divisions:divisions`` (size above
    512 B x divisions): the next of ``divisions`` equal steps between the powers of two around it."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor // divisions
    return size if size % step == 0 else (size // step + 1) * step


def test_roundup_power2_divisions(cuda_torch: Any, tmp_path: Path) -> None:
    """Blocks rounded up to quarters between powers of two: 3 MiB + 4 KiB requested is a 3.5 MiB block. memgate's
    figures are the blocks (torch's counters), its requested peak stays below them."""
    truth = _run_child(tmp_path, "roundup_power2_divisions:4")
    block = _roundup(LEAK, 4)
    assert block == 7 * 512 * 1024  # 3.5 MiB
    assert block in truth["leak_blocks"], f"torch's block per leak: {truth['leak_blocks']}"
    profile = _check_recording(tmp_path / "rec", truth, block)
    requested = _cuda0(profile)["peak_requested_bytes"]
    assert isinstance(requested, int) and requested < truth["peak_allocated"]


# ---- 7. a history ring buffer that filled ------------------------------------------------------------

def test_filled_ring_buffer_takes_the_trace_figures(fresh_cuda: Any, tmp_path: Path) -> None:
    truth = recorded_run(str(tmp_path / "rec"), "mlp", leak=True, steps=16, max_entries=200)
    profile = _one_profile(tmp_path / "rec")
    assert profile.format == "torch_recording"
    assert profile.metadata["figures_from"]["cuda:0"] == "torch_trace.json", profile.metadata["figures_from"]
    notes = profile.metadata.get("notes") or []
    assert any("cuda:0" in n and "max_entries" in n for n in notes), notes
    _check_figures(_cuda0(profile), truth, LEAK)


# ---- 8, 9. the pytest marker on a CUDA host ---------------------------------------------------------------

CPU_ON_CUDA_HOST = """
import pytest
import torch
import torch.nn as nn

CACHED = []


def test_cuda_used_before():
    CACHED.append(torch.empty(8 << 20, dtype=torch.uint8, device="cuda"))  # live and cached while the next records


@pytest.mark.memgate(step_growth="1 MiB")
def test_cpu_model(memgate_record):
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    for _ in range(8):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt.step()
        memgate_record.step()
"""


def _run_marker_tests(pytester: pytest.Pytester, source: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    pytester.makepyfile(test_gpu=source)
    report = pytester.path / "memgate.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", f"--memgate-json={report}", timeout=280)
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    return result, json.loads(report.read_text())


def test_marker_fails_the_leaking_cuda_loop_once(cuda_torch: Any, pytester: pytest.Pytester) -> None:
    result, report = _run_marker_tests(pytester, H200_MARKER_TESTS)
    result.assert_outcomes(failed=1, passed=1)
    result.stdout.fnmatch_lines(["*step_growth 3.00 MiB exceeds budget 1.00 MiB*cuda:0*"])
    result.stdout.fnmatch_lines(["FAILED test_gpu.py::test_leaks - step_growth 3.00 MiB exceeds*"])
    rows = sorted(report["budgets"], key=lambda r: str(r.get("test")))
    # one row per check: the recording is one profile (no second row for its trace or its snapshot)
    assert [(r["test"], r["metric"], r["device"], r["value"], r["passed"]) for r in rows] == [
        ("test_gpu.py::test_clean", "step_growth", "cuda:0", 0, True),
        ("test_gpu.py::test_leaks", "step_growth", "cuda:0", LEAK, False)], rows
    assert not any(str(r["profile"]).endswith((".json", ".pickle")) for r in rows), rows
    assert report["errors"] == []


def test_cpu_model_recorded_on_a_cuda_host(cuda_torch: Any, pytester: pytest.Pytester) -> None:
    """CUDA used (and cached) by an earlier test, nothing allocated on it while the CPU model records: judged on
    its CPU figures alone, no cuda row, no error."""
    result, report = _run_marker_tests(pytester, CPU_ON_CUDA_HOST)
    result.assert_outcomes(passed=2)
    rows = report["budgets"]
    assert rows and all(r["device"] == "cpu" for r in rows), rows
    assert all(r["passed"] for r in rows), rows
    assert report["errors"] == []
    result.stdout.no_fnmatch_line("*Traceback*")


# ---- 10. the process's device memory (NVML) ---------------------------------------------------------------

def test_nvml_app_memory_covers_the_reserved_peak(fresh_cuda: Any, tmp_path: Path) -> None:
    pytest.importorskip("pynvml")
    truth = recorded_run(str(tmp_path / "rec"), "mlp", leak=False)
    profile = _check_recording(tmp_path / "rec", truth, 0)
    assert profile.metadata.get("device_memory", {}).get("source") == "nvml", profile.metadata.get("device_memory")
    values = _cuda0(profile)
    # what the process holds on the device: the allocator's segments plus the CUDA context, cuBLAS, ...
    assert isinstance(values["peak_app_reserved_bytes"], int)
    assert values["peak_app_reserved_bytes"] >= values["peak_reserved_bytes"] == truth["peak_reserved"]

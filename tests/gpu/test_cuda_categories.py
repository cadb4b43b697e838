"""Categories at the peak and what a test leaves behind, on CUDA: a tracked AdamW step recorded with its
snapshot, checked against the model's and the optimizer's own storages (skips without a CUDA device,
conftest.py).

Every CUDA storage of this model is a multiple of 512 bytes (the allocator's rounding) and each is its
own block (the 64 MiB weights fill their segments exactly; the biases come from the small pool, split to
their size), so the allocator's blocks are the storages' own bytes. AdamW keeps its ``step`` tensors on
the CPU (not capturable, not fused): they are the CPU device's optimizer state, 4 bytes each.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memgate.discover import discover, load
from memgate.leftover import left_behind
from memgate.metrics import profile_metrics
from memgate.record import record


def _storage_bytes(tensors: Any) -> int:
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def test_a_tracked_cuda_adamw_step_is_exact_to_the_allocators_byte(fresh_cuda: Any, tmp_path: Path) -> None:
    torch = fresh_cuda
    nn = torch.nn
    keep = []
    with record(tmp_path / "rec") as rec:
        # made on the GPU: a model made on the CPU and moved would put the CPU's peak (its 128 MiB of
        # weights) before the optimizer's step tensors exist
        model = nn.Sequential(nn.Linear(2048, 8192, device="cuda"), nn.GELU(), nn.Linear(8192, 2048, device="cuda"))
        opt = torch.optim.AdamW(model.parameters())
        rec.track(model, opt)
        x = torch.randn(512, 2048, device="cuda")
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            opt.step()
            rec.step()
        keep.append(torch.empty(3 * 1024 * 1024 + 4096, dtype=torch.uint8, device="cuda"))  # left behind
        del x
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    [found] = discover(tmp_path / "rec")
    profile = load(found)
    assert profile.format == "torch_recording"
    devices = {m.device: m for m in profile_metrics(profile)}
    cuda = devices["cuda:0"].values["category_bytes_at_peak"]
    assert cuda["parameters"] == _storage_bytes(params)
    assert cuda["gradients"] == _storage_bytes(p.grad for p in params)
    assert cuda["optimizer_state"] == _storage_bytes(t for t in state if t.is_cuda)
    assert devices["cpu"].values["category_bytes_at_peak"]["optimizer_state"] == _storage_bytes(
        t for t in state if not t.is_cuda)
    left = {entry.device: entry for entry in left_behind(profile)}
    # the kept buffer, and the model, optimizer state and last gradients still held when recording stopped
    # (at least: torch may keep a cuBLAS workspace of the caching allocator too)
    held = 3 * 1024 * 1024 + 4096 + _storage_bytes(params) + _storage_bytes(p.grad for p in params) + _storage_bytes(
        t for t in state if t.is_cuda)
    assert left["cuda:0"].bytes is not None and left["cuda:0"].bytes >= held
    assert any(h["size"] == 3 * 1024 * 1024 + 4096 for h in left["cuda:0"].holders)

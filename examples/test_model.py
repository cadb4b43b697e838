"""Budget markers next to model tests.

`pytest --memgate` (from this folder) also gates every profile under ./profiles (`profiles` in
./memgate.toml) with the budgets of ./memgate.toml; the markers below gate single tests.
"""

from __future__ import annotations

import pytest

PROFILE = "profiles/alexnet_3016828_20250109_ascend_pt"


@pytest.mark.memgate(profile=PROFILE, peak_allocated="1.5 GiB", op_caps={"aten::mm": "256 MiB"})
def test_alexnet_training_step_fits_its_budget() -> None:
    """The training job wrote PROFILE; this test only states the budget the step must keep."""


@pytest.mark.memgate(warmup_steps=1, step_growth="64 KiB", peak_allocated="64 MiB")
def test_small_model_does_not_leak(memgate_record) -> None:  # type: ignore[no-untyped-def]
    """Trains a small torch model on the CPU under torch.profiler; gated after the body."""
    torch = pytest.importorskip("torch", reason="the recorded example needs torch (pip install torch)")
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(6):
        loss = model(torch.randn(32, 64)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        memgate_record.step()

"""Real torch: a trace recorded with ``with_modules=True`` attributes an encoder's activations to it.

(torch writes the ``nn.Module`` spans only with the Python tracer on: ``with_stack=True`` too.)

The model: ``Net = Encoder(Linear(61→127), relu) → head Linear(127→5)`` on a batch of 33, float32,
under no_grad on CPU. The encoder's Linear output (33·127·4 B, owner ``…/Encoder_0/Linear_0``) is
still live when relu allocates its output (33·127·4 B, owner ``…/Encoder_0``): that moment is the
peak, and both blocks are the encoder's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

import torch

from memgate.loaders.kineto import kineto
from memgate.metrics import profile_metrics
from memgate.record import TRACE_NAME, Recorder

BATCH, IN, HIDDEN, OUT = 33, 61, 127, 5
ACTIVATION = BATCH * HIDDEN * 4  # one float32 encoder activation: 16764 B


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(IN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = torch.nn.Linear(HIDDEN, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.encoder(x))
        return out


def _run(model: Net, x: torch.Tensor) -> None:
    with torch.no_grad():
        model(x)


def _check(trace: Path) -> None:
    profile = kineto.load(trace)
    (device,) = profile.devices
    blocks = device.blocks.to_pandas()
    encoder = blocks[blocks["owner"].fillna("").str.contains("Encoder")]
    assert sorted(encoder["size"].tolist()) == [ACTIVATION, ACTIVATION]
    assert sorted(encoder["owner"].str.rsplit("/", n=1).str[-1].tolist()) == ["Encoder_0", "Linear_0"]
    head = blocks[blocks["size"] == BATCH * OUT * 4]
    assert len(head) == 1 and "Encoder" not in head["owner"].iloc[0] and head["owner"].iloc[0].endswith("Linear_1")
    (m,) = profile_metrics(profile)
    at_peak = m.values["owner_bytes_at_peak"]
    assert sum(v for k, v in at_peak.items() if "Encoder_0" in k) == 2 * ACTIVATION
    assert m.values["op_bytes_at_peak"].get("aten::clamp_min") == ACTIVATION


def test_trace_with_modules_owns_encoder_activations(tmp_path: Path) -> None:
    model, x = Net(), torch.randn(BATCH, IN)
    _run(model, x)  # warm up: lazy initialisation stays out of the recorded window
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                with_modules=True, with_stack=True) as prof:
        _run(model, x)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    _check(trace)


def test_recorder_records_modules(tmp_path: Path) -> None:
    model, x = Net(), torch.randn(BATCH, IN)
    _run(model, x)
    with Recorder(tmp_path, snapshots=False) as rec:
        _run(model, x)
        rec.step()
    _check(tmp_path / TRACE_NAME)


def test_owner_caps_on_the_encoder_fail_and_pass_at_the_boundary(tmp_path: Path) -> None:
    """The encoder holds exactly 2 activations at the peak: a cap one byte below fails naming it."""
    from memgate.budgets import budget_from_mapping
    from memgate.judge import judge
    from memgate.metric_cache import MetricCache

    model, x = Net(), torch.randn(BATCH, IN)
    _run(model, x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                with_modules=True, with_stack=True) as prof:
        _run(model, x)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    profile = kineto.load(trace)
    metric = "owner_caps[*Encoder_0*]"

    def verdict(cap: int) -> tuple[bool, str]:
        budget = budget_from_mapping({"name": "enc", "owner_caps": {"*Encoder_0*": cap}}, origin="test")
        outcome = judge(MetricCache(profile), budget, metric)
        return outcome.passed, outcome.message

    passed, message = verdict(2 * ACTIVATION)
    assert passed and message.startswith(f"{metric} 32.74 KiB within budget 32.74 KiB")
    passed, message = verdict(2 * ACTIVATION - 1)
    assert not passed and "Encoder_0" in message and "exceeds budget" in message

"""Hints speak of the tool that made the profile: the fixture, torch.profiler, torch_npu, MindSpore,
msMemScope, CANN msprof, snapshots."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memgate.hints import RECORDED_BY_FIXTURE, no_memory_data, record_more_steps
from memgate.loaders.kineto import kineto
from memgate.metrics import profile_metrics

SAMPLES = Path(__file__).parent / "data" / "samples"
KINETO_3_STEPS = SAMPLES / "torch" / "cpu_train_profile_memory.json"  # ProfilerStep#2-4


@pytest.mark.parametrize(
    ("fmt", "metadata", "says", "never"),
    [
        ("kineto", {}, ("record at least 6 active steps: torch.profiler.profile(..., schedule(wait=1, warmup=1, "
                       "active=6)) and prof.step() once per training step, or lower warmup_steps"), "torch_npu"),
        ("torch_npu", {}, "torch_npu.profiler.profile(..., torch_npu.profiler.schedule(wait=1, warmup=1, active=6))",
         "memgate_record"),
        ("ascend_db", {"export": "db"}, "torch_npu.profiler.schedule(", "msprof"),
        ("ascend_db", {"export": "msprof db"}, "a CANN msprof profile has no step records", "or lower"),
        ("cann", {}, "msMemScope (msmemscope.step() per step)", "or lower"),
        ("mindspore", {}, "mindspore.Profiler(..., mindspore.profiler.schedule(wait=1, warmup=1, active=6))",
         "torch"),
        ("msmemscope", {}, "record at least 6 active steps: call msmemscope.step() once per training step",
         "torch"),
        ("torch_snapshot", {}, "ProfilerStep#N annotations torch.profiler adds while _record_memory_history()",
         "memgate_record"),
        ("kineto", {"recorded_by": RECORDED_BY_FIXTURE, "recorded_steps": 2},
         ("call memgate_record.step() once per training step, at least 6 times (5 counted after 1 warm-up), this "
         "test called it 2 time(s), or lower warmup_steps"), "schedule("),
    ],
)
def test_record_more_steps_in_the_tools_words(fmt: str, metadata: dict[str, object], says: str, never: str) -> None:
    hint = record_more_steps(fmt, metadata, needed=5, warmup=1)
    assert says in hint and never not in hint, hint


def test_no_warmup_means_no_advice_to_lower_it() -> None:
    assert record_more_steps("kineto", {}, needed=2, warmup=0).endswith("once per training step")


@pytest.mark.parametrize(
    ("fmt", "metadata", "says"),
    [
        ("kineto", {}, "torch.profiler.profile(..., profile_memory=True)"),
        ("mindspore", {}, "mindspore.Profiler(profile_memory=True)"),
        ("torch_snapshot", {}, "_record_memory_history()"),
        ("kineto", {"recorded_by": RECORDED_BY_FIXTURE}, ("the test allocated no tensor memory while memgate_record "
                                                          "recorded (it records with profile_memory=True)")),
    ],
)
def test_no_memory_data(fmt: str, metadata: dict[str, object], says: str) -> None:
    assert says in no_memory_data(fmt, metadata)


def test_metrics_give_the_fixture_hint_for_a_fixture_recording() -> None:
    profile = kineto.load(KINETO_3_STEPS)
    [plain] = profile_metrics(profile)
    assert "torch.profiler.profile(..., schedule(wait=1, warmup=1, active=6))" in plain.missing["step_growth_bytes"]
    recorded = dataclasses.replace(profile, metadata={**profile.metadata, "recorded_by": RECORDED_BY_FIXTURE,
                                                      "recorded_steps": 3})
    [m] = profile_metrics(recorded)
    assert m.missing["step_growth_bytes"].endswith(
        "the profile has 3 step(s) (2, 3, 4), 3 with start/end times: call memgate_record.step() once per training "
        "step, at least 6 times (5 counted after 1 warm-up), this test called it 3 time(s), or lower warmup_steps")
    assert "schedule(" not in m.missing["step_growth_bytes"]

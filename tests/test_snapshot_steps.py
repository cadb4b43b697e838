"""A snapshot's steps (memgate.loaders.snapshot.snapshot_steps): ProfilerStep#N annotations, else the optimizer's."""

from __future__ import annotations

import pickle
from pathlib import Path

from snapshot_reference import (
    EORNN,
    raw,
)

from memgate.loaders.snapshot import snapshot
from memgate.metrics import profile_metrics


def test_profiler_step_annotations_are_steps(tmp_path: Path) -> None:
    data = raw(EORNN)
    times = sorted(e["time_us"] for e in data["device_traces"][0])
    cuts = [times[k * (len(times) - 1) // 6] for k in range(7)]  # six steps, 5 counted: growth is measurable
    data["external_annotations"] = [
        {"name": f"ProfilerStep#{10 + k}", "stage": stage, "device": 0, "time_us": t}
        for k in range(6) for stage, t in (("START", cuts[k]), ("END", cuts[k + 1] - 1))
    ] + [{"name": "Optimizer.step#SGD.step", "stage": "START", "device": 0, "time_us": cuts[1]}]
    path = tmp_path / "steps.pickle"
    path.write_bytes(pickle.dumps(data))
    profile = snapshot.load(path)
    assert profile.steps.to_pandas()["step"].tolist() == list(range(10, 16))
    assert profile.steps.to_pandas()["t_start"].tolist() == [c * 1000 for c in cuts[:6]]
    assert profile.steps.to_pandas()["t_end"].tolist() == [(c - 1) * 1000 for c in cuts[1:]]
    assert "steps_by_optimizer" not in profile.metadata  # ProfilerStep#N, where there are any, are the steps
    [m] = profile_metrics(profile)
    assert isinstance(m.values["step_growth_bytes"], int)
    assert m.values["leaked_bytes"] is not None and m.values["leak_undetermined_bytes"] is not None


def test_optimizer_step_annotations_are_steps_without_profiler_steps(tmp_path: Path) -> None:
    """_record_memory_history without torch.profiler: the optimizer's own ``Optimizer.step#...``
    annotations mark the steps, step n ending where optimizer step n ends (the first starting at the
    history's first entry); a second optimizer's (a GAN's) add none."""
    data = raw(EORNN)
    times = sorted(e["time_us"] for e in data["device_traces"][0])
    ends = [times[k * (len(times) - 1) // 6] for k in range(1, 7)]
    data["external_annotations"] = [
        {"name": name, "stage": stage, "device": 0, "time_us": t}
        for end in ends for name, shift in (("Optimizer.step#SGD.step", 0), ("Optimizer.step#Adam.step", 1))
        for stage, t in (("START", end - 50 + shift), ("END", end + shift))]
    path = tmp_path / "optimizer.pickle"
    path.write_bytes(pickle.dumps(data))
    profile = snapshot.load(path)
    steps = profile.steps.to_pandas()
    assert steps["step"].tolist() == list(range(6))
    assert steps["t_end"].tolist() == [t * 1000 for t in ends]
    assert steps["t_start"].tolist() == [times[0] * 1000] + [t * 1000 for t in ends[:-1]]
    assert profile.metadata["steps_by_optimizer"] == "Optimizer.step#SGD.step"
    [m] = profile_metrics(profile)
    assert isinstance(m.values["step_growth_bytes"], int)

"""memgate.record: a real torch training loop recorded inside a test and gated by the memgate marker.

The ``memgate_record`` fixture comes with the memgate pytest plugin; pytester projects get it as is.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from memgate.discover import discover, load
from memgate.loaders import kineto
from memgate.metrics import profile_metrics
from memgate.record import TRACE_NAME, drop_step, record

NEEDS_TORCH = "recording needs torch (pip install 'memgate[torch]')"

LEAK = 256 * 1024

TRAIN = """
import pytest
import torch
import torch.nn as nn

LEAK = {leak}


@pytest.mark.memgate(step_growth={budget!r})
def test_train(memgate_record, memgate_profile_dir):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    kept = []
    for _ in range(6):
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if LEAK:
            kept.append(torch.empty(256 * 1024, dtype=torch.uint8))  # 256 KiB kept per step
        memgate_record.step()
    print("PROFILE_DIR", LEAK, memgate_profile_dir)
"""


def test_training_loops_gated_by_step_growth(pytester: pytest.Pytester) -> None:
    if importlib.util.find_spec("torch") is None:  # not imported here: pytester unloads what a test imports
        pytest.skip(NEEDS_TORCH)
    """Three projects' worth of tests in one subprocess run (torch is imported once; an in-process
    run would re-import torch modules that pytester unloads between runs):
    - a loop that keeps 256 KiB per step fails ``step_growth="64 KiB"`` with the DESIGN failure line;
    - the same loop passes at the exact boundary, ``step_growth="256 KiB"`` (value <= limit passes);
    - the loop without the leak passes ``step_growth="64 KiB"``.
    """

    pytester.makepyfile(
        test_leak_64=TRAIN.format(leak=True, budget="64 KiB"),
        test_leak_256=TRAIN.format(leak=True, budget="256 KiB"),
        test_clean_64=TRAIN.format(leak=False, budget="64 KiB"),
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s", "-rA")
    result.assert_outcomes(failed=1, passed=2)
    result.stdout.fnmatch_lines([
        "*step_growth 256.00 KiB exceeds budget 64.00 KiB by 192.00 KiB (+300.0%) — rank 0 cpu*",
    ])
    result.stdout.fnmatch_lines(["FAILED test_leak_64.py::test_train - step_growth 256.00 KiB exceeds budget*"])
    result.stdout.fnmatch_lines(["PASSED test_clean_64.py::test_train*"])
    result.stdout.fnmatch_lines(["PASSED test_leak_256.py::test_train*"])
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
    # Each run's own directory, read back: the leak shows as exactly 256 KiB per step, the clean loop as 0.
    runs = [line.split("PROFILE_DIR", 1)[1].split() for line in result.outlines if "PROFILE_DIR" in line]
    assert sorted(leak for leak, _ in runs) == ["False", "True", "True"]
    for leak, directory in runs:
        assert (Path(directory) / TRACE_NAME).is_file()
        [profile] = [load(found) for found in discover(directory)]
        [m] = profile_metrics(profile)
        assert profile.steps["step"].tolist() == [0, 1, 2, 3, 4, 5]  # one per training step
        assert m.values["step_growth_bytes"] == (LEAK if leak == "True" else 0)


def test_record_outside_pytest_writes_a_trace_memgate_reads(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason=NEEDS_TORCH)
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Linear(32, 8)
    x = torch.randn(16, 32)
    kept = []
    with record(tmp_path / "prof") as rec:
        for _ in range(6):  # 5 counted steps after the warm-up one: enough to measure growth
            model(x).sum().backward()
            kept.append(torch.empty(LEAK, dtype=torch.uint8))
            rec.step()
    assert rec.files == [tmp_path / "prof" / TRACE_NAME]
    assert rec.stop() == rec.files  # idempotent
    trace = json.loads((tmp_path / "prof" / TRACE_NAME).read_text())
    steps = sorted(e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#"))
    assert steps == [f"ProfilerStep#{n}" for n in range(6)]
    [profile] = [load(found) for found in discover(tmp_path / "prof")]
    [m] = profile_metrics(profile)
    assert m.values["step_growth_bytes"] == LEAK
    assert m.values["leaked_bytes"] == 4 * LEAK  # steps 1-4; step 5's tensor is within the leak horizon
    assert m.values["op_max_block_bytes"]["aten::empty"] == LEAK
    with pytest.raises(RuntimeError, match="not running"):
        rec.step()


def test_fixture_skips_without_torch(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:

    pytester.makepyfile(test_no_torch="def test_x(memgate_record):\n    raise AssertionError('not reached')\n")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    result = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*memgate_record records a torch run*memgate[[]torch[]]*"])


def test_drop_step_keeps_every_other_event_exactly(tmp_path: Path) -> None:
    """The recorder removes the trailing ProfilerStep span; every number keeps its exact text."""
    sample = Path(__file__).parent / "data" / "samples" / "torch" / "cpu_train_leak_profile_memory.json"
    path = tmp_path / "trace.json"
    shutil.copy(sample, path)
    drop_step(path, 4)
    before = json.loads(sample.read_bytes(), parse_float=Decimal)
    after = json.loads(path.read_bytes(), parse_float=Decimal)
    dropped = [e for e in before["traceEvents"] if e.get("name") == "ProfilerStep#4"]
    assert len(dropped) == 1
    assert after["traceEvents"] == [e for e in before["traceEvents"] if e.get("name") != "ProfilerStep#4"]
    assert {k: v for k, v in after.items() if k != "traceEvents"} == \
        {k: v for k, v in before.items() if k != "traceEvents"}
    profile = kineto.load(path)
    assert profile.steps["step"].tolist() == [2, 3]

"""memgate.record: a real torch training loop recorded inside a test and gated by the memgate marker.

The ``memgate_record`` fixture comes with the memgate pytest plugin; pytester projects get it as is.
"""

from __future__ import annotations

import json
import shutil
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from helpers import NEEDS_TORCH, skip_without_torch

from memgate.discover import discover, load
from memgate.loaders.kineto import kineto
from memgate.metrics import profile_metrics
from memgate.record import RECORDING_MANIFEST, TRACE_NAME, drop_step, record

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
    """Three projects' worth of tests in one subprocess run (torch is imported once; an in-process
    run would re-import torch modules that pytester unloads between runs):
    - a loop that keeps 256 KiB per step fails ``step_growth="64 KiB"`` with the DESIGN failure line;
    - the same loop passes at the exact boundary, ``step_growth="256 KiB"`` (value <= limit passes);
    - the loop without the leak passes ``step_growth="64 KiB"``.
    """
    skip_without_torch()
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
        assert profile.steps.ints("step").tolist() == [0, 1, 2, 3, 4, 5]  # one per training step
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
    assert rec.files == [tmp_path / "prof" / TRACE_NAME, tmp_path / "prof" / RECORDING_MANIFEST]
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
    result.stdout.fnmatch_lines(["*memgate_record records a torch run*pip install *pytest-memgate[[]torch[]]*"])


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
    assert profile.steps.ints("step").tolist() == [2, 3]


# ---- what a recording test shows: where the holders were allocated, hints, kept traces, reports ----

STACKS = """\
import pytest
import torch

LEAK = 256 * 1024


def make():
    return torch.empty(LEAK, dtype=torch.uint8)


@pytest.mark.memgate(peak_allocated="64 KiB")
def test_train(memgate_record):
    kept = []
    for _ in range(6):
        kept.append(make())
        memgate_record.step()
"""
# the lines that allocated: torch.empty in make() on line 8, called from test_train's line 15 (each frame at the
# line it was executing, memgate.allocation_lines), not where the functions start (7, and 11: the decorator)
STACK = ["make (test_stack.py:8)", "test_train (test_stack.py:15)"]

FORGOT_STEP = """\
import pytest
import torch


@pytest.mark.memgate(step_growth="1 MiB")
def test_forgot_step(memgate_record):
    kept = [torch.empty(1024) for _ in range(3)]
"""

NOTHING = """\
import pytest


@pytest.mark.memgate(peak_allocated="1 GiB")
def test_nothing(memgate_record):
    pass
"""


def test_recording_tests_show_holders_hints_and_keep_their_traces(pytester: pytest.Pytester) -> None:
    skip_without_torch()
    from memgate.marks import artifact_name

    pytester.makepyfile(test_stack=STACKS, test_forgot=FORGOT_STEP, test_nothing=NOTHING)
    # no --memgate-keep-traces: with a report, the recordings are kept beside it (pytest's temporary
    # folders, where they were written, are removed after three sessions)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly",
                                           "--memgate-html=out/report.html", "--memgate-json=out/report.json")
    result.assert_outcomes(failed=1, errors=2)  # two tests memgate could not judge: errors, as their rows say
    # the holders at the peak, each with the user functions that allocated it
    result.stdout.fnmatch_lines([
        "peak_allocated 1.50 MiB exceeds budget 64.00 KiB by 1.44 MiB (+2300.0%) — rank 0 cpu*",
        "top 6 of 6 live blocks at the peak (cpu):",  # six identical blocks: one line
        "  6 × 256.00 KiB = 1.50 MiB  aten::empty  owner make (test_stack.py:8)",
        f"                in {' <- '.join(STACK)}",
    ])
    # hints in the fixture's words
    result.stdout.fnmatch_lines([
        ("*step_growth is not measurable: cpu: needs at least 5 counted steps*the profile has 0 step(s), 0 with "
        "start/end times: call memgate_record.step() once per training step, at least 6 times (5 counted after 1 "
        "warm-up), this test called it 0 time(s), or lower warmup_steps")])
    result.stdout.fnmatch_lines([("*memgate_record recorded no tensor allocation: the test body allocated no torch memory "
                                 "while it recorded (the fixture records with profile_memory=True)*")])
    assert "profile_memory=True)" not in result.stdout.str().replace("(the fixture records with profile_memory=True)", "")
    # every recording kept as an artifact
    kept = pytester.path / "out" / "memgate-recordings"
    for test in ("test_stack.py::test_train", "test_forgot.py::test_forgot_step", "test_nothing.py::test_nothing"):
        assert (kept / artifact_name(test) / TRACE_NAME).is_file(), test
    result.stdout.fnmatch_lines([f"memgate: recordings of 3 test(s) kept in {kept}"])
    # the reports: each recording (not the one that allocated nothing) with its test and holders
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    by_test = {p["metadata"]["test"]: p for p in report["profiles"]}
    for test, profile in by_test.items():  # the report points at the kept copy, not a temporary folder
        assert Path(profile["path"]).is_relative_to(kept / artifact_name(test)), test
        assert Path(profile["path"]).exists(), test
    assert sorted(by_test) == ["test_forgot.py::test_forgot_step", "test_stack.py::test_train"]
    holders = by_test["test_stack.py::test_train"]["devices"][0]["metrics"]["top_at_peak"]
    assert [(h["size"], h["stack"], h["owner"]) for h in holders] == [(LEAK, STACK, STACK[0])] * 6
    assert by_test["test_stack.py::test_train"]["metadata"]["recorded_steps"] == 6
    page = (pytester.path / "out" / "report.html").read_text()
    assert "2 profile(s)" in page and page.count("<svg") >= 2 and STACK[0] in page


def test_drop_step_repairs_names_torch_left_unescaped(tmp_path: Path) -> None:
    """torch 2.13 with the Python tracer wrote this name line verbatim (under xdist): invalid JSON."""
    from memgate.record import drop_step

    trace = tmp_path / TRACE_NAME
    trace.write_bytes(b'{\n  "traceEvents": [\n  {\n    "ph": "X",\n    "cat": "python_function",\n'
                      b'    "name": "torch/profiler/_cupti_monitor.py(0):     "seed",",\n    "ts": 1.500, "dur": 2\n  },\n'
                      b'  {\n    "ph": "X", "cat": "user_annotation",\n    "name": "ProfilerStep#1",\n'
                      b'    "ts": 1.000, "dur": 9\n  }\n  ]\n}\n')
    assert drop_step(trace, 1) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert [e["name"] for e in events] == ['torch/profiler/_cupti_monitor.py(0):     "seed",']
    assert "1.500" in trace.read_text()  # numbers keep their text


def test_the_profilers_trace_point_chatter_stays_out_of_stderr(tmp_path: Path) -> None:
    skip_without_torch()
    import subprocess

    code = ("import sys, torch\nfrom memgate.record import record\n"
            f"with record({str(tmp_path / 'prof')!r}) as rec:\n"
            "    torch.ones(8); rec.step()\n"
            "print('mine', file=sys.stderr)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "USDT" not in done.stderr  # Kineto prints `USDT:... profiler_start` / `profiler_stop` to fd 2
    assert "mine" in done.stderr  # the program's own stderr still reaches it

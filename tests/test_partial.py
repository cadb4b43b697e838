"""Partial profiles: the message says what is missing and how to collect it.

- a torch_npu run profiled without ``profile_memory`` (profiler_info says false, no memory CSVs);
- a rank that died early: memory_record.csv without operator_memory.csv, a trace_view.json cut
  short, raw data never exported; the other ranks under the same root are still judged;
- a step range with no memory rows inside it: a step_growth budget is not measurable, naming the
  steps (never a silent slope of 0);
- a snapshot recorded without ``_record_memory_history`` (no traces) and a Kineto trace recorded
  without ``profile_memory`` (no ``[memory]`` events);
- MindSpore and the Ascend db without memory data.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from corpus import KINETO_SAMPLE, T0, TORCH, sample_dir, small_trace
from groundtruth import Block, Trace
from helpers import PTA21_L0, PTA21_L1, PTA271, in_process, one_stderr_line
from writers.ascend_db import write_torch_db
from writers.mindspore import MsOptions
from writers.mindspore import write_profile as write_ms_profile
from writers.torch_npu import NpuOptions
from writers.torch_npu import write_profile as write_npu_profile

from memgate.budgets import budget_from_mapping
from memgate.discover import discover, load
from memgate.errors import InputError, MemgateError, NotMeasurable
from memgate.judge import judge
from memgate.metric_cache import MetricCache
from memgate.model import Profile

COLLECT_NPU = "recorded without profile_memory=True; re-run torch_npu.profiler.profile(..., profile_memory=True)"



def load_all(root: Path) -> list[Profile]:
    return [load(found) for found in discover(root)]


def verdict_error(root: Path, **limits: object) -> MemgateError:
    """The error a budget with ``limits`` meets on ``root``: at load (InputError) or when judged."""
    budget = budget_from_mapping({"name": "partial", **limits}, origin="test")
    try:
        profiles = load_all(root)
    except InputError as exc:
        return exc
    for profile in profiles:
        cache = MetricCache(profile)
        for metric in budget.checks():
            try:
                judge(cache, budget, metric)
            except NotMeasurable as exc:
                return exc
    pytest.fail(f"every budget {limits} was judged on {root}")


# ---- torch_npu without profile_memory --------------------------------------------------------------

def _without_memory(prof: Path) -> Path:
    out = prof / "ASCEND_PROFILER_OUTPUT" if (prof / "ASCEND_PROFILER_OUTPUT").is_dir() else prof
    for name in ("memory_record.csv", "operator_memory.csv", "npu_module_mem.csv"):
        (out / name).unlink(missing_ok=True)
    info_path = next(prof.glob("profiler_info*.json"))
    info = json.loads(info_path.read_text("utf-8"))
    info["config"]["common_config"]["profile_memory"] = False
    info_path.write_text(json.dumps(info, indent=4), "utf-8")
    return info_path


def test_torch_npu_without_profile_memory_says_how_to_record(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    prof = write_npu_profile(small_trace(), tmp_path / "run", NpuOptions())  # steps in trace_view.json
    info_path = _without_memory(prof)
    with pytest.raises(InputError) as info:
        load_all(tmp_path / "run")
    assert info.value.file == str(info_path)
    assert info.value.column == "config.common_config.profile_memory"
    assert COLLECT_NPU in info.value.one_line()
    result = in_process(["inspect", tmp_path / "run"], capsys)
    assert result.rc == 2
    assert COLLECT_NPU in one_stderr_line(result.stderr)


def test_real_sample_without_memory_files_is_claimed_and_explained(tmp_path: Path) -> None:
    """No memory_record / operator_memory / trace_view at all: the *_ascend_pt folder still names the run."""
    root = sample_dir(PTA271, tmp_path)
    info_path = _without_memory(root)
    with pytest.raises(InputError) as info:
        load_all(tmp_path)
    assert info.value.file == str(info_path)
    assert COLLECT_NPU in info.value.one_line()


def test_profile_memory_true_but_no_memory_data(tmp_path: Path) -> None:
    prof = write_npu_profile(small_trace(), tmp_path / "run", NpuOptions())
    out = prof / "ASCEND_PROFILER_OUTPUT"
    for name in ("memory_record.csv", "operator_memory.csv", "npu_module_mem.csv"):
        (out / name).unlink()
    with pytest.raises(InputError) as info:
        load_all(tmp_path / "run")
    assert info.value.file == str(out)
    text = info.value.one_line()
    assert "no memory data" in text and "profile_memory=True" in text
    assert "trace_view.json" in (info.value.found or "")  # what is there instead


# ---- a rank that died early ------------------------------------------------------------------------

def test_memory_record_without_operator_memory_names_the_missing_file(tmp_path: Path) -> None:
    root = sample_dir(PTA21_L1, tmp_path)
    (root / "operator_memory.csv").unlink()
    with pytest.raises(InputError) as info:
        load_all(root)
    assert info.value.file == str(root / "operator_memory.csv")
    assert "operator_memory.csv is missing next to memory_record.csv" in info.value.one_line()
    assert "did not finish" in info.value.one_line()


def test_operator_memory_alone_is_a_complete_blocks_only_profile(tmp_path: Path) -> None:
    """The other direction is a valid export (torch_npu writes blocks without allocator rows)."""
    prof = write_npu_profile(small_trace(), tmp_path / "run", NpuOptions(memory_record=False))
    (profile,) = load_all(prof)
    assert len(profile.devices[0].blocks) == len(small_trace().blocks)


def test_app_only_memory_record_needs_no_operator_memory(tmp_path: Path) -> None:
    """No allocator rows (nothing allocated in the window): no operator_memory.csv is expected."""
    root = sample_dir(PTA21_L1, tmp_path)
    (root / "operator_memory.csv").unlink()
    path = root / "memory_record.csv"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b"".join(x for x in lines[1:] if x.startswith(b"APP,")))
    (profile,) = load_all(root)
    assert set(profile.devices[0].series) >= {"APP"}
    assert "PTA" not in profile.devices[0].series


def test_trace_view_cut_short_names_file_and_line(tmp_path: Path) -> None:
    root = sample_dir(PTA21_L0, tmp_path)
    path = root / "trace_view.json"
    data = path.read_bytes()
    cut = data[: len(data) * 9 // 10]
    path.write_bytes(cut)
    with pytest.raises(InputError) as info:
        load_all(root)
    assert info.value.file == str(path)
    assert info.value.line == cut.count(b"\n") + 1
    assert "truncated JSON" in info.value.one_line()
    assert f"end of file after {len(cut)} bytes" in info.value.one_line()


def test_raw_data_never_exported(tmp_path: Path) -> None:
    prof = tmp_path / "host_123_20250101_ascend_pt"
    (prof / "FRAMEWORK").mkdir(parents=True)
    shutil.copyfile(PTA271 / "profiler_info_0.json", prof / "profiler_info_0.json")
    with pytest.raises(InputError) as info:
        load_all(tmp_path)
    assert info.value.file == str(prof)
    assert "never exported" in info.value.one_line()
    assert "FRAMEWORK" in (info.value.found or "")


def test_a_dead_rank_does_not_hide_the_healthy_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    healthy = sample_dir(PTA21_L1, run / "rank_0")
    dead = sample_dir(PTA21_L1, run / "rank_1")
    (dead / "operator_memory.csv").unlink()
    budgets = tmp_path / "memgate.toml"
    budgets.write_text('[[budgets]]\nname = "gate"\npeak_allocated = "64 GiB"\n')
    result = in_process(["check", run, "--budgets", budgets], capsys)
    assert result.rc == 2
    assert str(dead / "operator_memory.csv") in one_stderr_line(result.stderr)
    judged = [line.split() for line in result.stdout.splitlines() if "peak_allocated" in line]
    # rank, device, budget, metric, measured (2 words), limit (2 words), result, profile
    assert [row[:4] + row[-2:] for row in judged] == [["0", "npu:0", "gate", "peak_allocated", "pass",
                                                       "msinsight_pta21_level1_rank0_ascend_pt"]]  # rank_0
    assert str(healthy) not in result.stderr


# ---- a step range without memory rows ------------------------------------------------------------------

def _steps_after_memory(tmp: Path) -> Path:
    """Every allocator event in the first millisecond; the seven steps start a second later."""
    blocks = (Block(4 << 20, T0, T0 + 500_000, "aten::mm"), Block(1 << 20, T0 + 1000, None, "aten::add"))
    steps = tuple((n, T0 + k * 1_000_000_000, T0 + (k + 1) * 1_000_000_000) for k, n in enumerate(range(5, 12), 1))
    trace = Trace(device_id=0, hidden_baseline=0, blocks=blocks, steps=steps, t_start=T0,
                  t_end=T0 + 8_000_000_000)
    return write_npu_profile(trace, tmp, NpuOptions(step_source="trace_view"))


def test_step_growth_on_steps_without_samples_is_not_measurable(tmp_path: Path) -> None:
    err = verdict_error(_steps_after_memory(tmp_path), step_growth="1 MiB")
    assert isinstance(err, NotMeasurable)
    text = err.one_line()
    assert "step_growth" in text
    assert "no allocator sample falls inside any step" in text
    assert all(str(n) in text for n in range(5, 12)), text


def test_step_growth_with_samples_inside_the_steps_is_measured(tmp_path: Path) -> None:
    """The control: the same steps with a block allocated inside each are measured."""
    prof = _steps_after_memory(tmp_path / "a")
    (profile,) = load_all(prof)
    trace_steps = [(int(s), int(a), int(b)) for s, a, b in profile.steps.to_pandas().to_numpy()]
    blocks = tuple(Block(1 << 20, a + 10, None, "aten::leak") for _, a, _ in trace_steps)
    trace = Trace(device_id=0, hidden_baseline=0, blocks=blocks, steps=tuple(trace_steps), t_start=T0,
                  t_end=T0 + 8_000_000_000)
    leaky = write_npu_profile(trace, tmp_path / "b", NpuOptions(step_source="trace_view"))
    budget = budget_from_mapping({"name": "leak", "step_growth": "512 KiB"}, origin="test")
    (outcome,) = [judge(MetricCache(p), budget, "step_growth") for p in load_all(leaky)]
    assert outcome.value == 1 << 20 and outcome.passed is False


# ---- snapshots and Kineto traces without memory history ------------------------------------------------

NO_TRACE_SNAPSHOT = TORCH / "snapshot_multidevice_expandable_notrace.pickle"


@pytest.mark.parametrize("limit", [{"peak_allocated": "1 GiB"}, {"step_growth": "1 MiB"}, {"leaked": "1 MiB"}],
                         ids=lambda d: next(iter(d)))
def test_snapshot_without_record_memory_history(limit: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / NO_TRACE_SNAPSHOT.name
    shutil.copyfile(NO_TRACE_SNAPSHOT, path)
    err = verdict_error(path, **limit)
    assert "_record_memory_history" in err.one_line(), err.one_line()


def test_the_no_trace_sample_really_has_no_trace() -> None:
    import pickle

    from memgate.readers import safepickle

    data = safepickle.load(NO_TRACE_SNAPSHOT)
    assert data["segments"] and not any(data["device_traces"])
    assert pickle.loads(NO_TRACE_SNAPSHOT.read_bytes())["device_traces"] == data["device_traces"]


def test_kineto_without_profile_memory(tmp_path: Path) -> None:
    trace = json.loads(KINETO_SAMPLE.read_text("utf-8"))
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("name") != "[memory]"]
    trace["profile_memory"] = 0
    path = tmp_path / "train.pt.trace.json"
    path.write_text(json.dumps(trace), "utf-8")
    err = verdict_error(path, peak_allocated="1 GiB")
    assert "profile_memory=True" in err.one_line(), err.one_line()


def test_kineto_sample_control_has_memory_events() -> None:
    trace = json.loads(KINETO_SAMPLE.read_text("utf-8"))
    assert sum(e.get("name") == "[memory]" for e in trace["traceEvents"]) > 100


# ---- MindSpore and the db without memory data -------------------------------------------------------------

def test_mindspore_without_memory_data(tmp_path: Path) -> None:
    prof = write_ms_profile(small_trace(), tmp_path, MsOptions(rank=0, memory_record=False, operator_memory=False,
                                                               cpu_record=False))
    for path in prof.rglob("npu_module_mem.csv"):
        path.unlink()
    with pytest.raises(InputError) as info:
        load_all(prof)
    assert info.value.file == str(prof)
    assert "mindspore.Profiler(profile_memory=True)" in info.value.one_line()


def test_torch_db_without_memory_tables(tmp_path: Path) -> None:
    import sqlite3

    path = write_torch_db(replace(small_trace(), steps=()), tmp_path, rank=0)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE MEMORY_RECORD")
    conn.execute("DROP TABLE OP_MEMORY")
    conn.commit()
    conn.close()
    with pytest.raises(InputError) as info:
        load_all(path)
    assert info.value.column == "MEMORY_RECORD"
    assert "profile_memory=True" in info.value.one_line()

"""torch_npu trace_view.json: the NPU MEM counters' device, from the process id msprof packed.

msprof's TraceViewManager.get_format_pid: ``(pid << 10) | (sort_index << 5) | device_id`` (CANN 8.0+,
device_id 31 = host); before, ``pid * 10000 + sort_index * 100 + device_id``. ``sort_index`` is also
written as the process's ``process_sort_index``. Expected values are computed here from those
formulas and from the raw sample, never copied from memgate's output.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from helpers import PTA21_L0, in_process

from memgate.errors import InputError
from memgate.loaders.ascend import torch_npu
from memgate.loaders.ascend.trace_view import device_of_pid, read_trace_view

HOST_PID = 3016828  # the sample's Python process
NPU_MEM_SORT = 19  # the sample's NPU MEM process_sort_index


def binary_pid(pid: int, sort_index: int, device: int) -> int:
    return (pid << 10) | (sort_index << 5) | device


def decimal_pid(pid: int, sort_index: int, device: int) -> int:
    return pid * 10000 + sort_index * 100 + device


# ---- the rule -------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", [0, 1, 3, 7, 15, 30])
def test_current_layout_gives_the_low_five_bits(device: int) -> None:
    pid = binary_pid(HOST_PID, NPU_MEM_SORT, device)
    assert device_of_pid(pid, NPU_MEM_SORT) == device
    assert device_of_pid(pid, None) == device  # no process_sort_index: the current layout


def test_host_device_names_no_device() -> None:
    assert device_of_pid(binary_pid(HOST_PID, NPU_MEM_SORT, 31), NPU_MEM_SORT) is None


@pytest.mark.parametrize("device", [0, 3, 63])
def test_older_decimal_layout_is_told_apart_by_the_sort_index(device: int) -> None:
    pid = decimal_pid(HOST_PID, NPU_MEM_SORT, device)
    assert (pid >> 5) & 31 != NPU_MEM_SORT  # not a current-layout pid by its index field
    assert device_of_pid(pid, NPU_MEM_SORT) == device
    assert device_of_pid(decimal_pid(HOST_PID, NPU_MEM_SORT, 64), NPU_MEM_SORT) is None  # 64: unknown device


def test_a_pid_matching_no_layout_names_no_device() -> None:
    pid = binary_pid(HOST_PID, NPU_MEM_SORT, 3)
    other = next(i for i in range(32) if i not in ((pid >> 5) & 31, (pid // 100) % 100))
    assert device_of_pid(pid, other) is None
    for bad in ("3089232480", None, True, -5, 1.5):
        assert device_of_pid(bad, NPU_MEM_SORT) is None


# ---- the real sample ------------------------------------------------------------------------------


def _sample_events() -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads((PTA21_L0 / "trace_view.json").read_text("utf-8"), parse_float=Decimal)
    return events


def test_real_sample_pid_is_the_current_layout_for_device_0() -> None:
    events = _sample_events()
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    sorts = {e["pid"]: e["args"]["sort_index"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_sort_index"}
    [mem_pid] = [pid for pid, name in names.items() if name == "NPU MEM"]
    assert mem_pid == 3089232480 == binary_pid(HOST_PID, NPU_MEM_SORT, 0)
    assert sorts[mem_pid] == NPU_MEM_SORT and names[HOST_PID] == "Python"  # each field has its witness
    # Every device-level process of the file follows the same packing with its own sort index.
    for pid, sort_index in sorts.items():
        if pid != HOST_PID:
            assert pid >> 10 == HOST_PID and (pid >> 5) & 31 == sort_index and pid & 31 == 0, names.get(pid)
    counters = read_trace_view(PTA21_L0 / "trace_view.json").counters
    assert set(counters) == {0}
    assert set(counters[0]) == {"APP/DDR", "APP/HBM", "APP/Memory", "Device/DDR", "Device/HBM", "Device/Memory"}


def test_real_sample_is_device_npu_0_and_an_npu_glob_finds_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = torch_npu.load(PTA21_L0)
    assert [d.device for d in profile.devices] == ["npu:0"]
    assert all(fnmatch.fnmatchcase(d.device, "npu:*") for d in profile.devices)
    app_kb = [e["args"]["KB"] for e in _sample_events() if e.get("ph") == "C" and e.get("name") == "APP/Memory"]
    assert int(profile.devices[0].series["APP"].frame.ints("reserved").known().max()) == round(max(app_kb) * 1024)

    prof = tmp_path / "prof" / "run_rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    prof.mkdir(parents=True)
    shutil.copyfile(PTA21_L0 / "trace_view.json", prof / "trace_view.json")
    limit = round(max(app_kb) * 1024)
    budgets = tmp_path / "memgate.toml"
    budgets.write_text(f'[[budgets]]\nname = "npu"\ndevices = "npu:*"\npeak_app_reserved = {limit}\n', "utf-8")
    rc, out, err = in_process(["check", tmp_path / "prof", "--budgets", budgets], capsys)
    assert (rc, err) == (0, ""), out
    [row] = [line.split() for line in out.splitlines() if "peak_app_reserved" in line]
    assert row[1] == "npu:0" and row[-2:] == ["pass", "run_rank0_ascend_pt"]  # result, profile


# ---- hand-built: two devices ----------------------------------------------------------------------


def _process(pid: int, name: str, sort_index: int | None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}}]
    if sort_index is not None:
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                       "args": {"sort_index": sort_index}})
    return events


def _counter(pid: int, name: str, ts_us: int, kb: float) -> dict[str, Any]:
    return {"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": str(ts_us), "args": {"KB": kb}}


def _two_device_profile(tmp_path: Path, pids: tuple[int, int], sort_index: int | None) -> Path:
    events: list[dict[str, Any]] = _process(HOST_PID, "Python", 0)
    for dev, pid in enumerate(pids):
        events += _process(pid, "NPU MEM", sort_index)
        for k in range(3):  # device d: (d + 1) * 1000 KB + k, at the same instants as the other device
            events.append(_counter(pid, "APP/Memory", 1_700_000_000_000_000 + k, (dev + 1) * 1000 + k))
            events.append(_counter(pid, "Device/HBM", 1_700_000_000_000_000 + k, (dev + 1) * 4000 + k))
    events.append(_counter(4242, "APP/Memory", 1_700_000_000_000_001, 99_999))  # not an NPU MEM process
    events.append({"ph": "X", "name": "ProfilerStep#5", "pid": HOST_PID, "tid": HOST_PID,
                   "ts": "1700000000000000.000", "dur": 3.0})
    out = tmp_path / "two_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "trace_view.json").write_text(json.dumps(events), encoding="utf-8")
    return out.parent


@pytest.mark.parametrize("layout", ["current", "current-without-sort-index", "decimal"])
def test_two_npu_mem_processes_are_two_devices(tmp_path: Path, layout: str) -> None:
    sort_index = None if layout == "current-without-sort-index" else NPU_MEM_SORT
    pack = decimal_pid if layout == "decimal" else binary_pid
    root = _two_device_profile(tmp_path, (pack(HOST_PID, NPU_MEM_SORT, 0), pack(HOST_PID, NPU_MEM_SORT, 1)),
                               sort_index)
    profile = torch_npu.load(root)
    assert [d.device for d in profile.devices] == ["npu:0", "npu:1"]
    for dev, model in enumerate(profile.devices):
        app = model.series["NPU MEM APP/Memory"].frame
        assert app.ints("reserved").tolist() == [((dev + 1) * 1000 + k) * 1024 for k in range(3)]  # never merged
        assert app.ints("t_ns").tolist() == [(1_700_000_000_000_000 + k) * 1000 for k in range(3)]
        hbm = model.series["NPU MEM Device/HBM"].frame
        assert hbm.ints("reserved").tolist() == [((dev + 1) * 4000 + k) * 1024 for k in range(3)]
        assert model.series["APP"].frame.ints("reserved").tolist() == app.ints("reserved").tolist()
    assert profile.steps.ints("step").tolist() == [5]


def test_device_3_counter(tmp_path: Path) -> None:
    """A rank on device 3: its counters are npu:3, whatever the rank's other files say."""
    root = _two_device_profile(tmp_path, (binary_pid(HOST_PID, NPU_MEM_SORT, 3), binary_pid(HOST_PID, NPU_MEM_SORT, 5)),
                               NPU_MEM_SORT)
    assert [d.device for d in torch_npu.load(root).devices] == ["npu:3", "npu:5"]


def test_a_pid_naming_no_device_goes_to_the_only_device(tmp_path: Path) -> None:
    """No layout matches the sort index: the counters belong to the rank's one device, as before."""
    pid = binary_pid(HOST_PID, NPU_MEM_SORT, 0)
    other = next(i for i in range(32) if i not in ((pid >> 5) & 31, (pid // 100) % 100))
    events = _process(pid, "NPU MEM", other) + [_counter(pid, "APP/Memory", 1_700_000_000_000_000, 10.0)]
    out = tmp_path / "x_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "trace_view.json").write_text(json.dumps(events), encoding="utf-8")
    assert set(read_trace_view(out / "trace_view.json").counters) == {None}
    [model] = torch_npu.load(out.parent).devices
    assert model.device == "npu" and model.series["APP"].frame.ints("reserved").item(0) == 10 * 1024


# ==== issue 11: exact numbers and repeated keys (JSON side) ================================================

TS_TEXT = "1736405443863674.401"  # µs as a JSON number: 19 digits, more than a float holds
TS_NS = 1736405443863674401


def _write_events(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace_view.json"
    path.write_text(text, encoding="utf-8")
    return path


def test_number_timestamps_and_kb_are_exact(tmp_path: Path) -> None:
    """A ts written as a number converts to its exact ns (the nearest float is 113 ns off), and a KB
    with decimals to its exact bytes."""
    assert int(Decimal(float(TS_TEXT)) * 1000) != TS_NS  # the premise: a float loses these ns
    pid = binary_pid(HOST_PID, NPU_MEM_SORT, 0)
    path = _write_events(tmp_path, "[" + ", ".join([
        f'{{"ph": "X", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": {TS_TEXT}, "dur": 0.001}}',
        f'{{"ph": "M", "name": "process_name", "pid": {pid}, "tid": 0, "args": {{"name": "NPU MEM"}}}}',
        f'{{"ph": "C", "name": "APP/Memory", "pid": {pid}, "tid": 0, "ts": {TS_TEXT}, "args": {{"KB": 1.5}}}}',
    ]) + "]")
    view = read_trace_view(path)
    assert view.steps.ints("t_start").tolist() == [TS_NS] and view.steps.ints("t_end").tolist() == [TS_NS + 1]
    frame = view.counters[0]["APP/Memory"]
    assert frame.ints("t_ns").tolist() == [TS_NS] and frame.ints("reserved").tolist() == [1536]


@pytest.mark.parametrize("member, column", [
    ('"KB": 10.0, "KB": 20.0', "[2].args.KB"),
    ('"KB": 10.0, "KB": 10', None),  # the same number twice: read once
])
def test_a_counter_repeating_a_key(tmp_path: Path, member: str, column: str | None) -> None:
    pid = binary_pid(HOST_PID, NPU_MEM_SORT, 0)
    path = _write_events(tmp_path, "[" + ", ".join([
        '{"ph": "X", "name": "aten::mm", "ts": "1.000", "dur": 1.0}',
        f'{{"ph": "M", "name": "process_name", "pid": {pid}, "tid": 0, "args": {{"name": "NPU MEM"}}}}',
        f'{{"ph": "C", "name": "APP/Memory", "pid": {pid}, "tid": 0, "ts": "2.000", "args": {{{member}}}}}',
    ]) + "]")
    if column is None:
        assert read_trace_view(path).counters[0]["APP/Memory"].ints("reserved").tolist() == [10 * 1024]
        return
    with pytest.raises(InputError) as info:
        read_trace_view(path)
    assert info.value.column == column and info.value.file == str(path)
    assert "conflicting duplicate key 'KB'" in info.value.message and info.value.found == "10.0, then 20.0"


def test_an_event_repeating_its_name_with_another_value(tmp_path: Path) -> None:
    """A step's name twice: ProfilerStep#3 or #4? Neither is read silently."""
    path = _write_events(tmp_path, '[{"ph": "X", "name": "ProfilerStep#3", "name": "ProfilerStep#4", '
                                   '"ts": "1.000", "dur": 1.0}]')
    with pytest.raises(InputError) as info:
        read_trace_view(path)
    assert info.value.column == "[0].name"

"""Owners of blocks (Kineto module spans / user frames, snapshot user frames), the bytes live at the
peak per operator and per owner, and the device capacity a Kineto trace records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from jsonschema import Draft202012Validator

from memgate.loaders import msmemscope
from memgate.loaders.events import is_torch_file
from memgate.loaders.kineto import kineto
from memgate.loaders.snapshot.snapshot_stacks import op_owner
from memgate.metrics import METRIC_KEYS, profile_metrics
from memgate.report import inspect_text
from memgate.schemas import load_schema
from memgate.session import measure
from memgate.sizes import format_size

GIB = 1 << 30
USER = "/home/u/train.py(5): step"
TORCH_FRAME = "torch/nn/modules/module.py(1782): _call_impl"


def _span(name: str, ts: int, dur: int, cat: str = "python_function", tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": tid}


def _mem(ts: int, nbytes: int, addr: int, total: int, device: tuple[int, int] = (1, 0), tid: int = 1) -> dict[str, Any]:
    return {"ph": "i", "name": "[memory]", "ts": ts, "pid": 7, "tid": tid,
            "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": total, "Total Reserved": 4096,
                     "Device Type": device[0], "Device Id": device[1]}}


def _trace(tmp_path: Path, events: list[dict[str, Any]], props: list[dict[str, Any]] | None = None) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": props or [], "traceEvents": events}))
    return path


# Module spans M_0 ⊃ Encoder_0 ⊃ Linear_0; a user frame (with a torch frame inside it) after M_0;
# a module span on another thread. Allocations: in Linear_0 (1000 B), in Encoder_0 only (2000 B),
# in M_0 only (300 B), in the user frame only (40 B), outside everything (5 B), and on thread 2
# (where no span is) at a moment thread 1's Encoder_0 spans (7 B).
EVENTS = [
    _span("nn.Module: M_0", 0, 100),
    _span(TORCH_FRAME, 1, 98),
    _span("nn.Module: Encoder_0", 10, 40),
    _span("nn.Module: Linear_0", 12, 18),
    _span("aten::addmm", 19, 2, cat="cpu_op"),
    _span(USER, 110, 40),
    _span(TORCH_FRAME, 112, 36),
    _span("<built-in method relu of type object>", 113, 30),
    _span("nn.Module: Other_0", 0, 300, tid=3),
    _mem(20, 1000, 1, 1000),
    _mem(40, 2000, 2, 3000),
    _mem(45, 7, 3, 3007, tid=2),
    _mem(60, -1000, 1, 2007),
    _mem(70, 300, 4, 2307),
    _mem(120, 40, 5, 2347),
    _mem(200, 5, 6, 2352),
]


def test_kineto_owners_modules_then_user_frames(tmp_path: Path) -> None:
    profile = kineto.load(_trace(tmp_path, EVENTS))
    (device,) = profile.devices
    blocks = device.blocks.to_pandas().sort_values("t_alloc")
    assert blocks["owner"].tolist() == ["M_0/Encoder_0/Linear_0", "M_0/Encoder_0", pd.NA, "M_0",
                                        "step (/home/u/train.py:5)", pd.NA]
    assert blocks["op"].tolist()[0] == "aten::addmm"


def test_kineto_owner_bytes_at_peak(tmp_path: Path) -> None:
    (m,) = profile_metrics(kineto.load(_trace(tmp_path, EVENTS)))
    # peak allocated 3007 at ts 45: the 1000 B and 2000 B blocks and thread 2's 7 B
    assert m.values["peak_allocated_bytes"] == 3007
    assert m.values["owner_bytes_at_peak"] == {"M_0/Encoder_0": 2000, "M_0/Encoder_0/Linear_0": 1000}
    assert m.values["op_bytes_at_peak"] == {"aten::addmm": 1000}
    assert "owner_bytes_at_peak" in METRIC_KEYS and "op_bytes_at_peak" in METRIC_KEYS


def test_kineto_without_python_functions_has_no_owners(tmp_path: Path) -> None:
    events = [e for e in EVENTS if e.get("cat") != "python_function"]
    (device,) = kineto.load(_trace(tmp_path, events)).devices
    assert device.blocks.texts("owner").isna().all()
    (m,) = profile_metrics(kineto.load(_trace(tmp_path, events)))
    assert m.values["owner_bytes_at_peak"] == {}


def test_kineto_device_capacity(tmp_path: Path) -> None:
    props = [{"id": 1, "name": "H100", "totalGlobalMem": 80 * GIB}, {"id": 0, "name": "H100", "totalGlobalMem": 79 * GIB}]
    profile = kineto.load(_trace(tmp_path, EVENTS, props))
    assert profile.metadata["device_capacity_bytes"] == {"cuda:0": 79 * GIB}


def test_kineto_capacity_absent_on_cpu_and_without_properties(tmp_path: Path) -> None:
    cpu = [_mem(20, 8, 1, 8, device=(0, -1))]
    assert "device_capacity_bytes" not in kineto.load(_trace(tmp_path, cpu, [{"id": 0, "totalGlobalMem": GIB}])).metadata
    assert "device_capacity_bytes" not in kineto.load(_trace(tmp_path, EVENTS)).metadata


def test_real_sample_with_device_properties_added(tmp_path: Path) -> None:
    sample = Path(__file__).parent / "data/samples/torch/cpu_train_profile_memory.json"
    doc = json.loads(sample.read_text())
    doc["deviceProperties"] = [{"id": 0, "totalGlobalMem": 24 * GIB}]
    for event in doc["traceEvents"]:  # the same run as if on cuda:0
        if event.get("name") == "[memory]":
            event["args"]["Device Type"], event["args"]["Device Id"] = 1, 0
    path = tmp_path / "cuda_trace.json"
    path.write_text(json.dumps(doc))
    assert kineto.load(path).metadata["device_capacity_bytes"] == {"cuda:0": 24 * GIB}


def test_snapshot_owner_skips_torch_frames() -> None:
    frames = [
        {"filename": "??", "line": 0, "name": "at::_ops::mm::call(at::Tensor const&)"},
        {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
        {"filename": "/usr/lib/python3/site-packages/torch_npu/utils/x.py", "line": 3, "name": "wrap"},
        {"filename": "/home/u/model.py", "line": 12, "name": "forward"},
        {"filename": "/home/u/train.py", "line": 40, "name": "main"},
    ]
    assert op_owner(frames, None, "frames") == ("aten::mm", "forward (/home/u/model.py:12)")


@pytest.mark.parametrize(("filename", "torch_own"), [
    ("/x/site-packages/torch/nn/modules/module.py", True),
    ("torch/nn/modules/module.py", True),
    ("C:\\py\\Lib\\site-packages\\torch_npu\\a.py", True),
    ("/home/u/torchvision_models/net.py", False),
    ("/home/u/my_torch/net.py", False),
])
def test_is_torch_file(filename: str, torch_own: bool) -> None:
    assert is_torch_file(filename) is torch_own


def test_schema_and_inspect_show_owners(tmp_path: Path) -> None:
    (m,) = profile_metrics(kineto.load(_trace(tmp_path, EVENTS)))
    schema = load_schema("report")
    Draft202012Validator.check_schema(schema)
    metrics_schema = schema["properties"]["profiles"]["items"]["properties"]["devices"]["items"]["properties"]["metrics"]
    Draft202012Validator({**metrics_schema, "$defs": schema["$defs"]}).validate(m.values)  # its $refs resolve there
    entry = {"path": "trace.json", "format": "kineto", "rank": "0", "devices": [m.as_json()]}
    text = "\n".join(inspect_text(entry))
    assert f"owners at peak: M_0/Encoder_0 {format_size(2000)}, M_0/Encoder_0/Linear_0 {format_size(1000)}" in text


def test_msmemscope_owner_attribute(tmp_path: Path) -> None:
    sample = Path(__file__).parent / "data/samples/msmemscope/smoke_memscope_dump_20250428113810.csv"
    lines = sample.read_text().splitlines(keepends=True)
    k = next(i for i, line in enumerate(lines) if ",MALLOC,PTA," in line)  # a 7168 B PTA block on npu:0
    lines[k] = lines[k].replace("owner:,", "owner:PTA@model@encoder,", 1)
    path = tmp_path / sample.name
    path.write_text("".join(lines))
    owned = {(d.device, int(size)) for d in msmemscope.load(path).devices
             for size in d.blocks.ints("size").values[d.blocks.texts("owner").isin(["PTA@model@encoder"])]}
    assert owned == {("npu:0/pid2523738", 7168)}


def test_measured_takes_the_dicts_of_the_device_with_the_largest_peak(tmp_path: Path) -> None:
    # a CPU block (owner: the user frame) beside EVENTS on cuda:0: two devices, cuda:0's peak is larger
    events = [*EVENTS, _mem(130, 64, 9, 64, device=(0, -1))]
    (measured,) = measure(_trace(tmp_path, events))
    assert [d.device for d in measured.devices] == ["cpu", "cuda:0"]
    assert measured.metrics["owner_bytes_at_peak"] == {"M_0/Encoder_0": 2000, "M_0/Encoder_0/Linear_0": 1000}
    assert measured.metrics["op_bytes_at_peak"] == {"aten::addmm": 1000}
    assert measured.devices[0].values["owner_bytes_at_peak"] == {"step (/home/u/train.py:5)": 64}


# ---- one spelling: memgate.owners ------------------------------------------------------------------


def test_a_frame_is_one_owner_in_a_kineto_trace_and_a_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Kineto's ``test_x.py(8): train`` (relative to the import path it came from) and a snapshot frame's
    absolute ``.../tests/test_x.py`` are one spelling: ``train (tests/test_x.py:8)``, relative to the cwd."""
    from memgate.owners import frame_owner, kineto_frame_owner

    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path / "tests"))  # pytest's rootdir-based import path
    assert kineto_frame_owner("test_x.py(8): train") == "train (tests/test_x.py:8)"
    assert frame_owner(str(tmp_path / "tests" / "test_x.py"), 8, "train") == "train (tests/test_x.py:8)"
    frames = [{"filename": str(tmp_path / "tests" / "test_x.py"), "line": 8, "name": "train"}]
    assert op_owner(frames, None, "frames") == (None, "train (tests/test_x.py:8)")
    # a file outside the cwd, and a relative name found nowhere under it, stay as written
    assert frame_owner("/elsewhere/m.py", 3, "f") == "f (/elsewhere/m.py:3)"
    assert kineto_frame_owner("lib/m.py(3): f") == "f (lib/m.py:3)"
    assert kineto_frame_owner("nn.Module: Linear_0") is None


@pytest.mark.parametrize(("old", "new"), [
    ("/home/u/train.py(5): step", "step (/home/u/train.py:5)"),  # Kineto's frame
    ("/home/u/train.py:5:step", "step (/home/u/train.py:5)"),  # memgate's former snapshot spelling
    ("/usr/lib/libc10.so:0:c10::cuda::f", "c10::cuda::f (/usr/lib/libc10.so:0)"),  # a C++ frame
    ("step (/home/u/train.py:5)", "step (/home/u/train.py:5)"),  # already spelled so
    ("Net_0/Encoder_0/Linear_0", "Net_0/Encoder_0/Linear_0"),  # a module path
    ("PTA@model@step", "PTA@model@step"),  # msMemScope's owner
    ("aten::mm", "aten::mm"),
])
def test_old_owner_spellings_are_read_as_todays(old: str, new: str) -> None:
    from memgate.owners import normalize_owner

    assert normalize_owner(old) == new


def test_a_baseline_with_old_owner_spellings_compares_owner_by_owner(tmp_path: Path) -> None:
    """A baseline saved before the one spelling: its owners read as a fresh load spells them, so a
    comparison names what grew, not every owner as new (and other formats' owners stay as written)."""
    from memgate.compare import grown_at_peak
    from memgate.documents import load_baseline, load_entries

    doc = {"memgate_baseline": 1, "memgate_version": "0.1.0", "profiles": {
        "0": {"rank": "0", "path": "/r/trace.json", "key": {"format": "kineto"},
              "devices": {"cpu": {"metrics": {"owner_bytes_at_peak": {"/home/u/train.py(5): step": 100,
                                                                      "/home/u/train.py:5:step": 20, "M_0": 7}}}}},
        "1": {"rank": "1", "path": "/r/dump.csv", "key": {"format": "msmemscope"},
              "devices": {"npu:0": {"metrics": {"owner_bytes_at_peak": {"/x/a.py:1:b": 5}}}}}}}
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(doc))
    profiles = load_baseline(path)["profiles"]
    assert profiles["0"]["devices"]["cpu"]["metrics"]["owner_bytes_at_peak"] == {"step (/home/u/train.py:5)": 120,
                                                                                 "M_0": 7}
    assert profiles["1"]["devices"]["npu:0"]["metrics"]["owner_bytes_at_peak"] == {"/x/a.py:1:b": 5}
    (before, _) = load_entries(path)
    now = {"metrics": {"owner_bytes_at_peak": {"step (/home/u/train.py:5)": 150, "M_0": 7}}}
    assert grown_at_peak(before["devices"][0], now)["owners"] == [
        {"name": "step (/home/u/train.py:5)", "base": 120, "current": 150, "delta": 30}]


@pytest.mark.parametrize(("glob", "meant"), [
    ("train.py(*): step", "step (*train.py:*)"),
    ("/src/train.py:*:step", "step (*/src/train.py:*)"),
    ("*:custom_softmax", "custom_softmax (*)"),
    ("*Encoder_0*", None),
    ("step (*)", None),
])
def test_a_glob_on_a_former_spelling_is_named_with_todays(glob: str, meant: str | None) -> None:
    from memgate.owners import respelled_glob

    assert respelled_glob(glob) == meant


def test_an_owner_cap_on_the_former_spelling_says_how_to_write_it() -> None:
    from memgate.budgets import budget_from_mapping
    from memgate.cache import open_profile
    from memgate.discover import discover
    from memgate.errors import NotMeasurable
    from memgate.judge import judge

    sample = Path(__file__).parent / "data/samples/torch/snapshot_modern_small_cs336.pickle"
    budget = budget_from_mapping({"name": "b", "owner_caps": {"*:custom_softmax": "1 GiB"}}, origin="test")
    with pytest.raises(NotMeasurable) as info:
        judge(open_profile(discover(sample)[0], None), budget, "owner_caps[*:custom_softmax]")
    assert str(info.value.message).endswith(
        "; a Python frame owner is spelled 'function (file:line)': 'custom_softmax (*)'?")

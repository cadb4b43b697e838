"""Kineto / torch.profiler Chrome traces: detection, the real samples (torch 2.13 CPU, torch 1.9 CUDA), bad
input, properties.

Expected values are derived here from the raw JSON with the json module (``parse_float=Decimal``
keeps µs exact) and plain loops, never copied from memgate's output.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from groundtruth import Trace, expected_metrics, peak_moment
from hypothesis import given
from hypothesis import strategies as st
from strategies import traces
from writers.kineto import KinetoOptions, device_label, write_trace, writes_ops

from memgate import cli
from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.loaders.kineto import kineto, memory_timeline
from memgate.metrics import profile_metrics
from memgate.readers import limits, traceevents
from memgate.schemas import load_schema

TORCH = Path(__file__).parent / "data" / "samples" / "torch"
LEAK = TORCH / "cpu_train_leak_profile_memory.json"
H200_TRACE = TORCH.parent / "torch_cuda" / "h200_trace_leak" / "train.1795846944832606968.pt.trace.json"
CLEAN = TORCH / "cpu_train_profile_memory.json"
LEAK6 = TORCH / "cpu_train_active6_leak_profile_memory.json"  # 6 active steps: growth is measurable
CLEAN6 = TORCH / "cpu_train_active6_profile_memory.json"
TIMELINE = TORCH / "cpu_memory_timeline.json"
TORCH19 = TORCH / "kineto_torch19_resnet50_cuda_workers4.pt.trace.json.gz"  # pytorch/kineto's tb_plugin sample
TRACE_VIEW = Path(__file__).parent / "data" / "samples" / "ascend" / "msinsight_pta21_level0_rank0" / "trace_view.json"
LEAK_BYTES = 256 * 1024  # the script in PROVENANCE.md keeps one 256 KiB uint8 tensor per step


def raw(path: Path) -> dict[str, Any]:
    return json.loads(path.read_bytes(), parse_float=Decimal)  # type: ignore[no-any-return]


def ns(trace: dict[str, Any], ts: Any) -> int:
    return int(trace.get("baseTimeNanoseconds", 0) + Decimal(ts) * 1000)


def memory_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    events = [e for e in trace["traceEvents"] if e.get("ph") == "i" and e.get("name") == "[memory]"]
    return sorted(events, key=lambda e: Decimal(e["ts"]))  # stable: ties keep file order


def step_ends(trace: dict[str, Any]) -> dict[int, int]:
    return {int(e["name"].split("#")[1]): ns(trace, e["ts"]) + int(Decimal(e["dur"]) * 1000)
            for e in trace["traceEvents"] if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")}


def innermost_op(trace: dict[str, Any], event: dict[str, Any]) -> str | None:
    t = Decimal(event["ts"])
    best = None
    for op in trace["traceEvents"]:
        contains = op.get("ph") == "X" and op.get("cat") == "cpu_op" and op["tid"] == event["tid"] \
            and op["pid"] == event["pid"] and Decimal(op["ts"]) <= t <= Decimal(op["ts"]) + Decimal(op["dur"])
        if contains and (best is None or Decimal(op["ts"]) > Decimal(best["ts"])):
            best = op
    return None if best is None else str(best["name"])


# ---- detection ------------------------------------------------------------------------------------


def test_claims_chrome_traces_only(tmp_path: Path) -> None:
    assert kineto.claims(LEAK) and kineto.claims(CLEAN)
    assert not kineto.claims(TIMELINE) and memory_timeline.claims_timeline(TIMELINE)
    assert not kineto.claims(TRACE_VIEW)  # torch_npu's trace_view.json is an array: its profile dir owns it
    assert not memory_timeline.claims_timeline(TRACE_VIEW)
    info = Path(__file__).parent / "data" / "samples" / "ascend" / "msinsight_st_pta271_level2_rank0" / \
        "profiler_info_0.json"
    assert not kineto.claims(info)
    gz = tmp_path / "worker0.1234.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(LEAK.read_bytes()))
    assert kineto.claims(gz)
    renamed = tmp_path / "trace.txt"
    renamed.write_bytes(LEAK.read_bytes())
    assert not kineto.claims(renamed)
    timeline_by_other_name = tmp_path / "curve.json"
    timeline_by_other_name.write_bytes(TIMELINE.read_bytes())
    assert not memory_timeline.claims_timeline(timeline_by_other_name)
    [found] = discover(gz)
    assert found.format.name == "kineto"


def test_discover_a_directory_of_traces(tmp_path: Path) -> None:
    shutil.copy(LEAK, tmp_path / "rank0.json")
    shutil.copy(TIMELINE, tmp_path / "memory_timeline.json")
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    found = discover(tmp_path)
    assert [(f.path.name, f.format.name) for f in found] == [("memory_timeline.json", "torch_memory_timeline"),
                                                             ("rank0.json", "kineto")]


# ---- the real CPU samples -------------------------------------------------------------------------


def step_floors(trace: dict[str, Any]) -> dict[int, int]:
    """Each step's lowest Total Allocated, counting the level it starts at, from the raw events."""
    mem = memory_events(trace)
    starts = {int(e["name"].split("#")[1]): ns(trace, e["ts"]) for e in trace["traceEvents"]
              if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")}
    out = {}
    for step, end in sorted(step_ends(trace).items()):
        before = [e["args"]["Total Allocated"] for e in mem if ns(trace, e["ts"]) <= starts[step]][-1:]
        during = [e["args"]["Total Allocated"] for e in mem if starts[step] < ns(trace, e["ts"]) <= end]
        out[step] = min(before + during)
    return out


def test_leak_sample_step_growth_is_the_leak() -> None:
    """ProfilerStep#2..#7, so #3..#7 count (warmup_steps=1). Measured allocator noise: 0 B — the
    floors of #3..#7 differ by exactly 262144 B each (every other tensor is freed or steady), so the
    test allows no tolerance."""
    floors = step_floors(raw(LEAK6))
    assert sorted(floors) == [2, 3, 4, 5, 6, 7]
    assert [floors[s + 1] - floors[s] for s in range(3, 7)] == [LEAK_BYTES] * 4
    [m] = profile_metrics(kineto.load(LEAK6))
    assert m.device == "cpu"
    assert m.values["step_growth_bytes"] == LEAK_BYTES


def test_clean_sample_does_not_grow() -> None:
    floors = step_floors(raw(CLEAN6))
    assert len({floors[s] for s in range(3, 8)}) == 1  # flat from the first counted step
    [m] = profile_metrics(kineto.load(CLEAN6))
    assert m.values["step_growth_bytes"] == 0


@pytest.mark.parametrize("path", [LEAK, CLEAN], ids=lambda p: p.name)
def test_three_step_samples_cannot_measure_growth(path: Path) -> None:
    """2 counted steps: a one-time jump and a leak look alike, so growth is not measured at all."""
    [m] = profile_metrics(kineto.load(path))
    assert m.values["step_growth_bytes"] is None
    assert "needs at least 5 counted steps" in m.missing["step_growth_bytes"]
    assert "active=6" in m.missing["step_growth_bytes"]


@pytest.mark.parametrize("path", [LEAK, CLEAN], ids=lambda p: p.name)
def test_real_sample_metrics_from_the_raw_events(path: Path) -> None:
    trace = raw(path)
    mem = memory_events(trace)
    profile = kineto.load(path)
    [model] = profile.devices
    [m] = profile_metrics(profile)
    # Peak: window-relative on CPU. Total Allocated carries in bytes from before the first event
    # that no event of the window accounts for (here: the previous recording's last-step tensors
    # in the same process); they are named and left out of the peak.
    first = mem[0]["args"]
    carried = first["Total Allocated"] - first["Bytes"]
    assert m.carried_over_bytes == carried
    assert m.values["peak_allocated_bytes"] == max(e["args"]["Total Allocated"] for e in mem) - carried
    assert "window-relative" in m.notes["peak_allocated_bytes"]
    # The CPU allocator reserves nothing: reserved is absent, not 0.
    assert all(e["args"]["Total Reserved"] == 0 and e["args"]["Device Type"] == 0 for e in mem)
    assert m.values["peak_reserved_bytes"] is None and m.values["fragmentation"] is None
    # Blocks: allocations paired with the next free at the same address.
    live: dict[int, dict[str, Any]] = {}
    pairs = []
    for e in mem:
        a = e["args"]
        if a["Bytes"] > 0:
            live[a["Addr"]] = e
        else:
            start = live.pop(a["Addr"])
            pairs.append((start, e))
    assert len(model.blocks) == len(pairs) + len(live)
    assert model.blocks.ints("t_alloc").present().all()
    assert int(model.blocks.ints("t_free").isna().sum()) == len(live)
    # Leaked: allocated inside a counted step (after the first) but the last, and never freed;
    # the last step's live blocks are undetermined (freed, or not, after the window).
    ends = step_ends(trace)
    starts = {int(e["name"].split("#")[1]): ns(trace, e["ts"]) for e in trace["traceEvents"]
              if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")}
    counted = sorted(ends)[1:]

    def live_bytes_of(steps: list[int]) -> int:
        return sum(e["args"]["Bytes"] for e in live.values()
                   if any(starts[s] <= ns(trace, e["ts"]) <= ends[s] for s in steps))

    assert m.values["leaked_bytes"] == live_bytes_of(counted[:-1])
    assert m.values["leak_undetermined_bytes"] == live_bytes_of(counted[-1:])
    # Operator of each block: the innermost cpu_op on its thread containing the allocation.
    ops: dict[str, int] = {}
    for e in [p[0] for p in pairs] + list(live.values()):
        op = innermost_op(trace, e)
        if op:
            ops[op] = max(ops.get(op, 0), e["args"]["Bytes"])
    assert m.values["op_max_block_bytes"] == ops
    # Baseline from before profiling: Total Allocated minus the block itself at the first event.
    assert m.facts.components["allocator"].baseline_bytes == first["Total Allocated"] - first["Bytes"]
    assert m.facts.components["allocator"].consistency == 1.0
    # Steps and exact ns times.
    assert profile.steps.ints("step").tolist() == sorted(ends)
    assert profile.steps.ints("t_end").tolist() == [ends[s] for s in sorted(ends)]
    assert model.series["allocator"].frame.ints("t_ns").item(0) == ns(trace, mem[0]["ts"])


def test_leak_sample_attributes_the_leak_to_aten_empty() -> None:
    [m] = profile_metrics(kineto.load(LEAK))
    assert m.values["op_max_block_bytes"]["aten::empty"] == LEAK_BYTES
    assert [b["op"] for b in m.values["top_at_peak"][:3]] == ["aten::empty"] * 3


def test_gzip_trace_reads_the_same(tmp_path: Path) -> None:
    gz = tmp_path / "leak.pt.trace.json.gz"
    gz.write_bytes(gzip.compress(LEAK.read_bytes()))
    [a] = profile_metrics(kineto.load(gz))
    [b] = profile_metrics(kineto.load(LEAK))
    assert a.values == b.values


def test_cli_inspect_json_reports_the_leak() -> None:
    """The acceptance check of the task: `memgate inspect <leak sample> --json` (the installed CLI)."""
    proc = subprocess.run([sys.executable, "-m", "memgate", "inspect", str(LEAK), "--json"], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    [entry] = json.loads(proc.stdout)["profiles"]
    [dev] = entry["devices"]
    assert (entry["format"], dev["device"]) == ("kineto", "cpu")
    assert dev["metrics"]["leaked_bytes"] == 262144  # #3's tensor; #4's is within the leak horizon
    assert dev["window_relative"] is True


def test_memory_events_split_by_device(tmp_path: Path) -> None:
    """Device Type and Device Id name the device; a CPU id and a negative id do not appear."""
    trace = json.loads(LEAK.read_bytes())  # floats: repr round-trips the 3-decimal µs text
    devices = {(1, 3): "cuda:3", (1, 12): "cuda:12", (20, 3): "npu:3", (1, -1): "cuda", (0, 5): "cpu"}
    addrs = sorted({e["args"]["Addr"] for e in trace["traceEvents"] if e.get("name") == "[memory]"})
    for e in trace["traceEvents"]:
        if e.get("name") == "[memory]":  # an address keeps its device, so allocs and frees still pair
            e["args"]["Device Type"], e["args"]["Device Id"] = list(devices)[addrs.index(e["args"]["Addr"]) % 5]
    path = tmp_path / "devices.pt.trace.json"
    path.write_text(json.dumps(trace))
    profile = kineto.load(path)
    assert [d.device for d in profile.devices] == sorted(devices.values())
    allocs = {label: 0 for label in devices.values()}
    for e in trace["traceEvents"]:
        if e.get("name") == "[memory]" and e["args"]["Bytes"] > 0:
            allocs[devices[(e["args"]["Device Type"], e["args"]["Device Id"])]] += 1
    assert {d.device: int(d.blocks.ints("t_alloc").present().sum()) for d in profile.devices} == allocs


# ---- schema and bad input -------------------------------------------------------------------------


def test_schema_is_valid_and_accepts_the_samples() -> None:
    schema = load_schema("kineto")
    jsonschema.Draft202012Validator.check_schema(schema)
    trace = json.loads(LEAK.read_bytes())
    validator = jsonschema.Draft202012Validator(schema)
    assert list(validator.iter_errors(trace)) == []
    memory = {"$defs": schema["$defs"], "$ref": "#/$defs/memory_event"}
    x_event = {"$defs": schema["$defs"], "$ref": "#/$defs/x_event"}
    for event in trace["traceEvents"]:
        if event.get("name") == "[memory]":
            assert list(jsonschema.Draft202012Validator(memory).iter_errors(event)) == []
        elif event.get("ph") == "X" and event.get("cat") in ("cpu_op", "user_annotation"):
            assert list(jsonschema.Draft202012Validator(x_event).iter_errors(event)) == []
    timeline = {"$defs": schema["$defs"], "$ref": "#/$defs/memory_timeline"}
    assert list(jsonschema.Draft202012Validator(timeline).iter_errors(json.loads(TIMELINE.read_bytes()))) == []
    old = json.loads(gzip.decompress(TORCH19.read_bytes()))  # torch 1.9: Operator spans, string tids
    assert list(validator.iter_errors(old)) == []
    memory_check, x_check = jsonschema.Draft202012Validator(memory), jsonschema.Draft202012Validator(x_event)
    for event in old["traceEvents"]:
        if event.get("name") == "[memory]":
            assert list(memory_check.iter_errors(event)) == []
        elif event.get("ph") == "X" and event.get("cat") == "Operator":
            assert list(x_check.iter_errors(event)) == []


def _edit(tmp_path: Path, mutate: Any, gz: bool = False) -> Path:
    trace = json.loads(LEAK.read_bytes())  # floats: repr round-trips the 3-decimal µs text
    mutate(trace)
    text = json.dumps(trace, indent=1).encode()
    path = tmp_path / ("bad.json.gz" if gz else "bad.json")
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


def _first(trace: dict[str, Any], pred: Any) -> int:
    return next(i for i, e in enumerate(trace["traceEvents"]) if pred(e))


def _is_mem(e: dict[str, Any]) -> bool:
    return e.get("name") == "[memory]"


def _is_op(e: dict[str, Any]) -> bool:
    return e.get("cat") == "cpu_op"


def _set_arg(key: str, value: Any) -> Any:
    def mutate(trace: dict[str, Any]) -> None:
        trace["traceEvents"][_first(trace, _is_mem) + 3]["args"][key] = value
    return mutate


BAD = {
    "bytes text": (_set_arg("Bytes", "16384"), "args.Bytes", "wrong type", _is_mem, 3),
    "device type": (_set_arg("Device Type", 99), "args.Device Type", "value too large", _is_mem, 3),
    "negative total": (_set_arg("Total Allocated", -1), "args.Total Allocated", "value too small", _is_mem, 3),
    "float addr": (_set_arg("Addr", 1.5), "args.Addr", "wrong type", _is_mem, 3),
    "no bytes": (lambda t: t["traceEvents"][_first(t, _is_mem) + 3]["args"].pop("Bytes"), "args", "missing key 'Bytes'",
                 _is_mem, 3),
    "args not object": (lambda t: t["traceEvents"][_first(t, _is_mem) + 3].__setitem__("args", [1]), "args",
                        "wrong type", _is_mem, 3),
    "ts text": (lambda t: t["traceEvents"][_first(t, _is_mem)].__setitem__("ts", "soon"), "ts", "wrong type", _is_mem, 0),
    "op dur negative": (lambda t: t["traceEvents"][_first(t, _is_op)].__setitem__("dur", -1), "dur", "value too small",
                        _is_op, 0),
}


@pytest.mark.parametrize("gz", [False, True], ids=["json", "gz"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_events_name_their_json_path(tmp_path: Path, case: str, gz: bool) -> None:
    mutate, key, problem, kind, offset = BAD[case]
    path = _edit(tmp_path, mutate, gz)
    index = _first(json.loads(LEAK.read_bytes()), kind) + offset
    with pytest.raises(InputError) as info:
        kineto.load(path)
    err = info.value
    assert err.file == str(path)
    assert err.column == f"traceEvents[{index}].{key}"
    assert problem in err.message


def test_truncated_and_corrupt_files(tmp_path: Path) -> None:
    data = LEAK.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated JSON") as info:
        kineto.load(cut)
    assert info.value.line == data[: len(data) // 2].count(b"\n") + 1
    assert info.value.column is not None and info.value.column.startswith("traceEvents[")
    gz_cut = tmp_path / "cut.json.gz"
    gz_cut.write_bytes(gzip.compress(data)[:5000])
    with pytest.raises(InputError, match="gzip"):
        kineto.load(gz_cut)
    garbage = tmp_path / "x.json"
    garbage.write_bytes(b'{"traceEvents": [{"ph": "i", "name": "[memory]"} {]}')
    with pytest.raises(InputError, match="invalid JSON"):
        kineto.load(garbage)
    array = tmp_path / "array.json"
    array.write_bytes(b'[{"ph": "X"}]')
    with pytest.raises(InputError, match="JSON array form"):
        kineto.load(array)
    not_array = tmp_path / "obj.json"
    not_array.write_bytes(b'{"schemaVersion": 1, "traceEvents": {"ph": "i"}}')
    with pytest.raises(InputError, match="traceEvents is not an array") as info:
        kineto.load(not_array)
    assert info.value.found == "an object"
    not_event = tmp_path / "odd.json"
    not_event.write_bytes(b'{"traceEvents": [{"ph": "M"}, 7]}')
    with pytest.raises(InputError, match="not an object") as info:
        kineto.load(not_event)
    assert info.value.column == "traceEvents[1]"


def test_a_trace_without_memory_events_says_how_to_record_them(tmp_path: Path) -> None:
    path = tmp_path / "nomem.json"
    path.write_bytes(b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.5, "dur": 2, '
                     b'"pid": 1, "tid": 1}]}')
    with pytest.raises(InputError) as info:
        kineto.load(path)
    assert "profile_memory=True" in info.value.one_line() and info.value.file == str(path)


# ---- the innermost-op search ----------------------------------------------------------------------


@st.composite
def nested_intervals(draw: st.DrawFn) -> list[tuple[int, int]]:
    """Properly nested intervals on a small clock (one thread's call tree, zero-length calls included)."""
    out: list[tuple[int, int]] = []

    def tree(lo: int, hi: int, depth: int) -> None:
        at = lo
        for _ in range(draw(st.integers(0, 3 if depth < 4 else 0))):
            if at > hi:
                return
            start = draw(st.integers(at, hi))
            end = draw(st.integers(start, hi))
            out.append((start, end))
            tree(start, end, depth + 1)
            at = end + draw(st.integers(0, 2))

    tree(0, 60, 0)
    return out


@given(intervals=nested_intervals(), queries=st.lists(st.integers(-2, 62), max_size=30))
def test_innermost_equals_brute_force(intervals: list[tuple[int, int]], queries: list[int]) -> None:
    start = np.array([s for s, _ in intervals], dtype=np.int64)
    end = np.array([e for _, e in intervals], dtype=np.int64)
    t = np.array(queries, dtype=np.int64)
    got = kineto.innermost(start, end, t) if len(intervals) else np.full(len(t), -1)
    for q, g in zip(queries, got.tolist()):
        containing = [i for i, (s, e) in enumerate(intervals) if s <= q <= e]
        if not containing:
            assert g == -1
        else:
            best = max(s for s, _ in (intervals[i] for i in containing))
            assert g in containing and intervals[g][0] == best
            # innermost: no other containing interval lies strictly inside it
            assert all(not (intervals[g][0] <= intervals[i][0] and intervals[i][1] <= intervals[g][1]
                            and intervals[i] != intervals[g]) for i in containing)


# ---- properties: a ground-truth trace written as a Kineto trace reads back to its own metrics -----


def _options() -> st.SearchStrategy[KinetoOptions]:
    return st.builds(KinetoOptions, device=st.sampled_from(("cpu", "cuda", "npu")), gz=st.booleans(),
                     base_time=st.booleans(), shuffle_seed=st.one_of(st.none(), st.integers(0, 2**16)),
                     rank=st.one_of(st.none(), st.integers(0, 7)), legacy_ops=st.booleans())


@given(trace=traces(max_blocks=20), opts=_options())
def test_written_trace_reads_back_to_ground_truth(trace: Trace, opts: KinetoOptions) -> None:
    """Exact, tolerance 0 ns: ts are written as µs with 3 decimals (Kineto's own format) and read as
    decimals, so every ns instant survives; bytes are integers."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_trace(trace, Path(tmp), opts)
        [found] = discover(path)
        assert found.format.name == "kineto"
        profile = load(found)
    expected = expected_metrics(trace)
    [m] = profile_metrics(profile)
    assert m.device == device_label(trace, opts)
    assert profile.rank == str(opts.rank if opts.rank is not None else 0)
    if not writes_ops(trace):  # no operator span in the file: the op figures are not measurable, and say so
        assert m.values["op_max_block_bytes"] is None and "no operator spans" in m.missing["op_max_block_bytes"]
        expected["op_max_block_bytes"] = None
    for key in ("step_growth_bytes", "leaked_bytes", "leak_undetermined_bytes", "op_max_block_bytes"):
        assert m.values[key] == expected[key], key
        assert type(m.values[key]) is type(expected[key]), key
    if opts.device == "cpu":  # window-relative: the bytes carried in from before the window are named, not counted
        assert m.carried_over_bytes == trace.hidden_baseline
        assert m.values["peak_allocated_bytes"] == expected["peak_allocated_bytes"] - trace.hidden_baseline
        assert m.values["peak_reserved_bytes"] is None
    else:
        assert m.carried_over_bytes is None
        assert m.values["peak_allocated_bytes"] == expected["peak_allocated_bytes"]
        assert m.values["peak_reserved_bytes"] == expected["peak_reserved_bytes"]
        assert m.values["fragmentation"] == expected["fragmentation"]
        assert m.values["external_fragmentation"] == expected["external_fragmentation"]
    assert m.peak_t_ns == peak_moment(trace)
    assert sorted(map(tuple, profile.steps.to_pandas().astype("int64").to_numpy().tolist())) == sorted(trace.steps)
    facts = m.facts.components["allocator"]
    assert (facts.baseline_bytes, facts.consistency) == (trace.hidden_baseline, 1.0)
    assert facts.pre_window_blocks == sum(1 for b in trace.blocks if b.t_alloc is None)


def test_cli_inspect_on_a_written_gz_trace(tmp_path: Path) -> None:
    t0 = 1_764_246_877_074_330_300
    ms = 1_000_000
    from groundtruth import Block

    trace = Trace(
        device_id=1, hidden_baseline=3 << 20,
        blocks=(Block(1 << 20, t0, t0 + 5 * ms, "aten::mm"), Block(4 << 20, t0 + 12 * ms, None, "aten::empty"),
                Block(4 << 20, t0 + 22 * ms, None, "aten::empty"), Block(2 << 20, None, t0 + 1 * ms, "")),
        steps=((7, t0, t0 + 10 * ms), (8, t0 + 10 * ms, t0 + 20 * ms), (9, t0 + 20 * ms, t0 + 30 * ms)),
        t_start=t0, t_end=t0 + 40 * ms,
    )
    write_trace(trace, tmp_path, KinetoOptions(device="cuda", gz=True))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(["inspect", str(tmp_path), "--json"]) == 0
    [dev] = json.loads(out.getvalue())["profiles"][0]["devices"]
    assert dev["device"] == "cuda:1"
    metrics = dev["metrics"]
    assert metrics["step_growth_bytes"] is None  # 2 counted steps (#8, #9): too few to tell a jump from a trend
    assert metrics["leaked_bytes"] == 4 << 20  # #8's block; #9's is within the leak horizon
    assert metrics["leak_undetermined_bytes"] == 4 << 20
    assert metrics["peak_allocated_bytes"] == (3 << 20) + (8 << 20)  # after both leaks (1 MiB and 2 MiB gone)
    assert metrics["op_max_block_bytes"] == {"aten::mm": 1 << 20, "aten::empty": 4 << 20}
    assert dev["reconciliation"]["components"]["allocator"]["baseline_bytes"] == 3 << 20


# ==== issue 11: the input boundary, JSON side ======================================================
# torch 1.9 traces (no Addr, no totals), repeated keys, exact ns,
# a cap on inflated bytes. Expected values come from the raw events by plain loops.

# ---- torch 1.9: [memory] events with Bytes, Device Type and Device Id only ---------------------------


def as_torch_1_9(src: Path, dest: Path, *, totals: bool = False) -> Path:
    """``src`` as torch 1.9 wrote it: the [memory] args without Addr and (unless ``totals``) without
    Total Allocated / Total Reserved. Text surgery: every other byte, the ts text included, stays."""
    text = src.read_bytes()
    events = text.count(b'"name": "[memory]"')
    if not totals:
        text, n = re.subn(rb'"Total Reserved": -?\d+, "Total Allocated": -?\d+, ', b"", text)
        assert n == events
    text, n = re.subn(rb', "Addr": \d+', b"", text)
    assert n == events
    dest.write_bytes(text)
    return dest


def running_floors(trace: dict[str, Any]) -> dict[int, int]:
    """Each step's lowest running sum of Bytes (counting the level it starts at), from the raw events."""
    levels, total = [], 0
    for e in memory_events(trace):
        total += e["args"]["Bytes"]
        levels.append((ns(trace, e["ts"]), total))
    starts = {int(e["name"].split("#")[1]): ns(trace, e["ts"]) for e in trace["traceEvents"]
              if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")}
    out = {}
    for step, end in sorted(step_ends(trace).items()):
        before = [level for t, level in levels if t <= starts[step]][-1:]
        during = [level for t, level in levels if starts[step] < t <= end]
        out[step] = min(before + during)
    return out


OLD_TRACE_GAPS = ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation", "external_fragmentation",
                  "leaked_bytes", "leak_undetermined_bytes", "top_at_peak")


def test_a_torch_1_9_trace_measures_growth_steps_and_op_blocks(tmp_path: Path) -> None:
    path = as_torch_1_9(LEAK6, tmp_path / "old.pt.trace.json")
    trace = raw(path)
    mem = memory_events(trace)
    assert all(set(e["args"]) == {"Bytes", "Device Id", "Device Type", "finished", "Ev Idx"} for e in mem)
    profile = kineto.load(path)
    [model] = profile.devices
    [m] = profile_metrics(profile)
    assert m.device == "cpu"
    # steps, exactly as the trace times them
    assert profile.steps.ints("step").tolist() == sorted(step_ends(trace)) == [2, 3, 4, 5, 6, 7]
    assert profile.steps.ints("t_end").tolist() == [step_ends(trace)[s] for s in sorted(step_ends(trace))]
    # the series: the running sum of Bytes, one sample per event in ts order
    running = [sum(e["args"]["Bytes"] for e in mem[: k + 1]) for k in range(len(mem))]
    frame = model.series["allocator"].frame.to_pandas()
    assert frame["allocated"].tolist() == running
    assert frame["t_ns"].tolist() == [ns(trace, e["ts"]) for e in mem]
    assert frame["reserved"].isna().all()
    # in-window growth: the floors grow by the leak each counted step (#3..#7), as with the totals
    floors = running_floors(trace)
    assert [floors[s + 1] - floors[s] for s in range(3, 7)] == [LEAK_BYTES] * 4
    assert m.values["step_growth_bytes"] == LEAK_BYTES
    # op blocks: each allocation's innermost op, its largest block
    ops: dict[str, int] = {}
    for e in mem:
        if e["args"]["Bytes"] > 0 and (op := innermost_op(trace, e)):
            ops[op] = max(ops.get(op, 0), e["args"]["Bytes"])
    assert m.values["op_max_block_bytes"] == ops and ops["aten::empty"] == LEAK_BYTES
    # blocks are the allocations alone: a free without Addr names none of them
    assert len(model.blocks) == sum(1 for e in mem if e["args"]["Bytes"] > 0)
    assert model.blocks.ints("t_free").isna().all() and set(model.blocks.texts("component").tolist()) == {kineto.UNPAIRED}
    # the rest is not measurable, and says why
    for key in OLD_TRACE_GAPS:
        assert m.values[key] in (None, []), key
        assert "Addr" in m.missing[key] or "Total Allocated" in m.missing[key], key
    assert "running sum of Bytes" in m.missing["peak_allocated_bytes"]
    assert profile.metadata["memory_events_without_addr"] is True


def test_a_torch_1_9_trace_matches_the_full_trace_where_both_measure(tmp_path: Path) -> None:
    [old] = profile_metrics(kineto.load(as_torch_1_9(LEAK6, tmp_path / "old.json")))
    [new] = profile_metrics(kineto.load(LEAK6))
    for key in ("step_growth_bytes", "op_max_block_bytes"):
        assert old.values[key] == new.values[key], key


def test_a_trace_with_totals_but_no_addr_keeps_what_the_totals_give(tmp_path: Path) -> None:
    """Totals without Addr: the series are the totals; blocks still cannot be paired, and on CPU the
    carried-over bytes cannot be told apart, so the window-relative peak is not measurable either."""
    path = as_torch_1_9(LEAK, tmp_path / "totals.json", totals=True)
    profile = kineto.load(path)
    [model] = profile.devices
    assert model.series["allocator"].frame.ints("allocated").tolist() == [
        e["args"]["Total Allocated"] for e in memory_events(raw(path))]
    [m] = profile_metrics(profile)
    for key in ("peak_allocated_bytes", "leaked_bytes", "top_at_peak"):
        assert m.values[key] in (None, []) and "Addr" in m.missing[key], key
    assert "peak_reserved_bytes" not in profile.metadata["not_measurable"]  # the metric's own reason: CPU reserves 0


def test_the_cpu_reason_for_totals_without_addr_is_the_cpu_devices_alone(tmp_path: Path) -> None:
    """A CUDA device's Total Allocated is the caching allocator's own count, from the process start: its
    peak stands without Addr. Only the CPU's totals may carry bytes from an earlier session."""
    source = TORCH.parent / "torch_cuda" / "h200_trace_leak" / "train.1795846944832606968.pt.trace.json"
    path = as_torch_1_9(source, tmp_path / "totals.pt.trace.json", totals=True)
    by_device = {m.device: m for m in profile_metrics(kineto.load(path))}
    cuda_totals = [e["args"]["Total Allocated"] for e in memory_events(raw(path)) if e["args"]["Device Type"] == 1]
    assert by_device["cuda:0"].values["peak_allocated_bytes"] == max(cuda_totals)
    assert by_device["cpu"].values["peak_allocated_bytes"] is None
    assert "CPU totals may carry bytes" in by_device["cpu"].missing["peak_allocated_bytes"]


def _drop_addr(trace_text: bytes, which: list[int]) -> bytes:
    """Delete Addr from the memory events numbered ``which`` (0 = the first in the file)."""
    k = -1

    def edit(match: re.Match[bytes]) -> bytes:
        nonlocal k
        k += 1
        return b"" if k in which else match.group(0)

    return re.sub(rb', "Addr": \d+', edit, trace_text)


@pytest.mark.parametrize("which, odd, found", [([3], 3, "no Addr"), ("all but 2", 2, "an Addr")])
def test_addr_on_some_memory_events_only_is_refused(tmp_path: Path, which: Any, odd: int, found: str) -> None:
    text = LEAK.read_bytes()
    n = text.count(b'"Addr"')
    path = tmp_path / "mixed.json"
    path.write_bytes(_drop_addr(text, [i for i in range(n) if i != 2] if which == "all but 2" else which))
    trace = json.loads(LEAK.read_bytes())
    index = [i for i, e in enumerate(trace["traceEvents"]) if _is_mem(e)][odd]
    with pytest.raises(InputError) as info:
        kineto.load(path)
    assert info.value.column == f"traceEvents[{index}].args.Addr"
    assert info.value.found == found and "cannot be paired" in info.value.message


# ---- torch <= 1.9 operators: cat "Operator", tid a string -------------------------------------------
# Kineto wrote CPU ops as "cat": "Operator" with "tid": "<n>" until June 2021 (then "cpu_op", the tid
# still a string until August 2021), and [memory] events with "tid": <n>: one thread.


def legacy_op_blocks(trace: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per device: each op's largest allocation, from the raw events by plain loops. An allocation's op is
    the innermost (latest-starting, then shortest) "Operator"/"cpu_op" span on its pid and tid (compared as
    text: 25738 and "25738" are one thread) containing its ts. ProfilerStep#N spans are the steps, not ops
    (torch >= 1.10 writes them as user_annotation)."""
    spans: dict[tuple[Any, str], list[tuple[Decimal, Decimal, str]]] = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in ("Operator", "cpu_op") and not e["name"].startswith("ProfilerStep#"):
            start = Decimal(e["ts"])
            spans.setdefault((e["pid"], str(e["tid"])), []).append((start, start + Decimal(e["dur"]), e["name"]))
    arrays = {key: (np.array([s for s, _, _ in v], dtype=object), np.array([e for _, e, _ in v], dtype=object),
                    [n for _, _, n in v]) for key, v in spans.items()}
    out: dict[str, dict[str, int]] = {}
    for e in memory_events(trace):
        a = e["args"]
        if a["Bytes"] <= 0 or (e["pid"], str(e["tid"])) not in arrays:
            continue
        start, end, names = arrays[(e["pid"], str(e["tid"]))]
        t = Decimal(e["ts"])
        inside = np.flatnonzero((start <= t) & (t <= end))
        if not len(inside):
            continue
        k = max(inside.tolist(), key=lambda i: (start[i], -end[i]))
        device = "cpu" if a["Device Type"] == 0 else f"cuda:{a['Device Id']}"
        ops = out.setdefault(device, {})
        ops[names[k]] = max(ops.get(names[k], 0), a["Bytes"])
    return out


def test_a_torch_1_9_sample_attributes_blocks_to_its_operator_spans() -> None:
    trace = json.loads(gzip.decompress(TORCH19.read_bytes()), parse_float=Decimal)
    ops = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "Operator"]
    mem = memory_events(trace)
    # the premise: Operator spans with string tids, [memory] events with int tids, neither Addr nor totals
    assert ops and {type(e["tid"]) for e in ops} == {str} and {type(e["tid"]) for e in mem} == {int}
    assert not any("cpu_op" == e.get("cat") for e in trace["traceEvents"])
    assert all(set(e["args"]) == {"Bytes", "Device Type", "Device Id"} for e in mem)
    profile = kineto.load(TORCH19)
    assert profile.metadata["cpu_ops"] == sum(1 for e in ops if not e["name"].startswith("ProfilerStep#"))
    expected = legacy_op_blocks(trace)
    assert sorted(expected) == ["cpu", "cuda:0"] and len(expected["cuda:0"]) > 10
    metrics = {m.device: m for m in profile_metrics(profile)}
    assert {d: m.values["op_max_block_bytes"] for d, m in metrics.items()} == expected
    for m in metrics.values():
        # no totals: no peak, so no moment or step of it, and no blocks live at it (no free names its block)
        assert m.values["peak_allocated_bytes"] is None and (m.peak_t_ns, m.peak_step) == (None, None)
        assert "op_max_block_bytes are measured" in m.missing["peak_allocated_bytes"]
        assert "op_max_block_bytes" not in m.missing
        for key in ("op_bytes_at_peak", "owner_bytes_at_peak"):
            assert m.values[key] == {} and "Addr" in m.missing[key], key


def _legacy_trace(path: Path, cat: str | None) -> Path:
    """A hand-made trace as torch 1.9 writes one: ops (``cat``; None: none) with string tids, [memory]
    events with int tids, no Addr and no totals."""
    def op(name: str, tid: str, ts: int, dur: int) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur, "args": {}}

    def mem(tid: Any, ts: int, nbytes: int) -> dict[str, Any]:
        return {"ph": "i", "s": "t", "name": "[memory]", "pid": 7, "tid": tid, "ts": ts,
                "args": {"Device Type": 0, "Device Id": -1, "Bytes": nbytes}}

    ops = [op("ProfilerStep#1", "11", 90, 100),  # a step, not an op
           op("aten::outer", "11", 100, 50), op("aten::empty", "11", 110, 10), op("aten::zeros", "12", 100, 50),
           op("aten::padded", "012", 100, 50)] if cat else []  # "012" is no number: not thread 12
    events = [*ops, mem(11, 115, 64), mem(11, 130, 256), mem(11, 95, 1024), mem(12, 120, 32), mem("11", 140, 512),
              mem(11, 150, -64), mem(13, 120, 4096)]
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events[::-1]}))
    return path


@pytest.mark.parametrize("cat", ["Operator", "cpu_op"])
def test_operator_spans_with_string_tids_name_the_blocks(tmp_path: Path, cat: str) -> None:
    """"cpu_op" with string tids: Kineto between June and August 2021."""
    profile = kineto.load(_legacy_trace(tmp_path / "old.pt.trace.json", cat))
    assert profile.metadata["cpu_ops"] == 4
    [m] = profile_metrics(profile)
    # 64 B inside aten::empty inside aten::outer; 256 B and 512 B (its tid a string too) in aten::outer
    # only; 1024 B inside the step alone; 32 B on thread 12 (not "012"); 4096 B on a thread without ops
    assert m.values["op_max_block_bytes"] == {"aten::empty": 64, "aten::outer": 512, "aten::zeros": 32}
    assert "op_max_block_bytes are measured" in m.missing["peak_allocated_bytes"]
    assert (m.peak_t_ns, m.peak_step) == (None, None)


def test_a_trace_without_operator_spans_says_op_blocks_are_not_measurable(tmp_path: Path) -> None:
    profile = kineto.load(_legacy_trace(tmp_path / "no_ops.pt.trace.json", None))
    assert profile.metadata["cpu_ops"] == 0
    [m] = profile_metrics(profile)
    assert m.values["op_max_block_bytes"] is None
    assert "no operator spans" in m.missing["op_max_block_bytes"] and "ProfilerActivity.CPU" in m.missing[
        "op_max_block_bytes"]
    assert "op_max_block_bytes" not in m.missing["peak_allocated_bytes"]  # no longer claimed measured
    assert "step_growth_bytes (from the running sum of Bytes) is measured" in m.missing["peak_allocated_bytes"]
    assert m.values["op_bytes_at_peak"] == {} and "op_bytes_at_peak" in m.missing


def test_a_full_trace_without_operator_spans_keeps_its_peak_and_says_why_ops_are_missing(tmp_path: Path) -> None:
    path = tmp_path / "no_ops.pt.trace.json"
    path.write_bytes(CLEAN.read_bytes().replace(b'"cat": "cpu_op"', b'"cat": "not_an_op"'))  # every other byte kept
    [m] = profile_metrics(kineto.load(path))
    [full] = profile_metrics(kineto.load(CLEAN))
    assert m.values["peak_allocated_bytes"] == full.values["peak_allocated_bytes"]
    assert m.peak_t_ns == full.peak_t_ns is not None
    assert m.values["op_max_block_bytes"] is None and "no operator spans" in m.missing["op_max_block_bytes"]
    assert full.values["op_max_block_bytes"] and "op_max_block_bytes" not in full.missing


# ---- keys repeated in one object ----------------------------------------------------------------------


def _insert(data: bytes, anchor: bytes, text: bytes, *, nth: int = 0) -> bytes:
    at = -1
    for _ in range(nth + 1):
        at = data.index(anchor, at + 1)
    return data[:at] + text + data[at:]


def _first_memory_index(data: bytes) -> int:
    return _first(json.loads(data), _is_mem)


REPEATS = {  # (edit of the sample's bytes, the JSON path named; None: accepted, same numbers)
    "a memory event's Bytes, another value": (lambda d: _insert(d, b'"Bytes": 16384', b'"Bytes": 1, '),
                                              lambda d: f"traceEvents[{_first_memory_index(d)}].args.Bytes"),
    "a memory event's Bytes, the same value": (lambda d: _insert(d, b'"Bytes": 16384', b'"Bytes": 16384, '), None),
    "an event's name, the same value (as Kineto writes)": (
        lambda d: _insert(d, b'"name": "[memory]"', b'"name": "[memory]", '), None),
    "an event's ts, another value": (
        lambda d: _insert(d, b'"ts": 4448489590991.992', b'"ts": 4448489590991.993,\n'),
        lambda d: f"traceEvents[{_first_memory_index(d)}].ts"),
    "an event's ts, the same number written otherwise": (
        lambda d: _insert(d, b'"ts": 4448489590991.992', b'"ts": 4448489590991.99200,\n'), None),
    "baseTimeNanoseconds, another value": (lambda d: _insert(d, b'"baseTimeNanoseconds"', b'"baseTimeNanoseconds": 5, '),
                                           lambda d: "baseTimeNanoseconds"),
    "traceName after the events, another value": (lambda d: d.rstrip()[:-1] + b', "traceName": "other"}',
                                                   lambda d: "traceName"),
    "traceName after the events, the same value": (
        lambda d: d.rstrip()[:-1] + b', "traceName": "cpu_train_profile_memory.json"}', None),
    "a second traceEvents array": (lambda d: d.rstrip()[:-1] + b', "traceEvents": []}', lambda d: "traceEvents"),
    "distributedInfo.rank, another value": (
        lambda d: _insert(d, b'"traceEvents"', b'"distributedInfo": {"rank": 1, "rank": 3}, '),
        lambda d: "distributedInfo.rank"),
}


@pytest.mark.parametrize("ijson_reader", [False, True], ids=["json-reader", "ijson-reader"])
@pytest.mark.parametrize("case", sorted(REPEATS))
def test_a_key_repeated_with_another_value_is_refused(tmp_path: Path, case: str, ijson_reader: bool) -> None:
    """Both readers: the json reader (each object through unique_pairs) and the ijson reader (forced
    here by a surrogate escape in an unrelated event, the kind of file only it reads)."""
    edit, where = REPEATS[case]
    data = edit(CLEAN.read_bytes())
    if ijson_reader:
        data = _insert(data, b'"name": "process_name"', b'"label": "\\ud83d\\ude00", ')
    path = tmp_path / "repeat.pt.trace.json"
    path.write_bytes(data)
    if where is None:
        [got] = profile_metrics(kineto.load(path))
        [expected] = profile_metrics(kineto.load(CLEAN))
        assert got.values == expected.values and got.peak_t_ns == expected.peak_t_ns
        return
    with pytest.raises(InputError) as info:
        kineto.load(path)
    assert info.value.column == where(data), info.value.one_line()
    assert "conflicting duplicate key" in info.value.message and info.value.file == str(path)


# ---- exact ns from number timestamps ---------------------------------------------------------------------

TS_TEXT = "1736408883573957.123"  # µs since the epoch without a base: 19 digits
TS_NS = 1736408883573957123


def test_the_premise_a_float_loses_these_ns() -> None:
    """The float nearest the text is 123 ns away from it (a float holds 15-17 digits, these are 19)."""
    assert int(Decimal(float(TS_TEXT)) * 1000) == TS_NS - 123


@pytest.mark.parametrize("ijson_reader", [False, True], ids=["json-reader", "ijson-reader"])
def test_number_timestamps_are_exact_ns(tmp_path: Path, ijson_reader: bool) -> None:
    events = [
        f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "ts": {TS_TEXT}, "dur": 1000.001}}',
        ('{"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": ' + TS_TEXT + ', "args": {"Addr": 1, '
         '"Bytes": 512, "Total Allocated": 512, "Total Reserved": 0, "Device Type": 0, "Device Id": -1}}'),
        '{"ph": "M", "name": "process_name", "args": {"name": "' + ("\\ud83d\\ude00" if ijson_reader else "py") + '"}}',
    ]
    path = tmp_path / "exact.pt.trace.json"
    path.write_text('{"traceEvents": [' + ", ".join(events) + "]}")
    if not ijson_reader:
        assert traceevents.CHUNK_BYTES > path.stat().st_size  # one chunk of the json reader
    profile = kineto.load(path)
    assert profile.steps.ints("t_start").tolist() == [TS_NS] and profile.steps.ints("t_end").tolist() == [TS_NS + 1_000_001]
    assert profile.devices[0].series["allocator"].frame.ints("t_ns").tolist() == [TS_NS]


# ---- a cap on inflated bytes --------------------------------------------------------------------------------


def gzip_bomb(path: Path, head: bytes, members: int, member_bytes: int = 1 << 20) -> Path:
    """A gzip file of ``members`` concatenated members of ``member_bytes`` spaces after ``head``: it
    inflates to ``members * member_bytes`` bytes from ~1/1000 of that (built in milliseconds)."""
    path.write_bytes(gzip.compress(head) + gzip.compress(b" " * member_bytes, 9) * members)
    return path


def test_a_gzip_bomb_stops_at_the_default_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """100 MiB from ~100 KB: the default cap (100x the file, at least 16 MiB) stops it at 16 MiB."""
    monkeypatch.delenv(limits.INFLATED_BYTES_ENV, raising=False)
    path = gzip_bomb(tmp_path / "bomb.pt.trace.json.gz", b'{"schemaVersion": 1,', 100)
    size = path.stat().st_size
    assert size * limits.INFLATE_RATIO < limits.MIN_INFLATED_BYTES
    with pytest.raises(InputError) as info:
        kineto.load(path)
    assert info.value.file == str(path)
    assert info.value.found == f"more than {limits.MIN_INFLATED_BYTES} bytes from a {size}-byte file"
    assert limits.INFLATED_BYTES_ENV in (info.value.expected or "")


def test_a_bomb_of_tens_of_gb_stops_at_a_configured_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """20 GiB once inflated, from 20 MB: with the cap at 4 MiB the load reads 4 MiB + 1 byte of it."""
    path = gzip_bomb(tmp_path / "big.pt.trace.json.gz", b'{"traceEvents": [', 1280, 16 << 20)
    monkeypatch.setenv(limits.INFLATED_BYTES_ENV, "4 MiB")
    with pytest.raises(InputError, match="inflates past") as info:
        kineto.load(path)
    assert info.value.found is not None and info.value.found.startswith(f"more than {4 << 20} bytes")


@pytest.mark.parametrize("which", ["trace", "raw timeline"])
def test_the_inflated_cap_is_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str) -> None:
    text = LEAK.read_bytes() if which == "trace" else b"[[-1, 1, 512, 0], [5, 2, 1024, 3]]"
    path = tmp_path / ("t.pt.trace.json.gz" if which == "trace" else "t.raw.json.gz")
    path.write_bytes(gzip.compress(text))
    monkeypatch.setenv(limits.INFLATED_BYTES_ENV, str(len(text)))  # exactly the inflated size: fine
    assert load(discover(path)[0]).devices
    monkeypatch.setenv(limits.INFLATED_BYTES_ENV, str(len(text) - 1))
    with pytest.raises(InputError) as info:
        load(discover(path)[0])
    assert info.value.found == f"more than {len(text) - 1} bytes from a {path.stat().st_size}-byte file"


def test_overlapping_profiler_steps_are_an_error_naming_both(tmp_path: Path) -> None:
    # the spans of one step number merge (earliest start, latest end); two steps never overlap
    memory = {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1,
              "args": {"Addr": 1, "Bytes": 16, "Total Allocated": 16, "Total Reserved": 0, "Device Type": 0,
                       "Device Id": -1}}

    def step(n: int, ts: int, dur: int) -> dict[str, Any]:
        return {"ph": "X", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur, "pid": 1, "tid": 1}

    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [memory, step(1, 0, 4), step(1, 2, 8), step(2, 10, 5)]}))
    (found,) = discover(path)
    steps = load(found).steps
    assert steps.to_pandas().values.tolist() == [[1, 0, 10_000], [2, 10_000, 15_000]]  # touching is fine
    path.write_text(json.dumps({"traceEvents": [memory, step(1, 0, 10), step(2, 5, 10)]}))
    with pytest.raises(InputError) as info:
        load(found)
    assert (info.value.message, info.value.column) == ("steps 1 and 2 overlap", "ProfilerStep")


def test_a_memory_event_of_another_phase_is_an_error_not_dropped(tmp_path: Path) -> None:
    memory = {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1,
              "args": {"Addr": 1, "Bytes": 16, "Total Allocated": 16, "Total Reserved": 0, "Device Type": 0,
                       "Device Id": -1}}
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": [memory, dict(memory, ph="Z", ts=2)]}))
    (found,) = discover(path)
    with pytest.raises(InputError) as info:
        load(found)
    assert (info.value.column, info.value.found) == ("traceEvents[1].ph", "'Z'")


# ---- the trace-event format's array form -----------------------------------------------------------


def _array_form_says_so(path: Path) -> None:
    with pytest.raises(InputError) as info:
        load(discover(path)[0])  # named *.pt.trace.json: the Kineto loader says what it is
    text = info.value.one_line()
    assert info.value.file == str(path) and info.value.line == 1, text
    assert "JSON array form" in text and "no [memory] events" in text, text


def test_a_trace_in_the_array_form_is_named_for_what_it_is(tmp_path: Path) -> None:
    """Kineto before torch 1.8 (tb_plugin's 2020 samples) wrote a top-level array of events, gzipped."""
    events = [{"ph": "X", "cat": "Operator", "name": "aten::empty", "pid": 1, "tid": "2", "ts": 1606910596297023,
               "dur": 13, "args": {"Device": 0, "External id": 2}}]
    path = tmp_path / "worker0.pt.trace.json.gz"
    path.write_bytes(gzip.compress(b"[\n\n" + json.dumps(events, indent=2)[1:].encode()))
    _array_form_says_so(path)
    # an array that holds no trace events is not called one
    other = tmp_path / "other.pt.trace.json"
    other.write_text("[[1, 2], [3]]")
    with pytest.raises(InputError, match="not a Chrome trace"):
        load(discover(other)[0])


def test_torchs_event_list_export_is_named_for_what_it_is(tmp_path: Path) -> None:
    """torch's EventList export (the legacy autograd profiler's) still writes the array form, without
    memory events even when memory was profiled."""
    torch = pytest.importorskip("torch")
    with torch.autograd.profiler.profile(use_kineto=False, profile_memory=True) as prof:
        torch.ones(1024).sum()
    path = tmp_path / "legacy.pt.trace.json"
    prof.function_events.export_chrome_trace(str(path))
    assert path.read_text().startswith("[{")
    _array_form_says_so(path)


def test_an_escaped_half_surrogate_pair_is_named_as_such(tmp_path: Path) -> None:
    """``"\\udc00"`` is valid JSON text naming no character; ijson turns it into bytes that are not
    UTF-8. The error says both what it may be and where."""
    data = LEAK.read_bytes()
    at = data.index(b'"name": "') + len(b'"name": "')
    path = tmp_path / "half.pt.trace.json"
    path.write_bytes(data[:at] + b"\\udc00" + data[at:])
    with pytest.raises(InputError) as info:
        kineto.load(path)
    assert "surrogate" in info.value.message and info.value.column.startswith("traceEvents["), info.value.one_line()


@pytest.mark.parametrize("reader", ["json", "ijson"])
def test_the_header_after_trace_events_counts_as_before_it(reader: str, tmp_path: Path) -> None:
    """Key order is no part of JSON: a tool that saves a trace again may put Kineto's header after traceEvents
    (real TraceLens test traces: a harness's metadata first, then traceEvents, then deviceProperties), which
    read as no capacity, no platform, time base 0 and rank 0 for rank 1. Both readers (ijson's takes a file
    with an escaped astral character) read the header wherever it is."""
    trace = json.loads(H200_TRACE.read_text())
    trace["distributedInfo"] = {"backend": "nccl", "rank": 3}
    if reader == "ijson":
        trace["traceName"] = "\U0001f600"  # written as a surrogate pair escape: the json reader gives up
    header = {k: v for k, v in trace.items() if k != "traceEvents"}
    assert header["deviceProperties"] and header["baseTimeNanoseconds"]
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(trace))
    after.write_text(json.dumps({"metadata": {"harness": 1}, "traceEvents": trace["traceEvents"], **header}))
    expected, got = kineto.load(before), kineto.load(after)
    assert got.rank == expected.rank == "3"
    assert got.metadata["base_time_ns"] == expected.metadata["base_time_ns"] == header["baseTimeNanoseconds"]
    assert got.metadata["device_capacity_bytes"] == expected.metadata["device_capacity_bytes"]
    assert got.metadata["platform"] == expected.metadata["platform"] and got.metadata["platform"]["cuda:0"]["driver"]
    assert [d.values for d in profile_metrics(got)] == [d.values for d in profile_metrics(expected)]


@pytest.mark.parametrize(("head", "column"), [
    ({"deviceProperties": [{"id": 0, "totalGlobalMem": 2**80}]}, "deviceProperties[0].totalGlobalMem"),
    ({"deviceProperties": [{"id": 0, "totalGlobalMem": 80 << 30}, {"id": "x", "totalGlobalMem": 1}]},
     "deviceProperties[1].id"),
    ({"deviceProperties": [{"id": 0, "totalGlobalMem": -1}]}, "deviceProperties[0].totalGlobalMem"),
    ({"distributedInfo": {"backend": "nccl", "rank": "x"}}, "distributedInfo.rank"),
    ({"distributedInfo": {"backend": "nccl", "rank": 2**40}}, "distributedInfo.rank"),
    ({"distributedInfo": {"backend": "nccl", "rank": -1}}, None),  # not distributed: the file name's rank
    ({"distributedInfo": {"backend": "nccl", "rank": 3}}, None),
])
def test_header_values_memgate_acts_on_are_checked(head: dict[str, Any], column: str | None, tmp_path: Path) -> None:
    """A capacity sizes "92%" budgets (2**80 bytes would pass anything) and a rank names the profile:
    a value that is no integer in range is an error naming it, not a silent fallback."""
    trace = json.loads(LEAK.read_text())
    path = tmp_path / "rank7.pt.trace.json"
    # the header before traceEvents, as Kineto writes it (replacing the trace's own)
    path.write_text(json.dumps({**head, **{k: v for k, v in trace.items() if k not in head}}))
    if column is None:
        rank = head["distributedInfo"]["rank"]
        assert kineto.load(path).rank == (str(rank) if rank >= 0 else "7")
        return
    with pytest.raises(InputError) as info:
        kineto.load(path)
    assert info.value.column == column and info.value.file == str(path), info.value.one_line()


def test_each_gpus_platform_is_labelled_as_its_memory_events_are() -> None:
    """A ROCm trace's memory events are on ``hip:0`` (real TraceLens MI300X traces): its platform is ``hip:0``'s,
    not a ``cuda:0`` no device has; an idle GPU of the node (no memory events, real Holistic Trace Analysis
    test data) is ``cuda:<id>`` with the memory deviceProperties lists."""
    fields = {"deviceProperties": [
        {"id": 0, "name": "AMD Instinct MI300X", "totalGlobalMem": 206141652992, "computeMajor": 9, "computeMinor": 4},
        {"id": 1, "name": "AMD Instinct MI300X", "totalGlobalMem": 206141652992}]}
    platforms = kineto._platforms(fields, {"hip:0": 206141652992})
    assert sorted(platforms) == ["cuda:1", "hip:0"]
    assert platforms["hip:0"]["device_name"] == "AMD Instinct MI300X" and platforms["hip:0"]["compute"] == "9.4"
    assert platforms["cuda:1"]["total_memory"] == 206141652992 and platforms["cuda:1"]["compute"] is None



@pytest.mark.parametrize("value", ["0", 5, True, None, {"id": 0}, ["x", 7]])
def test_a_header_after_trace_events_that_is_no_list_of_devices_lists_none(value: Any, tmp_path: Path) -> None:
    """After traceEvents as before it, a deviceProperties that is no list of objects names no device (found by the
    mutation fuzz: a string there was iterated as devices), and a distributedInfo that is no object no rank."""
    trace = json.loads(H200_TRACE.read_text())
    events = trace.pop("traceEvents")
    path = tmp_path / "rank5.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events, **trace, "deviceProperties": value, "distributedInfo": value}))
    profile = kineto.load(path)
    assert profile.rank == "5" and "device_capacity_bytes" not in profile.metadata

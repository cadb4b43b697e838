"""Kineto / torch.profiler Chrome traces: detection, the real CPU samples, bad input, properties.

Expected values are derived here from the raw JSON with the json module (``parse_float=Decimal``
keeps µs exact) and plain loops, never copied from memgate's output.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
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
from writers.kineto import KinetoOptions, device_label, write_trace

from memgate import cli
from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.loaders import kineto
from memgate.metrics import profile_metrics
from memgate.schemas import load_schema

TORCH = Path(__file__).parent / "data" / "samples" / "torch"
LEAK = TORCH / "cpu_train_leak_profile_memory.json"
CLEAN = TORCH / "cpu_train_profile_memory.json"
LEAK6 = TORCH / "cpu_train_active6_leak_profile_memory.json"  # 6 active steps: growth is measurable
CLEAN6 = TORCH / "cpu_train_active6_profile_memory.json"
TIMELINE = TORCH / "cpu_memory_timeline.json"
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
    assert not kineto.claims(TIMELINE) and kineto.claims_timeline(TIMELINE)
    assert not kineto.claims(TRACE_VIEW)  # torch_npu's trace_view.json is an array: its profile dir owns it
    assert not kineto.claims_timeline(TRACE_VIEW)
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
    assert not kineto.claims_timeline(timeline_by_other_name)
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
    assert model.blocks["t_alloc"].notna().all()
    assert int(model.blocks["t_free"].isna().sum()) == len(live)
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
    assert profile.steps["step"].tolist() == sorted(ends)
    assert profile.steps["t_end"].tolist() == [ends[s] for s in sorted(ends)]
    assert int(model.series["allocator"].frame["t_ns"].iloc[0]) == ns(trace, mem[0]["ts"])


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


def test_memory_timeline_sample() -> None:
    times, sizes = json.loads(TIMELINE.read_bytes())
    profile = kineto.load_timeline(TIMELINE)
    [model] = profile.devices
    [m] = profile_metrics(profile)
    assert model.device == "unknown"
    assert m.values["peak_allocated_bytes"] == max(sum(row) for row in sizes)
    assert model.series["allocator"].frame["t_ns"].tolist() == [t * 1000 for t in times]


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
    with pytest.raises(InputError, match="not a JSON object"):
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
                     rank=st.one_of(st.none(), st.integers(0, 7)))


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
    assert sorted(map(tuple, profile.steps.astype("int64").to_numpy().tolist())) == sorted(trace.steps)
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

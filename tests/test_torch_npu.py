"""memgate.loaders.ascend.torch_npu on the real torch_npu samples: memgate's metrics equal the values derived
here from the raw files. (Generated profiles, read back to their ground truth: tests/test_property_torch_npu.py.)

The expected values are computed with the ``csv``/``json`` modules and ``Decimal`` only, straight
from the files (docs/design.md metric table), never copied from memgate's output. Then the same
profiles in every directory layout torch_npu writes (and CRLF/LF) must give the same numbers.
"""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import dataclass
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers import PRE21, PTA21_L0, PTA21_L1, PTA271, REPO, TORCH_NPU_SAMPLES, copy_sample, run_cli

from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.metrics import TOP_HOLDERS, DeviceMetrics, profile_metrics
from memgate.model import Profile

MIB, KIB = 2**20, 2**10


# ---- the expected values, from the raw files --------------------------------------------------


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return list(csv.DictReader(fh))


def _bytes(text: str, unit: int) -> int:
    value = Decimal(text) * unit
    assert value == value.to_integral_value(), f"{text} x {unit} is not a whole number of bytes"
    return int(value)


def _ns(us_text: str | Decimal) -> int:
    value = Decimal(str(us_text).strip()) * 1000
    assert value == value.to_integral_value()
    return int(value)


@dataclass(frozen=True)
class Expected:
    rank: str
    device: str
    peak_allocated: int | None
    peak_reserved: int | None
    peak_app_reserved: int | None
    peak_t_ns: int | None
    op_max_block: dict[str, int]
    top_sizes: list[int]  # sizes of the TOP_HOLDERS largest blocks live at the peak
    top_candidates: dict[int, set[str]]  # size -> op names of live blocks of that size (ties)
    steps: list[tuple[int, int | None, int | None]]
    peak_step: int | None
    pool_fragmentation: dict[str, float]  # pool -> 1 - its peak allocated / its peak reserved


@cache
def expected(sample: Path) -> Expected:
    info_path = sample / "profiler_info_0.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    rank = str(int(info["rank_id"])) if "rank_id" in info else "0"  # "0" in 2.7.1, 0 in 2.1

    peak_allocated = peak_reserved = peak_app = peak_t = None
    pool_fragmentation: dict[str, float] = {}
    device = "npu:0"  # a trace_view.json alone: the device id is the low 5 bits of the NPU MEM pid (msprof)
    record = sample / "memory_record.csv"
    if record.exists():
        rows = _rows(record)
        devices = {r["Device Type"] for r in rows}
        assert len(devices) == 1
        device = devices.pop().lower()
        components = {r["Component"] for r in rows}
        framework = "PTA+GE" if "PTA+GE" in components else "PTA"
        fw = [r for r in rows if r["Component"] == framework]
        peak_allocated = max(_bytes(r["Total Allocated(MB)"], MIB) for r in fw)
        peak_reserved = max(_bytes(r["Total Reserved(MB)"], MIB) for r in fw)
        peak_t = min(_ns(r["Timestamp(us)"]) for r in fw if _bytes(r["Total Allocated(MB)"], MIB) == peak_allocated)
        peak_app = max(_bytes(r["Total Reserved(MB)"], MIB) for r in rows if r["Component"] == "APP")
        # fragmentation is judged per pool (an allocator with its own reserved): PTA, GE; never their sum
        for pool in sorted(components - {"PTA+GE", "APP"}):
            pool_rows = [r for r in rows if r["Component"] == pool]
            reserved = max(_bytes(r["Total Reserved(MB)"], MIB) for r in pool_rows)
            if reserved:
                pool_fragmentation[pool] = 1 - max(_bytes(r["Total Allocated(MB)"], MIB) for r in pool_rows) / reserved

    trace: list[dict[str, Any]] = []
    if (sample / "trace_view.json").exists():
        trace = json.loads((sample / "trace_view.json").read_text("utf-8"), parse_float=Decimal)
    if peak_app is None and trace:
        mem_pids = {e["pid"] for e in trace if e.get("ph") == "M" and e.get("name") == "process_name"
                    and e["args"].get("name") == "NPU MEM"}
        app = [e["args"]["KB"] for e in trace if e.get("ph") == "C" and e.get("name") == "APP/Memory" and e["pid"] in mem_pids]
        peak_app = _bytes(str(max(app)), KIB)

    op_max: dict[str, int] = {}
    top_sizes: list[int] = []
    top_candidates: dict[int, set[str]] = {}
    if (sample / "operator_memory.csv").exists():
        blocks = _rows(sample / "operator_memory.csv")
        for b in blocks:
            if b["Name"] and b["Allocation Time(us)"]:
                size = _bytes(b["Size(KB)"], KIB)
                op_max[b["Name"]] = max(op_max.get(b["Name"], 0), size)
        assert peak_t is not None
        live = [b for b in blocks
                if (not b["Allocation Time(us)"] or _ns(b["Allocation Time(us)"]) <= peak_t)
                and (not b["Release Time(us)"] or _ns(b["Release Time(us)"]) > peak_t)]
        top_sizes = sorted((abs(_bytes(b["Size(KB)"], KIB)) for b in live), reverse=True)[:TOP_HOLDERS]
        for b in live:
            top_candidates.setdefault(abs(_bytes(b["Size(KB)"], KIB)), set()).add(b["Name"] or "")

    steps: list[tuple[int, int | None, int | None]] = []
    step_events = [e for e in trace if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")]
    if step_events:
        for e in step_events:
            start = _ns(e["ts"])
            steps.append((int(e["name"].split("#")[1]), start, start + _ns(e["dur"])))
    elif (sample / "kernel_details.csv").exists():
        spans: dict[int, tuple[int, int]] = {}
        for k in _rows(sample / "kernel_details.csv"):
            if k["Step Id"]:
                start = _ns(k["Start Time(us)"])
                end = start + _ns(k["Duration(us)"])
                lo, hi = spans.get(int(k["Step Id"]), (start, end))
                spans[int(k["Step Id"])] = (min(lo, start), max(hi, end))
        steps = [(s, lo, hi) for s, (lo, hi) in sorted(spans.items())]
    elif (sample / "step_trace_time.csv").exists():
        steps = [(int(r["Step"]), None, None) for r in _rows(sample / "step_trace_time.csv") if r["Step"]]
    peak_step = next((s for s, lo, hi in steps if lo is not None and hi is not None and peak_t is not None
                      and lo <= peak_t <= hi), None)
    return Expected(rank, device, peak_allocated, peak_reserved, peak_app, peak_t, op_max, top_sizes,
                    top_candidates, sorted(steps), peak_step, pool_fragmentation)


# ---- what memgate says -----------------------------------------------------------------------


def load_one(root: Path) -> Profile:
    found = discover(root)
    assert len(found) == 1, found
    assert found[0].format.name == "torch_npu"
    return load(found[0])


def steps_of(profile: Profile) -> list[tuple[int, int | None, int | None]]:
    return [(int(r["step"]), r["t_start"], r["t_end"]) for r in profile.steps.records()]


def only_device(profile: Profile) -> DeviceMetrics:
    metrics = profile_metrics(profile)
    assert len(metrics) == 1
    return metrics[0]


def assert_matches(profile: Profile, want: Expected) -> None:
    m = only_device(profile)
    assert profile.format == "torch_npu"
    assert m.device == want.device
    assert m.values["peak_allocated_bytes"] == want.peak_allocated
    assert m.values["peak_reserved_bytes"] == want.peak_reserved
    assert m.values["peak_app_reserved_bytes"] == want.peak_app_reserved
    assert m.peak_t_ns == want.peak_t_ns
    assert m.values["op_max_block_bytes"] == want.op_max_block
    top = m.values["top_at_peak"]
    assert [b["size"] for b in top] == want.top_sizes
    for block in top:
        assert (block["op"] or "") in want.top_candidates[block["size"]], block
    assert steps_of(profile) == want.steps
    assert m.peak_step == want.peak_step
    if want.pool_fragmentation:
        worst = max(want.pool_fragmentation, key=want.pool_fragmentation.__getitem__)
        assert m.pool_of["fragmentation"] == worst
        assert m.values["fragmentation"] == pytest.approx(want.pool_fragmentation[worst], rel=1e-12)


@pytest.fixture(scope="module")
def loaded() -> dict[Path, Profile]:
    return {sample: load_one(sample) for sample in TORCH_NPU_SAMPLES}


@pytest.mark.parametrize("sample", TORCH_NPU_SAMPLES, ids=lambda p: p.name)
def test_sample_metrics_equal_the_raw_files(sample: Path, loaded: dict[Path, Profile]) -> None:
    profile = loaded[sample]
    want = expected(sample)
    assert profile.rank == want.rank
    assert profile.path == str(sample)
    assert_matches(profile, want)


def test_the_derivation_itself_on_the_271_sample() -> None:
    """The brief's hand-checked numbers, so a wrong derivation above cannot hide a wrong loader."""
    want = expected(PTA271)
    assert want.peak_allocated == 10782243840 == int(Decimal("10282.7490234375") * MIB)
    assert want.peak_reserved == 10875830272
    assert want.peak_app_reserved == 12504285184
    assert [s for s, _, _ in want.steps] == [13]
    assert want.peak_step == 13
    assert len(want.op_max_block) > 20 and TOP_HOLDERS >= len(want.top_sizes) >= 10


def test_rank_id_is_a_string_in_271_and_an_int_in_21() -> None:
    assert json.loads((PTA271 / "profiler_info_0.json").read_text())["rank_id"] == "0"
    assert json.loads((PTA21_L1 / "profiler_info_0.json").read_text())["rank_id"] == 0


def test_ge_blocks_count_for_op_caps_and_the_peak(loaded: dict[Path, Profile]) -> None:
    """pta21 level1 has `cann::` GE blocks; they belong to the PTA+GE series and its op caps."""
    m = only_device(loaded[PTA21_L1])
    assert m.component == "PTA+GE"
    ge_ops = {op for op in expected(PTA21_L1).op_max_block if op.startswith("cann::")}
    assert ge_ops and ge_ops <= set(m.values["op_max_block_bytes"])


def test_missing_metrics_say_what_is_missing(loaded: dict[Path, Profile]) -> None:
    m = only_device(loaded[PTA21_L0])  # trace_view.json only: NPU MEM counters, no allocator
    assert m.values["peak_allocated_bytes"] is None
    assert "no allocator series" in m.missing["peak_allocated_bytes"]
    m = only_device(loaded[PTA271])  # one profiled step
    assert m.values["step_growth_bytes"] is None
    assert "needs at least 5 counted steps" in m.missing["step_growth_bytes"]
    assert "1 step(s) (13)" in m.missing["step_growth_bytes"]


# ---- layouts ---------------------------------------------------------------------------------

META_FILES = ("profiler_info_0.json", "profiler_metadata.json")


def as_ascend_pt(sample: Path, dest: Path, *, info_name: str = "profiler_info_0.json",
                 rank_id: object = ..., keep_info: bool = True) -> Path:
    """Lay a flat sample out as torch_npu writes it: metadata at the root, CSVs in ASCEND_PROFILER_OUTPUT/."""
    out = dest / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    for f in sample.iterdir():
        if f.name in META_FILES:
            if not keep_info and f.name.startswith("profiler_info"):
                continue
            target = dest / (info_name if f.name.startswith("profiler_info") else f.name)
            if f.name.startswith("profiler_info") and rank_id is not ...:
                info = json.loads(f.read_text())
                if rank_id is None:
                    info.pop("rank_id", None)
                else:
                    info["rank_id"] = rank_id
                target.write_text(json.dumps(info, indent=4))
            else:
                shutil.copyfile(f, target)
        else:
            shutil.copyfile(f, out / f.name)
    (dest / "FRAMEWORK").mkdir()  # raw folders torch_npu leaves beside the output; not profiles
    (dest / "PROF_000001_20251127_abcdefg").mkdir()
    return dest


def test_ascend_pt_dir_with_output_folder(tmp_path: Path) -> None:
    root = as_ascend_pt(PTA271, tmp_path / "node0_4011_20251127183437_ascend_pt")
    profile = load_one(root)
    assert profile.path == str(root)
    assert profile.rank == "0"
    assert profile.metadata["torch_npu_version"] == "2.7.1"
    assert_matches(profile, expected(PTA271))


def test_output_folder_passed_directly_is_its_parent_profile(tmp_path: Path) -> None:
    root = as_ascend_pt(PTA21_L1, tmp_path / "node0_77_20250109_ascend_pt", rank_id=5)
    found = discover(root / "ASCEND_PROFILER_OUTPUT")
    assert [f.path for f in found] == [root]  # profiler_info (the rank) lives in the parent
    profile = load(found[0])
    assert profile.rank == "5"
    assert_matches(profile, expected(PTA21_L1))


def test_root_with_one_ascend_pt_dir_per_rank(tmp_path: Path) -> None:
    root = tmp_path / "prof"
    ranks = {
        as_ascend_pt(PTA21_L1, root / "hostA_101_20250109_ascend_pt", rank_id=0): "0",  # int, as 2.1 writes it
        as_ascend_pt(PTA271, root / "hostA_102_20251127_ascend_pt", rank_id="1"): "1",  # string, as 2.7.1 does
        as_ascend_pt(PTA21_L1, root / "hostB_103_20250109_ascend_pt", info_name="profiler_info_2.json",
                     rank_id=None): "2",  # no rank_id: the file name's suffix
        as_ascend_pt(PTA21_L1, root / "job_rank3_ascend_pt", keep_info=False): "3",  # no profiler_info: the dir name
    }
    (root / "logs").mkdir()
    (root / "logs" / "train.log").write_text("not a profile\n")
    found = discover(root)
    assert [f.path for f in found] == sorted(ranks)
    for f in found:
        profile = load(f)
        assert profile.rank == ranks[f.path], f.path
        sample = PTA271 if "hostA_102" in f.path.name else PTA21_L1
        assert_matches(profile, expected(sample))


@pytest.mark.parametrize(("sample", "eol"), [(PTA271, b"\r\n"), (PTA21_L1, b"\n")], ids=["271-to-crlf", "21-to-lf"])
def test_line_endings_do_not_change_the_numbers(sample: Path, eol: bytes, tmp_path: Path) -> None:
    root = copy_sample(sample, tmp_path / sample.name)
    for name in ("memory_record.csv", "operator_memory.csv", "npu_module_mem.csv", "step_trace_time.csv"):
        path = root / name
        original = path.read_bytes()
        path.write_bytes(eol.join(original.splitlines()) + eol)
        assert (b"\r\n" in path.read_bytes()) == (eol == b"\r\n")
    assert (PTA21_L1 / "memory_record.csv").read_bytes().count(b"\r\n") == 1005  # the original is CRLF
    assert_matches(load_one(root), expected(sample))


@pytest.mark.parametrize("sample", [PTA271, PTA21_L1], ids=["271", "21"])
def test_the_order_of_operator_rows_changes_nothing(sample: Path, tmp_path: Path) -> None:
    """Every figure, and which blocks hold the peak (sizes tie there), is the same for the rows in any order."""
    import random

    root = copy_sample(sample, tmp_path / sample.name)
    path = root / "operator_memory.csv"
    header, *rows = path.read_bytes().splitlines(keepends=True)
    eol = b"\r\n" if header.endswith(b"\r\n") else b"\n"
    rows = [r if r.endswith(b"\n") else r + eol for r in rows]  # the last row may have no line end
    random.Random(7).shuffle(rows)
    path.write_bytes(header + b"".join(rows))
    shuffled, original = profile_metrics(load_one(root)), profile_metrics(load_one(sample))
    sizes = [b["size"] for b in original[0].values["top_at_peak"]]
    assert len(set(sizes)) < len(sizes)  # ties: the case where row order could leak into the listing
    assert [m.values for m in shuffled] == [m.values for m in original]


def test_before_2_1_a_row_is_ge_by_its_cann_name_alone(tmp_path: Path) -> None:
    """torch_npu before 2.1 wrote no Stream Ptr: an unnamed row (no op matched, or a release-only
    row) is PTA's, as that writer made it; only ``cann::`` rows come from GE."""
    root = copy_sample(PRE21, tmp_path / "localhost_1408366_20230919_ascend_pt")
    path = root / "operator_memory.csv"
    path.write_text(path.read_text() + (
        "aten::mm,512,1695115378721350.2,1695115378721880.0,529.8,4599.740234375,8664.0,4599.86572265625,8664.0,NPU:0\n"
        ",1024.5,1695115378721360.5,,,4599.75,8664.0,,,NPU:0\n"
        ",-2048,,1695115378721370.0,,,,4599.5,8664.0,NPU:0\n"))
    [device] = load_one(root).devices
    rows = device.blocks.records()
    assert [(r["op"], r["component"], r["size"]) for r in rows[-3:]] == [
        ("aten::mm", "PTA", 512 * 1024), (None, "PTA", 1024 * 1024 + 512), (None, "PTA", 2048 * 1024)]
    assert {r["component"] for r in rows[:-3]} == {"GE"} and all(r["stream"] is None for r in rows)
    assert rows[-3]["t_alloc"] == 1695115378721350200  # a float's µs text, one decimal: exact ns


@pytest.mark.parametrize("name", ["memory_record.csv", "operator_memory.csv"])
def test_a_header_between_generations_is_refused(name: str, tmp_path: Path) -> None:
    """Stream Ptr without the Active columns was never written: named as missing, not half read."""
    root = copy_sample(PRE21, tmp_path / "localhost_1408366_20230919_ascend_pt")
    path = root / name
    header, rest = path.read_text().split("\n", 1)
    path.write_text(header.replace(",Device Type", ",Stream Ptr,Device Type") + "\n"
                    + "\n".join(line.replace(",NPU:0", ",7,NPU:0") for line in rest.split("\n")))
    with pytest.raises(InputError) as info:
        load_one(root)
    assert info.value.line == 1 and "Active" in info.value.one_line(), info.value.one_line()


def test_crlf_errors_still_name_the_right_line(tmp_path: Path) -> None:
    """Line numbers count CRLF lines as lines (the pta21 memory_record is CRLF)."""
    from memgate.errors import InputError

    root = copy_sample(PTA21_L1, tmp_path / "crlf")
    path = root / "memory_record.csv"
    lines = path.read_bytes().split(b"\r\n")
    lines[500] = lines[500].replace(b"NPU:0", b"GPU:0")
    path.write_bytes(b"\r\n".join(lines))
    with pytest.raises(InputError) as info:
        load_one(root)
    assert (info.value.line, info.value.column) == (501, "Device Type")
    assert "'GPU:0'" in info.value.one_line()


# ---- the JSON report -------------------------------------------------------------------------


def test_inspect_json_validates_against_the_report_schema() -> None:
    rc, out, err = run_cli(["inspect", PTA271, "--json"])
    assert rc == 0, err
    report = json.loads(out)
    schema = json.loads((REPO / "schemas" / "report.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(report)
    (profile,) = report["profiles"]
    (device,) = profile["devices"]
    want = expected(PTA271)
    assert profile["rank"] == want.rank and device["device"] == want.device
    metrics = device["metrics"]
    assert metrics["peak_allocated_bytes"] == want.peak_allocated == 10782243840
    assert metrics["peak_reserved_bytes"] == want.peak_reserved == 10875830272
    assert metrics["peak_app_reserved_bytes"] == want.peak_app_reserved == 12504285184
    assert metrics["op_max_block_bytes"] == want.op_max_block
    assert [s["step"] for s in profile["steps"]] == [13]
    assert '"peak_allocated_bytes": 10782243840' in out  # an exact integer, not 1.078e10


# ---- files of one profile that belong together, or not (issue 11) ------------------------------------

OP_TIMES = ("Allocation Time(us)", "Release Time(us)", "Active Release Time(us)")
ALLOCATOR = ("PTA", "GE", "PTA+GE")


def _shift_us(text: str, shift_us: int) -> str:
    """A torch_npu µs cell (``1764246877074330.300\\t``) moved by whole µs, written the same way."""
    if not text.strip():
        return text
    whole, _, rest = text.partition(".")
    return f"{int(whole) + shift_us}.{rest}" if rest else str(int(whole) + shift_us)


def _rewrite(path: Path, edit: Any) -> None:
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.reader(fh))
    header = rows[0]
    for row in rows[1:]:
        edit(dict(zip(header, range(len(header)))), row)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows(rows)


def _op_windows(sample: Path, shift_ns: int = 0) -> tuple[int, int]:
    """The blocks' window from operator_memory.csv: allocation times, and releases (active first)."""
    times = []
    for r in _rows(sample / "operator_memory.csv"):
        if r["Allocation Time(us)"].strip():
            times.append(_ns(r["Allocation Time(us)"]))
        release = r["Active Release Time(us)"].strip() or r["Release Time(us)"].strip()
        if release:
            times.append(_ns(release))
    return min(times) + shift_ns, max(times) + shift_ns


def _allocator_window(sample: Path) -> tuple[int, int]:
    times = [_ns(r["Timestamp(us)"]) for r in _rows(sample / "memory_record.csv") if r["Component"] in ALLOCATOR]
    return min(times), max(times)


def test_cross_file_figures_of_a_real_profile() -> None:
    profile = load_one(PTA271)
    record = [_ns(r["Timestamp(us)"]) for r in _rows(PTA271 / "memory_record.csv")]
    modules = [_ns(r["Timestamp(us)"]) for r in _rows(PTA271 / "npu_module_mem.csv")]
    assert profile.metadata["cross_file"] == {
        "devices_by_file": {"memory_record.csv": ["npu:0"], "npu_module_mem.csv": ["npu:0"],
                            "operator_memory.csv": ["npu:0"]},
        "window_ns_by_file": {"kernel_details.csv": [want := expected(PTA271).steps[0][1], expected(PTA271).steps[0][2]],
                              "memory_record.csv": [min(record), max(record)],
                              "npu_module_mem.csv": [min(modules), max(modules)],
                              "operator_memory.csv": list(_op_windows(PTA271))},
    }
    assert want is not None
    (device,) = profile_metrics(profile)
    facts = device.facts.consistency["PTA"]
    blocks = [r for r in _rows(PTA271 / "operator_memory.csv") if r["Allocation Time(us)"].strip()]
    assert (facts.window_overlap, facts.checked_blocks, facts.agreeing_blocks, facts.agreement) == (
        1.0, len(blocks), len(blocks), 1.0)
    report = device.as_json()["reconciliation"]["consistency"]["PTA"]
    assert report["agreement"] == 1.0 and report["series_source"].endswith("memory_record.csv")


def test_operator_rows_of_another_window_are_refused(tmp_path: Path) -> None:
    root = copy_sample(PTA271, tmp_path / "run_ascend_pt")
    hour_us = 3600 * 10**6
    _rewrite(root / "operator_memory.csv",
             lambda col, row: [row.__setitem__(col[c], _shift_us(row[col[c]], hour_us)) for c in OP_TIMES])
    with pytest.raises(InputError) as info:
        load_one(root)
    err = info.value
    lo, hi = _allocator_window(PTA271)
    b_lo, b_hi = _op_windows(PTA271, hour_us * 1000)
    assert err.file == str(root / "operator_memory.csv")
    assert err.message == ("npu:0: the blocks and the allocator totals of memory_record.csv do not overlap in time: "
                           "they come from different runs or profiling windows")
    assert err.expected == f"blocks inside the window of {root / 'memory_record.csv'} ({lo}..{hi} ns)"
    assert err.found == f"blocks from {b_lo}..{b_hi} ns"


def test_operator_rows_of_an_overlapping_window_show_in_the_figures(tmp_path: Path) -> None:
    """Half a window apart: loaded (the files overlap), the figures say how far they agree."""
    root = copy_sample(PTA271, tmp_path / "run_ascend_pt")
    lo, hi = _allocator_window(PTA271)
    shift_us = (hi - lo) // 2000
    _rewrite(root / "operator_memory.csv",
             lambda col, row: [row.__setitem__(col[c], _shift_us(row[col[c]], shift_us)) for c in OP_TIMES])
    b_lo, b_hi = _op_windows(PTA271, shift_us * 1000)
    record = {(_ns(r["Timestamp(us)"]), _bytes(r["Total Allocated(MB)"], 1 << 20))
              for r in _rows(PTA271 / "memory_record.csv") if r["Component"] == "PTA"}
    checked = [(_ns(r["Allocation Time(us)"]) + shift_us * 1000, _bytes(r["Allocation Total Allocated(MB)"], 1 << 20))
               for r in _rows(PTA271 / "operator_memory.csv") if r["Allocation Time(us)"].strip()]
    (device,) = profile_metrics(load_one(root))
    facts = device.facts.consistency["PTA"]
    assert facts.window_overlap == (min(hi, b_hi) - max(lo, b_lo)) / (b_hi - b_lo)
    assert (facts.checked_blocks, facts.agreeing_blocks) == (len(checked), sum(c in record for c in checked))
    assert facts.agreement is not None and facts.agreement < 0.05  # another window's totals hardly ever match


def test_operator_rows_of_another_device_are_refused(tmp_path: Path) -> None:
    root = copy_sample(PTA271, tmp_path / "run_ascend_pt")
    _rewrite(root / "operator_memory.csv", lambda col, row: row.__setitem__(col["Device Type"], "NPU:1"))
    with pytest.raises(InputError) as info:
        load_one(root)
    err = info.value
    assert (err.file, err.found) == (str(root / "operator_memory.csv"), "blocks on npu:1")
    assert err.message == ("the files of this profile name different devices: the blocks on npu:1 have no allocator "
                           "totals, memory_record.csv records them for npu:0 only (files of another rank or run?)")


# ---- the rank in profiler_info (issue 11) -------------------------------------------------------------

@pytest.mark.parametrize("rank_id", ["²", "٣", "３", "1.0", "rank0", True, 2.0, [0]])
def test_a_rank_id_that_is_not_ascii_digits_is_an_error(tmp_path: Path, rank_id: object) -> None:
    root = as_ascend_pt(PTA21_L1, tmp_path / "node0_77_20250109_ascend_pt", rank_id=rank_id)
    with pytest.raises(InputError) as info:
        load_one(root)
    err = info.value
    assert (err.file, err.column, err.message) == (str(root / "profiler_info_0.json"), "rank_id",
                                                   "rank_id is not a whole number")
    assert err.found == repr(rank_id)
    assert discover(root)[0].path == root  # discovery itself does not fail: the load says what is wrong


@pytest.mark.parametrize("rank_id", [2**31, "9" * 40, str(2**63)])
def test_a_rank_id_past_a_c_int_is_an_error(tmp_path: Path, rank_id: object) -> None:
    root = as_ascend_pt(PTA21_L1, tmp_path / "node0_77_20250109_ascend_pt", rank_id=rank_id)
    with pytest.raises(InputError) as info:
        load_one(root)
    assert (info.value.column, info.value.message) == ("rank_id", "rank_id out of range")


def test_a_rank_in_a_name_past_a_c_int_is_no_rank(tmp_path: Path) -> None:
    root = as_ascend_pt(PTA21_L1, tmp_path / f"rank_{'9' * 40}" / "node0_77_20250109_ascend_pt",
                        info_name="profiler_info.json", rank_id="")
    assert load_one(root).rank == "0"
    named = as_ascend_pt(PTA21_L1, tmp_path / "b" / "node0_77_20250109_ascend_pt",
                         info_name=f"profiler_info_{2**31}.json", rank_id="")
    with pytest.raises(InputError, match="the rank in the file name is out of range"):
        load_one(named)


@pytest.mark.parametrize(("rank_id", "rank"), [("7", "7"), (" 7 ", "7"), (7, "7"), (-1, "0"), ("-1", "0"), ("", "0")])
def test_rank_id_forms_that_are_whole_numbers(tmp_path: Path, rank_id: object, rank: str) -> None:
    root = as_ascend_pt(PTA21_L1, tmp_path / "node0_77_20250109_ascend_pt", info_name="profiler_info.json",
                        rank_id=rank_id)
    assert load_one(root).rank == rank  # -1 / empty: not distributed, no suffix, no rank_N dir: "0"


def test_profiler_info_name_and_content_disagreeing_is_stated(tmp_path: Path) -> None:
    root = as_ascend_pt(PTA21_L1, tmp_path / "node0_77_20250109_ascend_pt", info_name="profiler_info_3.json",
                        rank_id=5)
    profile = load_one(root)
    assert profile.rank == "5"
    assert profile.metadata["notes"] == [("profiler_info_3.json holds rank_id 5: the rank is 5 (the content; the file "
                                         "name's suffix 3 disagrees: a renamed or copied file?)")]
    agreeing = as_ascend_pt(PTA21_L1, tmp_path / "node1_78_20250109_ascend_pt", info_name="profiler_info_5.json",
                            rank_id=5)
    assert "notes" not in load_one(agreeing).metadata


def test_two_profiler_info_files_in_one_profile_are_an_error(tmp_path: Path) -> None:
    root = as_ascend_pt(PTA21_L1, tmp_path / "node0_77_20250109_ascend_pt")
    shutil.copyfile(root / "profiler_info_0.json", root / "profiler_info_1.json")
    with pytest.raises(InputError) as info:
        load_one(root)
    assert info.value.file == str(root / "profiler_info_1.json")
    assert info.value.found == "profiler_info_0.json, profiler_info_1.json"


def test_two_profiles_of_one_rank_in_one_window_are_stated(tmp_path: Path) -> None:
    import pickle

    root = tmp_path / "prof"
    a = as_ascend_pt(PTA21_L1, root / "hostA_101_20250109_ascend_pt")  # rank_id 0 ...
    b = as_ascend_pt(PTA21_L1, root / "hostB_102_20250109_ascend_pt")  # ... copied: rank 0 again, same window
    c = as_ascend_pt(PTA271, root / "hostA_103_20251127_ascend_pt")  # rank 0 of another run (another window)
    found = {f.path: f for f in discover(root)}
    assert sorted(found) == sorted([a, b, c])

    def note(other: Path) -> str:
        return (f"rank 0 (torch_npu) is also claimed by {other}, recorded over an overlapping window (the same run's "
                "rank twice? a copied folder, or processes that all took the default rank): both are kept, each keyed "
                "by its path")

    assert (found[a].notes, found[b].notes, found[c].notes) == ((note(b),), (note(a),), ())
    assert load(found[a]).metadata["notes"] == [note(b)]
    assert "notes" not in load(found[c]).metadata
    assert pickle.loads(pickle.dumps(found[a])).notes == (note(b),)  # travels to --jobs / xdist workers
    # the window profiler_info states: collectionTimeEnd minus the monotonic time it ran
    from memgate.loaders.ascend.torch_npu import run_window

    info = json.loads((PTA21_L1 / "profiler_info_0.json").read_text())
    end, mono_end = int(info["end_info"]["collectionTimeEnd"]), int(info["end_info"]["MonotonicTimeEnd"])
    assert run_window(a) == (end - (mono_end - int(info["start_info"]["start_monotonic"])), end)


def test_operator_rows_of_an_extra_device_are_refused(tmp_path: Path) -> None:
    """Half the blocks moved to npu:1: npu:0 still has blocks and totals, npu:1 blocks and no totals."""
    root = copy_sample(PTA271, tmp_path / "run_ascend_pt")
    rows = iter(range(10**6))
    _rewrite(root / "operator_memory.csv",
             lambda col, row: row.__setitem__(col["Device Type"], "NPU:1") if next(rows) % 2 else None)
    with pytest.raises(InputError) as info:
        load_one(root)
    assert info.value.found == "blocks on npu:1"


def test_a_block_frees_at_the_earlier_of_its_two_release_times() -> None:
    """torch_npu takes a block out of its allocated total in free(), then writes MEMORY_BLOCK_FREE
    (Active Release Time) and MEMORY_FREE (Release Time). Without stream uses the active release comes
    first; a block another stream still uses is handed back later (two such rows in this real file, up
    to 1.9 ms after their Release Time). The block leaves the allocated total at the earlier one."""
    expected, later_active = [], 0
    for r in _rows(PTA21_L1 / "operator_memory.csv"):
        if not r["Allocation Time(us)"].strip():
            continue
        times = [_ns(r[c]) for c in ("Release Time(us)", "Active Release Time(us)") if r[c].strip()]
        later_active += len(times) == 2 and times[1] > times[0]
        expected.append((_ns(r["Allocation Time(us)"]), min(times) if times else None))
    assert later_active == 2
    [device] = load_one(PTA21_L1).devices
    t_free = device.blocks.ints("t_free")
    got = list(zip(device.blocks.ints("t_alloc").values.tolist(),
                   [None if na else t for t, na in zip(t_free.values.tolist(), t_free.isna().tolist())]))
    assert sorted(got, key=str) == sorted(expected, key=str)

"""Fragmentation is judged per allocator pool (docs/design.md, Metrics), never on a combined series.

Every profile here is written by hand with exact sizes (MB = MiB in torch_npu files, MB = KB/1000 in
MindSpore's), so each expected value is a fraction known by construction; the tests compute it by
arithmetic, and where a real sample is read (snapshots, msMemScope) they rebuild the figures from the
raw file with plain loops — never from memgate's output.

- ``fragmentation`` per pool = 1 - peak allocated / peak reserved; the device value is the worst pool,
  named in ``pool_of``, with a note when that pool's reserved is at its maximum from its first sample.
- ``external_fragmentation`` per pool = max over growths of reserved between consecutive rows of
  (reserved - allocated at the row before) / (reserved at the row after); 0 when it never grew.
"""

from __future__ import annotations

import csv
import io
import math
import pickle
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from helpers import sample_pickle

from memgate.budgets import budget_from_mapping
from memgate.discover import discover, load
from memgate.errors import NotMeasurable
from memgate.judge import judge
from memgate.metric_cache import MetricCache
from memgate.metrics import DeviceMetrics, MetricOptions, profile_metrics
from memgate.model import Profile

MIB = 1 << 20
SAMPLES = Path(__file__).parent / "data" / "samples"
TORCH = SAMPLES / "torch"
MSMEMSCOPE = SAMPLES / "msmemscope"
BEFORE_WINDOW = "reserved is at its maximum from its first sample: the value reflects memory reserved before the window"

NPU_HEADER = "Component,Timestamp(us),Total Allocated(MB),Total Reserved(MB),Total Active(MB),Stream Ptr,Device Type\n"
OPS_HEADER = (
    "Name,Size(KB),Allocation Time(us),Release Time(us),Active Release Time(us),Duration(us),Active Duration(us),"
    "Allocation Total Allocated(MB),Allocation Total Reserved(MB),Allocation Total Active(MB),"
    "Release Total Allocated(MB),Release Total Reserved(MB),Release Total Active(MB),Stream Ptr,Device Type\n"
)
# One block (torch_npu refuses an operator_memory.csv without rows); blocks play no part in fragmentation.
OPS_ROW = "aten::empty,1024.0,1700000000001000.000\t,,,,,1.0,400.0,1.0,,,,187651234,NPU:0\n"

# ---- the hand-written torch_npu memory_record.csv files ------------------------------------------------
# PTA+GE after every PTA and GE row = the sum of each component's last row (0 before its first).
# APP rows (whole process, reserved only) come first, as torch_npu writes them; APP is never a pool.

# 1. Two pools peaking apart: PTA full at its peak (1000/1000 MB) at t3, GE full at its peak (800/800)
#    at t5. Both pools grow inside the window (PTA 400 -> 1000, GE 200 -> 800).
APART = NPU_HEADER + (
    "APP,1700000000000500.000\t,,4000.0,,,NPU:0\n"
    "APP,1700000000006500.000\t,,4100.0,,,NPU:0\n"
    "PTA,1700000000001000.000\t,200.0,400.0,200.0,187651234,NPU:0\n"
    "PTA+GE,1700000000001000.000\t,200.0,400.0,200.0,187651234,NPU:0\n"
    "GE,1700000000002000.000\t,100.0,200.0,,,NPU:0\n"
    "PTA+GE,1700000000002000.000\t,300.0,600.0,200.0,187651234,NPU:0\n"
    "PTA,1700000000003000.000\t,1000.0,1000.0,1000.0,187651234,NPU:0\n"
    "PTA+GE,1700000000003000.000\t,1100.0,1200.0,1000.0,187651234,NPU:0\n"
    "PTA,1700000000004000.000\t,100.0,1000.0,100.0,187651234,NPU:0\n"
    "PTA+GE,1700000000004000.000\t,200.0,1200.0,100.0,187651234,NPU:0\n"
    "GE,1700000000005000.000\t,800.0,800.0,,,NPU:0\n"
    "PTA+GE,1700000000005000.000\t,900.0,1800.0,100.0,187651234,NPU:0\n"
    "GE,1700000000006000.000\t,50.0,800.0,,,NPU:0\n"
    "PTA+GE,1700000000006000.000\t,150.0,1800.0,100.0,187651234,NPU:0\n"
)

# 2. PTA reserved before the window: 2000 MB from its first row on, allocated peaks at 1500 MB.
#    GE grows inside the window (100 -> 400 MB) and peaks at 380 MB.
RESERVED_BEFORE = NPU_HEADER + (
    "PTA,1700000000001000.000\t,500.0,2000.0,500.0,187651234,NPU:0\n"
    "PTA+GE,1700000000001000.000\t,500.0,2000.0,500.0,187651234,NPU:0\n"
    "GE,1700000000002000.000\t,50.0,100.0,,,NPU:0\n"
    "PTA+GE,1700000000002000.000\t,550.0,2100.0,500.0,187651234,NPU:0\n"
    "PTA,1700000000003000.000\t,1500.0,2000.0,1500.0,187651234,NPU:0\n"
    "PTA+GE,1700000000003000.000\t,1550.0,2100.0,1500.0,187651234,NPU:0\n"
    "GE,1700000000004000.000\t,380.0,400.0,,,NPU:0\n"
    "PTA+GE,1700000000004000.000\t,1880.0,2400.0,1500.0,187651234,NPU:0\n"
    "PTA,1700000000005000.000\t,700.0,2000.0,700.0,187651234,NPU:0\n"
    "PTA+GE,1700000000005000.000\t,1080.0,2400.0,700.0,187651234,NPU:0\n"
)

# 2b. The same PTA, but GE is now the worst pool, and it grew inside the window: no note.
#     GE: 10/100 -> 300/1000 MB (peak allocated 300 of 1000: fragmentation 0.7).
GROWING_WORST = NPU_HEADER + (
    "PTA,1700000000001000.000\t,500.0,2000.0,500.0,187651234,NPU:0\n"
    "PTA+GE,1700000000001000.000\t,500.0,2000.0,500.0,187651234,NPU:0\n"
    "GE,1700000000002000.000\t,10.0,100.0,,,NPU:0\n"
    "PTA+GE,1700000000002000.000\t,510.0,2100.0,500.0,187651234,NPU:0\n"
    "PTA,1700000000003000.000\t,1500.0,2000.0,1500.0,187651234,NPU:0\n"
    "PTA+GE,1700000000003000.000\t,1510.0,2100.0,1500.0,187651234,NPU:0\n"
    "GE,1700000000004000.000\t,300.0,1000.0,,,NPU:0\n"
    "PTA+GE,1700000000004000.000\t,1800.0,3000.0,1500.0,187651234,NPU:0\n"
)

# 3. PTA had to grow by 400 MB (1000 -> 1400) while 500 MB sat free (allocated 500), then filled up to
#    1390 of 1400 MB. No GE in this run (PTA+GE = PTA).
GREW_WHILE_FREE = NPU_HEADER + (
    "PTA,1700000000001000.000\t,500.0,1000.0,500.0,187651234,NPU:0\n"
    "PTA+GE,1700000000001000.000\t,500.0,1000.0,500.0,187651234,NPU:0\n"
    "PTA,1700000000002000.000\t,900.0,1400.0,900.0,187651234,NPU:0\n"
    "PTA+GE,1700000000002000.000\t,900.0,1400.0,900.0,187651234,NPU:0\n"
    "PTA,1700000000003000.000\t,1390.0,1400.0,1390.0,187651234,NPU:0\n"
    "PTA+GE,1700000000003000.000\t,1390.0,1400.0,1390.0,187651234,NPU:0\n"
    "PTA,1700000000004000.000\t,200.0,1400.0,200.0,187651234,NPU:0\n"
    "PTA+GE,1700000000004000.000\t,200.0,1400.0,200.0,187651234,NPU:0\n"
)


def write_npu(root: Path, memory_record: str) -> Path:
    """A ``*_ascend_pt`` directory holding this memory_record.csv (and an operator_memory.csv of one block)."""
    prof = root / "host_4321_1700000000000_ascend_pt"
    out = prof / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "memory_record.csv").write_text(memory_record, encoding="utf-8")
    (out / "operator_memory.csv").write_text(OPS_HEADER + OPS_ROW, encoding="utf-8")
    return prof


def load_one(path: Path) -> Profile:
    [found] = discover(path)
    return load(found)


def metrics_of(path: Path, options: MetricOptions | None = None) -> DeviceMetrics:
    [m] = profile_metrics(load_one(path), options)
    return m


def series_from_csv(text: str, units: int = MIB) -> dict[str, list[tuple[int, int | None, int]]]:
    """component -> [(t text rank, allocated bytes or None, reserved bytes)] in file order (csv module only)."""
    out: dict[str, list[tuple[int, int | None, int]]] = {}
    for i, row in enumerate(csv.DictReader(io.StringIO(text))):
        alloc = row["Total Allocated(MB)"]
        out.setdefault(row["Component"], []).append(
            (i, round(float(alloc) * units) if alloc else None, round(float(row["Total Reserved(MB)"]) * units)))
    return out


def pool_reference(rows: Iterable[tuple[Any, int | None, int]]) -> tuple[float, float, bool]:
    """(fragmentation, external_fragmentation, reserved at its max from the first row) of one pool's rows."""
    rows = list(rows)
    allocated = [a for _, a, _ in rows if a is not None]
    reserved = [r for _, _, r in rows]
    shares = [(reserved[k] - rows[k][1]) / reserved[k + 1] for k in range(len(rows) - 1)
              if reserved[k + 1] > reserved[k] and rows[k][1] is not None]
    return 1 - max(allocated) / max(reserved), max(shares, default=0.0), reserved[0] == max(reserved)


def combined_fragmentation(rows: list[tuple[int, int | None, int]]) -> float:
    """The old definition: 1 - max(combined allocated) / max(combined reserved)."""
    return 1 - max(a for _, a, _ in rows if a is not None) / max(r for _, _, r in rows)


# ---- 1. two pools peaking apart -------------------------------------------------------------------------


def test_two_pools_full_at_their_own_peaks_have_no_fragmentation(tmp_path: Path) -> None:
    m = metrics_of(write_npu(tmp_path, APART))
    # by construction: each pool is full at its peak
    pta, ge = 1 - 1000 / 1000, 1 - 800 / 800
    assert pta == ge == 0.0
    series = series_from_csv(APART)
    assert pool_reference(series["PTA"])[0] == pta and pool_reference(series["GE"])[0] == ge
    assert set(m.pools) == {"PTA", "GE"}  # not PTA+GE, not APP
    assert m.pools["PTA"].fragmentation == pta and m.pools["GE"].fragmentation == ge
    assert m.values["fragmentation"] == 0.0
    assert "fragmentation" not in m.pool_of and "fragmentation" not in m.notes
    # The old combined definition would call 39% of the reserved memory wasted: the PTA+GE allocated
    # peak (1100 MB at t3) and reserved peak (1800 MB from t5) fall at different moments.
    old = 1 - 1100 / 1800
    assert combined_fragmentation(series["PTA+GE"]) == old
    assert old == pytest.approx(0.3889, abs=1e-4) and old > 0.3
    # The peaks still come from the combined series.
    assert m.component == "PTA+GE"
    assert (m.values["peak_allocated_bytes"], m.values["peak_reserved_bytes"]) == (1100 * MIB, 1800 * MIB)
    assert m.values["peak_app_reserved_bytes"] == 4100 * MIB
    # Each pool grew while part of it sat free: PTA 400 -> 1000 MB with 200 allocated, GE 200 -> 800
    # with 100 allocated. The worst is PTA's, named.
    assert m.pools["PTA"].external_fragmentation == (400 - 200) / 1000 == 0.2
    assert m.pools["GE"].external_fragmentation == (200 - 100) / 800 == 0.125
    assert m.values["external_fragmentation"] == 0.2 and m.pool_of["external_fragmentation"] == "PTA"
    assert not m.pools["PTA"].reserved_before_window and not m.pools["GE"].reserved_before_window


# ---- 2. a pool reserved before the window ---------------------------------------------------------------


def test_pool_reserved_before_the_window_is_named_and_noted(tmp_path: Path) -> None:
    m = metrics_of(write_npu(tmp_path, RESERVED_BEFORE))
    pta = 1 - 1500 / 2000  # 0.25
    ge = 1 - 380 / 400  # 0.05
    assert (pta, ge) == (0.25, 1 - 0.95)
    series = series_from_csv(RESERVED_BEFORE)
    assert pool_reference(series["PTA"]) == (pta, 0.0, True)
    assert pool_reference(series["GE"]) == (ge, (100 - 50) / 400, False)
    assert m.values["fragmentation"] == pta
    assert m.pool_of["fragmentation"] == "PTA"
    assert m.notes["fragmentation"] == f"PTA {BEFORE_WINDOW}"
    assert m.pools["PTA"].reserved_before_window is True
    assert m.pools["GE"].reserved_before_window is False  # it grew inside the window: not flagged
    assert m.pools["GE"].fragmentation == ge
    assert m.pools["PTA"].external_fragmentation == 0.0  # never grew
    assert m.values["external_fragmentation"] == m.pools["GE"].external_fragmentation == 50 / 400
    assert m.pool_of["external_fragmentation"] == "GE"


def test_the_worst_pool_grew_in_the_window_so_no_note(tmp_path: Path) -> None:
    m = metrics_of(write_npu(tmp_path, GROWING_WORST))
    ge, pta = 1 - 300 / 1000, 1 - 1500 / 2000
    assert ge > pta
    assert m.values["fragmentation"] == ge == 0.7
    assert m.pool_of["fragmentation"] == "GE"
    assert m.pools["PTA"].reserved_before_window and not m.pools["GE"].reserved_before_window
    assert "fragmentation" not in m.notes  # the named pool (GE) was not reserved before the window
    assert m.values["external_fragmentation"] == (100 - 10) / 1000 == 0.09


# ---- 3. growth while free memory sat in the pool ---------------------------------------------------------


EXTERNAL = 500 / 1400  # (1000 - 500) / 1400 = 5/14
INTERNAL = 1 - 1390 / 1400  # 1/140


def test_growth_while_memory_sat_free_is_external_fragmentation(tmp_path: Path) -> None:
    m = metrics_of(write_npu(tmp_path, GREW_WHILE_FREE))
    assert EXTERNAL == (1000 - 500) / 1400 == 5 / 14
    assert INTERNAL == pytest.approx(1 / 140, rel=1e-12)
    assert pool_reference(series_from_csv(GREW_WHILE_FREE)["PTA"]) == (INTERNAL, EXTERNAL, False)
    assert m.pools["PTA"].external_fragmentation == EXTERNAL
    assert m.values["external_fragmentation"] == EXTERNAL
    assert m.pool_of["external_fragmentation"] == "PTA"
    assert m.values["fragmentation"] == INTERNAL < 0.01  # filled to near full later: small
    assert m.pool_of["fragmentation"] == "PTA" and "fragmentation" not in m.notes
    assert set(m.pools) == {"PTA"}


# ---- 4. the same through budgets ---------------------------------------------------------------------------


def test_fragmentation_failure_line_names_the_pool_and_the_note(tmp_path: Path) -> None:
    profile = load_one(write_npu(tmp_path, RESERVED_BEFORE))
    budget = budget_from_mapping({"name": "f", "fragmentation": 0.1}, origin="t")
    outcome = judge(MetricCache(profile), budget, "fragmentation")
    assert not outcome.passed
    assert outcome.value == 1 - 1500 / 2000 and outcome.limit == 0.1
    # 0.25 - 0.1 = 0.150, +150.0% over the limit
    assert outcome.message == (
        "fragmentation 0.250 exceeds budget 0.100 by 0.150 (+150.0%) — rank 0 npu:0, pool PTA, "
        "PTA reserved is at its maximum from its first sample: the value reflects memory reserved before the window")


def test_fragmentation_within_budget_when_pools_peak_apart(tmp_path: Path) -> None:
    profile = load_one(write_npu(tmp_path, APART))
    outcome = judge(MetricCache(profile), budget_from_mapping({"name": "f", "fragmentation": 0.1}, origin="t"),
                    "fragmentation")
    assert outcome.passed and outcome.value == 0.0  # the old combined 0.389 would have failed
    assert outcome.message == "fragmentation 0.000 within budget 0.100 — rank 0 npu:0"


@pytest.mark.parametrize(("limit", "passes"), [(EXTERNAL, True), (math.nextafter(EXTERNAL, 0.0), False),
                                               (math.nextafter(EXTERNAL, 1.0), True)],
                         ids=["exactly-at-limit", "a-hair-below", "a-hair-above"])
def test_external_fragmentation_at_the_exact_boundary(tmp_path: Path, limit: float, passes: bool) -> None:
    profile = load_one(write_npu(tmp_path, GREW_WHILE_FREE))
    budget = budget_from_mapping({"name": "f", "external_fragmentation": limit}, origin="t")
    outcome = judge(MetricCache(profile), budget, "external_fragmentation")
    assert outcome.value == EXTERNAL
    assert outcome.passed is passes
    if passes:
        assert outcome.message == "external_fragmentation 0.357 within budget 0.357 — rank 0 npu:0, pool PTA"
    else:
        assert outcome.message == ("external_fragmentation 0.357 exceeds budget 0.357 by 0.000 (+0.0%) — "
                                   "rank 0 npu:0, pool PTA")


@pytest.mark.parametrize(("limit", "passes"), [("0.3", False), ("0.36", True)])
def test_pytest_memgate_fails_on_external_fragmentation(pytester: pytest.Pytester, tmp_path: Path, limit: str,
                                                       passes: bool) -> None:
    prof = write_npu(tmp_path, GREW_WHILE_FREE)
    pytester.makefile(".toml", memgate=f'[[budgets]]\nname = "frag"\nexternal_fragmentation = {limit}\n'
                                       "fragmentation = 0.05\n")
    result = pytester.runpytest(f"--memgate={prof}", "-rf")
    if passes:
        result.assert_outcomes(passed=2)
        return
    result.assert_outcomes(passed=1, failed=1)  # fragmentation 1/140 is within 0.05
    # 5/14 = 0.357..., over by 0.057 = +19.0% of 0.3
    result.stdout.fnmatch_lines([
        "*external_fragmentation 0.357 exceeds budget 0.300 by 0.057 (+19.0%) — rank 0 npu:0, pool PTA*",
    ])
    assert "INTERNALERROR" not in result.stdout.str()


# ---- 5. a component override judges the parts of a combined series ----------------------------------------


def test_component_override_on_the_combined_series_judges_its_parts(tmp_path: Path) -> None:
    prof = write_npu(tmp_path, APART)
    m = metrics_of(prof, MetricOptions(component="PTA+GE"))
    assert m.component == "PTA+GE"
    assert set(m.pools) == {"PTA", "GE"}  # the parts, never the sum
    assert m.values["fragmentation"] == 0.0
    profile = load_one(prof)
    budget = budget_from_mapping({"name": "f", "component": "PTA+GE", "fragmentation": 0.1}, origin="t")
    outcome = judge(MetricCache(profile), budget, "fragmentation")
    assert outcome.passed and outcome.value == 0.0 != 1 - 1100 / 1800

    # With a part that is fragmented, the override finds it (and names it), as the default does.
    profile = load_one(write_npu(tmp_path / "b", RESERVED_BEFORE))
    outcome = judge(MetricCache(profile), budget, "fragmentation")
    assert outcome.value == 1 - 1500 / 2000 and not outcome.passed
    assert ", pool PTA, PTA reserved is at its maximum" in outcome.message
    # combined: 1 - 1880/2400 = 0.2166..., not what is judged
    assert combined_fragmentation(series_from_csv(RESERVED_BEFORE)["PTA+GE"]) == 1 - 1880 / 2400 != outcome.value


@pytest.mark.parametrize(("component", "pools", "expected"), [
    ("PTA", {"PTA"}, 1 - 1500 / 2000),
    ("GE", {"GE"}, 1 - 380 / 400),
])
def test_component_override_on_one_pool_judges_that_pool(tmp_path: Path, component: str, pools: set[str],
                                                          expected: float) -> None:
    m = metrics_of(write_npu(tmp_path, RESERVED_BEFORE), MetricOptions(component=component))
    assert set(m.pools) == pools
    assert m.values["fragmentation"] == expected
    assert m.pool_of["fragmentation"] == component


def test_override_naming_an_absent_combined_series_is_not_measurable(tmp_path: Path) -> None:
    profile = load_one(write_npu(tmp_path, RESERVED_BEFORE))
    budget = budget_from_mapping({"name": "f", "component": "MindSpore+GE", "fragmentation": 0.1}, origin="t")
    """A combined series the profile lacks: fragmentation says so, never judges one part silently."""
    with pytest.raises(NotMeasurable, match="no 'MindSpore\\+GE' series on npu:0"):
        judge(MetricCache(profile), budget, "fragmentation")


# ---- 6. snapshots ------------------------------------------------------------------------------------------

_ALLOC_SIGN = {"alloc": 1, "free_requested": -1, "free": -1}
_RESERVE_SIGN = {"segment_alloc": 1, "segment_map": 1, "segment_free": -1, "segment_unmap": -1}


def snapshot_reference(data: dict[str, Any], dev: int) -> tuple[float, float]:
    """(external_fragmentation, fragmentation) of the caching allocator, from the raw snapshot.

    Allocated (the allocator's blocks, by test_snapshot's own replay of its rules) and reserved (segment
    sizes) are rebuilt backwards from the final ``segments``: the level at the window start = the final
    level minus every change the trace made. Then forward in time order (``time_us``, stable), a growth
    of reserved is judged against the state just before it.
    """
    from snapshot_reference import block_replay  # the block-size reference written there, independent of memgate

    entries = [(e, block) for e, block in block_replay(data, dev)
               if e["action"] in _ALLOC_SIGN or e["action"] in _RESERVE_SIGN]
    final_allocated = sum(b["size"] for s in data["segments"] if s["device"] == dev
                          for b in s["blocks"] if b["state"] == "active_allocated")
    final_reserved = sum(s["total_size"] for s in data["segments"] if s["device"] == dev)
    allocated = final_allocated - sum(_ALLOC_SIGN.get(e["action"], 0) * (block or 0) for e, block in entries)
    reserved = final_reserved - sum(_RESERVE_SIGN.get(e["action"], 0) * e["size"] for e, _ in entries)
    assert allocated >= 0 and reserved >= 0
    peak_allocated, peak_reserved = allocated, reserved
    shares = []
    for e, block in entries:
        if e["action"] in _ALLOC_SIGN:
            allocated += _ALLOC_SIGN[e["action"]] * (block or 0)
        else:
            grown = reserved + _RESERVE_SIGN[e["action"]] * e["size"]
            if grown > reserved:
                shares.append(max(reserved - allocated, 0) / grown)
            reserved = grown
        peak_allocated, peak_reserved = max(peak_allocated, allocated), max(peak_reserved, reserved)
    return max(shares, default=0.0), 1 - peak_allocated / peak_reserved


def _grows_in_trace(path: Path) -> bool:
    data = sample_pickle(path)
    return isinstance(data, dict) and any(e.get("action") in ("segment_alloc", "segment_map")
                                          for t in data.get("device_traces") or [] for e in t)


GROWING_SNAPSHOTS = [p for p in sorted(TORCH.glob("snapshot_*.pickle")) if _grows_in_trace(p)]


def test_the_samples_with_segment_growth_are_the_expected_ones() -> None:
    assert [p.name for p in GROWING_SNAPSHOTS] == [
        "snapshot_mid_timeus_noallocsettings_eornn.pickle",
        "snapshot_modern_small_cs336.pickle",
        "snapshot_newest_compile_context_windows_decomfl.pickle",
    ]


@pytest.mark.parametrize("path", GROWING_SNAPSHOTS, ids=lambda p: p.name)
def test_real_snapshot_external_fragmentation_equals_the_raw_reconstruction(path: Path) -> None:
    data = sample_pickle(path)
    profile = load_one(path)
    for dev, m in enumerate(profile_metrics(profile)):
        external, internal = snapshot_reference(data, dev)
        assert set(m.pools) == {"allocator"}
        assert m.values["external_fragmentation"] == external  # the same ratios: exact
        assert m.values["fragmentation"] == internal
        assert external > 0 and m.pool_of["external_fragmentation"] == "allocator"


def _block(size: int, state: str, requested: int | None = None) -> dict[str, Any]:
    return {"size": size, "state": state, "requested_size": size if requested is None else requested}


def _segment(address: int, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    at = address
    for block in blocks:
        block["address"] = at
        at += block["size"]
    return {"device": 0, "address": address, "total_size": at - address, "stream": 0, "segment_type": "large",
            "blocks": blocks}


@pytest.mark.parametrize("grow", ["segment_alloc", "segment_map"])
def test_snapshot_segment_grown_while_8_mib_sat_free(tmp_path: Path, grow: str) -> None:
    """A 32 MiB pool holds 24 MiB; a 20 MiB segment is added while 8 MiB sit free: 8/52 MiB."""
    a, b = 1 << 32, 1 << 33
    frames = [{"filename": "train.py", "line": 7, "name": "step"}]
    data = {
        "segments": [
            _segment(a, [_block(24 * MIB, "active_allocated"), _block(8 * MIB, "inactive")]),
            # the allocator splits the 2 MiB rest off (over 1 MiB): an 18 MiB block and a free one
            _segment(b, [_block(18 * MIB, "active_allocated"), _block(2 * MIB, "inactive")]),
        ],
        "device_traces": [[
            {"action": "alloc", "addr": a, "size": 24 * MIB, "stream": 0, "time_us": 1_000, "frames": frames},
            {"action": grow, "addr": b, "size": 20 * MIB, "stream": 0, "time_us": 2_000, "frames": frames},
            {"action": "alloc", "addr": b, "size": 18 * MIB, "stream": 0, "time_us": 2_000, "frames": frames},
        ]],
    }
    path = tmp_path / "snap.pickle"
    path.write_bytes(pickle.dumps(data))
    m = metrics_of(path)
    assert m.values["external_fragmentation"] == 8 * MIB / (52 * MIB) == 8 / 52
    assert m.values["fragmentation"] == 1 - 42 / 52  # peak 24 + 18 MiB requested of 52 MiB
    assert snapshot_reference(data, 0) == (8 / 52, 1 - 42 / 52)
    assert m.pool_of == {"fragmentation": "allocator", "external_fragmentation": "allocator"}
    assert not m.pools["allocator"].reserved_before_window


# ---- 7. MindSpore and msMemScope: each pool on its own -------------------------------------------------

MS_MB = 1024 * 1000  # MindSpore's memory_record MB = KB / 1000
# MindSpore grows 400 -> 500 MB (peak allocated 450: 0.1); GE holds 200 MB from its first row and peaks at
# 140 (0.3, reserved before the window). MindSpore+GE = the sums.
MINDSPORE_RECORD = (
    "Component,Timestamp(us),Total Allocated(MB),Total Reserved(MB),Total Active(MB),Device Type\n"
    "MindSpore,1700000000001000,300.0,400.0,300.0,NPU:0\n"
    "MindSpore+GE,1700000000001000,300.0,400.0,300.0,NPU:0\n"
    "GE,1700000000002000.000\t,100.0,200.0,0,NPU:0\n"
    "MindSpore+GE,1700000000002000.000,400.0,600.0,300.0,NPU:0\n"
    "MindSpore,1700000000003000,450.0,500.0,450.0,NPU:0\n"
    "MindSpore+GE,1700000000003000,550.0,700.0,450.0,NPU:0\n"
    "GE,1700000000004000.000\t,140.0,200.0,0,NPU:0\n"
    "MindSpore+GE,1700000000004000.000,590.0,700.0,450.0,NPU:0\n"
    "APP,1700000000004500.000,0.0,900.0,0.0,NPU:0\n"
)


def test_mindspore_pools_are_judged_apart(tmp_path: Path) -> None:
    out = tmp_path / "worker0_1700000000000_ascend_ms" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "memory_record.csv").write_text(MINDSPORE_RECORD, encoding="utf-8")
    m = metrics_of(out.parent)
    ms, ge = 1 - 450 / 500, 1 - 140 / 200
    series = series_from_csv(MINDSPORE_RECORD, MS_MB)
    assert pool_reference(series["MindSpore"]) == (ms, (400 - 300) / 500, False)
    assert pool_reference(series["GE"]) == (ge, 0.0, True)
    assert set(m.pools) == {"MindSpore", "GE"}
    assert m.pools["MindSpore"].fragmentation == ms and m.pools["GE"].fragmentation == ge
    assert m.values["fragmentation"] == ge == pytest.approx(0.3) and m.pool_of["fragmentation"] == "GE"
    assert m.notes["fragmentation"] == f"GE {BEFORE_WINDOW}"
    assert m.values["external_fragmentation"] == 100 / 500 and m.pool_of["external_fragmentation"] == "MindSpore"
    # The combined series would hide GE's waste: 1 - 590/700 = 0.157
    assert combined_fragmentation(series["MindSpore+GE"]) == 1 - 590 / 700 < ge
    assert m.component == "MindSpore+GE" and m.values["peak_allocated_bytes"] == 590 * MS_MB


def _msmemscope_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    return rows[0], rows[1:]


def _attr(text: str) -> dict[str, str]:
    return dict(item.split(":", 1) for item in text.strip("{}").split(",") if item)


def msmemscope_pools(header: list[str], rows: list[list[str]]) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(process, device, pool) -> (fragmentation, external_fragmentation) from each MALLOC/FREE row's
    Attr used/total (the pool's allocated/reserved after the event), rows in (timestamp, ID) order."""
    col = {name: i for i, name in enumerate(header)}
    pools: dict[tuple[str, str, str], list[tuple[int, int, int | None, int]]] = {}
    for row in rows:
        if row[col["Event"]] not in ("MALLOC", "FREE"):
            continue
        attr = _attr(row[col["Attr"]])
        if "used" not in attr:  # HAL rows: sizes only, no pool totals
            continue
        key = (row[col["Process Id"]], row[col["Device Id"]], row[col["Event Type"]])
        pools.setdefault(key, []).append((int(row[col["Timestamp(ns)"]]), int(row[col["ID"]]), int(attr["used"]),
                                          int(attr["total"])))
    out = {}
    for key, events in pools.items():
        events.sort()
        frag, external, _ = pool_reference([(None, used, total) for _, _, used, total in events])
        out[key] = (frag, external)
    return out


BASELINE = MSMEMSCOPE / "example_compare_baseline.csv"
LEAKS = MSMEMSCOPE / "example_compare_leaks.csv"


@pytest.mark.parametrize("path", [BASELINE, LEAKS], ids=lambda p: p.name)
def test_real_msmemscope_pool_values(path: Path) -> None:
    header, rows = _msmemscope_rows(path)
    [(key, (frag, external))] = msmemscope_pools(header, rows).items()
    assert key[1:] == ("0", "PTA")
    m = metrics_of(path)
    assert set(m.pools) == {"PTA"}  # HAL carries no used/total: the driver's segments, not a pool
    assert m.values["fragmentation"] == frag and m.values["external_fragmentation"] == external
    assert frag > 0 and external > 0


def test_two_real_msmemscope_processes_in_one_dump_are_judged_apart(tmp_path: Path) -> None:
    """The two real dumps (different processes) as one file: each process's PTA pool on its own."""
    header, base = _msmemscope_rows(BASELINE)
    _, leaks = _msmemscope_rows(LEAKS)
    path = tmp_path / "memscope_dump_20251203000000.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows([header, *base, *leaks])
    expected = msmemscope_pools(header, base + leaks)
    assert len(expected) == 2
    profile = load_one(path)
    by_device = {m.device: m for m in profile_metrics(profile)}
    for (pid, device, pool), (frag, external) in expected.items():
        m = by_device[f"npu:{device}/pid{pid}"]
        assert set(m.pools) == {pool}
        assert (m.values["fragmentation"], m.values["external_fragmentation"]) == (frag, external)
    worst_pid, (worst, _) = max(((k[0], v) for k, v in expected.items()), key=lambda kv: kv[1][0])
    budget = budget_from_mapping({"name": "f", "fragmentation": 0.1}, origin="t")
    outcome = judge(MetricCache(profile), budget, "fragmentation")
    assert outcome.value == worst and outcome.device == f"npu:0/pid{worst_pid}"
    assert f"npu:0/pid{worst_pid}, pool PTA" in outcome.message


def test_two_msmemscope_pools_of_one_process_are_judged_apart(tmp_path: Path) -> None:
    """The leaks dump's PTA events replayed as a second pool (ATB) of the baseline's process, overlapping
    it in time: the device holds two pools, each judged on its own used/total, the worst named."""
    header, base = _msmemscope_rows(BASELINE)
    _, leaks = _msmemscope_rows(LEAKS)
    col = {name: i for i, name in enumerate(header)}
    pid = base[0][col["Process Id"]]
    t_base = min(int(r[col["Timestamp(ns)"]]) for r in base)
    t_leaks = min(int(r[col["Timestamp(ns)"]]) for r in leaks)
    extra = []
    for row in leaks:
        if row[col["Event"]] in ("MALLOC", "FREE") and row[col["Event Type"]] == "PTA":
            row = list(row)
            row[col["Event Type"]] = "ATB"
            row[col["Process Id"]] = row[col["Thread Id"]] = pid
            row[col["ID"]] = str(int(row[col["ID"]]) + 100_000)
            row[col["Timestamp(ns)"]] = str(int(row[col["Timestamp(ns)"]]) - t_leaks + t_base + 1)
            extra.append(row)
    path = tmp_path / "memscope_dump_20251203000001.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh, lineterminator="\n").writerows([header, *base, *extra])
    expected = msmemscope_pools(header, base + extra)
    assert set(expected) == {(pid, "0", "PTA"), (pid, "0", "ATB")}
    assert expected[(pid, "0", "PTA")] == msmemscope_pools(header, base)[(pid, "0", "PTA")]
    m = metrics_of(path)
    assert set(m.pools) == {"PTA", "ATB"}
    for pool in ("PTA", "ATB"):
        assert (m.pools[pool].fragmentation, m.pools[pool].external_fragmentation) == expected[(pid, "0", pool)]
    assert expected[(pid, "0", "ATB")][0] > expected[(pid, "0", "PTA")][0]
    assert m.values["fragmentation"] == expected[(pid, "0", "ATB")][0] and m.pool_of["fragmentation"] == "ATB"
    assert m.values["external_fragmentation"] == expected[(pid, "0", "ATB")][1]
    assert m.pool_of["external_fragmentation"] == "ATB"


# ---- a pool whose totals contradict each other -----------------------------------------------------------

# GE allocates 900 MB but never reserves more than 300: 1 - 900/300 = -2, which would pass every
# fragmentation budget. PTA is sound (1 - 500/1000 = 0.5).
GE_OVER = NPU_HEADER + (
    "PTA,1700000000001000.000\t,500.0,1000.0,500.0,187651234,NPU:0\n"
    "PTA+GE,1700000000001000.000\t,500.0,1000.0,500.0,187651234,NPU:0\n"
    "GE,1700000000002000.000\t,900.0,300.0,,,NPU:0\n"
    "PTA+GE,1700000000002000.000\t,1400.0,1300.0,500.0,187651234,NPU:0\n"
)


def test_a_pool_allocating_more_than_it_reserves_is_left_out_and_said(tmp_path: Path) -> None:
    m = metrics_of(write_npu(tmp_path / "both", GE_OVER))
    assert set(m.pools) == {"PTA"}
    assert m.values["fragmentation"] == 1 - 500 / 1000 and m.pool_of["fragmentation"] == "PTA"
    assert "left out: GE allocates more than it ever reserves" in m.notes["fragmentation"]
    assert f"peak allocated {900 * MIB} > peak reserved {300 * MIB} bytes" in m.notes["fragmentation"]
    # judged alone, it leaves nothing: not measurable, with the reason, never a negative value that passes
    m = metrics_of(tmp_path / "both" / "host_4321_1700000000000_ascend_pt", MetricOptions(component="GE"))
    assert m.values.get("fragmentation") is None
    assert "GE allocates more than it ever reserves" in m.missing["fragmentation"]
    budget = budget_from_mapping({"name": "b", "fragmentation": 0.15, "component": "GE"}, origin="t")
    with pytest.raises(NotMeasurable, match="GE allocates more than it ever reserves"):
        judge(MetricCache(load_one(tmp_path / "both")), budget, "fragmentation")

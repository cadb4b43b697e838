"""A ``--memgate`` root mixing ranks and formats: one profile per rank, budgets selecting ranks.

Layout (one folder per rank, as a multi-rank job writes it)::

    root/rank_0/host-0_4000_..._ascend_pt/   torch_npu sample, profiler_info_0.json rank_id 0
    root/rank_1/host-1_4001_..._ascend_pt/   the same sample, profiler_info_1.json rank_id 1
    root/rank_2/worker2_..._ascend_ms/        MindSpore (tests/writers/mindspore.py), rank_id 2
    root/rank_3/PROF_.../device_3/summary/    CANN msprof (tests/writers/cann.py), device 3

The torch_npu peaks are derived here from the raw memory_record.csv with the csv module; the
MindSpore and CANN ones from the ground-truth traces the writers rendered.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
from groundtruth import Block, Trace, expected_metrics
from helpers import PTA21_L1, copy_sample, run_cli
from writers.cann import CannOptions, write_prof
from writers.mindspore import MsOptions, write_profile

from memgate.budgets import budget_from_mapping
from memgate.discover import discover, load
from memgate.model import Profile
from memgate.schemas import load_schema

T0 = 1_736_408_883_573_957_920


def _trace(device_id: int, scale: int) -> Trace:
    return Trace(
        device_id=device_id, hidden_baseline=scale << 20, t_start=T0, t_end=T0 + 90_000_000,
        blocks=(Block(3 * scale << 20, T0, T0 + 40_000_000, "MatMul-op1"),
                Block(5 * scale << 20, T0 + 1_000, None, "Add-op2"),
                Block(scale << 20, T0 + 2_000, T0 + 60_000_000, "cann::Conv2D", component="GE")),
        steps=((11, T0, T0 + 30_000_000), (12, T0 + 30_000_000, T0 + 60_000_000), (13, T0 + 60_000_000, T0 + 90_000_000)),
    )


MS_TRACE = _trace(device_id=2, scale=40)
CANN_TRACE = _trace(device_id=3, scale=70)


def _raw_torch_npu_peak(folder: Path) -> int:
    """max PTA+GE Total Allocated(MB) of memory_record.csv, in bytes (MB = bytes / 1024**2)."""
    with open(folder / "memory_record.csv", newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.DictReader(fh) if r["Component"] == "PTA+GE"]
    return max(round(float(r["Total Allocated(MB)"]) * (1 << 20)) for r in rows)


@dataclass(frozen=True)
class Root:
    path: Path
    profiles: dict[str, Path]  # rank -> profile path
    peaks: dict[str, int]  # rank -> peak allocated bytes (derived without memgate)
    loaded: list[Profile]  # what memgate discovered and loaded, in discovery order


def _torch_npu_rank(root: Path, rank: int) -> Path:
    prof = copy_sample(PTA21_L1, root / f"rank_{rank}" / f"host-{rank}_{4000 + rank}_1736408883_ascend_pt")
    (prof / "operator_details.csv").unlink()  # 430 kB nobody here reads
    info_file = prof / "profiler_info_0.json"
    info = json.loads(info_file.read_text())
    info["rank_id"] = rank
    info_file.unlink()
    (prof / f"profiler_info_{rank}.json").write_text(json.dumps(info, indent=4))
    return prof


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Root:
    base = tmp_path_factory.mktemp("multirank") / "root"
    profiles = {"0": _torch_npu_rank(base, 0), "1": _torch_npu_rank(base, 1)}
    profiles["2"] = write_profile(MS_TRACE, base / "rank_2", MsOptions(rank=2))
    profiles["3"] = write_prof([CANN_TRACE], base / "rank_3", CannOptions(layout="device"))
    torch_peak = _raw_torch_npu_peak(PTA21_L1)
    peaks = {"0": torch_peak, "1": torch_peak,
             "2": int(expected_metrics(MS_TRACE, separate_allocators=True)["peak_allocated_bytes"]),  # type: ignore[call-overload]
             "3": int(expected_metrics(CANN_TRACE)["peak_allocated_bytes"])}  # type: ignore[call-overload]
    return Root(base, profiles, peaks, [load(f) for f in discover(base)])


def test_one_profile_per_rank(root: Root) -> None:
    found = discover(root.path)
    assert [(f.path, f.format.name) for f in found] == [
        (root.profiles["0"], "torch_npu"), (root.profiles["1"], "torch_npu"),
        (root.profiles["2"], "mindspore"), (root.profiles["3"], "cann"),
    ]
    profiles = root.loaded
    assert [p.path for p in profiles] == [str(f.path) for f in found]
    assert [p.rank for p in profiles] == ["0", "1", "2", "3"]
    assert [[d.device for d in p.devices] for p in profiles] == [["npu:0"], ["npu:0"], ["npu:2"], ["npu:3"]]


@pytest.mark.parametrize(("ranks", "selected"), [
    ("*", ["0", "1", "2", "3"]), ("1", ["1"]), ("rank[0-1]", ["0", "1"]), ("rank3, 2", ["2", "3"]),
    ("rank[!0]", ["1", "2", "3"]),
])
def test_rank_globs_select_profiles(root: Root, ranks: str, selected: list[str]) -> None:
    budget = budget_from_mapping({"name": "b", "ranks": ranks, "peak_allocated": "1 GiB"}, origin="test")
    ranks_found = [p.rank for p in root.loaded]
    assert [r for r in ranks_found if budget.selects_rank(r)] == selected


BUDGETS = """
[[budgets]]
name = "all"
peak_allocated = "{all}"

[[budgets]]
name = "rank1-only"
ranks = "1"
peak_allocated = "1 GiB"

[[budgets]]
name = "low-ranks"
ranks = "rank[0-1]"
peak_reserved = "2 GiB"
"""


def _budgets(folder: Path, root: Root) -> Path:
    path = folder / "budgets.toml"
    path.write_text(BUDGETS.format(all=max(root.peaks.values())), encoding="utf-8")
    return path


def test_cli_json_report_names_every_rank(root: Root, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    rc, stdout, stderr = run_cli(["check", "--budgets", str(_budgets(tmp_path, root)), str(root.path),
                                  "--json", str(out)])
    assert rc == 1, stderr  # rank1-only: the torch_npu sample's 1.23 GiB is over 1 GiB
    report = json.loads(out.read_text())
    jsonschema.validate(report, load_schema("report"))
    assert sorted((p["rank"], p["format"], p["path"]) for p in report["profiles"]) == sorted(
        (r, f, str(root.profiles[r])) for r, f in (("0", "torch_npu"), ("1", "torch_npu"), ("2", "mindspore"),
                                                   ("3", "cann")))
    for p in report["profiles"]:
        assert p["devices"][0]["metrics"]["peak_allocated_bytes"] == root.peaks[p["rank"]]
    entries = sorted((o["budget"], o["rank"], o["passed"]) for o in report["budgets"])
    assert entries == [
        ("all", "0", True), ("all", "1", True), ("all", "2", True), ("all", "3", True),
        ("low-ranks", "0", True), ("low-ranks", "1", True),
        ("rank1-only", "1", False),
    ]
    for o in report["budgets"]:
        assert o["profile"] == str(root.profiles[o["rank"]])
    failed = [line for line in stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 1 and failed[0].startswith(
        f"FAILED {root.profiles['1'].name}::rank1-only::peak_allocated: peak_allocated 1.23 GiB exceeds budget 1.00 GiB")
    assert failed[0].endswith("— rank 1 npu:0")


def test_pytest_items_name_each_rank_profile(root: Root, pytester: pytest.Pytester) -> None:
    budgets = pytester.makefile(".toml", budgets='[[budgets]]\nname = "all"\npeak_allocated = "1 GiB"\n')
    result = pytester.runpytest(f"--memgate={root.path}", f"--memgate-budgets={budgets}", "-v", "-p", "no:cacheprovider")
    over = [r for r, peak in root.peaks.items() if peak > 1 << 30]
    assert over == ["0", "1"]  # the torch_npu sample: 1.23 GiB
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines([
        f"memgate::rank_{rank}/{root.profiles[rank].name}::all::peak_allocated {verdict}*"
        for rank, verdict in (("0", "FAILED"), ("1", "FAILED"), ("2", "PASSED"), ("3", "PASSED"))
    ], consecutive=False)
    result.stdout.fnmatch_lines(["*peak_allocated 1.23 GiB exceeds budget 1.00 GiB by * — rank 1 npu:0"])


def test_pytest_budget_ranks_select_items(root: Root, pytester: pytest.Pytester) -> None:
    budgets = _budgets(pytester.path, root)
    result = pytester.runpytest(f"--memgate={root.path}", f"--memgate-budgets={budgets}", "-v", "-p", "no:cacheprovider")
    ids = [line.split(" ")[0] for line in result.stdout.lines if line.startswith("memgate::")]
    only = f"memgate::rank_1/{root.profiles['1'].name}::rank1-only::peak_allocated"  # the profile's path
    assert [i for i in ids if "::rank1-only::" in i] == [only]
    assert sorted(i.split("/")[0] for i in ids if "::low-ranks::" in i) == ["memgate::rank_0", "memgate::rank_1"]
    result.assert_outcomes(passed=6, failed=1)


def test_a_budget_for_other_devices_is_not_selected_a_skip(root: Root, pytester: pytest.Pytester) -> None:
    """devices="npu:3" selects rank 3's device only: the other ranks' items skip, saying why."""
    budgets = pytester.makefile(".toml", budgets='[[budgets]]\nname = "dev3"\ndevices = "npu:3"\n'
                                'peak_allocated = "1 GiB"\n')
    result = pytester.runpytest(f"--memgate={root.path}", f"--memgate-budgets={budgets}", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=3)
    result.stdout.fnmatch_lines(["SKIPPED *not selected: budget 'dev3' selects devices='npu:3', the profile has npu:0"])


# ---- a budget that selects nothing in the whole run ----------------------------------------------

_NOWHERE = "; expected ranks and devices that select a device of the run, or --memgate-allow-unselected*"


def test_a_budget_for_devices_no_rank_has_is_an_error_not_a_green_run(root: Root, pytester: pytest.Pytester) -> None:
    """A relabelled device: a cuda budget on a run of NPU ranks skipped every item and exited 0."""
    budgets = pytester.makefile(".toml", budgets='[[budgets]]\nname = "gpu"\ndevices = "cuda:*"\n'
                                'peak_allocated = "1 MiB"\n')
    result = pytester.runpytest(f"--memgate={root.path}", f"--memgate-budgets={budgets}", "-rE", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=4)
    result.stdout.fnmatch_lines(["memgate: error: budget 'gpu': devices 'cuda:*' selects no device of the run "
                                 "(it has npu:0, npu:2, npu:3)" + _NOWHERE] * 4)
    assert result.ret != 0


def test_a_budget_for_a_rank_the_run_lacks_is_an_error(root: Root, pytester: pytest.Pytester) -> None:
    """A renamed rank: no item was even generated for the budget, and the run passed."""
    budgets = pytester.makefile(".toml", budgets='[[budgets]]\nname = "r7"\nranks = "7"\npeak_allocated = "1 MiB"\n\n'
                                '[[budgets]]\nname = "all"\npeak_allocated = "10 GiB"\n')
    result = pytester.runpytest(f"--memgate={root.path}", f"--memgate-budgets={budgets}", "-rE", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, errors=1)
    result.stdout.fnmatch_lines(["memgate: error: budget 'r7': ranks '7' selects no rank of the run (it has 0, 1, 2, 3)"
                                 + _NOWHERE, "ERROR memgate::root::r7::ranks*"])


def test_a_budget_for_devices_its_ranks_lack_names_them(root: Root, pytester: pytest.Pytester) -> None:
    budgets = pytester.makefile(".toml", budgets='[[budgets]]\nname = "low"\nranks = "rank[0-1]"\ndevices = "npu:3"\n'
                                'peak_allocated = "1 MiB"\n')
    result = pytester.runpytest(f"--memgate={root.path}", f"--memgate-budgets={budgets}", "-rE", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines([("memgate: error: budget 'low': devices 'npu:3' selects no device of the ranks "
                                 "'rank[[]0-1]' selects in the run (they have npu:0)*")] * 2)


@pytest.mark.parametrize("where", ["option", "ini"])
def test_allow_unselected_keeps_the_skips(root: Root, pytester: pytest.Pytester, where: str) -> None:
    budgets = pytester.makefile(".toml", budgets='[[budgets]]\nname = "gpu"\ndevices = "cuda:*"\n'
                                'peak_allocated = "1 MiB"\n\n[[budgets]]\nname = "r7"\nranks = "7"\n'
                                'peak_allocated = "1 MiB"\n')
    args = [f"--memgate={root.path}", f"--memgate-budgets={budgets}", "-rs", "-p", "no:cacheprovider"]
    if where == "option":
        args.append("--memgate-allow-unselected")
    else:
        pytester.makeini("[pytest]\nmemgate_allow_unselected = true\n")
    result = pytester.runpytest(*args)
    result.assert_outcomes(skipped=4)
    result.stdout.fnmatch_lines(["SKIPPED *not selected: budget 'gpu' selects devices='cuda:*', the profile has npu:0"])
    assert result.ret == 0

"""rank_imbalance: ``1 - min/max`` of a metric over the ranks a budget selects (CLI and pytest), and
owner_caps judged on the bytes each owner holds at the device's peak."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from memgate.budgets import Budget, budget_from_mapping
from memgate.cli import main
from memgate.judge import judge
from memgate.schemas import load_schema

SAMPLE = Path(__file__).parent / "data" / "samples" / "ascend" / "msinsight_pta21_level1_rank0"
PEAK0 = 1322299392  # max PTA+GE Total Allocated(MB) * 2**20 of the sample (tests/test_plugin.py)
SCALE = 0.951  # rank 1's PTA+GE allocations: its peak 4.9 % below rank 0's


def make_ranks(root: Path, scale: float = SCALE) -> Path:
    """Two ranks under ``root``: the sample as rank 0, and as rank 1 with PTA+GE 'Total Allocated(MB)' scaled."""
    shutil.copytree(SAMPLE, root / "rank0")
    rank1 = root / "rank1"
    shutil.copytree(SAMPLE, rank1)
    info = json.loads((rank1 / "profiler_info_0.json").read_text())
    info["rank_id"] = 1
    (rank1 / "profiler_info_0.json").unlink()
    (rank1 / "profiler_info_1.json").write_text(json.dumps(info))
    lines = (rank1 / "memory_record.csv").read_text().splitlines()
    out = [lines[0]]
    for line in lines[1:]:
        cells = line.split(",")
        if cells[0] == "PTA+GE" and cells[2]:
            cells[2] = repr(float(cells[2]) * scale)
        out.append(",".join(cells))
    (rank1 / "memory_record.csv").write_text("\n".join(out) + "\n")
    return root


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_ranks(tmp_path_factory.mktemp("ranks"))


def _toml(path: Path, body: str) -> Path:
    path.write_text(body)
    return path


def test_built_ranks_differ_by_4_9_percent(ranks: Path) -> None:
    from memgate.session import measure
    measured = {m.rank: m["peak_allocated"] for m in measure(ranks)}
    assert measured["0"] == PEAK0
    assert math.isclose(1 - measured["1"] / measured["0"], 0.049, abs_tol=1e-9)


@pytest.mark.parametrize(("limit", "code"), [(0.04, 1), (0.05, 0)])
def test_cli_check(ranks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], limit: float, code: int) -> None:
    budgets = _toml(tmp_path / "b.toml", f'[[budgets]]\nname = "bal"\nrank_imbalance = {{ peak_allocated = {limit} }}\n')
    report = tmp_path / "r.json"
    assert main(["check", str(ranks), "--budgets", str(budgets), "--json", str(report)]) == code
    out = capsys.readouterr().out
    if code:
        assert "FAILED" in out
        assert "rank_imbalance[peak_allocated] 0.0490 exceeds budget 0.0400 over 2 ranks" in out
        assert "worst rank 0 npu:0 1.23 GiB, best rank 1 npu:0" in out
    doc = json.loads(report.read_text())
    jsonschema.validate(doc, load_schema("report"))
    [row] = doc["budgets"]
    assert (row["metric"], row["worst_rank"], row["best_rank"], row["passed"]) == (
        "rank_imbalance[peak_allocated]", "0", "1", code == 0)
    assert row["worst_value"] == PEAK0


def test_cli_needs_two_ranks(ranks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    budgets = _toml(tmp_path / "b.toml", '[[budgets]]\nname = "one"\nranks = "0"\nrank_imbalance = { peak_allocated = 0.5 }\n')
    assert main(["check", str(ranks), "--budgets", str(budgets)]) == 2
    assert "needs at least two ranks" in capsys.readouterr().err


def _run_pytest(pytester: pytest.Pytester, root: Path, limit: float, *args: str) -> pytest.RunResult:
    pytester.makefile(".toml", memgate=f'[[budgets]]\nname = "bal"\nrank_imbalance = {{ peak_allocated = {limit!r} }}\n')
    return pytester.runpytest(f"--memgate={root}", "-rf", *args)


def test_pytest_fails_at_0_04_naming_both_ranks(pytester: pytest.Pytester, ranks: Path) -> None:
    result = _run_pytest(pytester, ranks, 0.04)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*::bal::rank_imbalance[[]peak_allocated[]]*",
                                 ("*rank_imbalance[[]peak_allocated[]] 0.0490 exceeds budget 0.0400 over 2 ranks"
                                 " — worst rank 0 npu:0 1.23 GiB, best rank 1 npu:0*")])


def test_pytest_passes_at_0_05(pytester: pytest.Pytester, ranks: Path) -> None:
    _run_pytest(pytester, ranks, 0.05).assert_outcomes(passed=1)


def test_pytest_exact_boundary(pytester: pytest.Pytester, ranks: Path) -> None:
    from memgate.session import measure
    ratio = 1 - measure(ranks / "rank1")[0]["peak_allocated"] / PEAK0
    _run_pytest(pytester, ranks, ratio).assert_outcomes(passed=1)
    _run_pytest(pytester, ranks, math.nextafter(ratio, 0)).assert_outcomes(failed=1)


def test_pytest_under_xdist(pytester: pytest.Pytester, ranks: Path) -> None:
    pytest.importorskip("xdist")
    result = _run_pytest(pytester, ranks, 0.04, "-n", "2", "-p", "xdist")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*worst rank 0 npu:0 1.23 GiB, best rank 1 npu:0*"])


def test_marker_rejects_rank_imbalance(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"""
        import pytest
        @pytest.mark.memgate(profile={str(SAMPLE)!r}, rank_imbalance={{"peak_allocated": 0.1}})
        def test_x():
            pass
    """)
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*rank_imbalance compares the ranks of a run*"])


def _budget(**raw: Any) -> Budget:
    return budget_from_mapping({"name": "b", **raw}, origin="test")


def test_cli_check_on_two_processes(ranks: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    budgets = _toml(tmp_path / "b.toml", '[[budgets]]\nname = "bal"\nrank_imbalance = { peak_allocated = 0.04 }\n')
    assert main(["check", str(ranks), "--budgets", str(budgets), "--jobs", "2"]) == 1
    assert "worst rank 0 npu:0 1.23 GiB, best rank 1 npu:0" in capsys.readouterr().out


# ---- owner_caps (judged on their own: tests/test_judge.py) ---------------------------------------


SNAPSHOT = Path(__file__).parent / "data" / "samples" / "torch" / "snapshot_modern_small_cs336.pickle"


def _softmax_bytes_at_peak() -> int:
    """By hand from the blocks: those live at cuda:0's peak whose owner (innermost user frame) is custom_softmax."""
    from memgate.session import measure
    [measured] = measure(SNAPSHOT)
    [dev] = [d for d in measured.devices if d.device == "cuda:0"]
    [model] = [d for d in measured.profile.devices if d.device == "cuda:0"]
    b = model.blocks.to_pandas()
    live = ((b["t_alloc"].isna() | (b["t_alloc"] <= dev.peak_t_ns)) & (b["t_free"].isna() | (b["t_free"] > dev.peak_t_ns))
            & b["owner"].fillna("").str.startswith("custom_softmax ("))
    return int(b["size"][live.fillna(False)].sum())


@pytest.mark.parametrize("delta", [0, -1])
def test_owner_caps_on_a_snapshot(delta: int) -> None:
    from memgate.cache import open_profile
    from memgate.discover import discover
    expected = _softmax_bytes_at_peak()
    assert expected > 0
    cache = open_profile(discover(SNAPSHOT)[0], None)
    budget = _budget(owner_caps={"custom_softmax (*)": expected + delta})
    outcome = judge(cache, budget, "owner_caps[custom_softmax (*)]")
    assert (outcome.value, outcome.passed) == (expected, delta == 0)
    assert "largest owner custom_softmax (/root/autodl-tmp/assignment2-systems/cs336_systems/trace_peak_memory.py:7)" in outcome.message

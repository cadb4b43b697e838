"""memgate.session, the core both shells share: each profile measured; many ranks in parallel, the serial results."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from memgate.budgets import budget_from_mapping
from memgate.cli import main
from memgate.session import run_profiles

SAMPLE = Path(__file__).parent / "data" / "samples" / "ascend" / "msinsight_pta21_level1_rank0"


@pytest.fixture
def ranks(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    for rank in range(4):
        target = root / f"node_{rank}_ascend_pt"
        shutil.copytree(SAMPLE, target)
        info = json.loads((target / "profiler_info_0.json").read_text())
        info["rank_id"] = rank
        (target / "profiler_info_0.json").write_text(json.dumps(info))
    return root


def test_jobs_give_the_serial_results(ranks: Path) -> None:
    budgets = [budget_from_mapping({"name": "b", "peak_allocated": "1 GiB", "ranks": "[0-2]"}, origin="test")]
    serial = run_profiles(ranks, budgets, jobs=1)
    parallel = run_profiles(ranks, budgets, jobs=2)
    assert [r.entry for r in serial] == [r.entry for r in parallel]
    assert [r.outcomes for r in serial] == [r.outcomes for r in parallel]
    assert [o.rank for r in parallel for o in r.outcomes] == ["0", "1", "2"]  # the ranks glob selects


def test_cli_jobs_flag(ranks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(ranks), "--json", "--jobs", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(p["rank"] for p in report["profiles"]) == ["0", "1", "2", "3"]
    assert main(["inspect", str(ranks), "--jobs", "0"]) == 2
    assert "invalid --jobs 0" in capsys.readouterr().err


def test_measure_gives_each_profile_its_metrics(ranks: Path) -> None:
    from memgate.errors import NotMeasurable
    from memgate.session import measure

    measured = measure(ranks)
    assert [m.rank for m in measured] == ["0", "1", "2", "3"]
    m = measured[0]
    # the sample's peaks (tests/test_plugin.py: from its memory_record.csv)
    assert m["peak_allocated"] == m["peak_allocated_bytes"] == 1322299392
    assert m.metrics["peak_reserved_bytes"] == 1600913408
    assert m.metrics["op_max_block_bytes"]["aten::mm"] == m.devices[0].values["op_max_block_bytes"]["aten::mm"]
    assert m.metrics["top_at_peak"] == m.devices[0].values["top_at_peak"]
    assert "needs at least 5 counted steps" in m.not_measurable["step_growth_bytes"]
    with pytest.raises(NotMeasurable, match=r"step_growth is not measurable: npu:0: needs at least 5"):
        m["step_growth"]
    with pytest.raises(KeyError, match="unknown metric 'peak'"):
        m["peak"]

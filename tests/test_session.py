"""The shared core: many ranks in parallel give the serial results; progress shows only for slow loads."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from memgate.budgets import budget_from_mapping
from memgate.cli import main
from memgate.progress import progress, wanted
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
    assert [o["rank"] for r in parallel for o in r.outcomes] == ["0", "1", "2"]  # the ranks glob selects


def test_cli_jobs_flag(ranks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(ranks), "--json", "--jobs", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert sorted(p["rank"] for p in report["profiles"]) == ["0", "1", "2", "3"]
    assert main(["inspect", str(ranks), "--jobs", "0"]) == 2
    assert "invalid --jobs 0" in capsys.readouterr().err


def test_progress_is_silent_for_fast_work_and_shown_for_slow() -> None:
    lines: list[str] = []
    with progress("fast", lines.append, delay=0.5):
        pass
    assert lines == []
    with progress(lambda: "loading slow", lines.append, delay=0.05, interval=0.02):
        time.sleep(0.2)
    assert any("memgate: loading slow …" in line for line in lines)
    assert lines[-1].startswith("\r  memgate: loading slow … done in ")


def test_progress_wanted_only_on_a_terminal_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    assert wanted(Tty(), None) is True  # type: ignore[arg-type]
    monkeypatch.setenv("CI", "true")
    assert wanted(Tty(), None) is False  # type: ignore[arg-type]
    assert wanted(Tty(), True) is True  # type: ignore[arg-type]
    assert wanted(Tty(), False) is False  # type: ignore[arg-type]

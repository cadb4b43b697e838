"""Profile identity end to end: a root holding several profiles per rank, built from the real
samples, diffed with itself and with a later run of the same jobs (other root, pids, timestamps),
saved as a baseline and compared; profiles only pids tell apart are an error saying how to fix it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from helpers import PTA21_L1, PTA271, SAMPLES, copy_sample

from memgate.cli import main

TORCH = SAMPLES / "torch"
MSMEMSCOPE = SAMPLES / "msmemscope"


def _run_root(base: Path, stamp: str, pid: int) -> Path:
    """One run of four jobs, rank 0 throughout, as their writers name their output: torch_npu
    folders and torch.profiler traces with pid and timestamp, msMemScope dumps with a timestamp."""
    root = base / "prof"
    copy_sample(PTA21_L1, root / "rank_0" / f"train_{pid}_{stamp}123_ascend_pt")
    copy_sample(PTA271, root / "rank_0" / f"eval_{pid + 1}_{stamp}456_ascend_pt")
    for job, sample in (("job_a", "example_compare_baseline.csv"), ("job_b", "example_compare_leaks.csv")):
        (root / "msmemscope" / job).mkdir(parents=True)
        shutil.copyfile(MSMEMSCOPE / sample, root / "msmemscope" / job / f"memscope_dump_{stamp}.csv")
    (root / "traces").mkdir()
    shutil.copyfile(TORCH / "cpu_train_profile_memory.json", root / "traces" / f"train_{pid}.{stamp}000.pt.trace.json")
    shutil.copyfile(TORCH / "cpu_train_leak_profile_memory.json", root / "traces" / f"eval_{pid}.{stamp}999.pt.trace.json")
    for name in ("snapshot_modern_small_cs336.pickle", "snapshot_mid_timeus_noallocsettings_eornn.pickle"):
        (root / "snapshots").mkdir(exist_ok=True)
        shutil.copyfile(TORCH / name, root / "snapshots" / name)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(main-branch run, PR run): the same jobs, written by processes of other pids, days apart."""
    base = tmp_path_factory.mktemp("pairing")
    return _run_root(base / "main-ci-4711", "20250101000000", 1000), _run_root(base / "pr-17", "20250202120000", 5000)


def test_diff_of_a_root_with_itself_reports_no_change(runs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    root = runs[0]
    assert main(["diff", str(root), str(root), "--fail", "peak_allocated:1%"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-9:-8] == ["no change: 8 profile(s) paired, every metric and operator equal"]
    verdicts = out[-8:]
    assert len(verdicts) == 8 and all(line.startswith("ok     peak_allocated ") and ": +0 B (+0.0%), allowed +1%" in line
                                      for line in verdicts)


def test_a_later_run_of_the_same_jobs_pairs_although_its_names_differ(runs: tuple[Path, Path],
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    main_run, pr = runs
    assert main(["diff", str(main_run), str(pr), "--json", "--fail", "peak_allocated:1%"]) == 0
    diff = json.loads(capsys.readouterr().out)
    assert diff["changed"] is False and diff["missing_profiles"] == []
    pairs = {Path(r["base_profile"]).relative_to(main_run).as_posix(): Path(r["profile"]).relative_to(pr).as_posix()
             for r in diff["ranks"]}
    assert pairs == {
        "rank_0/train_1000_20250101000000123_ascend_pt": "rank_0/train_5000_20250202120000123_ascend_pt",
        "rank_0/eval_1001_20250101000000456_ascend_pt": "rank_0/eval_5001_20250202120000456_ascend_pt",
        "msmemscope/job_a/memscope_dump_20250101000000.csv": "msmemscope/job_a/memscope_dump_20250202120000.csv",
        "msmemscope/job_b/memscope_dump_20250101000000.csv": "msmemscope/job_b/memscope_dump_20250202120000.csv",
        "traces/train_1000.20250101000000000.pt.trace.json": "traces/train_5000.20250202120000000.pt.trace.json",
        "traces/eval_1000.20250101000000999.pt.trace.json": "traces/eval_5000.20250202120000999.pt.trace.json",
        "snapshots/snapshot_modern_small_cs336.pickle": "snapshots/snapshot_modern_small_cs336.pickle",
        "snapshots/snapshot_mid_timeus_noallocsettings_eornn.pickle":
            "snapshots/snapshot_mid_timeus_noallocsettings_eornn.pickle",
    }
    assert [r["passed"] for r in diff["regressions"]] == [True] * 8


def test_a_baseline_saved_on_the_root_holds_every_profile_and_passes(runs: tuple[Path, Path],
                                                                      pytester: pytest.Pytester) -> None:
    main_run, pr = runs
    pytester.makefile(".toml", memgate='[[budgets]]\nname = "any"\npeak_allocated = "64 GiB"\n')
    saved = pytester.runpytest(f"--memgate={main_run}", "--memgate-save-baseline=baseline.json", "-p", "no:cacheprovider")
    saved.assert_outcomes(passed=8)
    baseline = json.loads((pytester.path / "baseline.json").read_text())
    assert len(baseline["profiles"]) == 8  # none overwrote another
    assert {p["rank"] for p in baseline["profiles"].values()} == {"0"}
    assert "0:train_1000_20250101000000123_ascend_pt" in baseline["profiles"]
    for root in (main_run, pr):  # the run itself, and the PR run of the same jobs
        result = pytester.runpytest(f"--memgate={root}", "--memgate-baseline=baseline.json",
                                    "--memgate-compare-fail=peak_allocated:1%", "--memgate-baseline-missing=fail",
                                    "-p", "no:cacheprovider")
        result.assert_outcomes(passed=16)


def test_ratchet_keeps_each_profile_of_a_rank_apart() -> None:
    from memgate.baselines import baseline_from_entries, ratchet

    def entries(peaks: dict[str, int], root: str) -> list[dict[str, Any]]:
        return [{"rank": "0", "format": "kineto", "path": f"{root}/{name}.{1736408883000 + n}.pt.trace.json", "metadata": {},
                 "devices": [{"device": "cpu", "metrics": {"peak_allocated_bytes": peak}}]}
                for n, (name, peak) in enumerate(peaks.items(), 1)]

    old = baseline_from_entries(entries({"train": 100, "eval": 50}, "/main"))
    new = baseline_from_entries(entries({"eval": 40, "train": 120}, "/pr"))
    kept = {p["path"].split("/")[-1].split(".")[0]: p["devices"]["cpu"]["metrics"]["peak_allocated_bytes"]
            for p in ratchet(old, new)["profiles"].values()}
    assert kept == {"train": 100, "eval": 40}


def test_profiles_only_pids_tell_apart_are_an_error_naming_the_fix(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    main_run, pr = tmp_path / "main", tmp_path / "pr"
    for root, pid in ((main_run, 100), (pr, 900)):
        for k, stamp in enumerate(("20250101000000123", "20250101000000456")):
            # tensorboard_trace_handler's default worker name: {host}_{pid}
            root.mkdir(exist_ok=True)
            shutil.copyfile(TORCH / "cpu_train_profile_memory.json", root / f"host_{pid + k}.{stamp}.pt.trace.json")
    assert main(["diff", str(main_run), str(pr)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memgate: error: cannot tell which profile of rank 0 (kineto) is which in the other run: ")
    assert str(main_run / "host_100.20250101000000123.pt.trace.json") in err
    assert "worker_name" in err and "a folder of its own for each" in err
    assert main(["diff", str(main_run), str(main_run)]) == 0  # the same paths on both sides: no guess needed
    assert capsys.readouterr().out.splitlines()[-1].startswith("no change: 2 profile(s) paired")

"""`memgate report`: the HTML page and the image from the command line; `--memgate-html` in pytest."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memgate.cli import main

SAMPLE = Path(__file__).parent / "data" / "samples" / "ascend" / "msinsight_st_pta271_level2_rank0"
PEAK = 10782243840  # max PTA+GE Total Allocated(MB) x 2**20 of memory_record.csv (tests/test_torch_npu.py)


def test_report_html_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    budgets = tmp_path / "memgate.toml"
    budgets.write_text('[[budgets]]\nname = "step"\npeak_allocated = "10 GiB"\n')
    html, png = tmp_path / "out" / "report.html", tmp_path / "out" / "curves.png"
    assert main(["report", str(SAMPLE), "--html", str(html), "--image", str(png), "--budgets", str(budgets)]) == 0
    page = html.read_text()
    assert str(PEAK) in page
    assert "peak_allocated 10.04 GiB exceeds budget 10.00 GiB" in page
    assert not re.search(r"(?i)\b(?:https?|ftp)://|//[a-z0-9.-]+\.[a-z]{2,}/", page)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert html.stat().st_mode & 0o044  # readable by others, like any CI artifact
    assert "HTML report written" in capsys.readouterr().out


def test_report_needs_an_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(SAMPLE)]) == 2
    assert "nothing to write" in capsys.readouterr().err


def test_pytest_writes_the_html_report(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", memgate='[[budgets]]\nname = "step"\npeak_allocated = "11 GiB"\n')
    pytester.runpytest(f"--memgate={SAMPLE}", "--memgate-html=report.html").assert_outcomes(passed=1)
    page = (pytester.path / "report.html").read_text()
    assert str(PEAK) in page and "<svg" in page


def test_report_html_of_a_snapshot_with_a_ratio_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snapshot = Path(__file__).parent / "data" / "samples" / "torch" / "snapshot_multidevice_expandable_notrace.pickle"
    budgets = tmp_path / "memgate.toml"
    budgets.write_text('[[budgets]]\nname = "pool"\nfree_block_fragmentation = 0.5\nreserved_at_dump = "64 MiB"\n')
    html = tmp_path / "report.html"
    # cuda:0's inactive blocks: 0.513 of their bytes are outside the largest one; cuda:1's 0.406.
    # `report` draws the verdicts; gating is `check`'s exit status.
    assert main(["report", str(snapshot), "--html", str(html), "--budgets", str(budgets)]) == 0
    page = html.read_text()
    assert "free_block_fragmentation 0.513 exceeds budget 0.500 by 0.013 (+2.5%) — rank 0 cuda:0" in page
    assert "reserved_at_dump 42.00 MiB within budget 64.00 MiB — rank 0 cuda:0" in page
    for key in ("allocated_at_dump_bytes", "reserved_at_dump_bytes", "largest_free_block_bytes", "free_block_fragmentation"):
        assert len(re.findall(rf'<tr><td title="[^"]*">{key}</td>', page)) == 2  # one metrics row per device
    assert "Allocator pools" not in page  # no history: no pool figures (the dump's cache is no fragmentation)
    assert "HTML report written" in capsys.readouterr().out


def test_report_image_draws_every_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One image per profile, named after it; a profile that cannot be read is named as left out."""
    pytest.importorskip("matplotlib")
    import shutil

    from helpers import PTA21_L1, copy_sample

    root = tmp_path / "prof"
    copy_sample(SAMPLE, root / "rank_0" / "run_ascend_pt")
    copy_sample(PTA21_L1, root / "rank_1" / "run_ascend_pt")
    (root / "snap").mkdir()
    shutil.copyfile(SAMPLE.parents[1] / "torch" / "snapshot_modern_small_cs336.pickle", root / "snap" / "a.pickle")
    broken = copy_sample(PTA21_L1, root / "rank_2" / "run_ascend_pt")
    (broken / "memory_record.csv").write_bytes(b"")
    out = tmp_path / "out" / "curves.svg"
    assert main(["report", str(root), "--image", str(out)]) == 2
    captured = capsys.readouterr()
    names = sorted(p.name for p in out.parent.iterdir())
    assert names == ["curves-a.pickle.svg", "curves-rank_0_run_ascend_pt.svg", "curves-rank_1_run_ascend_pt.svg"]
    assert all(f"written to {out.parent / name}" in captured.out for name in names)
    assert f"memgate: left out of the images: {broken} (it could not be read)" in captured.out
    assert "rank 0 npu:0" in (out.parent / "curves-rank_0_run_ascend_pt.svg").read_text()
    assert captured.err.startswith(f"memgate: error: {broken / 'memory_record.csv'}")


def test_report_html_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(SAMPLE), "--html", "-"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("<!DOCTYPE html>") and str(PEAK) in captured.out and captured.err == ""

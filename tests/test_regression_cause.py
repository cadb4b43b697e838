"""Regressions that name their cause (issue 13, item 4): baselines keep the bytes at the peak per
operator and per owner and the commit they were saved at; a failed comparison and ``memgate diff``
list what grew most."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from scale import scaled_copy

from memgate.autosave import save_run
from memgate.baselines import baseline_from_entries
from memgate.cli import main
from memgate.compare import attribution_lines, compare_entry, diff_entries, diff_text, grown_at_peak, parse_rule
from memgate.sizes import format_size

SAMPLE = Path(__file__).parent / "data" / "samples" / "ascend" / "msinsight_pta21_level1_rank0"
MM_BASE, MM_HEAVY = 234489344, 257937920  # aten::mm at the peak, and × 1.10 in whole 512-byte blocks
PEAK_BASE, PEAK_HEAVY = 1322299392, 1454529536
COMMIT = "ab" * 20
MIB = 1 << 20


def _entry(peak: int, ops: dict[str, int] | None, owners: dict[str, int] | None = None) -> dict[str, Any]:
    metrics: dict[str, Any] = {"peak_allocated_bytes": peak}
    if ops is not None:
        metrics["op_bytes_at_peak"] = ops
    if owners is not None:
        metrics["owner_bytes_at_peak"] = owners
    return {"rank": "0", "path": "/runs/rank0", "format": "torch_npu", "metadata": {},
            "devices": [{"device": "npu:0", "metrics": metrics, "pool_of": {}}]}


def test_growth_is_ordered_by_growth_then_name_top_five() -> None:
    before = {"metrics": {"op_bytes_at_peak": {"a": 10, "b": 10, "c": 10, "d": 10, "e": 10, "f": 10, "g": 50},
                          "owner_bytes_at_peak": {"enc": 100}}}
    now = {"metrics": {"op_bytes_at_peak": {"a": 12, "b": 30, "c": 30, "d": 11, "e": 13, "f": 14, "g": 40, "new": 5},
                       "owner_bytes_at_peak": {"enc": 100}}}
    grew = grown_at_peak(before, now)
    assert [r["name"] for r in grew["ops"]] == ["b", "c", "new", "f", "e"]  # 20, 20 (by name), 5, 4, 3
    assert grew["ops"][2] == {"name": "new", "base": None, "current": 5, "delta": 5}
    assert grew["owners"] == []  # unchanged: nothing grew
    assert len(grown_at_peak(before, now, top=None)["ops"]) == 7  # g shrank: never listed


def test_old_baseline_without_the_keys_has_no_attribution() -> None:
    assert grown_at_peak({"metrics": {}}, {"metrics": {"op_bytes_at_peak": {"a": 1}}}) == {}
    old = baseline_from_entries([_entry(100 * MIB, None)])
    assert "metadata" not in old
    r = compare_entry(_entry(120 * MIB, {"aten::mm": 5}), old, parse_rule("peak_allocated:5%"))
    assert r.passed is False and r.attribution is None and r.baseline_commit is None and r.detail == ""


def test_failed_comparison_names_the_operator_and_owner_and_the_commit() -> None:
    base = baseline_from_entries([_entry(100 * MIB, {"aten::mm": 50 * MIB, "aten::add": 10 * MIB, "(other)": MIB},
                                         {"encoder": 60 * MIB})], commit=COMMIT, dirty=True)
    assert base["metadata"] == {"git_commit": COMMIT, "git_dirty": True}
    stored = base["profiles"]["0"]["devices"]["npu:0"]["metrics"]
    assert stored["op_bytes_at_peak"] == {"aten::mm": 50 * MIB, "aten::add": 10 * MIB, "(other)": MIB}
    assert stored["owner_bytes_at_peak"] == {"encoder": 60 * MIB}
    now = _entry(110 * MIB, {"aten::mm": 55 * MIB, "aten::add": 11 * MIB, "(other)": MIB}, {"encoder": 66 * MIB})
    r = compare_entry(now, base, parse_rule("peak_allocated:5%"))
    assert r.passed is False
    assert r.baseline_commit == COMMIT + "-dirty"
    assert r.detail.splitlines() == [
        "grew at the peak: op aten::mm 50.00 MiB -> 55.00 MiB (+5.00 MiB)",
        "grew at the peak: op aten::add 10.00 MiB -> 11.00 MiB (+1.00 MiB)",
        "grew at the peak: owner encoder 60.00 MiB -> 66.00 MiB (+6.00 MiB)",
        f"baseline saved at commit {COMMIT}-dirty",
    ]
    assert compare_entry(now, base, parse_rule("peak_allocated:10%")).passed is True  # exactly at the boundary


def test_saved_run_keeps_its_commit_in_the_metadata(tmp_path: Path) -> None:
    (path,) = save_run(tmp_path, [_entry(MIB, {"a": 1})], commit=COMMIT, dirty=False,
                       now=datetime(2025, 1, 1, tzinfo=UTC))
    document = json.loads(path.read_text())
    assert document["metadata"] == {"git_commit": COMMIT, "git_dirty": False}
    r = compare_entry(_entry(2 * MIB, {"a": 3}), document, parse_rule("peak_allocated:5%"))
    assert r.baseline_commit == COMMIT
    assert attribution_lines(r.attribution or {})[0] == "grew at the peak: op a 1 B -> 3 B (+2 B)"


def test_saved_run_of_an_older_memgate_names_its_commit_from_memgate_run() -> None:
    old = baseline_from_entries([_entry(MIB, None)])
    old["memgate_run"] = {"layout": 1, "id": 1, "commit": COMMIT, "dirty": False}
    assert compare_entry(_entry(2 * MIB, None), old, parse_rule("peak_allocated:5%")).baseline_commit == COMMIT


# ---- a real profile: one operator's blocks grown 10 % ---------------------------------------------


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    scaled_copy(SAMPLE, tmp_path / "base" / "rank0", 1.0)
    scaled_copy(SAMPLE, tmp_path / "heavy" / "rank0", 1.10, ops=("aten::mm",))  # only aten::mm's blocks grow
    return tmp_path / "base", tmp_path / "heavy"


MM_LINE = f"grew at the peak: op aten::mm {format_size(MM_BASE)} -> {format_size(MM_HEAVY)} (+{format_size(MM_HEAVY - MM_BASE)})"


def test_real_profile_fails_with_the_grown_operator_named_first(runs: tuple[Path, Path]) -> None:
    from memgate.discover import discover, load
    from memgate.metrics import profile_metrics
    from memgate.model import ProfileInfo
    from memgate.report import profile_entry

    def entry(root: Path) -> dict[str, Any]:
        profile = load(discover(root)[0])
        return profile_entry(ProfileInfo.of(profile), profile_metrics(profile))

    base = baseline_from_entries([entry(runs[0])], commit=COMMIT)
    r = compare_entry(entry(runs[1]), base, parse_rule("peak_allocated:5%"))
    assert (r.passed, r.base, r.value) == (False, PEAK_BASE, PEAK_HEAVY)
    assert r.attribution == {"ops": [{"name": "aten::mm", "base": MM_BASE, "current": MM_HEAVY, "delta": MM_HEAVY - MM_BASE}],
                             "owners": []}
    assert r.detail.splitlines() == [MM_LINE, f"baseline saved at commit {COMMIT}"]


def test_plugin_failure_lists_the_cause_under_the_failure_line(pytester: pytest.Pytester, runs: tuple[Path, Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memgate.outputs.git_commit", lambda directory: (COMMIT, False))
    base, heavy = runs
    pytester.runpytest(f"--memgate={base}", "--memgate-save-baseline=baseline.json").assert_outcomes(passed=1)
    saved = json.loads((pytester.path / "baseline.json").read_text())
    assert saved["metadata"] == {"git_commit": COMMIT, "git_dirty": False}
    assert saved["profiles"]["0"]["devices"]["npu:0"]["metrics"]["op_bytes_at_peak"]["aten::mm"] == MM_BASE
    result = pytester.runpytest(f"--memgate={heavy}", "--memgate-baseline=baseline.json",
                                "--memgate-compare-fail=peak_allocated:5%")
    result.assert_outcomes(failed=1)
    out = result.stdout.lines
    head = next(i for i, line in enumerate(out) if "exceeds baseline" in line and "peak_allocated" in line)
    after = [line.strip() for line in out[head + 1:head + 6] if line.strip()]
    assert after[:2] == [MM_LINE, f"baseline saved at commit {COMMIT}"]
    pytester.runpytest(f"--memgate={heavy}", "--memgate-baseline=baseline.json",
                       "--memgate-compare-fail=peak_allocated:11%").assert_outcomes(passed=1)


def test_memgate_diff_shows_the_attribution(runs: tuple[Path, Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    base, heavy = runs
    assert main(["diff", str(base), str(heavy), "--fail", "peak_allocated:5%"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"  {MM_LINE}" in out
    failed = next(i for i, line in enumerate(out) if line.startswith("FAILED "))
    assert out[failed + 1] == f"       {MM_LINE}"
    assert main(["diff", str(base), str(heavy), "--json", "--fail", "peak_allocated:5%"]) == 1
    data = json.loads(capsys.readouterr().out)
    (device,) = data["ranks"][0]["devices"]
    assert device["grew_at_peak"]["ops"] == [{"name": "aten::mm", "base": MM_BASE, "current": MM_HEAVY,
                                              "delta": MM_HEAVY - MM_BASE}]
    assert data["regressions"][0]["attribution"]["ops"][0]["name"] == "aten::mm"


def test_diff_of_a_baseline_with_a_commit_names_it() -> None:
    base = baseline_from_entries([_entry(MIB, {"a": 1})], commit=COMMIT)
    from memgate.baselines import baseline_entries

    diff = diff_entries(baseline_entries(base), [_entry(2 * MIB, {"a": 2})])
    assert diff["ranks"][0]["base_commit"] == COMMIT
    lines = diff_text(diff)
    assert "  grew at the peak: op a 1 B -> 2 B (+1 B)" in lines
    assert f"  base saved at commit {COMMIT}" in lines


def test_plugin_json_report_carries_the_attribution_and_the_commit(pytester: pytest.Pytester, runs: tuple[Path, Path],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("memgate.outputs.git_commit", lambda directory: (COMMIT, False))
    base, heavy = runs
    pytester.runpytest(f"--memgate={base}", "--memgate-save-baseline=baseline.json").assert_outcomes(passed=1)
    pytester.runpytest(f"--memgate={heavy}", "--memgate-baseline=baseline.json",
                       "--memgate-compare-fail=peak_allocated:5%", "--memgate-json=report.json").assert_outcomes(failed=1)
    report = json.loads((pytester.path / "report.json").read_text())
    [row] = [o for o in report["budgets"] if o["budget"] == "baseline"]
    assert row["baseline_commit"] == COMMIT
    assert row["attribution"] == {"ops": [{"name": "aten::mm", "base": MM_BASE, "current": MM_HEAVY,
                                           "delta": MM_HEAVY - MM_BASE}], "owners": []}


def test_diff_names_a_marked_test_by_its_whole_node_id() -> None:
    """A marked test's history entry is keyed by its node id: the diff names it so, ``tests/`` included,
    even where it is the only profile of its rank."""
    base = {**_entry(MIB, {"a": 1}), "path": "tests/test_train.py::test_step"}
    now = {**_entry(2 * MIB, {"a": 1}), "path": "tests/test_train.py::test_step"}
    lines = diff_text(diff_entries([base], [now]))
    assert lines[0] == "rank 0 npu:0  [tests/test_train.py::test_step]"
    two = [now, {**now, "path": "tests/unit/test_train.py::test_step"}]
    assert [r["label"] for r in diff_entries([base], two)["ranks"]] == [
        "tests/test_train.py::test_step", "tests/unit/test_train.py::test_step"]

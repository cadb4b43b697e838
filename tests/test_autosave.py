"""Saved runs under .memgate/ (--memgate-autosave) and comparing with one (--memgate-compare[=ID])."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from scale import BASE_AND_HEAVY_BUDGETS, base_and_heavy

from memgate.autosave import (
    check_run_id,
    configuration_name,
    default_storage,
    find_run,
    is_run_id,
    missing_run,
    run_entries,
    run_files,
    run_number,
    run_summaries,
    save_run,
    saved_runs,
    storage_problem,
)
from memgate.cli import main
from memgate.documents import load_baseline
from memgate.errors import ConfigError, MemgateError

BUDGETS = BASE_AND_HEAVY_BUDGETS
NPU_KEY = {"format": "torch_npu", "device_type": "npu"}  # what the example's metadata makes comparable
NPU = f"torch_npu-npu-{hashlib.sha256(json.dumps(NPU_KEY, sort_keys=True).encode()).hexdigest()[:8]}"
RULE = "--memgate-compare-fail=peak_allocated:5%"


def _entry(rank: str, fmt: str = "torch_npu", device: str = "npu:0", **metadata: object) -> dict[str, Any]:
    return {"path": f"prof/{rank}", "format": fmt, "rank": rank, "metadata": metadata,
            "devices": [{"device": device, "metrics": {"peak_allocated_bytes": 100}, "pool_of": {}}]}


def test_configuration_name_is_readable_and_exact() -> None:
    key = {"format": "torch_npu", "device_type": "npu", "torch_npu_version": "2.1.0rc1", "cann_version": "8.0.RC1",
           "world_size": 8}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    assert configuration_name(key) == f"torch_npu-npu-cann8.0.RC1-torch_npu2.1.0rc1-ws8-{digest}"
    assert configuration_name(NPU_KEY) == NPU
    assert configuration_name({**key, "world_size": 16}) != configuration_name(key)


def test_runs_are_numbered_across_configurations(tmp_path: Path) -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    first = save_run(tmp_path, [_entry("0"), _entry("1")], commit="ab" * 20, dirty=False, now=now)
    mixed = save_run(tmp_path, [_entry("0"), _entry("0", "kineto", "cpu")], commit=None, dirty=False, now=now)
    third = save_run(tmp_path, [_entry("0")], commit="cd" * 20, dirty=True, now=now)
    cpu = configuration_name({"format": "kineto", "device_type": "cpu"})
    assert [p.relative_to(tmp_path).as_posix() for p in first + mixed + third] == [
        f"v1/{NPU}/0001_abababababab.json",
        f"v1/{cpu}/0002_nogit.json", f"v1/{NPU}/0002_nogit.json",  # one file per configuration, one number
        f"v1/{NPU}/0003_cdcdcdcdcdcd-dirty.json",
    ]
    document = json.loads(first[0].read_text())
    assert document["memgate_run"] == {"layout": 1, "id": 1, "commit": "ab" * 20, "dirty": False,
                                       "saved_at": "2026-01-02T03:04:05Z", "configuration": NPU_KEY}
    assert sorted(load_baseline(first[0])["profiles"]) == ["0", "1"]  # a saved run is a baseline as is
    assert [r.number for r in saved_runs(tmp_path)] == [1, 2, 2, 3]


def test_find_run_latest_by_number_and_by_commit(tmp_path: Path) -> None:
    for commit in ("ab" * 20, "cd" * 20, "ab" * 20):
        save_run(tmp_path, [_entry("0")], commit=commit, dirty=False)
    assert find_run(tmp_path, NPU_KEY).number == 3  # type: ignore[union-attr]
    assert find_run(tmp_path, NPU_KEY, "latest").number == 3  # type: ignore[union-attr]
    assert find_run(tmp_path, NPU_KEY, "2").commit == "cd" * 6  # type: ignore[union-attr]
    assert find_run(tmp_path, NPU_KEY, "0001").number == 1  # type: ignore[union-attr]
    assert find_run(tmp_path, NPU_KEY, "abab").number == 3  # type: ignore[union-attr]  # the commit's latest run
    assert find_run(tmp_path, NPU_KEY, "9") is None
    assert find_run(tmp_path, {"format": "kineto", "device_type": "cpu"}) is None
    why = missing_run(tmp_path, {"format": "kineto", "device_type": "cpu"})
    assert why.startswith("no saved run for configuration kineto-cpu-") and why.endswith(f"saved configurations: {NPU}")


@pytest.mark.parametrize("run_id", ["", "latest", "3", "0003", "abc1234"])
def test_run_ids(run_id: str) -> None:
    assert check_run_id(run_id) == run_id


@pytest.mark.parametrize("run_id", ["tests/", "HEAD", "abc"])
def test_bad_run_ids(run_id: str) -> None:
    with pytest.raises(ConfigError, match="invalid --memgate-compare"):
        check_run_id(run_id)


# ---- through pytest ----------------------------------------------------------------------------


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makefile(".toml", memgate=BUDGETS)
    base_and_heavy(pytester.path)
    return pytester


def test_autosave_then_compare_with_the_latest_run(project: pytest.Pytester) -> None:
    saved = project.runpytest("--memgate=base", "--memgate-autosave")
    saved.assert_outcomes(passed=1)
    run = project.path / ".memgate" / "v1" / NPU / "0001_nogit.json"  # pytester's folder is no git checkout
    saved.stdout.fnmatch_lines([f"memgate: run saved to {run}"])
    assert load_baseline(run)["profiles"]["0"]["devices"]["npu:0"]["metrics"]["peak_allocated_bytes"] == 1322299392
    project.runpytest("--memgate=base", "--memgate-compare", RULE).assert_outcomes(passed=2)
    heavy = project.runpytest("--memgate=heavy", "--memgate-compare", RULE)
    heavy.assert_outcomes(passed=1, failed=1)
    heavy.stdout.fnmatch_lines([
        "*peak_allocated 1.35 GiB exceeds baseline 1.23 GiB by 126.1? MiB (+10.0%), allowed +5% — rank 0 npu:0*",
        f"baseline: {run}",
        "*= memgate compare =*",
        f"compared with {run}:",
        "*peak_allocated*1.23 GiB ->*1.35 GiB*+126.1? MiB (+10.0%)*",
    ])


def test_compare_with_a_run_by_number(project: pytest.Pytester) -> None:
    project.runpytest("--memgate=base", "--memgate-autosave").assert_outcomes(passed=1)
    project.runpytest("--memgate=heavy", "--memgate-autosave").assert_outcomes(passed=1)
    project.runpytest("--memgate=heavy", "--memgate-compare", RULE).assert_outcomes(passed=2)  # latest: run 2
    project.runpytest("--memgate=heavy", "--memgate-compare=1", RULE).assert_outcomes(passed=1, failed=1)
    project.makeini("[pytest]\nmemgate_compare = 1\n")  # the ini twin
    project.runpytest("--memgate=heavy", RULE).assert_outcomes(passed=1, failed=1)


def test_no_saved_run_follows_the_missing_baseline_policy(project: pytest.Pytester) -> None:
    result = project.runpytest("--memgate=base", "--memgate-compare", RULE, "--memgate-baseline-missing=skip", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([(f"*no saved run for configuration {NPU} in {project.path / '.memgate' / 'v1'} "
                                 "(save one with --memgate-autosave)*")])


def test_storage_option_and_autosave_without_profiles(project: pytest.Pytester) -> None:
    project.runpytest("--memgate=base", "--memgate-autosave", "--memgate-storage=runs").assert_outcomes(passed=1)
    assert (project.path / "runs" / "v1" / NPU / "0001_nogit.json").is_file()
    project.makepyfile(test_x="def test_x():\n    pass\n")
    result = project.runpytest("--memgate-autosave")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["memgate: --memgate-autosave saved nothing: no --memgate=PATH profile and no marked test*"])


def test_autosave_and_storage_ini_twins(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nmemgate_autosave = true\nmemgate_storage = ci-runs\n")
    project.runpytest("--memgate=base").assert_outcomes(passed=1)
    assert (project.path / "ci-runs" / "v1" / NPU / "0001_nogit.json").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memgate-baseline=b.json", "--memgate-compare"], "*--memgate-baseline and --memgate-compare both*"),
        ([RULE], "*--memgate-compare-fail needs --memgate-baseline=FILE or --memgate-compare[[]=ID[]]*"),
        (["--memgate-compare=tests/"], "*invalid --memgate-compare 'tests/'*"),
    ],
)
def test_usage_errors(project: pytest.Pytester, args: list[str], message: str) -> None:
    result = project.runpytest("--memgate=base", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_runs_are_keyed_by_the_git_commit(project: pytest.Pytester) -> None:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=project.path,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", "memgate.toml")
    git("commit", "-q", "-m", "budgets")
    commit = git("rev-parse", "HEAD")
    project.runpytest("--memgate=base", "--memgate-autosave").assert_outcomes(passed=1)
    (project.path / "memgate.toml").write_text(BUDGETS + "# changed\n")
    project.runpytest("--memgate=heavy", "--memgate-autosave").assert_outcomes(passed=1)
    folder = project.path / ".memgate" / "v1" / NPU
    assert sorted(p.name for p in folder.iterdir()) == [f"0001_{commit[:12]}.json", f"0002_{commit[:12]}-dirty.json"]
    assert json.loads((folder / f"0001_{commit[:12]}.json").read_text())["memgate_run"]["commit"] == commit
    # a commit prefix picks that commit's latest run: run 2 (heavy), so heavy passes against it
    project.runpytest("--memgate=heavy", f"--memgate-compare={commit[:7]}", RULE).assert_outcomes(passed=2)
    project.runpytest("--memgate=heavy", "--memgate-compare=1", RULE).assert_outcomes(passed=1, failed=1)



# ---- memgate runs, and memgate diff A B over saved runs ------------------------------------------


def test_run_files_by_id(tmp_path: Path) -> None:
    save_run(tmp_path, [_entry("0")], commit="ab" * 20, dirty=False)
    save_run(tmp_path, [_entry("0"), _entry("0", "kineto", "cpu")], commit="cd" * 20, dirty=False)
    save_run(tmp_path, [_entry("1")], commit="ab" * 20, dirty=True)
    assert [r.number for r in run_files(tmp_path, "latest")] == [3]
    assert [r.number for r in run_files(tmp_path, "previous")] == [2, 2]  # both configurations of run 2
    assert [r.number for r in run_files(tmp_path, "0001")] == [1]
    assert [r.number for r in run_files(tmp_path, "abab")] == [3]  # that commit's latest run
    assert [r.number for r in run_files(tmp_path, "CDCD")] == [2, 2]
    assert sorted(e["format"] for e in run_entries(tmp_path, "2")) == ["kineto", "torch_npu"]
    with pytest.raises(ConfigError, match=r"no saved run '9' in .*v1 \(saved: 0001, 0002, 0003\); expected latest"):
        run_files(tmp_path, "9")
    with pytest.raises(ConfigError, match=r"no saved run 'previous' .*\(none saved: pytest --memgate-autosave"):
        run_files(tmp_path / "empty", "previous")
    assert [is_run_id(t) for t in ("latest", "previous", "12", "abc1", "base", "abc", "run.json")] == [
        True, True, True, True, False, False, False]


def test_run_summaries_name_an_unreadable_file_and_go_on(tmp_path: Path) -> None:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    save_run(tmp_path, [_entry("0"), _entry("1")], commit="ab" * 20, dirty=False, now=now)
    broken = save_run(tmp_path, [_entry("0")], commit=None, dirty=False, now=now)[0]
    broken.write_text('{"memgate_baseline": 1, "profiles": [}')
    first, second = run_summaries(tmp_path)
    assert (first.number, first.commit, first.dirty, first.saved_at, first.profiles, first.problems) == (
        1, "ab" * 6, False, "2026-01-02T03:04:05Z", ("prof/0", "prof/1"), ())
    assert second.number == 2 and second.profiles == ()
    assert len(second.problems) == 1 and second.problems[0].startswith(f"{broken}:1")


def test_default_storage_is_the_nearest_above(tmp_path: Path) -> None:
    save_run(tmp_path / ".memgate", [_entry("0")], commit=None, dirty=False)
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert default_storage(tmp_path / "a" / "b") == tmp_path / ".memgate"
    assert default_storage(Path("/")) == Path("/.memgate") or (Path("/.memgate") / "v1").is_dir()


def test_memgate_runs_lists_and_diff_compares_any_two(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    project.runpytest("--memgate=base", "--memgate-autosave").assert_outcomes(passed=1)
    project.runpytest("--memgate=heavy", "--memgate-autosave").assert_outcomes(passed=1)
    (project.path / "sub").mkdir()
    monkeypatch.chdir(project.path / "sub")  # the storage is found above the current folder
    capsys.readouterr()  # pytester's in-process runs print here too
    assert main(["runs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"saved runs in {project.path / '.memgate' / 'v1'}"
    assert out[1].split() == ["run", "commit", "saved", "(UTC)", "platform", "profiles"]
    assert [line.split()[:2] for line in out[2:4]] == [["0001", "nogit"], ["0002", "nogit"]]
    base, heavy = (project.path / "base" / "run_ascend_pt", project.path / "heavy" / "run_ascend_pt")
    assert out[2].endswith(f"  1: {base}") and out[3].endswith(f"  1: {heavy}")  # not under sub/: absolute
    assert out[4] == "compare two: memgate diff 0001 0002 (or: memgate diff previous latest)"

    assert main(["diff", "previous", "latest", "--fail", "peak_allocated:5%"]) == 1
    text = capsys.readouterr().out
    assert "peak_allocated" in text and "1.23 GiB ->     1.35 GiB" in text
    assert "FAILED peak_allocated 1.35 GiB exceeds baseline 1.23 GiB" in text
    assert main(["diff", "2", "0002", "--fail", "peak_allocated:5%"]) == 0  # a run with itself
    capsys.readouterr()
    assert main(["suggest", "latest", "--form", "toml"]) == 0
    assert "peak_allocated" in capsys.readouterr().out
    assert main(["diff", "1", "7"]) == 2
    assert "no saved run '7'" in capsys.readouterr().err

    assert main(["runs", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["id"], r["profiles"], r["problems"]) for r in listed["runs"]] == [
        (1, [str(base)], []), (2, [str(heavy)], [])]
    monkeypatch.chdir(project.path)
    assert main(["runs"]) == 0
    assert capsys.readouterr().out.splitlines()[2].endswith("  1: base/run_ascend_pt")  # relative where it can be


def test_memgate_runs_with_none_saved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--storage", str(tmp_path / "nowhere")]) == 0
    assert capsys.readouterr().out == f"no saved runs in {tmp_path / 'nowhere' / 'v1'} (pytest --memgate-autosave saves one)\n"


def test_autosave_and_compare_in_one_run_compare_with_the_run_before(project: pytest.Pytester) -> None:
    """The comparison printed is with the latest run saved before this one, not the one it just saved."""
    project.runpytest("--memgate=base", "--memgate-autosave").assert_outcomes(passed=1)
    result = project.runpytest("--memgate=heavy", "--memgate-autosave", "--memgate-compare", RULE)
    result.assert_outcomes(passed=1, failed=1)
    first = project.path / ".memgate" / "v1" / NPU / "0001_nogit.json"
    result.stdout.fnmatch_lines([
        "*= memgate compare =*",
        f"compared with {first}:",
        "*peak_allocated*1.23 GiB ->*1.35 GiB*+126.1? MiB (+10.0%)*",
        f"memgate: run saved to {first.with_name('0002_nogit.json')}",
    ])


MARKED = """
import os
import pytest

@pytest.mark.memgate(peak_allocated="4 GiB", profile=os.environ["RUN"])
def test_train():
    pass
"""


def test_a_marked_tests_failed_comparison_is_the_same_failed_row_in_every_output(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A marked test compared with its saved run: the comparison is one row, judged once, and the
    terminal table, the JSON report, JUnit, the HTML page, the annotations and the step summary all
    show it failed, with as many failed checks as pytest counts."""
    project.makepyfile(test_marked_compare=MARKED)
    monkeypatch.setenv("RUN", "base/run_ascend_pt")
    project.runpytest("--memgate-autosave").assert_outcomes(passed=1)
    monkeypatch.setenv("RUN", "heavy/run_ascend_pt")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    summary = project.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = project.runpytest("--memgate-compare", RULE, "--memgate-json=r.json", "--memgate-html=r.html",
                               "--junitxml=j.xml")
    result.assert_outcomes(failed=1)
    failure = "peak_allocated 1.35 GiB exceeds baseline 1.23 GiB by 126.1? MiB (+10.0%), allowed +5% — rank 0 npu:0"
    result.stdout.fnmatch_lines([
        f"*{failure}*",
        "*0 npu:0  test_marked_compare.py::test_train (baseline)  peak_allocated  1.35 GiB*FAIL*",
        ("::error file=test_marked_compare.py,line=*,title=memgate test_marked_compare.py%3A%3Atest_train::peak_allocated 1.35 GiB "
         "exceeds baseline*"),
    ])
    report = json.loads((project.path / "r.json").read_text())
    compared = [b for b in report["budgets"] if "baseline_value" in b]
    assert [(b["test"], b["metric"], b["passed"]) for b in compared] == [("test_marked_compare.py::test_train",
                                                                          "peak_allocated", False)]
    assert sum(1 for b in report["budgets"] if b["passed"] is False) == 1  # as many as pytest failed
    junit = (project.path / "j.xml").read_text()
    assert '<property name="memgate.baseline.peak_allocated.result" value="FAIL" />' in junit
    assert '<property name="memgate.peak_allocated.result" value="pass" />' in junit
    page = (project.path / "r.html").read_text()
    assert "1 of 2 budget checks failed" in page and "<h2>Comparisons</h2>" in page
    comparisons = page[page.index("<h2>Comparisons</h2>"):]
    assert "test_marked_compare.py::test_train" in comparisons and '<td class="result">FAIL</td>' in comparisons
    steps = summary.read_text()
    assert "### memgate: 1 failed (2 checks)" in steps
    assert "| ❌ FAIL | `test_marked_compare.py::test_train` | 0 | npu:0 | test_marked_compare.py::test_train (baseline) |" in steps
# ---- the store as untrusted input: hostile run IDs, odd files, loops, files for folders -----------

HOSTILE_RUN_IDS = ["²", "٣", "１２", "3²", "\u0663\u0660", "1_0", "+3", "-3", "3.0", "9" * 5000]


@pytest.mark.parametrize("run_id", HOSTILE_RUN_IDS)
def test_a_run_id_is_read_in_ascii_digits_only(tmp_path: Path, run_id: str) -> None:
    """'²'.isdigit() is True and int('²') raises; '٣' and '１２' int() reads as 3 and 12: none is a run number."""
    save_run(tmp_path, [_entry("0")], commit=None, dirty=False)
    assert run_number(run_id) is None
    assert not is_run_id(run_id)
    assert find_run(tmp_path, NPU_KEY, run_id) is None
    with pytest.raises(ConfigError) as info:
        run_files(tmp_path, run_id)
    assert info.value.one_line().startswith("no saved run ") and len(info.value.one_line()) < 400
    with pytest.raises(ConfigError, match="invalid --memgate-compare") as info:
        check_run_id(run_id)
    assert len(info.value.one_line()) < 400


def test_run_numbers_ascii_with_leading_zeros() -> None:
    assert [run_number(t) for t in ("3", "0003", "000000000007", "999999999", "1000000000")] == [
        3, 3, 7, 999999999, None]


def test_foreign_names_in_the_ids_folder_are_not_run_numbers(tmp_path: Path) -> None:
    save_run(tmp_path, [_entry("0")], commit=None, dirty=False)
    ids = tmp_path / "v1" / ".ids"
    for name in ("²", "٣", "１２", "7_0", "abc", "9" * 200):  # from a merged or tampered CI cache
        (ids / name).touch()
    assert [p.name for p in save_run(tmp_path, [_entry("0")], commit=None, dirty=False)] == ["0002_nogit.json"]
    (ids / "999999999").touch()
    with pytest.raises(ConfigError) as info:
        save_run(tmp_path, [_entry("0")], commit=None, dirty=False)
    assert info.value.one_line() == (f"{ids}: no run number left: the store claims run 999999999; expected run numbers "
                                     "up to 999999999: start a new storage folder")


def _odd_storages(tmp_path: Path) -> dict[str, tuple[Path, Path, str]]:
    """name → (the storage given, the path the error names, what it says)."""
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("v1_file", "ids_file"):
        (tmp_path / name).mkdir()
    (tmp_path / "v1_file" / "v1").write_text("")
    (tmp_path / "ids_file" / "v1").mkdir()
    (tmp_path / "ids_file" / "v1" / ".ids").write_text("")
    return {
        "a file": (tmp_path / "a_file", tmp_path / "a_file", "not a folder"),
        "a folder in a file": (tmp_path / "a_file" / "runs", tmp_path / "a_file", "not a folder"),
        "a symlink loop": (tmp_path / "loop_a", tmp_path / "loop_a",
                           "cannot use the saved runs' folder: Too many levels of symbolic links"),
        "a dangling link": (tmp_path / "dangling", tmp_path / "dangling", "a symbolic link to nothing"),
        "v1 a file": (tmp_path / "v1_file", tmp_path / "v1_file" / "v1", "not a folder"),
        ".ids a file": (tmp_path / "ids_file", tmp_path / "ids_file" / "v1" / ".ids", "not a folder"),
    }


def test_a_storage_that_cannot_be_one_is_named(tmp_path: Path) -> None:
    for case, (storage, named, says) in _odd_storages(tmp_path).items():
        problem = storage_problem(storage)
        assert problem is not None, case
        assert problem.one_line() == (f"{named}: {says}; expected a folder for saved runs "
                                      "(--memgate-storage / --storage DIR)"), case
    assert storage_problem(tmp_path / "not" / "yet") is None  # created when a run is saved
    assert storage_problem(Path("relative-runs")) is None


def test_memgate_runs_on_an_odd_storage_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for case, (storage, named, says) in _odd_storages(tmp_path).items():
        capsys.readouterr()
        assert main(["runs", "--storage", str(storage)]) == 2, case
        captured = capsys.readouterr()
        assert captured.err.splitlines() == [(f"memgate: error: {named}: {says}; expected a folder for saved runs "
                                             "(--memgate-storage / --storage DIR)")], case
        assert main(["diff", "--storage", str(storage), "1", "2"]) == 2, case
        assert len(capsys.readouterr().err.splitlines()) == 1, case


@pytest.mark.parametrize("case", ["a file", "a symlink loop", "a dangling link", ".ids a file"])
def test_an_odd_storage_is_a_usage_error_before_the_session(project: pytest.Pytester, case: str) -> None:
    storage, named, says = _odd_storages(project.path)[case]
    for option in ("--memgate-autosave", "--memgate-compare"):
        result = project.runpytest("--memgate=base", option, f"--memgate-storage={storage}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        result.stderr.fnmatch_lines([f"*memgate: {named}: {says}; expected a folder for saved runs*"])
        assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize("run_id", ["²", "１", "\u0663"])
def test_a_unicode_digit_compare_id_is_a_usage_error(project: pytest.Pytester, run_id: str) -> None:
    result = project.runpytest("--memgate=base", f"--memgate-compare={run_id}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*invalid --memgate-compare '{run_id}'; expected nothing (the latest saved run)*"])


def test_a_run_saved_twice_for_one_configuration_names_both_files(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Two CI caches merged: run 0002 of one configuration twice, at two commits."""
    save_run(tmp_path, [_entry("0")], commit=None, dirty=False)
    [second] = save_run(tmp_path, [_entry("0")], commit=None, dirty=False)
    other = second.with_name("0002_abababababab.json")
    shutil.copyfile(second, other)
    says = (f"{second.parent}: run 0002 is saved twice for one configuration: 0002_abababababab.json and "
            "0002_nogit.json (two stores merged?); expected one file per run and configuration: remove or renumber one")
    for find in (lambda: run_files(tmp_path, "2"), lambda: run_files(tmp_path, "latest"),
                 lambda: find_run(tmp_path, NPU_KEY), lambda: find_run(tmp_path, NPU_KEY, "0002"),
                 lambda: find_run(tmp_path, NPU_KEY, "abab")):
        with pytest.raises(ConfigError) as info:
            find()
        assert info.value.one_line() == says
    assert [r.number for r in run_files(tmp_path, "1")] == [1]  # the other runs are still there
    first, twice = run_summaries(tmp_path)
    assert (first.problems, twice.problems) == ((), (says,))
    assert main(["runs", "--storage", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert [line.split()[0] for line in captured.out.splitlines()[2:4]] == ["0001", "0002"]
    assert captured.err.splitlines() == [f"memgate: error: run 0002: {says}"]
    assert main(["diff", "--storage", str(tmp_path), "1", "2"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"memgate: error: {says}"]


def test_memgate_runs_names_a_run_file_it_cannot_read_and_lists_the_rest(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    save_run(tmp_path, [_entry("0")], commit=None, dirty=False)
    [second] = save_run(tmp_path, [_entry("1")], commit=None, dirty=False)
    dangling = second.with_name("0003_nogit.json")
    dangling.symlink_to(tmp_path / "gone.json")  # a dangling link, as a restored cache may hold
    folder = second.with_name("0004_nogit.json")
    folder.mkdir()
    assert main(["runs", "--storage", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert [line.split()[0] for line in captured.out.splitlines()[2:6]] == ["0001", "0002", "0003", "0004"]
    assert captured.err.splitlines() == [
        (f"memgate: error: run 0003: {dangling}: baseline file is a symbolic link to '{tmp_path / 'gone.json'}', "
        "which does not exist"),
        f"memgate: error: run 0004: {folder}: baseline is a directory; expected a memgate baseline file"]
    assert main(["runs", "--storage", str(tmp_path), "--json"]) == 2
    listed = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["id"], r["profiles"], len(r["problems"])) for r in listed] == [
        (1, ["prof/0"], 0), (2, ["prof/1"], 0), (3, [], 1), (4, [], 1)]
    with pytest.raises(MemgateError, match="symbolic link to"):  # the latest is not skipped for the one before
        load_baseline(find_run(tmp_path, NPU_KEY, "3").path)  # type: ignore[union-attr]


def test_a_store_broken_during_the_session_is_said_at_its_end(project: pytest.Pytester) -> None:
    """The storage is checked at the start; a folder of it made a file by the time the run is saved: said, exit 4."""
    folder = project.path / ".memgate" / "v1" / NPU
    project.makepyfile(test_break=f"import os\ndef test_break():\n    os.makedirs(r'{folder.parent}', exist_ok=True)\n"
                                  f"    open(r'{folder}', 'w').close()\n")
    result = project.runpytest("--memgate=base", "--memgate-autosave", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stdout.fnmatch_lines([(f"memgate: error: {folder}: cannot use the saved runs' folder: File exists; "
                                 "expected a folder memgate can read and write (--memgate-storage / --storage) "
                                 "(the run was not saved)")])
    assert "INTERNALERROR" not in result.stdout.str() and "saved nothing" not in result.stdout.str()

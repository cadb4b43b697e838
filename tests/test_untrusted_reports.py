"""Baselines, saved runs, JSON reports and the profile cache read back as untrusted input.

Every file here is a real output of memgate on a repo sample (``memgate inspect --json``, a baseline
and a saved run made from it), then corrupted the way CI artifact storage, caches and other
branches hand them back: each corruption is exit 2 with one stderr line naming the file and the
JSON path (never exit 3), and in pytest an error item naming the file; a tampered cache entry is a
miss (the profile is loaded again and the numbers are the real ones). (memgate.documents on small
hand-written files: tests/test_documents.py.)
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import PTA21_L1
from scale import BASE_AND_HEAVY_BUDGETS, base_and_heavy

from memgate import __version__
from memgate.autosave import save_run
from memgate.baselines import baseline_from_entries
from memgate.cache import ProfileCache, open_profile
from memgate.cli import main
from memgate.discover import discover, load
from memgate.documents import load_baseline, load_entries, load_report
from memgate.errors import InputError
from memgate.metrics import profile_metrics

SAMPLE = PTA21_L1  # tests/data/samples/ascend/msinsight_pta21_level1_rank0: 0.8 s to load
PEAK = 1322299392
METRIC = 'profiles["0"].devices["npu:0"].metrics.'
REPORT_METRIC = "profiles[0].devices[0].metrics."


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["inspect", str(SAMPLE), "--json"]) == 0
    doc: dict[str, Any] = json.loads(out.getvalue())
    return doc


@pytest.fixture(scope="module")
def baseline(report: dict[str, Any]) -> dict[str, Any]:
    return baseline_from_entries(report["profiles"], commit="a" * 40, dirty=False)


@pytest.fixture(scope="module")
def saved_run(report: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    (path,) = save_run(tmp_path_factory.mktemp("runs"), report["profiles"], commit="b" * 40, dirty=True,
                       now=datetime(2025, 1, 1, tzinfo=UTC))
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _device(doc: dict[str, Any]) -> dict[str, Any]:
    device: dict[str, Any] = doc["profiles"]["0"]["devices"]["npu:0"]
    return device


def _set_metric(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda doc: _device(doc)["metrics"].__setitem__(key, value)


# (name, edit of a baseline/saved run, JSON path named, a word the message holds)
BASELINE_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("metric_string", _set_metric("peak_allocated_bytes", "1322299392"), METRIC + "peak_allocated_bytes", "string"),
    ("metric_negative", _set_metric("peak_reserved_bytes", -4096), METRIC + "peak_reserved_bytes", "out of range"),
    ("metric_past_2_63", _set_metric("peak_allocated_bytes", 2**63 + 1), METRIC + "peak_allocated_bytes", "2**56"),
    ("metric_past_2_56", _set_metric("peak_allocated_bytes", 2**56 + 1), METRIC + "peak_allocated_bytes", "2**56"),
    ("metric_10_30", _set_metric("peak_allocated_bytes", 10**30), METRIC + "peak_allocated_bytes", "2**56"),
    ("metric_float_bytes", _set_metric("peak_allocated_bytes", 1322299392.5), METRIC + "peak_allocated_bytes", "float"),
    ("metric_bool", _set_metric("leaked_bytes", True), METRIC + "leaked_bytes", "true"),
    ("ratio_above_1", _set_metric("fragmentation", 1.5), METRIC + "fragmentation", "ratio from 0 to 1"),
    ("ratio_negative", _set_metric("external_fragmentation", -0.1), METRIC + "external_fragmentation", "ratio"),
    ("op_negative", lambda d: _device(d)["metrics"]["op_max_block_bytes"].__setitem__("aten::mm", -1),
     METRIC + 'op_max_block_bytes["aten::mm"]', "byte count"),
    ("devices_list", lambda d: d["profiles"]["0"].__setitem__("devices", [1, 2]), 'profiles["0"].devices', "array"),
    ("metrics_list", lambda d: _device(d).__setitem__("metrics", []), METRIC.rstrip("."), "array"),
    ("pool_not_text", lambda d: _device(d).__setitem__("pool_of", {"fragmentation": 3}),
     'profiles["0"].devices["npu:0"].pool_of.fragmentation', "string"),
    ("profiles_list", lambda d: d.__setitem__("profiles", []), "profiles", "array"),
    ("unknown_metric", _set_metric("peak_magic_bytes", 1), METRIC.rstrip("."), "peak_magic_bytes"),
    ("rank_int", lambda d: d["profiles"]["0"].__setitem__("rank", 0), 'profiles["0"].rank', "string"),
]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(args)
    return code, capsys.readouterr().err.splitlines()


def _assert_refused(code: int, err: list[str], file: Path, path: str, word: str) -> None:
    assert code == 2, err
    assert len(err) == 1, err
    assert err[0].startswith(f"memgate: error: {file}:"), err
    assert repr(path) in err[0] or path in err[0], err
    assert word in err[0], err
    assert "internal error" not in err[0]


@pytest.mark.parametrize("kind", ["baseline", "saved_run"])
@pytest.mark.parametrize(("name", "edit", "where", "word"), BASELINE_CASES, ids=[c[0] for c in BASELINE_CASES])
def test_a_corrupted_baseline_or_saved_run_is_exit_2_naming_file_and_json_path(
        kind: str, name: str, edit: Callable[[dict[str, Any]], None], where: str, word: str, baseline: dict[str, Any],
        saved_run: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(json.dumps(baseline if kind == "baseline" else saved_run))
    edit(doc)
    file = tmp_path / f"{name}.json"
    file.write_text(json.dumps(doc))
    _assert_refused(*_run(["diff", str(file), str(SAMPLE), "--fail", "peak_allocated:5%"], capsys), file, where, word)
    _assert_refused(*_run(["suggest", str(file)], capsys), file, where, word)
    with pytest.raises(InputError) as raised:
        load_baseline(file)
    assert raised.value.file == str(file) and raised.value.column == where


TOKENS = [("NaN", "NaN"), ("Infinity", "Infinity"), ("-Infinity", "-Infinity"), ("1e400", "1e400"),
          ("9" * 5000, "5000 digits")]


@pytest.mark.parametrize(("token", "word"), TOKENS, ids=["nan", "inf", "-inf", "1e400", "5000_digits"])
def test_nan_infinity_and_huge_number_tokens_are_refused_where_they_are(
        token: str, word: str, baseline: dict[str, Any], report: dict[str, Any], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    text = json.dumps(baseline).replace(f'"peak_allocated_bytes": {PEAK}', f'"peak_allocated_bytes": {token}', 1)
    file = tmp_path / "base.json"
    file.write_text(text)
    _assert_refused(*_run(["diff", str(file), str(SAMPLE)], capsys), file, METRIC + "peak_allocated_bytes", word)
    text = json.dumps(report).replace(f'"peak_allocated_bytes": {PEAK}', f'"peak_allocated_bytes": {token}', 1)
    file = tmp_path / "report.json"
    file.write_text(text)
    _assert_refused(*_run(["suggest", str(file)], capsys), file, REPORT_METRIC + "peak_allocated_bytes", word)


@pytest.mark.parametrize("kind", ["baseline", "saved_run", "report"])
@pytest.mark.parametrize("cut", [0.1, 0.5, 0.99])
def test_a_truncated_file_is_exit_2(kind: str, cut: float, baseline: dict[str, Any], saved_run: dict[str, Any],
                                    report: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = json.dumps({"baseline": baseline, "saved_run": saved_run, "report": report}[kind], indent=1)
    file = tmp_path / "run.json"
    file.write_text(text[: int(len(text) * cut)])
    for args in (["suggest", str(file)], ["diff", str(file), str(SAMPLE)], ["diff", str(SAMPLE), str(file)]):
        code, err = _run(args, capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith(f"memgate: error: {file}:"), err
        assert "invalid JSON" in err[0] and "truncated" in err[0]


def test_a_duplicate_key_is_refused(baseline: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = json.dumps(baseline).replace(f'"peak_allocated_bytes": {PEAK}',
                                        f'"peak_allocated_bytes": {PEAK}, "peak_allocated_bytes": 1', 1)
    file = tmp_path / "base.json"
    file.write_text(text)
    _assert_refused(*_run(["diff", str(file), str(SAMPLE)], capsys), file, METRIC + "peak_allocated_bytes", "twice")


REPORT_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str, str]] = [
    ("metric_string", lambda d: d["profiles"][0]["devices"][0]["metrics"].__setitem__("leaked_bytes", "x"),
     REPORT_METRIC + "leaked_bytes", "string"),
    ("metric_negative", lambda d: d["profiles"][0]["devices"][0]["metrics"].__setitem__("peak_allocated_bytes", -1),
     REPORT_METRIC + "peak_allocated_bytes", "out of range"),
    ("top_size_huge", lambda d: d["profiles"][0]["devices"][0]["metrics"]["top_at_peak"][0].__setitem__("size", 2**64),
     REPORT_METRIC + "top_at_peak[0].size", "2**56"),
    ("devices_object", lambda d: d["profiles"][0].__setitem__("devices", {}), "profiles[0].devices", "object"),
    ("missing_metric", lambda d: d["profiles"][0]["devices"][0]["metrics"].pop("fragmentation"),
     REPORT_METRIC.rstrip("."), "fragmentation"),
    ("pool_ratio", lambda d: next(iter(d["profiles"][0]["devices"][0]["pools"].values())).__setitem__(
        "fragmentation", 2.0), "profiles[0].devices[0].pools", "ratio"),
]


@pytest.mark.parametrize(("name", "edit", "where", "word"), REPORT_CASES, ids=[c[0] for c in REPORT_CASES])
def test_a_corrupted_json_report_is_exit_2_naming_file_and_json_path(
        name: str, edit: Callable[[dict[str, Any]], None], where: str, word: str, report: dict[str, Any],
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(json.dumps(report))
    edit(doc)
    file = tmp_path / f"{name}.json"
    file.write_text(json.dumps(doc))
    for args in (["suggest", str(file)], ["diff", str(file), str(SAMPLE)], ["diff", str(SAMPLE), str(file)]):
        code, err = _run(args, capsys)
        assert code == 2 and len(err) == 1, err
        assert err[0].startswith(f"memgate: error: {file}:") and where in err[0] and word in err[0], err
    with pytest.raises(InputError):
        load_report(file)
    with pytest.raises(InputError):
        load_baseline(file)  # a report given as a baseline is checked as a report


def test_real_outputs_read_back_unchanged(report: dict[str, Any], baseline: dict[str, Any], saved_run: dict[str, Any],
                                         tmp_path: Path) -> None:
    for name, doc in (("report", report), ("baseline", baseline), ("run", saved_run)):
        file = tmp_path / f"{name}.json"
        file.write_text(json.dumps(doc))
        entries = load_entries(file)
        assert entries[0]["devices"][0]["metrics"]["peak_allocated_bytes"] == PEAK
    assert load_report(tmp_path / "report.json") == report
    assert load_baseline(tmp_path / "baseline.json") == baseline


FUTURE = "99.0.0"


@pytest.mark.parametrize(("edit", "where", "words"), [
    (lambda d: d.__setitem__("memgate_version", FUTURE), "memgate_version",
     [f"written by memgate {FUTURE}, newer than this memgate {__version__}: upgrade"]),
    (lambda d: d.__setitem__("memgate_baseline", 2), "memgate_baseline", ["layout 2", "newer", "upgrade"]),
    (lambda d: d.__setitem__("memgate_baseline", 0), "memgate_baseline", ["unknown baseline layout", "layout 1"]),
    (lambda d: d["memgate_run"].__setitem__("layout", 7), "memgate_run.layout", ["saved-run layout 7", "upgrade"]),
    (lambda d: d["memgate_run"].__setitem__("layout", 0), "memgate_run.layout", ["unknown saved-run layout"]),
], ids=["version", "baseline_layout", "old_baseline_layout", "run_layout", "old_run_layout"])
def test_a_version_from_the_future_or_an_unknown_layout_is_named(
        edit: Callable[[dict[str, Any]], None], where: str, words: list[str], saved_run: dict[str, Any],
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(json.dumps(saved_run))
    edit(doc)
    file = tmp_path / "run.json"
    file.write_text(json.dumps(doc))
    code, err = _run(["diff", str(file), str(SAMPLE)], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(f"memgate: error: {file}:") and where in err[0], err
    for word in words:
        assert word in err[0], err


def test_a_report_from_a_newer_memgate_is_named(report: dict[str, Any], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    file = tmp_path / "report.json"
    file.write_text(json.dumps({**report, "memgate_version": FUTURE}))
    code, err = _run(["suggest", str(file)], capsys)
    assert code == 2 and err == [(f"memgate: error: {file}: column 'memgate_version': written by memgate {FUTURE}, newer "
                                 f"than this memgate {__version__}: upgrade memgate to read this JSON report; expected "
                                 f"a JSON report of memgate {__version__} or older, found '{FUTURE}'")]


# ---- pytest: the error item names the baseline file ----------------------------------------------


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makefile(".toml", memgate=BASE_AND_HEAVY_BUDGETS)
    base_and_heavy(pytester.path)
    return pytester


@pytest.mark.parametrize(("content", "where"), [
    (lambda b: b["profiles"]["0"]["devices"]["npu:0"]["metrics"].__setitem__("peak_allocated_bytes", "12"),
     METRIC + "peak_allocated_bytes"),
    (lambda b: b["profiles"]["0"].__setitem__("devices", []), 'profiles["0"].devices'),
    (lambda b: b.__setitem__("memgate_version", FUTURE), "memgate_version"),
], ids=["string", "devices_list", "future"])
def test_pytest_error_item_names_the_baseline_file(project: pytest.Pytester, content: Callable[[dict[str, Any]], None],
                                                   where: str) -> None:
    project.runpytest("--memgate=base", "--memgate-save-baseline=good.json").assert_outcomes(passed=1)
    doc = json.loads((project.path / "good.json").read_text())
    content(doc)
    (project.path / "bad.json").write_text(json.dumps(doc))
    result = project.runpytest("--memgate=heavy", "--memgate-baseline=bad.json", "--memgate-compare-fail=peak_allocated:5%")
    result.assert_outcomes(passed=1, errors=1)
    text = result.stdout.str()
    assert "bad.json" in text and where in text
    assert "TypeError" not in text and "INTERNALERROR" not in text


def test_pytest_saved_run_that_is_truncated_is_an_error_naming_it(project: pytest.Pytester) -> None:
    project.runpytest("--memgate=base", "--memgate-autosave").assert_outcomes(passed=1)
    (run,) = (project.path / ".memgate").rglob("0001_*.json")
    run.write_text(run.read_text()[:200])
    result = project.runpytest("--memgate=heavy", "--memgate-compare", "--memgate-compare-fail=peak_allocated:5%")
    result.assert_outcomes(passed=1, errors=1)
    assert run.name in result.stdout.str() and "truncated" in result.stdout.str()
    assert "INTERNALERROR" not in result.stdout.str()


# ---- the profile cache: a tampered entry is a miss, never a crash or a wrong number --------------


def _cached(tmp_path: Path) -> tuple[ProfileCache, Any, Path, int]:
    (found,) = discover(SAMPLE)
    store = ProfileCache(tmp_path / "cache")
    truth = profile_metrics(load(found))[0].values["peak_allocated_bytes"]
    assert open_profile(found, store).get()[0].values["peak_allocated_bytes"] == truth  # stores the entry and result
    (entry,) = [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".")]
    assert list(entry.glob("metrics-*.json"))
    return store, found, entry, int(truth)


RESULT_TAMPERING: dict[str, Callable[[str], str]] = {
    "bad_json": lambda t: t[: len(t) // 2],
    "huge_number": lambda t: t.replace(f'"peak_allocated_bytes": {PEAK}', '"peak_allocated_bytes": 1' + "0" * 30),
    "negative": lambda t: t.replace(f'"peak_allocated_bytes": {PEAK}', '"peak_allocated_bytes": -5'),
    "string": lambda t: t.replace(f'"peak_allocated_bytes": {PEAK}', '"peak_allocated_bytes": "5"'),
    "nan": lambda t: t.replace('"fragmentation": 0.', '"fragmentation": NaN, "x": 0.', 1),
    "ratio": lambda t: t.replace('"fragmentation": 0.', '"fragmentation": 7.', 1),
    "devices_dict": lambda t: t.replace('"devices": [', '"devices": {"a": [', 1).replace("]}", "]}}", 1),
}


@pytest.mark.parametrize("how", list(RESULT_TAMPERING))
def test_a_tampered_cached_result_is_computed_again(tmp_path: Path, how: str) -> None:
    store, found, entry, truth = _cached(tmp_path)
    (result,) = entry.glob("metrics-*.json")
    text = result.read_text()
    tampered = RESULT_TAMPERING[how](text)
    assert tampered != text
    result.write_text(tampered)
    assert open_profile(found, store).get()[0].values["peak_allocated_bytes"] == truth


MANIFEST_TAMPERING: dict[str, Callable[[dict[str, Any]], None]] = {
    "info_steps_huge": lambda m: m["info"].__setitem__("steps", [{"step": 10**30, "t_start_ns": 0, "t_end_ns": 1}]),
    "info_path_int": lambda m: m["info"].__setitem__("path", 7),
    "info_list": lambda m: m.__setitem__("info", []),
    "profile_rank_int": lambda m: m["profile"].__setitem__("rank", 3),
    "requested_peak_huge": lambda m: m["profile"]["devices"][0].__setitem__("requested_peak", 2**70),
    "metadata_not_json": lambda m: m["profile"].__setitem__("metadata", "{"),
    "devices_text": lambda m: m["profile"].__setitem__("devices", "x"),
}


@pytest.mark.parametrize("how", list(MANIFEST_TAMPERING))
def test_a_tampered_cache_manifest_is_a_miss(tmp_path: Path, how: str) -> None:
    store, found, entry, truth = _cached(tmp_path)
    for result in entry.glob("metrics-*.json"):
        result.unlink()  # the profile itself is read back
    manifest = entry / "manifest.json"
    doc = json.loads(manifest.read_text())
    MANIFEST_TAMPERING[how](doc)
    manifest.write_text(json.dumps(doc))
    profile = store.get(found)
    assert profile is None or profile_metrics(profile)[0].values["peak_allocated_bytes"] == truth
    assert open_profile(found, store).get()[0].values["peak_allocated_bytes"] == truth


def test_a_manifest_with_nan_is_a_miss(tmp_path: Path) -> None:
    store, found, entry, truth = _cached(tmp_path)
    manifest = entry / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"created": ', '"created": NaN, "was": ', 1))
    assert store.get(found) is None
    assert open_profile(found, store).get()[0].values["peak_allocated_bytes"] == truth

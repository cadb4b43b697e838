"""Baselines, regression rules, CI outputs (pytester), and the pure comparison functions."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from decimal import Decimal
from pathlib import Path

import pytest
from scale import scaled_copy

from memgate.compare import CompareRule, parse_rule
from memgate.errors import ConfigError

EXAMPLE = Path(__file__).parents[1] / "examples" / "profiles" / "alexnet_3016828_20250109_ascend_pt"
BUDGETS = '[[budgets]]\nname = "train"\npeak_allocated = "4 GiB"\n'
PEAK = 1322299392  # the example's peak allocated (PTA+GE), see tests/test_samples_torch_npu.py


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makefile(".toml", memgate=BUDGETS)
    (pytester.path / "base").mkdir()
    scaled_copy(EXAMPLE, pytester.path / "base" / "run_ascend_pt", 1.0)
    (pytester.path / "heavy").mkdir()
    scaled_copy(EXAMPLE, pytester.path / "heavy" / "run_ascend_pt", 1.10)
    return pytester


def _save(p: pytest.Pytester, root: str = "base", *extra: str) -> dict:
    p.runpytest(f"--memgate={root}", "--memgate-save-baseline=baseline.json", *extra).assert_outcomes(passed=1)
    return json.loads((p.path / "baseline.json").read_text())


def test_scaled_copy_is_exact(project: pytest.Pytester) -> None:
    from memgate.discover import discover, load
    from memgate.metrics import profile_metrics

    base = profile_metrics(load(discover(project.path / "base")[0]))[0].values["peak_allocated_bytes"]
    heavy = profile_metrics(load(discover(project.path / "heavy")[0]))[0].values["peak_allocated_bytes"]
    assert base == PEAK
    assert abs(heavy - PEAK * 1.1) <= 2048  # each KB value rounded to a whole KB


def test_saved_baseline_holds_metrics_and_comparability_key(project: pytest.Pytester) -> None:
    baseline = _save(project)
    assert baseline["memgate_baseline"] == 1
    rank0 = baseline["profiles"]["0"]
    assert rank0["key"] == {"format": "torch_npu", "device_type": "npu"}
    assert rank0["devices"]["npu:0"]["metrics"]["peak_allocated_bytes"] == PEAK


def test_unchanged_run_passes_heavier_run_fails_everywhere(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    _save(project)
    args = ["--memgate-baseline=baseline.json", "--memgate-compare-fail=peak_allocated:5%", "--junitxml=junit.xml"]
    project.runpytest("--memgate=base", *args).assert_outcomes(passed=2)

    summary = project.path / "step_summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = project.runpytest("--memgate=heavy", *args)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*peak_allocated 1.35 GiB exceeds baseline 1.23 GiB by 126.1? MiB (+10.0%), allowed +5% — rank 0 npu:0*",
        "::error title=memgate baseline%3A%3Apeak_allocated (rank 0)::peak_allocated 1.35 GiB exceeds baseline*",
    ])
    failures = ET.parse(project.path / "junit.xml").findall(".//testcase/failure")
    assert len(failures) == 1 and failures[0].get("message", "").startswith("peak_allocated 1.35 GiB exceeds baseline")
    table = summary.read_text()
    assert "| ❌ FAIL | 0 | npu:0 | baseline | `peak_allocated` |" in table
    assert "| ✅ pass | 0 | npu:0 | train | `peak_allocated` |" in table


@pytest.mark.parametrize(
    ("rule", "passes"),
    [
        ("peak_allocated:10.5%", True),
        ("peak_allocated:9.5%", False),
        ("peak_allocated:+256MiB", True),
        ("peak_allocated:+64MiB", False),
        ("peak_allocated:5%+256MiB", True),  # only the relative allowance is exceeded
        ("peak_allocated:5%+64MiB", False),  # both exceeded
    ],
)
def test_rule_boundaries(project: pytest.Pytester, rule: str, passes: bool) -> None:
    _save(project)
    result = project.runpytest("--memgate=heavy", "--memgate-baseline=baseline.json", f"--memgate-compare-fail={rule}")
    result.assert_outcomes(passed=2 if passes else 1, failed=0 if passes else 1)


@pytest.mark.parametrize(("policy", "outcome"), [("skip", {"skipped": 1}), ("warn", {"passed": 1, "warnings": 1}),
                                                 ("fail", {"errors": 1})])
def test_missing_baseline_policy(project: pytest.Pytester, policy: str, outcome: dict) -> None:
    result = project.runpytest("--memgate=base", "--memgate-baseline=nope.json",
                               "--memgate-compare-fail=peak_allocated:5%", f"--memgate-baseline-missing={policy}", "-rs")
    result.assert_outcomes(passed=1 + outcome.get("passed", 0), skipped=outcome.get("skipped", 0),
                           errors=outcome.get("errors", 0), warnings=outcome.get("warnings", 0))
    result.stdout.fnmatch_lines(["*nope.json does not exist*"])


def test_missing_policy_ini_twin(project: pytest.Pytester) -> None:
    project.makeini("[pytest]\nmemgate_baseline = nope.json\nmemgate_compare_fail =\n    peak_allocated:5%\n"
                    "    peak_reserved:5%\nmemgate_baseline_missing = skip\n")
    project.runpytest("--memgate=base").assert_outcomes(passed=1, skipped=2)


def test_incomparable_baseline_is_an_error_naming_what_differs(project: pytest.Pytester) -> None:
    _save(project)
    info = project.path / "heavy" / "run_ascend_pt" / "profiler_info_0.json"
    data = json.loads(info.read_text())
    data["torch_npu_version"] = "2.7.1"
    info.write_text(json.dumps(data))
    result = project.runpytest("--memgate=heavy", "--memgate-baseline=baseline.json", "--memgate-compare-fail=peak_allocated:5%")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*not comparable with the baseline (torch_npu_version: baseline None, now '2.7.1')*"])


def test_ratchet_keeps_the_smaller_value(project: pytest.Pytester) -> None:
    _save(project)
    project.runpytest("--memgate=heavy", "--memgate-save-baseline=baseline.json", "--memgate-ratchet").assert_outcomes(passed=1)
    ratcheted = json.loads((project.path / "baseline.json").read_text())
    assert ratcheted["profiles"]["0"]["devices"]["npu:0"]["metrics"]["peak_allocated_bytes"] == PEAK
    project.runpytest("--memgate=heavy", "--memgate-save-baseline=baseline.json").assert_outcomes(passed=1)
    plain = json.loads((project.path / "baseline.json").read_text())
    assert plain["profiles"]["0"]["devices"]["npu:0"]["metrics"]["peak_allocated_bytes"] > PEAK


def test_a_json_report_works_as_a_baseline(project: pytest.Pytester) -> None:
    project.runpytest("--memgate=base", "--memgate-json=report.json").assert_outcomes(passed=1)
    result = project.runpytest("--memgate=heavy", "--memgate-baseline=report.json", "--memgate-compare-fail=peak_allocated:5%")
    result.assert_outcomes(passed=1, failed=1)


def test_benchmark_export(project: pytest.Pytester) -> None:
    project.runpytest("--memgate=base", "--memgate-benchmark-json=bench.json").assert_outcomes(passed=1)
    records = json.loads((project.path / "bench.json").read_text())
    by_name = {r["name"]: r for r in records}
    assert by_name["rank 0 npu:0 peak_allocated"] == {
        "name": "rank 0 npu:0 peak_allocated", "unit": "bytes", "value": PEAK, "extra": by_name["rank 0 npu:0 peak_allocated"]["extra"]}
    assert by_name["rank 0 npu:0 fragmentation"]["unit"] == "ratio"


def test_compare_rule_without_baseline_is_a_usage_error(project: pytest.Pytester) -> None:
    result = project.runpytest("--memgate=base", "--memgate-compare-fail=peak_allocated:5%")
    assert result.ret == pytest.ExitCode.USAGE_ERROR


# ---- pure functions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "percent", "absolute"),
    [
        ("peak_allocated:5%", Decimal(5), None),
        ("peak_allocated:+256MiB", None, 256 << 20),
        ("peak_allocated:2.5%+256MiB", Decimal("2.5"), 256 << 20),
        ("fragmentation:+0.02", None, 0.02),
        ("leaked:0.5%", Decimal("0.5"), None),
    ],
)
def test_parse_rule(text: str, percent: Decimal | None, absolute: float | None) -> None:
    rule = parse_rule(text)
    assert (rule.percent, rule.absolute) == (percent, absolute)


@pytest.mark.parametrize("text", ["peak_allocated", "peak_allocated:", "peak:5%", "peak_allocated:5", "peak_allocated:+5 parsecs",
                                  "peak_allocated:5%%", "peak_allocated:-5%"])
def test_bad_rules_are_rejected(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_rule(text)


def test_allowed_is_exact_for_bytes() -> None:
    rule = CompareRule("peak_allocated", Decimal("2.5"), 256 << 20, "x")
    assert rule.allowed(1000) == 1000 + (256 << 20)
    assert CompareRule("peak_allocated", Decimal("2.5"), None, "x").allowed(1000) == 1025
    assert CompareRule("peak_allocated", Decimal("2.5"), None, "x").allowed(999) == 1023  # floor of 1023.975

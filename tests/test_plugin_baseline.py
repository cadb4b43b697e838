"""The plugin with a baseline (pytester): saving one, compare rules and CI outputs through pytest, and a baseline of
an older memgate. (memgate.baselines, the baseline documents themselves: tests/test_baselines.py.)"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from scale import BASE_AND_HEAVY_BUDGETS, base_and_heavy

from memgate.compare import parse_rule
from memgate.errors import ConfigError

BUDGETS = BASE_AND_HEAVY_BUDGETS
PEAK = 1322299392  # the example's peak allocated (PTA+GE), see tests/test_torch_npu.py


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makefile(".toml", memgate=BUDGETS)
    base_and_heavy(pytester.path)
    return pytester


def _save(p: pytest.Pytester, root: str = "base", *extra: str) -> dict[str, Any]:
    p.runpytest(f"--memgate={root}", "--memgate-save-baseline=baseline.json", *extra).assert_outcomes(passed=1)
    saved: dict[str, Any] = json.loads((p.path / "baseline.json").read_text())
    return saved


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
        ("::error title=memgate memgate%3A%3Arun_ascend_pt%3A%3Abaseline%3A%3Apeak_allocated::peak_allocated 1.35 "
        "GiB exceeds baseline*"),
    ])
    failures = ET.parse(project.path / "junit.xml").findall(".//testcase/failure")
    assert len(failures) == 1 and failures[0].get("message", "").startswith("peak_allocated 1.35 GiB exceeds baseline")
    table = summary.read_text()
    assert table.startswith("### memgate: 1 failed, 1 passed (2 checks)\n")
    assert ("| ❌ FAIL | `memgate::run_ascend_pt::baseline::peak_allocated` | 0 | npu:0 | baseline | "
            "`peak_allocated` |") in table
    assert "| ✅ pass | `memgate::run_ascend_pt::train::peak_allocated` | 0 | npu:0 | train | `peak_allocated` |" in table


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
def test_missing_baseline_policy(project: pytest.Pytester, policy: str, outcome: dict[str, int]) -> None:
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


# ---- every LIMITS metric: baselines, rules, CI outputs ------------------------------------------

RESERVED = 1600913408  # the example's peak reserved (PTA+GE)
# A baseline as memgate saved it before the per-pool metrics: no external_fragmentation, no
# leak_undetermined, no snapshot pool state, no pool_of; fragmentation of the combined series.
OLD_BASELINE: dict[str, Any] = {
    "memgate_baseline": 1,
    "memgate_version": "0.1.0",
    "profiles": {"0": {
        "path": "base/run_ascend_pt",
        "key": {"format": "torch_npu", "device_type": "npu"},
        "devices": {"npu:0": {"metrics": {
            "peak_allocated_bytes": PEAK, "peak_reserved_bytes": RESERVED, "peak_app_reserved_bytes": 2216407040,
            "fragmentation": 1 - PEAK / RESERVED, "step_growth_bytes": None, "leaked_bytes": None,
            "op_max_block_bytes": {"aten::mm": 150995456},
        }}},
    }},
}


def test_saved_baseline_holds_every_metric_and_the_pools(project: pytest.Pytester) -> None:
    from memgate.budgets import LIMITS

    device = _save(project)["profiles"]["0"]["devices"]["npu:0"]
    assert {key for key, _ in LIMITS.values()} <= set(device["metrics"])
    assert device["metrics"]["external_fragmentation"] == 0.0
    assert device["metrics"]["leak_undetermined_bytes"] is None  # not measurable here, stored as such
    assert "top_at_peak" not in device["metrics"]
    assert device["pool_of"] == {"fragmentation": "PTA"}  # external_fragmentation is 0 in every pool: none named


def test_rules_on_new_metrics_compare_against_a_new_baseline(project: pytest.Pytester) -> None:
    _save(project)
    result = project.runpytest("--memgate=heavy", "--memgate-baseline=baseline.json",
                               "--memgate-compare-fail=external_fragmentation:+0.01",
                               "--memgate-compare-fail=fragmentation:+0.001", "-v")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*::baseline::external_fragmentation PASSED*", "*::baseline::fragmentation PASSED*"])


def test_old_baseline_still_compares_on_the_keys_it_has(project: pytest.Pytester) -> None:
    (project.path / "old.json").write_text(json.dumps(OLD_BASELINE))
    result = project.runpytest("--memgate=heavy", "--memgate-baseline=old.json",
                               "--memgate-compare-fail=peak_allocated:5%",
                               "--memgate-compare-fail=external_fragmentation:+0.01")
    # peak_allocated is judged (and fails: +10%); external_fragmentation is not in the old file:
    # nothing compared, under the missing-baseline policy (default: warn), no crash
    result.assert_outcomes(passed=2, failed=1, warnings=1)
    result.stdout.fnmatch_lines([("*peak_allocated 1.35 GiB exceeds baseline 1.23 GiB by 126.1? MiB (+10.0%), allowed "
                                 "+5% — rank 0 npu:0*"), "*nothing compared*"])
    skipped = project.runpytest("--memgate=base", "--memgate-baseline=old.json",
                                "--memgate-compare-fail=peak_allocated:5%",
                                "--memgate-compare-fail=leak_undetermined:+1MiB", "--memgate-baseline-missing=skip")
    skipped.assert_outcomes(passed=2, skipped=1)


def test_old_baseline_in_memgate_diff(project: pytest.Pytester, capsys: pytest.CaptureFixture[str]) -> None:
    from memgate.cli import main

    old = project.path / "old.json"
    old.write_text(json.dumps(OLD_BASELINE))
    heavy = str(project.path / "heavy")
    assert main(["diff", str(old), heavy]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  external_fragmentation              - ->        0.000  (not in the base)" in out
    assert any(line.startswith("  peak_allocated               1.23 GiB ->     1.35 GiB  +126.1") for line in out)
    assert main(["diff", str(old), heavy, "--fail", "peak_allocated:5%"]) == 1
    assert main(["diff", str(old), heavy, "--fail", "external_fragmentation:+0.01"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "memgate: error: rank 0: the baseline has no external_fragmentation (saved by a memgate that did not measure "
        "it); nothing compared — save a new baseline to compare external_fragmentation")


def test_old_baseline_pure_compare() -> None:
    from memgate.compare import MetricNotInBaseline, compare_entry

    entry = {"rank": "0", "format": "torch_npu", "path": "p", "devices": [
        {"device": "npu:0", "metrics": {**OLD_BASELINE["profiles"]["0"]["devices"]["npu:0"]["metrics"],
                                        "external_fragmentation": 0.25, "peak_allocated_bytes": PEAK + 1},
         "pool_of": {"external_fragmentation": "GE", "fragmentation": "PTA"}}]}
    ok = compare_entry(entry, OLD_BASELINE, parse_rule("peak_allocated:+1"))
    assert ok.passed and ok.message == (
        "peak_allocated 1.23 GiB vs baseline 1.23 GiB: +1 B (+0.0%), allowed +1 B — rank 0 npu:0")
    frag = compare_entry(entry, OLD_BASELINE, parse_rule("fragmentation:+0.01"))
    assert frag.passed and frag.pool == "PTA" and frag.base_pool is None
    assert frag.message.endswith("— rank 0 npu:0, pool PTA")
    with pytest.raises(MetricNotInBaseline) as info:
        compare_entry(entry, OLD_BASELINE, parse_rule("external_fragmentation:+0.01"))
    # a ConfigError (the CLI exits 2), not a KeyError: the plugin catches it by name for its missing-baseline policy
    assert isinstance(info.value, ConfigError) and not isinstance(info.value, KeyError)


def test_compare_fail_ini_twin_with_new_metrics(project: pytest.Pytester) -> None:
    _save(project)
    project.makeini("[pytest]\nmemgate_baseline = baseline.json\nmemgate_compare_fail =\n"
                    "    leak_undetermined:+1MiB\n    external_fragmentation:+0.01\n")
    # leak_undetermined is measured in neither run of this one-step profile: an error naming it
    result = project.runpytest("--memgate=heavy")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*rank 0: leak_undetermined is measured in neither run on a common device*"])


NEW_METRIC_BUDGETS = ('[[budgets]]\nname = "train"\npeak_allocated = "4 GiB"\nfragmentation = 0.5\n'
                      "external_fragmentation = 0.05\n")


def test_junit_units_and_step_summary_for_ratio_metrics(project: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    project.makefile(".toml", memgate=NEW_METRIC_BUDGETS)
    summary = project.path / "step_summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    project.runpytest("--memgate=base", "--junitxml=junit.xml").assert_outcomes(passed=3)
    props = {p.get("name"): p.get("value") for p in ET.parse(project.path / "junit.xml").iter("property")}
    assert props["memgate.peak_allocated.unit"] == "bytes"
    assert props["memgate.fragmentation.unit"] == "ratio"
    assert props["memgate.external_fragmentation.unit"] == "ratio"
    assert props["memgate.external_fragmentation.measured"] == "0.0"
    table = summary.read_text()
    assert ("| ✅ pass | `memgate::run_ascend_pt::train::external_fragmentation` | 0 | npu:0 | train | "
            "`external_fragmentation` | 0.000 | 0.050 |") in table
    assert ("| ✅ pass | `memgate::run_ascend_pt::train::fragmentation` | 0 | npu:0 | train | `fragmentation` | "
            "0.182 | 0.500 |") in table


def test_benchmark_export_has_the_new_metrics(project: pytest.Pytester) -> None:
    project.runpytest("--memgate=base", "--memgate-benchmark-json=bench.json").assert_outcomes(passed=1)
    by_name = {r["name"]: r for r in json.loads((project.path / "bench.json").read_text())}
    assert by_name["rank 0 npu:0 external_fragmentation"]["unit"] == "ratio"
    assert by_name["rank 0 npu:0 external_fragmentation"]["value"] == 0.0
    assert "rank 0 npu:0 leak_undetermined" not in by_name  # not measurable: no record

"""The pytest plugin, driven through pytester: options and their ini twins, items, markers, reports."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from memgate.schemas import load_schema

SAMPLE = Path(__file__).parent / "data" / "samples" / "ascend" / "msinsight_pta21_level1_rank0"
# Derived from the raw memory_record.csv (max PTA+GE Total Allocated / Reserved * 2**20), checked
# independently in tests/test_samples_torch_npu.py.
PEAK_ALLOCATED = 1322299392
PEAK_RESERVED = 1600913408

BUDGETS = """
[[budgets]]
name = "train"
peak_allocated = {alloc}
peak_reserved = "2 GiB"
"""


def _budget_file(pytester: pytest.Pytester, alloc: str | int = '"2 GiB"', name: str = "memgate.toml") -> Path:
    return pytester.makefile(".toml", **{name.removesuffix(".toml"): BUDGETS.format(alloc=alloc)})


@pytest.mark.parametrize(
    ("limit", "passes"),
    [(PEAK_ALLOCATED, True), (PEAK_ALLOCATED - 1, False), (PEAK_ALLOCATED + 1, True)],
    ids=["exactly-at-limit", "one-byte-over", "one-byte-under"],
)
def test_budget_boundary(pytester: pytest.Pytester, limit: int, passes: bool) -> None:
    _budget_file(pytester, alloc=limit)
    result = pytester.runpytest(f"--memgate={SAMPLE}")
    if passes:
        result.assert_outcomes(passed=2)
    else:
        result.assert_outcomes(passed=1, failed=1)
        result.stdout.fnmatch_lines(["*peak_allocated 1.23 GiB exceeds budget 1.23 GiB by 1 B (+0.0%) — rank 0 npu:0*"])


def test_failure_line_and_summary_table(pytester: pytest.Pytester) -> None:
    _budget_file(pytester, alloc='"1 GiB"')
    result = pytester.runpytest(f"--memgate={SAMPLE}", "-rf")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*peak_allocated 1.23 GiB exceeds budget 1.00 GiB by 237.04 MiB (+23.1%) — rank 0 npu:0",
        "*top * live blocks at the peak (npu:0):",
        "*144.00 MiB  aten::mm*",
        "*= memgate =*",
        "rank*budget*metric*measured*limit*result*",
        "0 npu:0*train*peak_allocated*1.23 GiB*1.00 GiB*FAIL*",
        "0 npu:0*train*peak_reserved*1.49 GiB*2.00 GiB*pass*",
    ])
    assert "INTERNALERROR" not in result.stdout.str()


def test_item_ids_name_profile_budget_metric(pytester: pytest.Pytester) -> None:
    _budget_file(pytester)
    result = pytester.runpytest(f"--memgate={SAMPLE}", "--collect-only", "-q")
    result.stdout.fnmatch_lines([
        "*memgate::msinsight_pta21_level1_rank0::train::peak_allocated",
        "*memgate::msinsight_pta21_level1_rank0::train::peak_reserved",
    ])


@pytest.mark.parametrize("where", ["memgate.toml", "pyproject.toml", "--memgate-budgets", "ini memgate_budgets"])
def test_budget_file_locations(pytester: pytest.Pytester, where: str) -> None:
    body = BUDGETS.format(alloc='"1 GiB"')
    args = [f"--memgate={SAMPLE}"]
    if where == "memgate.toml":
        pytester.makefile(".toml", memgate=body)
    elif where == "pyproject.toml":
        pytester.makepyprojecttoml(body.replace("[[budgets]]", "[[tool.memgate.budgets]]"))
    elif where == "--memgate-budgets":
        pytester.makefile(".toml", team_budgets=body)
        args.append("--memgate-budgets=team_budgets.toml")
    else:
        pytester.makefile(".toml", team_budgets=body)
        pytester.makeini("[pytest]\nmemgate_budgets = team_budgets.toml\n")
    pytester.runpytest(*args).assert_outcomes(passed=1, failed=1)


def test_ini_twin_of_memgate_path_and_json(pytester: pytest.Pytester) -> None:
    _budget_file(pytester)
    pytester.makeini(f"[pytest]\nmemgate = {SAMPLE}\nmemgate_json = out/report.json\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=2)
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    jsonschema.validate(report, load_schema("report.schema".removesuffix(".schema")))


def test_command_line_wins_over_ini(pytester: pytest.Pytester, tmp_path: Path) -> None:
    _budget_file(pytester)
    pytester.makeini("[pytest]\nmemgate = does-not-exist\nmemgate_json = ini.json\n")
    result = pytester.runpytest(f"--memgate={SAMPLE}", "--memgate-json=cli.json")
    result.assert_outcomes(passed=2)
    assert (pytester.path / "cli.json").exists() and not (pytester.path / "ini.json").exists()


def test_bare_memgate_uses_profiles_from_budget_file(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", memgate=f'profiles = "{SAMPLE}"\n' + BUDGETS.format(alloc='"2 GiB"'))
    pytester.runpytest("--memgate").assert_outcomes(passed=2)


def test_json_report_contents(pytester: pytest.Pytester) -> None:
    _budget_file(pytester, alloc='"1 GiB"')
    pytester.runpytest(f"--memgate={SAMPLE}", "--memgate-json=report.json")
    report = json.loads((pytester.path / "report.json").read_text())
    jsonschema.validate(report, load_schema("report"))
    (profile,) = report["profiles"]
    assert profile["rank"] == "0"
    assert profile["devices"][0]["metrics"]["peak_allocated_bytes"] == PEAK_ALLOCATED
    verdicts = {(b["budget"], b["metric"]): (b["value"], b["limit"], b["passed"]) for b in report["budgets"]}
    assert verdicts[("train", "peak_allocated")] == (PEAK_ALLOCATED, 1 << 30, False)
    assert verdicts[("train", "peak_reserved")] == (PEAK_RESERVED, 2 << 30, True)


def test_junit_message_is_the_failure_line_and_properties_carry_numbers(pytester: pytest.Pytester) -> None:
    _budget_file(pytester, alloc='"1 GiB"')
    pytester.runpytest(f"--memgate={SAMPLE}", "--junitxml=junit.xml")
    tree = ET.parse(pytester.path / "junit.xml")
    failures = tree.findall(".//testcase/failure")
    assert len(failures) == 1
    assert failures[0].get("message") == (
        "peak_allocated 1.23 GiB exceeds budget 1.00 GiB by 237.04 MiB (+23.1%) — rank 0 npu:0"
    )
    props = {p.get("name"): p.get("value") for p in tree.findall(".//testcase/properties/property")}
    assert props["memgate.peak_allocated.measured"] == str(PEAK_ALLOCATED)
    assert props["memgate.peak_allocated.limit"] == str(1 << 30)
    assert props["memgate.peak_allocated.unit"] == "bytes"


@pytest.mark.parametrize("bad", ['"12 GB!"', '"12 parsecs"', '"-1 GiB"', '"1.5"', "true"])
def test_bad_size_in_budget_file_is_a_usage_error(pytester: pytest.Pytester, bad: str) -> None:
    _budget_file(pytester, alloc=bad)
    result = pytester.runpytest(f"--memgate={SAMPLE}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*memgate:*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_unknown_budget_key_is_rejected(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", memgate='[[budgets]]\nname = "x"\npeak_alocated = "1 GiB"\n')
    result = pytester.runpytest(f"--memgate={SAMPLE}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*peak_alocated*"])


def test_no_budgets_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest(f"--memgate={SAMPLE}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*no budgets are declared*"])


def test_missing_root_is_an_error_item(pytester: pytest.Pytester) -> None:
    _budget_file(pytester)
    result = pytester.runpytest("--memgate=nowhere")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*memgate: error: *nowhere: no such file or directory*"])


def test_not_measurable_metric_is_an_error_not_a_pass(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", memgate='[[budgets]]\nname = "leak"\nstep_growth = "1 MiB"\n')
    result = pytester.runpytest(f"--memgate={SAMPLE}")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*step_growth is not measurable*needs at least 5 counted steps*active=6*"])


# ---- markers -----------------------------------------------------------------------------------


def test_marker_with_profile_path(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.memgate(profile={str(SAMPLE)!r}, peak_allocated="2 GiB")
        def test_fits():
            pass

        @pytest.mark.memgate(profile={str(SAMPLE)!r}, peak_allocated="1 GiB", op_caps={{"aten::mm": "1 GiB"}})
        def test_too_big():
            pass
    """)
    result = pytester.runpytest("-rf")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*peak_allocated 1.23 GiB exceeds budget 1.00 GiB by 237.04 MiB (+23.1%) — rank 0 npu:0*",
    ])


def test_marker_with_profile_dir_fixture_is_gated_after_the_body(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"""
        import shutil
        import pytest

        @pytest.mark.memgate(peak_reserved="1 GiB")
        def test_writes_profile(memgate_profile_dir):
            shutil.copytree({str(SAMPLE)!r}, memgate_profile_dir / "run_ascend_pt")
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*peak_reserved 1.49 GiB exceeds budget 1.00 GiB*"])


def test_marker_body_failure_is_reported_as_is(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.memgate(profile={str(SAMPLE)!r}, peak_allocated="1 GiB")
        def test_body_fails():
            assert 1 == 2
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*assert 1 == 2*"])
    assert "exceeds budget" not in result.stdout.str()


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ('peak_allocated="2 GB!"', "*invalid marker.peak_allocated*"),
        ('peak_alocated="2 GiB"', "*unknown budget key*peak_alocated*"),
        ('"2 GiB"', "*keywords only*"),
        ("op_caps={'aten::mm': 'lots'}", "*invalid marker.op_caps*"),
        ("fragmentation=1.5", "*invalid marker.fragmentation*"),
    ],
)
def test_bad_marker_arguments_are_rejected_at_collection(pytester: pytest.Pytester, marker: str, message: str) -> None:
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.memgate({marker})
        def test_model(memgate_profile_dir):
            raise AssertionError("must not run")
    """)
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([message])
    assert "must not run" not in result.stdout.str()


def test_marker_without_profile_source_is_rejected(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.memgate(peak_allocated="2 GiB")
        def test_model():
            pass
    """)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*needs a profile*memgate_profile_dir*"])


def test_memgate_load_fixture(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"""
        def test_load(memgate_load):
            (profile,) = memgate_load({str(SAMPLE)!r})
            assert profile.format == "torch_npu" and profile.rank == "0"
            assert profile.devices[0].device == "npu:0"
    """)
    pytester.runpytest().assert_outcomes(passed=1)


# ---- xdist -------------------------------------------------------------------------------------


def test_xdist_gives_the_same_outcomes_and_one_report(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    root = pytester.mkdir("root")
    for rank in range(3):
        import shutil

        target = root / f"worker_{rank}_ascend_pt"
        shutil.copytree(SAMPLE, target)
        info = json.loads((target / "profiler_info_0.json").read_text())
        info["rank_id"] = rank
        (target / "profiler_info_0.json").write_text(json.dumps(info))
    _budget_file(pytester, alloc='"1 GiB"')
    serial = pytester.runpytest("--memgate=root", "--memgate-json=serial.json", "-p", "no:randomly")
    serial.assert_outcomes(passed=3, failed=3)
    parallel = pytester.runpytest_subprocess("--memgate=root", "--memgate-json=parallel.json", "-n", "2")
    parallel.assert_outcomes(passed=3, failed=3)
    parallel.stdout.fnmatch_lines(["*= memgate =*"])
    a = json.loads((pytester.path / "serial.json").read_text())
    b = json.loads((pytester.path / "parallel.json").read_text())
    assert a["budgets"] == b["budgets"]
    assert sorted(p["rank"] for p in b["profiles"]) == ["0", "1", "2"]
    assert a["profiles"] == b["profiles"]


@pytest.mark.parametrize(("verbosity", "shown"), [((), 5), (("-v",), 10)])
def test_detail_section_is_capped_and_verbosity_raises_the_cap(pytester: pytest.Pytester, verbosity: tuple[str, ...],
                                                                shown: int) -> None:
    _budget_file(pytester, alloc='"1 GiB"')
    result = pytester.runpytest(f"--memgate={SAMPLE}", *verbosity)
    result.stdout.fnmatch_lines([f"*top {shown} of 10 live blocks at the peak (npu:0):*"])
    holder_lines = [line for line in result.stdout.lines if line.startswith("  ") and "MiB  " in line]
    assert len(holder_lines) == shown

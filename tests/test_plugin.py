"""The pytest plugin, driven through pytester: options and their ini twins, items, markers, reports."""

from __future__ import annotations

import json
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest

from memgate.schemas import load_schema

SAMPLE = Path(__file__).parent / "data" / "samples" / "ascend" / "msinsight_pta21_level1_rank0"
# Derived from the raw memory_record.csv (max PTA+GE Total Allocated / Reserved * 2**20), checked
# independently in tests/test_torch_npu.py.
PEAK_ALLOCATED = 1322299392
RECORDING = Path(__file__).parent / "data" / "samples" / "torch_cuda" / "h200_record_leak"  # no rank in its name
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
        "*3 blocks = 223.63 MiB (largest 144.00 MiB)  aten::mm  stream*",
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


def test_a_marked_check_that_is_not_measurable_reads_error_everywhere(pytester: pytest.Pytester) -> None:
    """Not measurable is an error in the status line, the counts, the short summary and the table, as the
    same check of a budget file is; a budget exceeded in the same run stays a failure."""
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.memgate(profile={str(SAMPLE)!r}, step_growth="1 MiB")
        def test_growth():
            pass

        @pytest.mark.memgate(profile={str(SAMPLE)!r}, peak_allocated="1 GiB")
        def test_too_big():
            pass
    """)
    result = pytester.runpytest("-rA", "-vv")  # -vv (or CI set): pytest keeps the whole message in the summary
    result.assert_outcomes(errors=1, failed=1)
    result.stdout.fnmatch_lines([
        "*::test_growth ERROR*",
        "*::test_too_big FAILED*",
        "ERROR *::test_growth - memgate: error: *step_growth is not measurable*",
        "FAILED *::test_too_big - peak_allocated 1.23 GiB exceeds budget 1.00 GiB*",
    ])
    result.stdout.fnmatch_lines(["*step_growth * error *", "*1 failed, 1 error*"])


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


MARKED_ELSEWHERE = f"""
    import pytest

    @pytest.mark.memgate(profile={str(SAMPLE)!r}, devices="cuda:*", peak_allocated="1 MiB")
    def test_gpu():
        pass

    @pytest.mark.memgate(profile={str(SAMPLE)!r}, ranks="5", peak_allocated="1 MiB")
    def test_rank5():
        pass

    @pytest.mark.memgate(profile={str(SAMPLE)!r}, devices="npu:*", peak_allocated="2 GiB")
    def test_npu():
        pass
"""


def test_a_marker_that_selects_none_of_its_profiles_is_an_error(pytester: pytest.Pytester) -> None:
    """A marker for CUDA (or another rank) on an NPU profile of rank 0 judged nothing and passed."""
    pytester.makepyfile(MARKED_ELSEWHERE)
    result = pytester.runpytest("-rA", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=2, passed=1)
    result.stdout.fnmatch_lines([
        ("memgate: error: budget 'test_a_marker_that_selects_none_of_its_profiles_is_an_error.py::test_gpu': devices "
        "'cuda:*' selects no device of the test's profiles (they have npu:0); expected ranks and devices that select "
        "a device of the test's profiles, or --memgate-allow-unselected where they are optional"),
        "memgate: error: budget '*::test_rank5': ranks '5' selects no rank of the test's profiles (they have 0)*",
    ])
    result.stdout.fnmatch_lines(["*test_gpu*peak_allocated*error*", "*test_rank5*peak_allocated*error*"])


def test_allow_unselected_lets_a_marker_skip_its_checks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(MARKED_ELSEWHERE)
    result = pytester.runpytest("-rA", "-p", "no:cacheprovider", "--memgate-allow-unselected")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["*test_gpu*peak_allocated*not selected*", "*test_rank5*peak_allocated*not selected*"])


def test_a_budget_for_a_rank_only_the_load_tells_is_an_error_too(pytester: pytest.Pytester) -> None:
    """A recording's folder states no rank: its item is generated, and its setup finds the run has no rank 3."""
    shutil.copytree(RECORDING, pytester.path / "rec")
    pytester.makefile(".toml", memgate='[[budgets]]\nname = "r3"\nranks = "3"\npeak_allocated = "1 MiB"\n')
    result = pytester.runpytest("--memgate=rec", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["memgate: error: budget 'r3': ranks '3' selects no rank of the run (it has 0)*"])


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
        ('peak_allocated="2 GB!"', "invalid marker.peak_allocated '2 GB!'; expected a number with a unit in "),
        ('peak_alocated="2 GiB"', "unknown budget key 'peak_alocated' (did you mean 'peak_allocated'?)\n"),
        ('profle="prof"', "unknown budget key 'profle' (did you mean 'profile'?)\n"),
        ('"2 GiB"', "takes keywords only, got ('2 GiB',)\n"),
        ("op_caps={'aten::mm': 'lots'}", "invalid marker.op_caps['aten::mm'] 'lots'; expected a number"),
        ("fragmentation=1.5", "invalid marker.fragmentation 1.5; expected a ratio between 0 and 1\n"),
        ("profile=3, peak_allocated='1 GiB'", "invalid profile 3; expected a path (str or pathlib.Path)\n"),
    ],
)
def test_bad_marker_is_an_error_of_its_own_test_and_the_others_run(pytester: pytest.Pytester, marker: str,
                                                                     message: str) -> None:
    pytester.makepyfile(test_user_model=f"""
        import pytest

        @pytest.mark.memgate({marker})
        def test_model(memgate_profile_dir):
            raise AssertionError("must not run")

        def test_other():
            pass
    """)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, errors=1)
    # The test's file and the marker's line (3), the test's id, the key; at setup, before the body.
    result.stdout.fnmatch_lines(["*ERROR at setup of test_model*"])
    assert f"\nmemgate: error: test_user_model.py:3: memgate marker of test_user_model.py::test_model: {message}" in \
        result.stdout.str()
    assert "must not run" not in result.stdout.str()


def test_every_bad_marker_is_reported(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_two=f"""
        import pytest

        @pytest.mark.memgate(peak_alocated="2 GiB", profile={str(SAMPLE)!r})
        def test_a():
            pass

        @pytest.mark.memgate(step_grwth="2 GiB", profile={str(SAMPLE)!r})
        def test_b():
            pass

        @pytest.mark.memgate(peak_allocated="2 GiB", profile={str(SAMPLE)!r})
        def test_c():
            pass
    """)
    result = pytester.runpytest()
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines([("*test_two.py::test_a: unknown budget key 'peak_alocated' (did you mean "
                                 "'peak_allocated'?)")], consecutive=False)
    result.stdout.fnmatch_lines(["*test_two.py::test_b: unknown budget key 'step_grwth' (did you mean 'step_growth'?)"])


def test_each_bad_keyword_of_a_marker_is_its_own_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_kw=f"""
        import pytest

        @pytest.mark.memgate(peak_alocated="2 GiB", leakd=1, step_growth="64 XB", profile={str(SAMPLE)!r})
        def test_a():
            pass
    """)
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    at = "memgate: error: test_kw.py:3: memgate marker of test_kw.py::test_a:"
    result.stdout.fnmatch_lines([
        f"{at} unknown budget key 'peak_alocated' (did you mean 'peak_allocated'?)",
        "",
        f"{at} unknown budget key 'leakd' (did you mean 'leaked'?)",
        f"{at} invalid marker.step_growth '64 XB': unknown unit 'XB'; expected one of B, KiB, MiB, GiB, TiB *",
    ], consecutive=True)


def test_marker_without_profile_source_is_an_error_before_the_body(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.memgate(peak_allocated="2 GiB")
        def test_model():
            raise AssertionError("must not run")
    """)
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([("*memgate marker of *::test_model: needs a profile: use the memgate_record fixture "
                                 "(or memgate_profile_dir) or pass profile='path'")])
    assert "must not run" not in result.stdout.str()


def test_memgate_load_returns_metrics_for_assertions(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(f"""
        import pytest
        from memgate.errors import NotMeasurable

        def test_load(memgate_load):
            (m,) = memgate_load({str(SAMPLE)!r})
            assert (m.format, m.rank, [d.device for d in m.devices]) == ("torch_npu", "0", ["npu:0"])
            assert m["peak_allocated"] == m["peak_allocated_bytes"] == m.metrics["peak_allocated_bytes"] == {PEAK_ALLOCATED}
            assert m["peak_reserved"] == {PEAK_RESERVED}
            assert m.metrics["step_growth_bytes"] is None
            with pytest.raises(NotMeasurable, match="step_growth is not measurable: npu:0: needs at least 5"):
                m["step_growth"]
            assert m.profile.devices[0].device == "npu:0"  # the normalized model too
    """)
    pytester.runpytest().assert_outcomes(passed=1)


# ---- --help, --markers ---------------------------------------------------------------------------


def test_help_shows_every_option_with_a_help_line_and_a_metavar(pytester: pytest.Pytester) -> None:
    from memgate.plugin import OPTIONS

    result = pytester.runpytest("--help")
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    text = result.stdout.str()
    assert "memory budgets from profiler output:" in text  # the memgate group
    for opt in OPTIONS:
        if opt.metavar is None:
            assert opt.kind == "bool", opt  # only a flag takes no value
            shown = opt.flag
        else:
            shown = f"{opt.flag}=[{opt.metavar}]" if opt.optional_value else f"{opt.flag}={opt.metavar}"
        # the option, then its help on the same line or the next
        assert re.search(re.escape(shown) + r"(?![\w-])\s+" + re.escape(opt.help.split()[0]), text), shown
        assert re.search(rf"^  {opt.dest} \({opt.kind}\):", text, re.MULTILINE), opt.dest  # the ini twin
    assert "5%," in text  # a literal % in a help text (it once crashed argparse)


def test_markers_lists_the_memgate_marker(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--markers")
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["@pytest.mark.memgate(**limits): memory budget for this test's profile, e.g.*"])


# ---- marker results carry their test ------------------------------------------------------------


TWO_MARKED = f"""\
import shutil
import pytest

@pytest.mark.memgate(peak_allocated="2 GiB")
def test_fits(memgate_profile_dir):
    shutil.copytree({str(SAMPLE)!r}, memgate_profile_dir / "run_ascend_pt")

@pytest.mark.memgate(peak_allocated="1 GiB")
def test_too_big(memgate_profile_dir):
    shutil.copytree({str(SAMPLE)!r}, memgate_profile_dir / "run_ascend_pt")
"""


def test_two_marked_tests_are_two_rows_everywhere(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_user_model=TWO_MARKED)
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    result = pytester.runpytest("--memgate-json=report.json", "--junitxml=junit.xml", "--memgate-html=report.html")
    result.assert_outcomes(passed=1, failed=1)
    # the terminal table: one row per test, named by its node id
    result.stdout.fnmatch_lines(["*test_user_model.py::test_fits*peak_allocated*1.23 GiB*2.00 GiB*pass*"])
    result.stdout.fnmatch_lines(["*test_user_model.py::test_too_big*peak_allocated*1.23 GiB*1.00 GiB*FAIL*"])
    # the annotation: on the marker's line (4 and 8 of TWO_MARKED), titled with the test
    result.stdout.fnmatch_lines([
        ("::error file=test_user_model.py,line=8,title=memgate test_user_model.py%3A%3Atest_too_big peak_allocated::"
        "peak_allocated 1.23 GiB exceeds budget 1.00 GiB by 237.04 MiB (+23.1%25) — rank 0 npu:0")])
    assert sum(line.startswith("::error") for line in result.outlines) == 1
    # the JSON report: each row names its test; each test's profile is in it, with the test
    report = json.loads((pytester.path / "report.json").read_text())
    jsonschema.validate(report, load_schema("report"))
    rows = {b["test"]: (b["passed"], b["declared_in"]) for b in report["budgets"]}
    assert rows == {"test_user_model.py::test_fits": (True, {"file": "test_user_model.py", "line": 4}),
                    "test_user_model.py::test_too_big": (False, {"file": "test_user_model.py", "line": 8})}
    assert sorted(p["metadata"]["test"] for p in report["profiles"]) == ["test_user_model.py::test_fits",
                                                                        "test_user_model.py::test_too_big"]
    # JUnit: each testcase its own verdict and numbers
    cases = {c.get("name"): c for c in ET.parse(pytester.path / "junit.xml").iter("testcase")}
    failure = cases["test_too_big"].find("failure")
    assert failure is not None and failure.get("message", "").startswith("peak_allocated 1.23 GiB exceeds")
    assert cases["test_fits"].find("failure") is None
    limits = {name: {p.get("name"): p.get("value") for p in c.iter("property")}["memgate.peak_allocated.limit"]
              for name, c in cases.items()}
    assert limits == {"test_fits": str(2 << 30), "test_too_big": str(1 << 30)}
    # the step summary counts tests as pytest does, and names them
    table = summary.read_text()
    assert table.startswith("### memgate: 1 failed, 1 passed (2 checks)\n")
    assert "| ❌ FAIL | `test_user_model.py::test_too_big` | 0 | npu:0 | marker | `peak_allocated` | 1.23 GiB | 1.00 GiB |" in table
    assert "| ✅ pass | `test_user_model.py::test_fits` | 0 | npu:0 | marker | `peak_allocated` | 1.23 GiB | 2.00 GiB |" in table
    # the HTML: both recordings with their curves, rows and holders
    page = (pytester.path / "report.html").read_text()
    assert "2 profile(s)" in page and page.count("<svg") >= 2
    assert "test_user_model.py::test_fits" in page and "test_user_model.py::test_too_big" in page
    assert "aten::mm" in page  # a holder at the peak


def test_annotation_of_a_budget_file_check_is_on_its_key(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    _budget_file(pytester, alloc='"1 GiB"')  # makefile drops BUDGETS' leading newline: peak_allocated is line 3
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(pytester.path.parent))  # the repository: paths are relative to it
    result = pytester.runpytest(f"--memgate={SAMPLE}")
    result.stdout.fnmatch_lines([
        (f"::error file={pytester.path.name}/memgate.toml,line=3,title=memgate memgate%3A%3Amsinsight_pta21_level1_rank0%3A%3Atrain"
        "%3A%3Apeak_allocated::peak_allocated 1.23 GiB exceeds budget 1.00 GiB*")])


def test_budget_file_error_names_the_line(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", memgate='[[budgets]]\nname = "x"\npeak_alocated = "1 GiB"\n')
    result = pytester.runpytest(f"--memgate={SAMPLE}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([("*memgate.toml:3: invalid budget file at budgets/0: unknown budget key "
                                 "'peak_alocated' (did you mean 'peak_allocated'?)")])


MANY_ERRORS = """\
profile = "prof"
[[budgets]]
name = "a"
peak_alocated = "1 GiB"

[[budgets]]
name = "a"
peak_reserved = "12 parsecs"
fragmentation = 1.5
"""


def test_budget_file_errors_are_all_shown_in_file_order(pytester: pytest.Pytester) -> None:
    path = pytester.makefile(".toml", memgate=MANY_ERRORS)
    result = pytester.runpytest(f"--memgate={SAMPLE}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        f"ERROR: memgate: {path}:1: invalid budget file at (top level): unknown key 'profile' (did you mean 'profiles'?)",
        f"memgate: {path}:4: invalid budget file at budgets/0: unknown budget key 'peak_alocated'*",
        f"memgate: {path}:7: duplicate budget name(s) 'a'; expected unique names (also at line 3)",
        f"memgate: {path}:8: invalid a.peak_reserved '12 parsecs'*",
        f"memgate: {path}:9: invalid budget file at budgets/1/fragmentation: 1.5 is greater than the maximum of 1",
    ], consecutive=True)


# ---- --memgate's optional PATH: a test path after it is refused --------------------------------

TRAP = ("*invalid --memgate {value!r}: {what}, not a profile; expected a profile directory or file; "
        "--memgate takes the next argument as its PATH: write --memgate=PATH (or put the test path first)")


@pytest.mark.parametrize("xdist", [False, True], ids=["plain", "xdist"])
@pytest.mark.parametrize(("value", "what"), [
    ("test_train.py", "a test file"),
    ("test_x.py::test_y", "a test node id"),
    ("tests", "a directory of tests with no profile"),
    ("tools.py", "a Python file"),  # not helpers.py: an in-process run would meet the suite's own helpers module
])
def test_memgate_followed_by_a_test_path_is_refused(pytester: pytest.Pytester, xdist: bool, value: str,
                                                    what: str) -> None:
    if xdist:
        pytest.importorskip("xdist")
    pytester.makefile(".toml", memgate=f'profiles = "{SAMPLE}"\n' + BUDGETS.format(alloc='"2 GiB"'))
    pytester.makepyfile(test_train="def test_train():\n    pass\n", test_x="def test_y():\n    pass\n",
                        tools="")
    pytester.mkdir("tests").joinpath("test_more.py").write_text("def test_more():\n    pass\n")
    args = ["-n", "2"] if xdist else []
    result = (pytester.runpytest_subprocess if xdist else pytester.runpytest)(*args, "--memgate", value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([TRAP.format(value=value, what=what)])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    # The fix the message gives: the bare --memgate after the test path (profiles from the budget file) ...
    (pytester.runpytest_subprocess if xdist else pytester.runpytest)(
        *args, value, "--memgate").assert_outcomes(passed=2 + (value != "tools.py"))


def test_memgate_equals_a_test_file_and_the_ini_twin_are_refused_without_the_next_argument_hint(
        pytester: pytest.Pytester) -> None:
    _budget_file(pytester)
    pytester.makepyfile(test_train="def test_train():\n    pass\n")
    result = pytester.runpytest("--memgate=test_train.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([("ERROR: memgate: invalid --memgate 'test_train.py': a test file, not a profile; "
                                  "expected a profile directory or file")])
    assert "next argument" not in result.stderr.str()
    pytester.makeini("[pytest]\nmemgate = test_train.py::test_train\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([("ERROR: memgate: invalid memgate (ini) 'test_train.py::test_train': a test node id, "
                                  "not a profile; expected a profile directory or file")])
    pytester.makeini(f"[pytest]\nmemgate = {SAMPLE}\n")  # the ini twin with a real profile still gates it
    pytester.runpytest().assert_outcomes(passed=3)


def test_memgate_followed_by_a_real_profile_still_gates_it(pytester: pytest.Pytester) -> None:
    _budget_file(pytester)
    pytester.makepyfile(test_train="def test_train():\n    pass\n")
    pytester.runpytest("--memgate", str(SAMPLE), "test_train.py").assert_outcomes(passed=3)
    # a folder holding both tests and profiles is a profile root
    root = pytester.mkdir("root")
    import shutil

    shutil.copytree(SAMPLE, root / SAMPLE.name)
    (root / "test_in_root.py").write_text("def test_in_root():\n    pass\n")
    pytester.runpytest("--memgate", "root", "test_train.py").assert_outcomes(passed=3)


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


@pytest.mark.parametrize(("verbosity", "lines", "shown"), [((), 5, 23), (("-v",), 10, 40), (("-vv",), 12, 43)])  # 12 lines hold all 43)
def test_detail_section_is_capped_and_verbosity_raises_the_cap(pytester: pytest.Pytester, verbosity: tuple[str, ...],
                                                                lines: int, shown: int) -> None:
    _budget_file(pytester, alloc='"1 GiB"')
    result = pytester.runpytest(f"--memgate={SAMPLE}", *verbosity)
    # 43 blocks are live at the peak; holder lines group the blocks of one op (and owner, stack, stream)
    result.stdout.fnmatch_lines([f"*top {shown} of 43 live blocks at the peak (npu:0):*"])
    out = result.stdout.lines
    start = next(i for i, line in enumerate(out) if line.startswith("top "))
    end = next(i for i, line in enumerate(out) if line.startswith("series: "))
    assert len(out[start + 1:end]) == lines


TRACE = Path(__file__).parent / "data" / "samples" / "torch_cuda" / "h200_trace_leak" / "train.1795846944832606968.pt.trace.json"
TRACE_BUDGETS = """
[[budgets]]
name = "train"
peak_allocated = "1 MiB"
leaked = "1 KiB"
"""


def _trace_run(pytester: pytest.Pytester, *names: str) -> None:
    """A --memgate root holding the leaking CUDA trace under torch.profiler's names (host_pid.time_ns)."""
    prof = pytester.path / "prof"
    shutil.rmtree(prof, ignore_errors=True)
    prof.mkdir()
    for name in names:
        shutil.copyfile(TRACE, prof / name)
    pytester.makefile(".toml", memgate=TRACE_BUDGETS)


def test_identical_holders_are_one_line_with_count_and_total_under_the_real_live_count(
        pytester: pytest.Pytester) -> None:
    _trace_run(pytester, "host_1234.1700000000000000001.pt.trace.json")
    result = pytester.runpytest("--memgate=prof", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    # 14 blocks are live at the trace's peak: two 64 MiB aten::mm blocks are one line, not two
    result.stdout.fnmatch_lines(["top 14 of 14 live blocks at the peak (cuda:0):",
                                 "  2 × 64.00 MiB = 128.00 MiB  aten::mm"])
    assert not any(line.strip().startswith("64.00 MiB  aten::mm") for line in result.stdout.lines)


def test_budget_file_item_ids_name_the_profile_by_its_path_under_the_root(pytester: pytest.Pytester) -> None:
    """An item is named by its profile's real path under the --memgate root, as `memgate check` names it
    (never the starred identity pairing uses); two ranks' traces are two ids."""
    name = "host_1234.1700000000000000001.pt.trace.json"
    _trace_run(pytester, name)
    result = pytester.runpytest("--memgate=prof", "--collect-only", "-q", "-p", "no:cacheprovider")
    assert [line for line in result.stdout.lines if line.startswith("memgate::")] == [
        f"memgate::{name}::train::peak_allocated", f"memgate::{name}::train::leaked"]
    _trace_run(pytester, "host_1.1700000000000000001.pt.trace.json", "host_2.1700000000000000002.pt.trace.json")
    result = pytester.runpytest("--memgate=prof", "--collect-only", "-q", "-p", "no:cacheprovider")
    two = [line for line in result.stdout.lines if line.startswith("memgate::")]
    assert sorted(two) == sorted(f"memgate::host_{pid}.170000000000000000{pid}.pt.trace.json::train::{metric}"
                                 for pid in (1, 2) for metric in ("peak_allocated", "leaked"))
    check = pytester.run(sys.executable, "-m", "memgate", "check", "prof")
    assert any("host_1.1700000000000000001.pt.trace.json" in line for line in check.outlines)


def test_short_summary_line_of_a_budget_file_item_carries_its_message(pytester: pytest.Pytester,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # pytest trims the message to the terminal's width (and drops it where the id leaves no room); the id
    # is the trace's real name (pid and 19-digit timestamp), as `memgate check` names it: 120 columns show it
    monkeypatch.setenv("COLUMNS", "120")
    for var in ("CI", "BUILD_NUMBER"):
        monkeypatch.delenv(var, raising=False)
    _trace_run(pytester, "fv-az1234-567_2048.1736412345678901234.pt.trace.json")
    result = pytester.runpytest("--memgate=prof", "-rf", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines([("FAILED memgate::fv-az1234-567_2048.1736412345678901234.pt.trace.json::train::leaked"
                                  " - leaked 13.00 MiB*")])


@pytest.mark.parametrize(("args", "kept"), [
    (["--memgate-html=out/r.html"], "out/memgate-recordings"),  # beside the report: outlives pytest's tmp folders
    (["--memgate-json=j/r.json", "--memgate-html=h/r.html"], "h/memgate-recordings"),
    (["--memgate-json=j/r.json", "--memgate-keep-traces=kept"], "kept"),  # asked for: there
    ([], None),  # no report, nothing asked: recordings stay where pytest put them
])
def test_recordings_are_kept_beside_a_report(pytester: pytest.Pytester, args: list[str], kept: str | None) -> None:
    from memgate.plugin import STATE

    config = pytester.parseconfigure(*args)
    found = config.stash[STATE].settings.keep_traces
    assert found == (None if kept is None else Path(config.invocation_params.dir) / kept)

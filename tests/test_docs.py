"""Docs that cannot drift: the README's sample output, the example budget file's "measured" comments
and the README's CLI section, each checked against what the tool prints on the bundled example.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
import tomllib
from pathlib import Path

import pytest

from memgate.cli import build_parser, main
from memgate.compare import format_metric, metric_kind
from memgate.sizes import format_size

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text("utf-8")
EXAMPLES = REPO / "examples"


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def _code_block(section: str) -> list[str]:
    body = section[section.index("```") + 3:]
    return body[body.index("\n") + 1:body.index("```")].splitlines()


def _normalize(line: str) -> str:
    """Runs of spaces as one (column widths follow the longest cell), rules of = as three."""
    return re.sub(r"={3,}", "===", " ".join(line.split()))


def _pattern(line: str) -> str:
    """A README line as an fnmatch pattern: ``...`` inside it stands for any text."""
    text = _normalize(line)
    escaped = "".join(f"[{c}]" if c in "*?[" else c for c in text)
    return re.sub(r"\s*\.\.\.\s*", "*", escaped)


def assert_shows(documented: list[str], printed: list[str]) -> None:
    """Each run of documented lines between ``...`` lines is a run of printed lines, in order."""
    runs: list[list[str]] = [[]]
    for line in documented:
        if line.strip() == "...":
            runs.append([])
        else:
            runs[-1].append(_pattern(line))
    lines = [_normalize(line) for line in printed]
    at = 0
    for run in (r for r in runs if r):
        starts = [i for i in range(at, len(lines) - len(run) + 1)
                  if all(fnmatch.fnmatchcase(lines[i + k], p) for k, p in enumerate(run))]
        assert starts, "README lines not printed (in this order):\n" + "\n".join(run) + "\n---- printed:\n" + "\n".join(
            printed)
        at = starts[0] + len(run)


def test_readme_sample_output_is_what_pytest_prints(pytester: pytest.Pytester) -> None:
    """`pytest --memgate` in a copy of examples/ (no PATH: `profiles` of its memgate.toml)."""
    shutil.copytree(EXAMPLES, pytester.path, dirs_exist_ok=True)
    # The recorded torch test has rows of its own, which the README leaves out: not run here (speed).
    result = pytester.runpytest("--memgate", "-p", "no:cacheprovider",
                                "--deselect", "test_model.py::test_small_model_does_not_leak")
    result.assert_outcomes(passed=4, failed=3, deselected=1)
    assert_shows(_code_block(_section("What the gate prints")), result.outlines)


def test_assert_shows_needs_the_lines_in_order() -> None:
    printed = ["a  1", "b", "c 2", "d", "=== memgate ==="]
    assert_shows(["a 1", "b", "...", "d", "========= memgate ========="], printed)
    assert_shows(["a ...", "...", "c ..."], printed)
    with pytest.raises(AssertionError):
        assert_shows(["a 1", "c 2"], printed)  # not consecutive
    with pytest.raises(AssertionError):
        assert_shows(["d", "...", "b"], printed)  # not in order


_COMMENT = re.compile(r"^(?P<key>\w+)\s*=.*#\s*measured (?P<value>[0-9.]+(?: [KMGT]?i?B)?)(?: \(pool (?P<pool>\w+)\))?"
                      r": (?P<verdict>passes|fails)")
_OP_COMMENT = re.compile(r"(?P<glob>\S+) (?P<value>[0-9.]+ [KMGT]?i?B) \((?P<op>[^)]+)\): (?P<verdict>passes|fails)")


def _documented_checks() -> dict[tuple[str, str], dict[str, str | None]]:
    """(budget, metric) -> the value, verdict (and pool or op) examples/memgate.toml's comments state."""
    checks: dict[tuple[str, str], dict[str, str | None]] = {}
    budget = None
    for line in (EXAMPLES / "memgate.toml").read_text("utf-8").splitlines():
        if m := re.match(r'name = "(.+)"', line):
            budget = m.group(1)
        elif (m := _COMMENT.match(line)) and budget is not None:
            checks[(budget, m.group("key"))] = {"value": m.group("value"), "verdict": m.group("verdict"),
                                                "where": m.group("pool")}
        elif line.startswith("# measured:") and budget is not None:
            for op in _OP_COMMENT.finditer(line):
                checks[(budget, f"op_caps[{op.group('glob')}]")] = {"value": op.group("value"),
                                                                    "verdict": op.group("verdict"),
                                                                    "where": op.group("op")}
    return checks


def test_example_budget_comments_are_what_memgate_check_prints(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """`memgate check` in examples/ with no PATH (its `profiles`), the report on stdout (`--json -`)."""
    monkeypatch.chdir(EXAMPLES)
    assert main(["check", "--json", "-"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert "FAILED alexnet_3016828_20250109_ascend_pt::train-step::fragmentation:" in captured.err  # the table
    outcomes = {(o["budget"], o["metric"]): o for o in report["budgets"]}
    documented = _documented_checks()
    budgets = tomllib.loads((EXAMPLES / "memgate.toml").read_text("utf-8"))["budgets"]
    declared = {(b["name"], key) for b in budgets for key in b if key not in ("name", "ranks", "op_caps")}
    declared |= {(b["name"], f"op_caps[{glob}]") for b in budgets for glob in b.get("op_caps", {})}
    assert set(documented) == declared == set(outcomes)  # every check has its comment
    for check, says in documented.items():
        o = outcomes[check]
        metric = check[1]
        shown = format_size(o["value"]) if metric.startswith("op_caps") else format_metric(metric_kind(metric), o["value"])
        assert (shown, "passes" if o["passed"] else "fails") == (says["value"], says["verdict"]), check
        if says["where"] is not None:
            assert (f"pool {says['where']}" if metric == "fragmentation" else f"op {says['where']}") in o["message"]


def test_readme_cli_section_lists_every_command() -> None:
    block = "\n".join(_code_block(_section("CLI")))
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    commands = list(sub.choices)
    assert set(commands) == {"inspect", "check", "validate", "report", "diff", "suggest", "runs"}
    for command in commands:
        assert re.search(rf"^memgate {command} ", block, re.MULTILINE), command


def test_readme_example_profiles_key_is_in_the_example_budget_file() -> None:
    table = tomllib.loads((EXAMPLES / "memgate.toml").read_text("utf-8"))
    assert table["profiles"] == "profiles" and (EXAMPLES / table["profiles"]).is_dir()
    assert 'profiles = "profiles"' in _section("What the gate prints")

"""No output a file can write into: names from profiles, reports and saved runs (ops, owners, categories,
pools, paths, test ids, ranks, devices) that reach a text output are quoted or escaped there, so none
can end a line, close a TOML table, add a budget or a marker, or start a GitHub workflow command.

A corpus of hostile names through ``memgate suggest`` (budget-file and marker forms, from JSON reports
and saved runs; a suggestion read back is exactly what :func:`memgate.suggest.suggestions` says it
declares), pytest's failure text under ``GITHUB_ACTIONS=true``, the annotations and the step summary.
``memgate suggest --form marker`` of a saved run of two marked tests gives one marker each, as a JSON
report of the same run does.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import shutil
import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from helpers import computed_cache
from hypothesis import given
from hypothesis import strategies as st

from memgate.autosave import save_run
from memgate.budgets import budget_from_mapping, load_budget_file
from memgate.categories import CATEGORIES
from memgate.ci import github_annotations, md_code, md_text, step_summary_markdown
from memgate.cli import main
from memgate.errors import printable
from memgate.judge import judge
from memgate.metrics import DeviceMetrics
from memgate.suggest import FORMS, Suggested, suggest_toml, suggestions

SAMPLES = Path(__file__).parent / "data" / "samples"
CLEAN = SAMPLES / "torch" / "cpu_train_profile_memory.json"
ASCEND = SAMPLES / "ascend" / "msinsight_pta21_level1_rank0"

# Each ends a line somewhere (str.splitlines, TOML, Python, a log), closes a table or a string, starts a
# comment, an array of tables or a workflow command, or is a byte that is not UTF-8.
HOSTILE = (
    "a\nb", "a\rb", "a\r\nb", 'q"uote', "q'uote", "back\\slash", "\\", "]]", "[[budgets]]", "# hash", "x\u2028y",
    "x\u2029y", "x\x85y", "x\x0by\x0cz", "x\x1c\x1d\x1ey", "tab\there", "\x1b[31mred", "\u202eevil", "run\udcff",
    "'''", '"""', "{ a = 1 }", "::error::x", "\n::error::injected", ']\n[[budgets]]\nname = "evil"', "",
    "\x00nul", "é層🔥", "*?[", "\U000e0001tag",
)
PIECES = st.sampled_from(HOSTILE) | st.text(st.sampled_from(list("ab:#[]{}\"'\\\n\r\t\u2028\x85\udcff =*")), max_size=6)
NAMES = st.lists(PIECES, min_size=1, max_size=3).map("".join)


def _plain(value: Any) -> Any:
    """A suggestion's values as a TOML reader or literal_eval gives them back (ratios as floats)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return float(value) if isinstance(value, Decimal) else value


def _one_line_each(text: str) -> list[str]:
    """The text's lines, asserting there are no others: no line break but the newlines, nothing a terminal
    acts on (what :func:`memgate.errors.printable` escapes)."""
    assert text.endswith("\n")
    lines = text[:-1].split("\n")
    assert text.splitlines() == lines, [line for line in text.splitlines() if line not in lines]
    assert all(printable(line) == line for line in lines), [line for line in lines if printable(line) != line]
    return lines


def _markers(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(the heading comment above, keywords) of each @pytest.mark.memgate(...) line; every other line is
    a comment or blank."""
    out = []
    heading = None
    for line in _one_line_each(text):
        if line.startswith("@pytest.mark.memgate("):
            call = ast.parse(line[1:], mode="eval").body
            assert isinstance(call, ast.Call) and not call.args and heading is not None
            out.append((heading, {str(k.arg): ast.literal_eval(k.value) for k in call.keywords}))
            heading = None
        elif line.startswith("# ") and not line.startswith("#   ") and heading is None:
            heading = line[2:]
        else:
            assert line == "" or line.startswith("#"), line
    return out


def read_back(text: str, form: str) -> list[dict[str, Any]]:
    """The budgets (or markers' keywords) a suggestion declares, read as TOML or Python reads them."""
    if form == "marker":
        return [kwargs for _, kwargs in _markers(text)]
    lines = _one_line_each(text)
    assert all(re.match(r"#|\[|[a-z_]+ = |\Z", line) for line in lines), lines  # a comment, header or key
    table = tomllib.loads(text)
    if form == "pyproject":
        assert list(table) == ["tool"] and list(table["tool"]) == ["memgate"]
        table = table["tool"]["memgate"]
    assert list(table) == ["budgets"]
    budgets: list[dict[str, Any]] = table["budgets"]
    return budgets


def _heading(s: Suggested) -> str:
    """The heading comment of a marker: its test id, in quotes where spaces begin or end it."""
    if not s.heading:
        return f"{s.profiles} profile(s), judged together"
    shown = printable(s.heading)
    return f'"{shown}"' if shown.strip() != shown else shown


def _entry(path: str, *, test: str | None = None, ops: dict[str, int] | None = None,
           owners: dict[str, int] | None = None, categories: dict[str, int] | None = None,
           pool: str = "PTA", rank: str = "0", device: str = "cuda:0", peak: int = 50 << 20) -> dict[str, Any]:
    metrics: dict[str, Any] = {"peak_allocated_bytes": peak, "peak_reserved_bytes": peak * 2, "leaked_bytes": 0,
                               "step_growth_bytes": 4096, "fragmentation": 0.25,
                               "op_max_block_bytes": ops or {}, "owner_bytes_at_peak": owners or {}}
    if categories is not None:
        metrics["category_bytes_at_peak"] = categories
    return {"path": path, "rank": rank, "format": "kineto", "metadata": {"test": test} if test else {},
            "devices": [{"device": device, "metrics": metrics, "pool_of": {"fragmentation": pool}}]}


# ---- suggest: a round trip of hostile names ------------------------------------------------------


@given(ops=st.lists(NAMES, min_size=1, max_size=3, unique=True), owners=st.lists(NAMES, max_size=3, unique=True),
       categories=st.lists(NAMES | st.sampled_from(CATEGORIES), max_size=3, unique=True),
       paths=st.lists(NAMES, min_size=2, max_size=2, unique=True), tests=st.lists(NAMES, min_size=2, max_size=2),
       marked=st.booleans(), pool=NAMES, rank=NAMES,
       name=NAMES.filter(lambda n: not any(0xD800 <= ord(c) < 0xE000 for c in n)))
def test_a_suggestion_reads_back_as_exactly_the_budgets_it_declares(
        ops: list[str], owners: list[str], categories: list[str], paths: list[str], tests: list[str], marked: bool,
        pool: str, rank: str, name: str) -> None:
    sizes = {op: (i + 2) << 20 for i, op in enumerate(ops)}
    held = {owner: (i + 1) << 20 for i, owner in enumerate(owners)}
    by_category = {c: (i + 1) << 20 for i, c in enumerate(categories)}
    entries = [_entry(path, test=test if marked else None, ops=sizes, owners=held, categories=by_category,
                      pool=pool, rank=f"{rank}{i}")
               for i, (path, test) in enumerate(zip(paths, tests))]
    for form in FORMS:
        found = suggestions(entries, Decimal(10), name, form)
        text = suggest_toml(entries, Decimal(10), name, form)
        assert read_back(text, form) == [_plain(s.values) for s in found], text
        if form == "marker":
            assert [h for h, _ in _markers(text)] == [_heading(s) for s in found]
            assert len(found) == (len(set(tests)) if marked and "" not in tests else 1)  # "": no test
        else:
            (budget,) = found
            assert budget.values["name"] == name
            assert all(any(fnmatch.fnmatchcase(op, g) for g in budget.values["op_caps"]) for op in ops)
            assert set(budget.values.get("category_caps", {})) == set(categories) & set(CATEGORIES)


@pytest.mark.parametrize("form", ["toml", "pyproject"])
@pytest.mark.parametrize("hostile", HOSTILE)
def test_each_hostile_name_is_a_budget_memgate_accepts(hostile: str, form: str, tmp_path: Path) -> None:
    """Read back by memgate itself: one budget, whose caps name the hostile op and owner exactly."""
    entries = [_entry(hostile + "/p", test=hostile, ops={hostile: 3 << 20}, owners={hostile or "o": 1 << 20},
                      pool=hostile, rank=hostile)]
    text = suggest_toml(entries, Decimal(10), "default", form)
    target = tmp_path / ("pyproject.toml" if form == "pyproject" else "memgate.toml")
    target.write_text(text, "utf-8")
    (budget,) = load_budget_file(target).budgets
    assert [g for g in budget.op_caps if fnmatch.fnmatchcase(hostile, g)] == list(budget.op_caps)
    assert budget.owner_caps and all(fnmatch.fnmatchcase(hostile or "o", g) for g in budget.owner_caps)


def test_a_hostile_budget_name_is_quoted_and_one_not_utf8_refused(capsys: pytest.CaptureFixture[str]) -> None:
    name = ']\n[[budgets]]\nname = "evil"'
    assert main(["suggest", str(CLEAN), "--form", "toml", "--name", name]) == 0
    assert [b["name"] for b in read_back(capsys.readouterr().out, "toml")] == [name]
    assert main(["suggest", str(CLEAN), "--name", "run\udcff"]) == 2
    assert capsys.readouterr().err == ("memgate: error: invalid --name 'run\\\\xff'; expected a name TOML can write "
                                       "(UTF-8 text)\n")


def _report(tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any) -> Path:
    assert main(["inspect", str(CLEAN), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    edit(report)
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report), "utf-8")
    return path


CLOSE_TABLE = ']\n[[budgets]]\nname = "evil"\npeak_allocated = "1 TiB"'


@pytest.mark.parametrize("form", FORMS)
def test_a_tampered_report_category_cannot_add_a_budget(form: str, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A category name that closes the table (issue 38) is no category: not suggested, named in one comment."""
    def edit(report: dict[str, Any]) -> None:
        profile = report["profiles"][0]
        profile["devices"][0]["metrics"]["category_bytes_at_peak"] = {"parameters": 3 << 20, CLOSE_TABLE: 5 << 20}
        profile["path"] = "prof\n[[budgets]]\nname = 'x'"
        profile["metadata"]["test"] = "tests/test_a.py::test_b\n@pytest.mark.memgate(peak_allocated='1 TiB')"
    path = _report(tmp_path, capsys, edit)
    assert main(["suggest", str(path), "--form", form]) == 0
    text = capsys.readouterr().out
    (budget,) = read_back(text, form)
    assert budget["category_caps"] == {"parameters": "4 MiB"}
    assert "evil" not in str(budget) and budget.get("name", "default") == "default"
    assert "# category_caps not suggested for ']\\n[[budgets]]\\nname = \"evil\"\\npeak_allocated = \"1 TiB\"': " \
           "not a category (parameters, buffers, gradients, optimizer_state, activations, other)" in text.splitlines()
    if form == "marker":
        assert text.startswith("# tests/test_a.py::test_b\\x0a@pytest.mark.memgate(peak_allocated='1 TiB')\n")


@pytest.mark.parametrize("form", FORMS)
def test_a_profile_folder_named_to_add_a_budget_stays_in_its_comment(form: str, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The leaking profile is named in a comment (issue 38: its folder's newlines wrote a budget there)."""
    evil = tmp_path / "f" / "evil\n[[budgets]]\nname = 'x'\u2028@pytest.mark.memgate(peak_allocated='1 TiB')"
    evil.mkdir(parents=True)
    shutil.copy(SAMPLES / "torch" / "cpu_train_leak_profile_memory.json", evil)
    (tmp_path / "f" / "ok").mkdir()
    shutil.copy(CLEAN, tmp_path / "f" / "ok")
    assert main(["suggest", str(tmp_path / "f"), "--form", form]) == 0
    text = capsys.readouterr().out
    (budget,) = read_back(text, form)
    assert "TiB" not in str(budget) and budget["leaked"] == "0 B"
    assert ("# f/evil\\x0a[[budgets]]\\x0aname = 'x'\\u2028@pytest.mark.memgate(peak_allocated='1 TiB')/"
            "cpu_train_leak_profile_memory.json leaks 256.00 KiB (leaked; the cleanest profile allows 0 B): fix it "
            "or budget it alone") in [line.replace(str(tmp_path) + "/", "") for line in text.splitlines()]


def test_a_saved_run_of_hostile_folders_and_tests_reads_back(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A saved run travels as a CI cache: its profile paths and test ids are untrusted too."""
    storage = tmp_path / ".memgate"
    hostile = [h for h in HOSTILE if h][:12]
    entries = [_entry(f"{h}/prof_{i}", test=f"t.py::test_{i}[{h}]", ops={h: 3 << 20, "aten::mm": 2 << 20},
                      owners={h: 1 << 20})
               for i, h in enumerate(hostile)]
    save_run(storage, entries, commit=None, dirty=False)
    for form in FORMS:
        assert main(["suggest", "latest", "--storage", str(storage), "--form", form]) == 0
        text = capsys.readouterr().out
        found = read_back(text, form)
        if form == "marker":
            markers = _markers(text)
            assert [head for head, _ in markers] == [printable(str(e["metadata"]["test"])) for e in entries]
            for h, (_, kwargs) in zip(hostile, markers):  # each test's caps name its own op and owner exactly
                assert sorted(fnmatch.fnmatchcase(h, g) for g in kwargs["op_caps"]) == [False, True]
                assert [fnmatch.fnmatchcase(h, g) for g in kwargs["owner_caps"]] == [True]
        else:
            assert len(found) == 1 and found[0]["op_caps"] == {"aten::mm": "3 MiB"}  # the only op every profile has


def test_unit_escapes_are_exact() -> None:
    """The marker's strings are Python literals of the exact name; TOML's read back by tomllib."""
    from memgate.suggest import _py_string, _toml_string
    for name in HOSTILE:
        assert ast.literal_eval(_py_string(name)) == name
        assert "\n" not in _py_string(name) and len(_py_string(name).splitlines()) == 1
        if "\udcff" not in name:
            assert tomllib.loads(f"k = {_toml_string(name)}")["k"] == name
    with pytest.raises(ValueError, match="surrogate"):
        _toml_string("run\udcff")


@pytest.mark.parametrize("name", [h for h in HOSTILE if "\udcff" not in h] + ["\U0001f600\\U"])
def test_a_quoted_key_is_found_on_its_line(name: str) -> None:
    """A budget-file error names the line of a key written with escapes (memgate.toml_lines decodes them
    as tomllib does)."""
    from memgate.suggest import _toml_string
    from memgate.toml_lines import key_lines

    text = f'[[budgets]]\nname = "b"\n[budgets.op_caps]\n{_toml_string(name)} = "1 MiB"\n'
    assert tomllib.loads(text)["budgets"][0]["op_caps"] == {name: "1 MiB"}
    assert key_lines(text)[("budgets", 0, "op_caps", name)] == 4


# ---- suggest --form marker of a saved run: one marker per marked test -----------------------------


TWO_MARKED = f"""\
import shutil
import pytest

@pytest.mark.memgate(peak_allocated="2 GiB")
def test_fits(memgate_profile_dir):
    shutil.copytree({str(ASCEND)!r}, memgate_profile_dir / "run_ascend_pt")

@pytest.mark.memgate(peak_allocated="2 GiB")
def test_also_fits(memgate_profile_dir):
    shutil.copytree({str(ASCEND)!r}, memgate_profile_dir / "run_ascend_pt")
"""


def test_suggest_latest_marker_gives_one_marker_per_marked_test(pytester: pytest.Pytester,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    pytester.makepyfile(test_two=TWO_MARKED)
    result = pytester.runpytest("-p", "no:cacheprovider", "--memgate-autosave", "--memgate-json=report.json")
    result.assert_outcomes(passed=2)
    capsys.readouterr()
    storage = pytester.path / ".memgate"
    assert main(["suggest", "latest", "--storage", str(storage), "--form", "marker"]) == 0
    saved = _markers(capsys.readouterr().out)
    assert [head for head, _ in saved] == ["test_two.py::test_also_fits", "test_two.py::test_fits"]
    assert main(["suggest", str(pytester.path / "report.json"), "--form", "marker"]) == 0
    reported = _markers(capsys.readouterr().out)
    assert sorted(reported) == sorted(saved)  # the same markers, from the report or the saved run
    assert all(kwargs["peak_allocated"] == "1388 MiB" for _, kwargs in saved)


# ---- pytest's failure text, the annotations and the step summary under GitHub Actions -----------------


def _span(name: str, ts: int, dur: int, cat: str = "python_function") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": 1}


def _mem(ts: int, nbytes: int, addr: int, total: int) -> dict[str, Any]:
    return {"ph": "i", "name": "[memory]", "ts": ts, "pid": 7, "tid": 1,
            "args": {"Addr": addr, "Bytes": nbytes, "Total Allocated": total, "Total Reserved": 1 << 20,
                     "Device Type": 1, "Device Id": 0}}


# A module (its owner) and an op whose names hold a newline, a line separator and a NEL, each followed by
# a workflow command.
OWNER = "nn.Module: Evil\n::error::owner\u2028::error::sep\x85::error::nel_0"
OP = "aten::addmm\r\n::error::op"
HOSTILE_TRACE = json.dumps({"schemaVersion": 1, "deviceProperties": [], "traceEvents": [
    _span(OWNER, 0, 100), _span(OP, 19, 2, cat="cpu_op"), _mem(20, 1000, 1, 1000), _mem(40, 2000, 2, 3000)]})


def _no_injected_line(result: pytest.RunResult, annotations: int) -> None:
    lines = result.stdout.lines  # split by str.splitlines: every line break a log viewer may know
    commands = [line for line in lines if line.startswith("::")]
    assert all(line.startswith("::error file=") for line in commands), commands
    assert len(commands) == annotations, commands
    assert not [line for line in lines if "::error::" in line and not line.startswith("::error file=")
                and "\\x0a::error::" not in line and "\\u2028::error::" not in line and "\\x0d" not in line], lines


def test_a_marked_test_failure_names_hostile_owners_on_one_line_each(pytester: pytest.Pytester,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Two failed checks of one marked test: the second's line (an owner_caps verdict naming the owner)
    is in the first's detail, one line, as are the holders'."""
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    pytester.makepyfile(test_evil=f"""\
import pytest

@pytest.mark.memgate(peak_allocated="1 KiB", owner_caps={{"*": "1 KiB"}})
def test_evil(memgate_profile_dir):
    (memgate_profile_dir / "t.pt.trace.json").write_text({HOSTILE_TRACE!r})
""")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    _no_injected_line(result, annotations=2)
    result.stdout.fnmatch_lines([("*owner_caps[[]*] 2.93 KiB exceeds budget 1.00 KiB*largest owner Evil\\x0a::error::owner"
                                  "\\u2028::error::sep\\x85::error::nel_0 2.93 KiB")])
    summary = (pytester.path / "summary.md").read_text("utf-8")
    assert len(summary.splitlines()) == len(summary.split("\n")) - 1 == 6  # heading, blank, head, rule, 2 rows


def test_a_budget_file_failure_names_hostile_owners_on_one_line_each(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    (pytester.path / "prof").mkdir()
    (pytester.path / "prof" / "t.pt.trace.json").write_text(HOSTILE_TRACE, "utf-8")
    pytester.makefile(".toml", memgate='[[budgets]]\nname = "b"\nowner_caps = { "*" = "1 KiB" }\n'
                                       'peak_allocated = "1 KiB"\n')
    result = pytester.runpytest("-p", "no:cacheprovider", "--memgate=prof")
    result.assert_outcomes(failed=2)
    _no_injected_line(result, annotations=2)


def test_a_verdict_naming_an_owner_is_one_line() -> None:
    cache = computed_cache([DeviceMetrics("cuda:0", "blocks", "f", {"owner_bytes_at_peak": {OWNER: 600}}, {}, 10, None)])
    budget = budget_from_mapping({"name": "b", "owner_caps": {"*": 1}}, origin="test")
    outcome = judge(cache, budget, "owner_caps[*]")
    assert len(outcome.message.splitlines()) == 1 and printable(outcome.message) == outcome.message
    assert "largest owner nn.Module: Evil\\x0a::error::owner\\u2028::error::sep\\x85::error::nel_0 600 B" in outcome.message


def _row(**fields: Any) -> dict[str, Any]:
    row = {"profile": "p", "rank": "0", "budget": "b", "metric": "peak_allocated", "limit": 1024, "value": 2048,
           "passed": False, "device": "cuda:0", "message": "peak_allocated over"}
    return {**row, **fields}


@pytest.mark.parametrize("hostile", HOSTILE)
def test_annotations_are_one_command_line_each(hostile: str) -> None:
    rows = [_row(message=f"m {hostile}", budget=hostile, metric=f"op_caps[{hostile}]", rank=hostile,
                 declared_in={"file": f"{hostile}.toml", "line": 3}),
            _row(test=hostile, budget=hostile, message=hostile)]
    lines = github_annotations(rows, [{"test": hostile, "error": f"bad {hostile}"}])
    assert len(lines) == 3
    for line in lines:
        assert len(line.splitlines()) == 1 and printable(line) == line, line
        command, _, message = line.partition("::")[2].partition("::")
        assert command.startswith("error ") and "\n" not in message
        properties = dict(p.split("=", 1) for p in command.removeprefix("error ").split(","))
        assert set(properties) <= {"file", "line", "title"}  # a name's ',' or ':' adds no property


def _cells(row: str) -> list[str]:
    """A GFM table row's cells: split at the pipes no backslash escapes."""
    cells, cell, i = [], "", 0
    while i < len(row):
        if row[i] == "\\" and i + 1 < len(row):
            cell += row[i:i + 2]
            i += 2
            continue
        if row[i] == "|":
            cells.append(cell)
            cell = ""
        else:
            cell += row[i]
        i += 1
    return [*cells, cell][1:-1]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_the_step_summary_keeps_each_name_in_its_cell(hostile: str) -> None:
    rows = [_row(test=hostile, budget=hostile), _row(budget=hostile, metric=f"owner_caps[{hostile}]", rank=hostile,
                                                      device=hostile, passed=True)]
    text = step_summary_markdown(rows, [{"test": hostile, "error": f"bad | {hostile}"}])
    lines = _one_line_each(text)
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 2 + 2 + 1 and all(len(_cells(line)) == 8 for line in table), table
    assert lines[-1].startswith("- ") and len([line for line in lines if line.startswith("- ")]) == 1
    outside_code = re.sub(r"`[^`]*`", "", "".join(table[2:]))
    assert not re.search(r"(?<!\\)[<\[!`]", outside_code), outside_code  # no HTML, link, image or code of a name's


def test_markdown_cells_show_the_name() -> None:
    assert md_text("a|b\\c<i>[x](y)") == "a\\|b\\\\c\\<i\\>\\[x\\](y)"
    assert md_text("test_a.py _x_") == "test_a.py \\_x\\_"
    assert md_code("op_caps[a|b]") == "`op_caps[a\\|b]`"
    assert md_code("a`b") == "a\\`b" and md_code("a\nb") == "a\\\\x0ab"

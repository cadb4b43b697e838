"""Docs that cannot drift: the pages of docs/ (and the README's links to them) checked against the tool.

- The PyTorch quick start is run as written, in a fresh folder: its files are written, its commands
  run (torch on the CPU; blocks marked ``needs: cuda`` only where a GPU is) and the output it shows
  compared with what the commands print.
- The Ascend quick start's sample output is what ``pytest --memgate`` prints on the bundled example,
  and the example budget file's "measured" comments are what ``memgate check`` measures.
- Every TOML block loads as a budget file; every marker in a Python block is a valid marker.
- The CLI page names every command and option the parser has, and no other command; the options page
  every option the plugin registers, with its ini twin, and no other option.
- The metrics and budgets pages define every metric and budget key; the CI page shows the example
  workflow as it is.
- The site builds with ``mkdocs build --strict`` (skipped where mkdocs is not installed).

How a page tells the tests what to do with a fenced block: an HTML comment right before it (a blank
line between them is allowed). ``<!-- file: NAME -->`` writes the block to NAME; ``<!-- run -->``
runs each command of the block (every one must exit 0; ``<!-- run: exit N -->``: the last one must
exit N); ``<!-- output -->`` is what the command run last printed, ``...`` standing for any lines or
any part of a line; ``needs: cuda`` (``<!-- file: x.py; needs: cuda -->``) skips the block where
CUDA is not available; ``<!-- include: PATH -->`` says the block is the repository's file PATH.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import skip_without_torch

from memgate.budgets import BUDGET_KEYS, CROSS_RANK, budget_from_mapping, load_budget_file
from memgate.cli import build_parser, main
from memgate.compare import format_metric, metric_kind
from memgate.metrics import METRIC_KEYS
from memgate.plugin import OPTIONS
from memgate.sizes import format_size

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text("utf-8")
DOCS = REPO / "docs"
EXAMPLES = REPO / "examples"
PAGES = sorted(DOCS.glob("*.md"))


def _page(name: str) -> str:
    return (DOCS / name).read_text("utf-8")


def _section(text: str, title: str, level: int = 2) -> str:
    """The section under the heading ``title`` (of ``level``), up to the next heading of that level or above."""
    start = text.index(f"\n{'#' * level} {title}\n")
    following = re.compile(rf"\n#{{1,{level}}} ").search(text, start + 1)
    return text[start:following.start() if following else None]


def _code_block(section: str) -> list[str]:
    body = section[section.index("```") + 3:]
    return body[body.index("\n") + 1:body.index("```")].splitlines()


@dataclass(frozen=True)
class Block:
    """A fenced block of a page, with what the HTML comment right before it says."""

    lang: str
    text: str
    notes: dict[str, str]
    line: int  # 1-based line of the opening fence


_NOTE = re.compile(r"\A<!--\s*(?P<notes>.*?)\s*-->\Z")


def _notes(comment: str) -> dict[str, str]:
    """``file: train.py; needs: cuda`` -> {"file": "train.py", "needs": "cuda"}; ``run`` -> {"run": ""}."""
    notes = {}
    for part in comment.split(";"):
        key, _, value = part.partition(":")
        notes[key.strip()] = value.strip()
    return notes


def blocks(text: str) -> list[Block]:
    found = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"\A(`{3,})(\w*)\s*\Z", lines[i])
        if fence is None:
            i += 1
            continue
        end = next(k for k in range(i + 1, len(lines)) if lines[k].strip() == fence.group(1))
        before = [line for line in lines[max(i - 2, 0):i] if line.strip()]
        note = _NOTE.match(before[-1].strip()) if before else None
        found.append(Block(fence.group(2), "\n".join(lines[i + 1:end]) + "\n",
                           _notes(note.group("notes")) if note else {}, i + 1))
        i = end + 1
    return found


def test_blocks_are_read_with_their_notes() -> None:
    page = "text\n<!-- file: a.py; needs: cuda -->\n```python\nx = 1\n```\n\n<!-- run -->\n\n```bash\nls\n```\n"
    assert blocks(page) == [Block("python", "x = 1\n", {"file": "a.py", "needs": "cuda"}, 3),
                            Block("bash", "ls\n", {"run": ""}, 9)]


def _normalize(line: str) -> str:
    """Runs of spaces as one (column widths follow the longest cell), rules of = as three."""
    return re.sub(r"={3,}", "===", " ".join(line.split()))


def _pattern(line: str) -> str:
    """A documented line as an fnmatch pattern: ``...`` inside it stands for any text."""
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
        assert starts, "documented lines not printed (in this order):\n" + "\n".join(run) + "\n---- printed:\n" + "\n".join(
            printed)
        at = starts[0] + len(run)


def test_assert_shows_needs_the_lines_in_order() -> None:
    printed = ["a  1", "b", "c 2", "d", "=== memgate ==="]
    assert_shows(["a 1", "b", "...", "d", "========= memgate ========="], printed)
    assert_shows(["a ...", "...", "c ..."], printed)
    with pytest.raises(AssertionError):
        assert_shows(["a 1", "c 2"], printed)  # not consecutive
    with pytest.raises(AssertionError):
        assert_shows(["d", "...", "b"], printed)  # not in order


# ---- the PyTorch quick start, run as written ---------------------------------------------------------


def _commands(script: str) -> list[list[str]]:
    """The commands of a bash block: one a line (``\\`` continues it), ``#`` comments dropped."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            commands.append(words)
    return commands


def _run_command(pytester: pytest.Pytester, words: list[str]) -> tuple[int, list[str]]:
    """A documented command, as a shell in the page's folder would run it; (exit status, what it printed).
    Each runs in a process of its own: pytester unloads the torch modules an in-process run imported."""
    program, args = words[0], words[1:]
    if program == "pytest":
        result = pytester.runpytest_subprocess(*args, timeout=600)
    elif program == "python":
        result = pytester.run(sys.executable, *args, timeout=600)
    elif program == "memgate":
        result = pytester.run(sys.executable, "-m", "memgate", *args, timeout=600)
    else:
        raise AssertionError(f"the docs test runs python, pytest and memgate commands, not {program!r}")
    return int(result.ret), result.outlines + result.errlines


def test_pytorch_quick_start_runs_as_written(pytester: pytest.Pytester) -> None:
    """Every file of the page written, every command run, in the page's order, in a fresh folder;
    each documented output is what its command printed."""
    skip_without_torch("the PyTorch quick start needs torch (pip install 'pytest-memgate[torch]')")
    cuda = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
                          capture_output=True, text=True, check=True, timeout=120).stdout.strip() == "True"
    page = _page("quickstart-pytorch.md")
    ran: list[str] = []
    printed: list[str] | None = None
    for block in blocks(page):
        where = f"quickstart-pytorch.md:{block.line}"
        if block.notes.get("needs") == "cuda" and not cuda:
            continue
        if "file" in block.notes:
            (pytester.path / block.notes["file"]).write_text(block.text, encoding="utf-8")
        elif "run" in block.notes:
            expected = int(block.notes["run"].removeprefix("exit").strip() or 0)
            commands = _commands(block.text)
            for k, words in enumerate(commands):
                status, printed = _run_command(pytester, words)
                want = expected if k == len(commands) - 1 else 0
                assert status == want, f"{where}: `{shlex.join(words)}` exited {status}, not {want}:\n" + "\n".join(printed)
                ran.append(shlex.join(words))
        elif "output" in block.notes:
            assert printed is not None, f"{where}: an output block before any command"
            assert_shows(block.text.splitlines(), printed)
    assert {"python train.py", "pytest --memgate=prof", "pytest --memgate=prof --memgate-autosave",
            "pytest test_train.py", "python record_run.py", "memgate check recorded"} <= set(ran), ran
    assert any("--memgate-compare " in command and "--memgate-compare-fail=" in command for command in ran), ran
    # what the page says each step left behind
    assert [p.name for p in (pytester.path / "prof").glob("train.*.pt.trace.json")], "train.py wrote no trace"
    assert list((pytester.path / ".memgate" / "v1").glob("*/0001_*.json")), "--memgate-autosave saved no run"
    assert (pytester.path / "recorded" / "run" / "torch_trace.json").is_file()


# ---- the Ascend quick start and the bundled example ---------------------------------------------------


def test_sample_output_is_what_pytest_prints(pytester: pytest.Pytester) -> None:
    """`pytest --memgate` in a copy of examples/ (no PATH: `profiles` of its memgate.toml)."""
    shutil.copytree(EXAMPLES, pytester.path, dirs_exist_ok=True)
    # The recorded torch test has rows of its own, which the page leaves out: not run here (speed). In a
    # process of its own, as a user runs it: examples/test_model.py is named like this suite's tests/test_model.py.
    result = pytester.runpytest_subprocess("--memgate", "-p", "no:cacheprovider",
                                           "--deselect", "test_model.py::test_small_model_does_not_leak", timeout=600)
    result.assert_outcomes(passed=4, failed=3, deselected=1)
    assert_shows(_code_block(_section(_page("quickstart-ascend.md"), "What the gate prints")), result.outlines)


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


def test_example_profiles_key_is_in_the_example_budget_file() -> None:
    table = tomllib.loads((EXAMPLES / "memgate.toml").read_text("utf-8"))
    assert table["profiles"] == "profiles" and (EXAMPLES / table["profiles"]).is_dir()
    assert 'profiles = "profiles"' in _section(_page("quickstart-ascend.md"), "What the gate prints")


# ---- budget files and markers ------------------------------------------------------------------------


def _doc_blocks(lang: str) -> list[tuple[str, Block]]:
    return [(f"{page.name}:{block.line}", block) for page in PAGES for block in blocks(page.read_text("utf-8"))
            if block.lang == lang]


TOML_BLOCKS = _doc_blocks("toml")


@pytest.mark.parametrize(("where", "block"), TOML_BLOCKS, ids=[where for where, _ in TOML_BLOCKS])
def test_every_toml_block_is_a_budget_file_memgate_accepts(where: str, block: Block, tmp_path: Path) -> None:
    """Written as the file it stands for (``[tool.memgate]``: a pyproject.toml) and loaded as pytest
    and `memgate check` load it: every key known, every size and ratio valid."""
    pyproject = re.search(r"^\[\[?tool\.memgate", block.text, re.MULTILINE) is not None
    path = tmp_path / ("pyproject.toml" if pyproject else block.notes.get("file", "memgate.toml"))
    path.write_text(block.text, encoding="utf-8")
    loaded = load_budget_file(path)
    assert loaded.budgets, where


def test_the_pages_have_toml_blocks() -> None:
    assert {where.split(":")[0] for where, _ in TOML_BLOCKS} >= {"budgets.md", "quickstart-pytorch.md", "ci.md"}


def _markers(source: str) -> list[dict[str, Any]]:
    """The keywords of every ``@pytest.mark.memgate(...)`` in a Python block whose values are literals."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "memgate"
                and ast.unparse(node.func) == "pytest.mark.memgate"):
            assert not node.args, ast.unparse(node)
            found.append({k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None})
    return found


def test_every_marker_in_the_docs_is_a_valid_marker() -> None:
    markers = [(where, kwargs) for where, block in _doc_blocks("python") for kwargs in _markers(block.text)]
    assert len(markers) >= 4
    for where, kwargs in markers:
        budget = budget_from_mapping(kwargs, origin=where, default_name="marker", extra_keys=("profile",))
        assert not budget.rank_imbalance, where  # a marker rejects it


def _first_cells(table_text: str) -> set[str]:
    """The backticked names in the first cell of each row of the Markdown tables in ``table_text``."""
    names: set[str] = set()
    for line in table_text.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def test_budgets_page_defines_every_key() -> None:
    keys = _first_cells(_section(_page("budgets.md"), "Keys"))
    assert keys == set(BUDGET_KEYS) | {"profiles", "budgets"}
    assert CROSS_RANK in keys


def test_metrics_page_defines_every_metric() -> None:
    page = _page("metrics.md")
    assert set(METRIC_KEYS) <= _first_cells(_section(page, "Definitions"))
    assert "schedule(wait=1, warmup=1, active=6)" in _section(page, "Record enough steps")


# ---- the CLI and the pytest options --------------------------------------------------------------------


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_cli_page_documents_every_command_and_option() -> None:
    page = _page("cli.md")
    commands = _subcommands()
    documented = re.findall(r"^## memgate (\S+)$", page, re.MULTILINE)
    assert len(documented) == len(set(documented))
    assert set(documented) == set(commands), set(documented) ^ set(commands)
    synopsis = "\n".join(_code_block(page))
    assert set(re.findall(r"^memgate (\w+)", synopsis, re.MULTILINE)) == set(commands), "the synopsis"
    common = _section(page, "Options of every command that loads profiles")
    for name, parser in commands.items():
        section = _section(page, f"memgate {name}")
        for action in parser._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    named = re.compile(rf"`{re.escape(option)}(?![\w-])")  # `--top N`, not `--topp`
                    assert named.search(section) or named.search(common), f"memgate {name} {option}"


def test_cli_synopsis_names_the_commands_in_the_parsers_order() -> None:
    listed = re.findall(r"^memgate (\w+)", "\n".join(_code_block(_page("cli.md"))), re.MULTILINE)
    assert listed == [c for c in _subcommands() if c in listed]


_FLAG = re.compile(r"--memgate(?:-[a-z]+)*")


def test_options_page_documents_every_option_with_its_ini_twin() -> None:
    page = _page("options.md")
    registered = {o.flag: o for o in OPTIONS}
    rows: dict[str, list[str]] = {}
    for line in page.splitlines():
        if line.startswith("| `--memgate"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            named = _FLAG.match(cells[0].strip("`"))
            assert named is not None, line
            rows[named.group(0)] = cells
    assert set(rows) == set(registered)  # every option the plugin registers, and no other
    for flag, cells in rows.items():
        option = registered[flag]
        assert cells[1].startswith(f"`{option.dest}`"), (flag, cells[1])  # the ini twin
        value = cells[0].strip("`")[len(flag):]  # what the option takes: nothing, =VALUE or [=VALUE]
        if option.kind == "bool":
            assert value == "", flag
        elif option.optional_value:
            assert value == f"[={option.metavar}]", flag
        else:
            assert re.fullmatch(r"=[A-Z]+", value), flag


def test_every_option_the_docs_name_exists() -> None:
    registered = {o.flag for o in OPTIONS}
    for page in [*PAGES, REPO / "README.md"]:
        named = set(_FLAG.findall(page.read_text("utf-8")))
        assert named <= registered, f"{page.name}: {named - registered}"


# ---- the CI page, the README's links, the site ----------------------------------------------------------


def test_included_files_are_shown_as_they_are() -> None:
    included = [(where, block) for page in PAGES for where, block in
                ((f"{page.name}:{b.line}", b) for b in blocks(page.read_text("utf-8"))) if "include" in block.notes]
    assert {block.notes["include"] for _, block in included} >= {"examples/github-workflow.yml"}
    for where, block in included:
        assert block.text == (REPO / block.notes["include"]).read_text("utf-8"), where


def test_every_yaml_block_parses() -> None:
    yaml = pytest.importorskip("yaml")
    found = _doc_blocks("yaml")
    assert len(found) >= 2
    for where, block in found:
        assert isinstance(yaml.safe_load(block.text), dict), where


def test_readme_links_to_pages_that_exist() -> None:
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", README)
    assert {"docs/quickstart-pytorch.md", "docs/quickstart-ascend.md"} <= set(links)
    for link in links:
        assert (REPO / link).is_file(), link
    assert len(README.encode()) < 12_000  # the README introduces; the pages document


def test_readme_commands_run_one_after_the_other_from_the_clone_root() -> None:
    """The first command may not leave the shell in examples/ (a `cd` only inside a subshell), or the second,
    run after it, finds no pyproject.toml; the Ascend quick start shows the same first command, and .ci/run
    runs it against the built wheel."""
    commands = [b.text.strip() for b in blocks(_section(README, "Try it (fresh machine, Python ≥ 3.11)")) if b.lang == "bash"]
    assert len(commands) == 2, commands
    for command in commands:
        assert not re.search(r"(?:^|&&|;)\s*cd\b", re.sub(r"\([^()]*\)", "", command)), command
    assert commands[0].endswith("(cd examples && pytest --memgate=profiles)")
    ascend = [b.text.strip() for b in blocks(_section(_page("quickstart-ascend.md"), "Try it (fresh machine, Python ≥ 3.11)"))]
    assert ascend == commands[:1]
    assert "(cd examples && pytest --memgate=profiles)" in (REPO / ".ci" / "run").read_text("utf-8")


def test_site_builds_strict(tmp_path: Path) -> None:
    """Broken links or anchors, pages missing from the nav: warnings, and so errors under --strict."""
    pytest.importorskip("mkdocs", reason="the docs build needs mkdocs (pip install -e '.[docs]')")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(REPO / "mkdocs.yml"),
                           "--site-dir", str(tmp_path / "site")], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert {p.stem for p in PAGES} <= {p.parent.name for p in (tmp_path / "site").glob("*/index.html")} | {"index"}

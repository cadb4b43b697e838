"""Names from profile files reach a terminal as text, never as terminal commands.

An op name is whatever the model's code called it (``record_function`` labels, custom ops): one
holding ESC, a C1 control, a bidi override or a newline must not recolour or redraw the terminal,
reorder what it shows, or start a line of its own (a GitHub Actions log runs a line starting with
``::`` as a workflow command). The JSON and HTML reports keep the name exactly (escaped by their
own syntax); the text a person reads gets it with those characters written as escapes, end to end
here (the CLI, pytest); memgate.errors.printable itself is tested in tests/test_errors.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import SAMPLES

from memgate import cli

TRACE = SAMPLES / "torch" / "cpu_train_profile_memory.json"
# ESC colour, a C1 CSI, a right-to-left override, and a newline that starts a workflow command
HOSTILE = "aten::mm\x1b[31m\x9b2J\u202egnp.exe\n::error::injected"
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@pytest.fixture
def hostile_trace(tmp_path: Path) -> Path:
    text = TRACE.read_text("utf-8")
    assert text.count('"name": "aten::mm"') > 0
    path = tmp_path / "hostile.pt.trace.json"
    path.write_text(text.replace('"name": "aten::mm"', f'"name": {json.dumps(HOSTILE)}'), "utf-8")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "memgate", *args], capture_output=True, text=True, check=False)


def test_inspect_text_shows_a_hostile_op_name_escaped(hostile_trace: Path) -> None:
    done = run_cli("inspect", str(hostile_trace))
    assert done.returncode == 0, done.stderr
    assert not RAW.search(done.stdout), done.stdout
    assert not any(line.startswith("::") for line in done.stdout.splitlines())
    assert "aten::mm\\x1b[31m\\x9b2J\\u202egnp.exe\\x0a::error::injected" in done.stdout
    # the JSON report keeps the name exactly
    report = json.loads(run_cli("inspect", "--json", str(hostile_trace)).stdout)
    assert HOSTILE in report["profiles"][0]["devices"][0]["metrics"]["op_max_block_bytes"]


def test_check_lines_show_a_hostile_op_name_escaped(hostile_trace: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    budgets = tmp_path / "memgate.toml"
    budgets.write_text('[[budgets]]\nname = "ops"\nop_caps = { "aten::mm*" = "1 KiB" }\n', "utf-8")
    assert cli.main(["check", str(hostile_trace), "--budgets", str(budgets)]) == cli.EXIT_EXCEEDED
    out = capsys.readouterr().out
    assert "FAILED" in out and "\\x1b[31m" in out, out
    assert not RAW.search(out), out
    assert not any(line.startswith("::") for line in out.splitlines())


def test_a_pytest_failure_shows_a_hostile_op_name_escaped(hostile_trace: Path, tmp_path: Path) -> None:
    (tmp_path / "memgate.toml").write_text('[[budgets]]\nname = "ops"\nop_caps = { "aten::mm*" = "1 KiB" }\n',
                                           "utf-8")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--memgate={hostile_trace}",
                           "-q", "--rootdir", str(tmp_path)], capture_output=True, text=True, check=False,
                          cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "\\x1b[31m" in done.stdout, done.stdout[-3000:]
    assert not RAW.search(done.stdout), done.stdout[-3000:]
    assert not any(line.startswith("::error::injected") for line in done.stdout.splitlines())


def test_a_path_that_is_not_utf8_is_shown_by_its_bytes(tmp_path: Path) -> None:
    """Linux names are bytes: ``run\\xff`` reaches Python as ``run\\udcff``, which a strict UTF-8
    stream (a UTF-8 locale's stdout) or file cannot write. Every output shows the byte instead."""
    folder = os.fsdecode(os.fsencode(tmp_path) + b"/run\xff")
    os.mkdir(folder)
    shutil.copy(TRACE, Path(folder) / "t.pt.trace.json")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}

    def strict(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "memgate", *args], capture_output=True, text=True, check=False,
                              env=env, errors="surrogateescape")

    for command in (["inspect", folder], ["validate", folder]):
        done = strict(*command)
        assert done.returncode == 0, done.stderr
        assert "run\\xff" in done.stdout and "\udcff" not in done.stdout, done.stdout
    html = tmp_path / "report.html"
    done = strict("report", folder, "--html", str(html))
    assert done.returncode == 0, done.stderr
    assert "run\\xff" in html.read_text("utf-8")  # the page is valid UTF-8 and names the byte
    report = json.loads(strict("inspect", "--json", folder).stdout)
    assert report["profiles"][0]["path"].endswith("run\udcff/t.pt.trace.json")  # JSON: exact, as \udcff


def test_suggest_writes_a_hostile_op_name_as_escapes_that_toml_reads_back(hostile_trace: Path) -> None:
    import fnmatch
    import tomllib

    done = run_cli("suggest", str(hostile_trace))
    assert done.returncode == 0, done.stderr
    assert not RAW.search(done.stdout), done.stdout
    caps = tomllib.loads(done.stdout)["tool"]["memgate"]["budgets"][0]["op_caps"]
    assert any(fnmatch.fnmatchcase(HOSTILE, glob) for glob in caps), caps  # the cap names that op exactly

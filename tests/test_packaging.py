"""The wheel as pip builds it: licence text, one version, classifiers, URLs; the changelog names the version.

The wheel is built from a copy of the files it is made of (pyproject.toml, README.md, LICENSE and the
memgate package), so setuptools' build/ of the checkout can add no stale module, with the setuptools
already installed (the test extra's; no build isolation: no index is asked). A few seconds.
"""

from __future__ import annotations

import email.parser
import email.policy
import functools
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.message import Message
from pathlib import Path

import pytest

import memgate

ROOT = Path(__file__).resolve().parent.parent
PYTHONS = ("3.11", "3.12", "3.13")
DIST = "pytest-memgate"  # the distribution's name; the import package and the command are memgate
DIST_INFO = f"pytest_memgate-{memgate.__version__}.dist-info"


def _build(tmp: Path, env: dict[str, str] | None = None) -> tuple[Path, str]:
    """The wheel built from a copy of its files, and what the build said."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copyfile(ROOT / name, src / name)
    shutil.copytree(ROOT / "memgate", src / "memgate",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.pyd", "_snapshot_core.c"))
    out = tmp / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=300, check=False,
                          env=None if env is None else {**os.environ, **env})
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("pytest_memgate-*.whl")
    return wheel, done.stdout + done.stderr


@functools.cache
def _wheel(tmp: Path) -> Path:
    return _build(tmp)[0]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _wheel(tmp_path_factory.mktemp("wheel"))


def _metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(f"{DIST_INFO}/METADATA").decode()
    return email.parser.Parser(policy=email.policy.compat32).parsestr(text)


def test_the_wheel_ships_the_licence_text(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert f"{DIST_INFO}/licenses/LICENSE" in names, names
        shipped = zf.read(f"{DIST_INFO}/licenses/LICENSE")
    assert shipped == (ROOT / "LICENSE").read_bytes()
    assert b"Apache License" in shipped and b"Version 2.0, January 2004" in shipped
    assert b"END OF TERMS AND CONDITIONS" in shipped  # the full text, not a notice
    meta = _metadata(wheel)
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]


def test_the_distribution_is_pytest_memgate_with_the_memgate_package_command_and_plugin(wheel: Path) -> None:
    """`memgate` on PyPI is another project: the distribution is pytest-memgate; what it installs keeps the name."""
    assert _metadata(wheel)["Name"] == DIST
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        entry_points = zf.read(f"{DIST_INFO}/entry_points.txt").decode()
    assert "memgate/__init__.py" in names and "memgate/plugin.py" in names
    schemas = {f"memgate/schemas/{p.name}" for p in (ROOT / "memgate" / "schemas").glob("*.json")}
    assert schemas and schemas <= set(names), schemas - set(names)  # read at run time: validation needs them
    sections = dict(re.findall(r"^\[([^\]]+)\]\n((?:.+\n?)*)", entry_points, re.MULTILINE))
    assert sections["console_scripts"].split() == ["memgate", "=", "memgate.cli:entry"]
    assert sections["pytest11"].split() == ["memgate", "=", "memgate.plugin"]


_INSTALL = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?(?P<name>[\w.-]+)(?P<extras>\[[^\]]*\])?")


def test_every_install_line_names_the_distribution() -> None:
    """README, docs, examples and the messages of the code install pytest-memgate (with its extras), never `memgate`."""
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "examples").rglob("*.yml"),
             *(ROOT / "memgate").rglob("*.py")]
    named = {m.group("name") for f in files for m in _INSTALL.finditer(f.read_text("utf-8"))}
    assert DIST in named
    assert "memgate" not in named, [f.name for f in files if re.search(r"pip install\s+['\"]?memgate\b", f.read_text())]
    for page in ("README.md", "docs/index.md"):  # the name a newcomer may type is said to be another project
        assert "`memgate` distribution on PyPI" in (ROOT / page).read_text("utf-8"), page


def test_one_version_and_the_wheel_carries_it(wheel: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]  # written once, in memgate/__init__.py
    assert wheel.name.startswith(f"pytest_memgate-{memgate.__version__}-")
    assert _metadata(wheel)["Version"] == memgate.__version__


def test_classifiers_urls_and_dependencies(wheel: Path) -> None:
    meta = _metadata(wheel)
    classifiers = set(meta.get_all("Classifier") or [])
    for python in PYTHONS:
        assert f"Programming Language :: Python :: {python}" in classifiers
    assert {"Framework :: Pytest", "Typing :: Typed", "Operating System :: OS Independent"} <= classifiers
    assert any(c.startswith("Topic :: ") for c in classifiers)
    urls = dict(value.split(", ", 1) for value in meta.get_all("Project-URL") or [])
    assert set(urls) == {"Homepage", "Documentation", "Issues", "Changelog"}
    assert all(url.startswith("https://github.com/memgate/memgate") for url in urls.values())
    assert meta["Requires-Python"] == ">=3.11"
    requires = [r.split(";")[0].replace(" ", "") for r in meta.get_all("Requires-Dist") or []]
    assert "numpy>=1.26" in requires  # imported by the core: declared
    with zipfile.ZipFile(wheel) as zf:
        assert "memgate/py.typed" in zf.namelist()


def test_the_changelog_names_the_version() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in text
    version = re.escape(memgate.__version__)
    assert re.search(rf"^## \[{version}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.MULTILINE)  # a dated section
    assert re.search(rf"^\[{version}\]: https://github.com/memgate/memgate/", text, re.MULTILINE)  # and its link


def test_ci_runs_every_python_the_classifiers_name() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    for python in PYTHONS[1:]:
        assert python in script, python


@pytest.mark.skipif(importlib.util.find_spec("Cython") is None, reason="Cython is not installed")
def test_the_wheel_carries_the_compiled_snapshot_reader(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert any(re.fullmatch(r"memgate/readers/_snapshot_core\..*(so|pyd)", n) for n in names), names
    assert not wheel.name.endswith("-py3-none-any.whl")  # a platform wheel


def test_without_a_compiler_the_install_goes_on_and_says_so_once(tmp_path: Path) -> None:
    """No C compiler (CC names a command that fails): the wheel builds without the extension, and the
    build says once that the pure-Python reader will be used."""
    wheel, said = _build(tmp_path, {"CC": "false", "LDSHARED": "false"})
    with zipfile.ZipFile(wheel) as zf:
        assert not [n for n in zf.namelist() if "_snapshot_core" in n and not n.endswith(".pyx")]
    notices = [line for line in said.splitlines() if "the compiled snapshot reader was not built" in line]
    assert len(notices) == 1, said

"""The wheel as pip builds it: licence text, one version, classifiers, URLs; the changelog names the version.

The wheel is built from a copy of the files it is made of (pyproject.toml, README.md, LICENSE and the
memgate package), so setuptools' build/ of the checkout can add no stale module, with the setuptools
already installed (the test extra's; no build isolation: no index is asked). A few seconds.
"""

from __future__ import annotations

import email.parser
import email.policy
import functools
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
DIST_INFO = f"memgate-{memgate.__version__}.dist-info"


@functools.cache
def _wheel(tmp: Path) -> Path:
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copyfile(ROOT / name, src / name)
    shutil.copytree(ROOT / "memgate", src / "memgate", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = out.glob("memgate-*.whl")
    return wheel


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


def test_one_version_and_the_wheel_carries_it(wheel: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]  # written once, in memgate/__init__.py
    assert wheel.name.startswith(f"memgate-{memgate.__version__}-")
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

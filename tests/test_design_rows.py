"""The design's rows pinned: every module of memgate stands in one row of the stage table of
docs/design.md ("| stage | modules |"), and imports only from its own row and the rows above it.

Read from the code's own imports (the AST of every memgate/**.py, imports inside functions and under
TYPE_CHECKING included), as tests/test_imports.py pins the lean imports. The registry's import of a
loader by name (importlib, when a path may be the loader's) is the one exception the design states,
and no ``import`` statement.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"
TABLE_HEAD = "| stage | modules |"


def stage_rows(page: str) -> list[tuple[str, list[str]]]:
    """The stage table's rows, in order: (stage, the paths it names: ``memgate/x.py`` files and
    ``memgate/dir/`` folders, in backticks)."""
    lines = page.splitlines()
    start = lines.index(TABLE_HEAD)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = line.split("|")
        rows.append((cells[1].strip(), re.findall(r"`(memgate/[\w/.]*?(?:\.py|/))`", "|".join(cells[2:]))))
    return rows


def module_path(name: str, files: set[str]) -> str | None:
    """The file of module ``name`` (``memgate.a.b``) among ``files``: ``memgate/a/b.py`` or its package's
    ``memgate/a/b/__init__.py``; None for a name that is no module (a function imported from a package)."""
    base = name.replace(".", "/")
    return next((p for p in (f"{base}.py", f"{base}/__init__.py") if p in files), None)


def imported(source: str, files: set[str]) -> set[str]:
    """The files of memgate's modules that ``source`` imports (``from memgate.a import b`` imports
    ``memgate/a`` and, where ``b`` is a module, ``memgate/a/b.py``)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        found |= {p for p in (module_path(n, files) for n in names if n.split(".")[0] == "memgate") if p}
    return found


def row_of(path: str, rows: list[tuple[str, list[str]]]) -> int | None:
    """The index of the row that names ``path``: the row of the longest path named that is the file
    itself or a folder above it."""
    best: tuple[int, int] | None = None
    for index, (_, named) in enumerate(rows):
        for entry in named:
            named_here = path == entry or (entry.endswith("/") and path.startswith(entry))
            if named_here and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    return None if best is None else best[1]


def layout_problems(rows: list[tuple[str, list[str]]], sources: dict[str, str]) -> list[str]:
    """Each module in no row, and each import from a row below the importer's, one line each."""
    files = set(sources)
    problems = [f"{path} stands in no row of the stage table" for path in sorted(files) if row_of(path, rows) is None]
    for path in sorted(files):
        mine = row_of(path, rows)
        if mine is None:
            continue
        for target in sorted(imported(sources[path], files)):
            theirs = row_of(target, rows)
            if theirs is not None and theirs > mine:
                problems.append(f"{path} ({rows[mine][0]}) imports {target}, of a later row ({rows[theirs][0]})")
    return problems


def memgate_sources() -> dict[str, str]:
    return {p.relative_to(REPO).as_posix(): p.read_text(encoding="utf-8") for p in (REPO / "memgate").rglob("*.py")}


def test_every_module_imports_from_its_row_or_earlier() -> None:
    rows = stage_rows(DESIGN.read_text(encoding="utf-8"))
    assert [stage for stage, _ in rows] == ["beside", "readers", "model", "formats", "core", "gate", "outputs",
                                             "recording", "shells"]
    assert layout_problems(rows, memgate_sources()) == []


def test_a_planted_back_import_is_named() -> None:
    rows = stage_rows(DESIGN.read_text(encoding="utf-8"))
    sources = memgate_sources()
    sources["memgate/model.py"] += "\nfrom memgate.plugin import pytest_addoption\n"  # the model reaching a shell
    sources["memgate/readers/files.py"] += "\n\ndef f() -> None:\n    from memgate.loaders.snapshot import snapshot\n"
    sources["memgate/metrics.py"] += "\nfrom memgate.loaders import registry\n"  # core from formats: earlier, allowed
    sources["memgate/extra.py"] = ""
    assert layout_problems(rows, sources) == [
        "memgate/extra.py stands in no row of the stage table",
        "memgate/model.py (model) imports memgate/plugin.py, of a later row (shells)",
        "memgate/readers/files.py (readers) imports memgate/loaders/snapshot/__init__.py, of a later row (formats)",
        "memgate/readers/files.py (readers) imports memgate/loaders/snapshot/snapshot.py, of a later row (formats)",
    ]


def test_the_table_s_paths_exist() -> None:
    for stage, named in stage_rows(DESIGN.read_text(encoding="utf-8")):
        for path in named:
            assert (REPO / path).exists(), f"{stage}: {path}"

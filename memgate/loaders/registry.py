"""The formats memgate reads: what each loader module tells discovery about its own files.

Each loader module registers one :class:`Format` per format it reads (:func:`register`) when it is
imported; :mod:`memgate.discover` asks them, in order, which claims a path. The loader modules are
listed once, in :data:`LOADERS`, with the names of the paths each may claim: a module is imported
only when a path may be its own (:func:`import_loaders`), so ``memgate inspect x.pickle`` imports
the snapshot loader alone, not the Ascend stack (tests/test_imports.py checks both the import graph
and that no claim is missed). Detection goes by file name and header only (docs/formats-reference.md), never
by guessing from values.

The rank a profile's file or folder names (``rank3``, ``rank_3``, ``rank-3``, any case) is read by
one rule here (:func:`rank_in_names`); each loader says which names it asks, nearest first.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from memgate.model import Profile


@dataclass(frozen=True)
class Format:
    name: str
    claims: Callable[[Path], bool]  # is this path (a file or a directory) one profile of mine?
    load: Callable[[Path], Profile]
    # The rank a load would report, cheaply (file names, a small JSON), or None when only a load
    # can tell: lets pytest generate items only for the budgets that select a profile's rank.
    rank_hint: Callable[[Path], str | None] | None = None
    # When the profile recorded, (start, end) in ns since the epoch, cheaply (profiler_info), or None:
    # two profiles of one rank whose windows overlap are stated as a collision (memgate.discover).
    run_window: Callable[[Path], tuple[int, int] | None] | None = None
    # Is this file named as this format names its files? A file given directly that no format claims
    # goes to the loader whose name it bears, which says what is wrong with it (a pickle protocol,
    # a file that is not sqlite, an empty dump) instead of "not a profile file".
    named: Callable[[Path], bool] | None = None
    # What `memgate validate` loads with, where a load skips what no metric reads (a snapshot's
    # frames of frees): everything the schema covers is checked. None: ``load`` checks all already.
    load_thorough: Callable[[Path], Profile] | None = None
    # The profile a folder given directly lies inside, where it is a part of one of mine (torch_npu's
    # ASCEND_PROFILER_OUTPUT: the profile is its parent, which holds profiler_info and the rank), or None.
    profile_root: Callable[[Path], Path | None] | None = None


FORMATS: list[Format] = []  # in the order they are asked; each loader module registers its own


def register(fmt: Format, *, before: str | None = None) -> None:
    """Add a format (a loader module calls this when it is imported).

    ``before`` names a format this one must be asked before (a MindSpore ``*_ascend_ms`` directory
    also looks like a torch_npu one by its file names, so MindSpore claims first).
    """
    if any(f.name == fmt.name for f in FORMATS):
        return
    names = [f.name for f in FORMATS]
    FORMATS.insert(names.index(before) if before in names else len(FORMATS), fmt)


def format_named(name: str) -> Format:
    """The registered format called ``name`` (its loader module imported already)."""
    return next(f for f in FORMATS if f.name == name)


# ---- the rank a name states ---------------------------------------------------------------------------

RANK_IN_NAME = re.compile(r"rank[_-]?([0-9]+)", re.IGNORECASE)


def rank_in_names(*names: str, at_most: int | None = None) -> str | None:
    """The rank the first of ``names`` that states one states: the number after its first ``rank``,
    ``rank_`` or ``rank-`` (any case), leading zeros dropped; None when none does.

    ``at_most``: a number above it is no rank (a name's long number), and the next name is asked.
    """
    for name in names:
        m = RANK_IN_NAME.search(name)
        if m and (at_most is None or int(m.group(1)) <= at_most):
            return str(int(m.group(1)))
    return None


def rank_of_file(path: Path) -> str:
    """The rank a profile file's name states, else its folder's name, else "0" (not distributed)."""
    return rank_in_names(path.name, path.parent.name) or "0"


# ---- the loader modules -------------------------------------------------------------------------------

# Ascend output folders by name, and the files that make a folder a text export (docs/formats-reference.md §1-3).
_ASCEND_DIR_SUFFIXES = ("_ascend_pt", "_ascend_ms")
_ASCEND_DIR_NAMES = ("ASCEND_PROFILER_OUTPUT", "mindstudio_profiler_output")
_ASCEND_EXPORTS = ("memory_record.csv", "operator_memory.csv", "trace_view.json")
_SNAPSHOT_NAMES = (".pickle", ".pkl")
_TRACE_NAMES = (".json", ".json.gz")
_RECORDING_MANIFEST = "memgate_recording.json"  # memgate.record's manifest
_RAW_TIMELINE_NAMES = ("raw.json.gz", ".raw.json", ".raw.gz")


def _ascend_dir(path: Path) -> bool:
    """A folder an Ascend loader may claim: named like a profiler's output, or holding a text export."""
    name = path.name
    if name.endswith(_ASCEND_DIR_SUFFIXES) or name.startswith("PROF_") or name in _ASCEND_DIR_NAMES:
        return path.is_dir()
    return path.is_dir() and any((path / name).is_file() or (path / _ASCEND_DIR_NAMES[0] / name).is_file()
                                 for name in _ASCEND_EXPORTS)


def _recording_dir(path: Path) -> bool:
    """A folder the recording loader may claim: a trace by name directly inside it, beside a snapshot
    or memgate's recording manifest (a tracked recording without a snapshot)."""
    if not path.is_dir():
        return False
    try:
        with os.scandir(path) as entries:
            names = [e.name.lower() for e in entries]
    except OSError:
        return False
    return (any(n.endswith(_SNAPSHOT_NAMES) or n == _RECORDING_MANIFEST for n in names)
            and any(n.endswith(_TRACE_NAMES) and n != _RECORDING_MANIFEST for n in names))


def _ending(*endings: str) -> Callable[[str], bool]:
    return lambda name: name.endswith(endings)


def _timeline_name(name: str) -> bool:
    """``export_memory_timeline``'s names: ``*memory_timeline*.json(.gz)``, or the raw form's
    (``*raw.json.gz``, ``*.raw.json``, ``*.raw.gz`` as Holistic Trace Analysis keeps it)."""
    return ("memory_timeline" in name and name.endswith(_TRACE_NAMES)) or name.endswith(_RAW_TIMELINE_NAMES)


class Loader(NamedTuple):
    """A loader module (``memgate.loaders.<module>``, ``<module>`` dotted within a family's folder) and the
    paths its formats may claim."""

    module: str
    files: Callable[[str], bool] | None = None  # the file names (lower case) it may claim
    folders: Callable[[Path], bool] | None = None  # the folders it may claim


# In the order they register (a format registered with ``before`` is asked earlier).
LOADERS: tuple[Loader, ...] = (
    Loader("ascend.torch_npu", folders=_ascend_dir),
    Loader("snapshot.snapshot", _ending(*_SNAPSHOT_NAMES)),
    Loader("kineto.kineto", _ending(*_TRACE_NAMES)),
    Loader("kineto.memory_timeline", _timeline_name),
    Loader("msmemscope", _ending(".csv", ".db")),
    Loader("ascend.ascend_db", _ending(".db"), _ascend_dir),
    Loader("ascend.mindspore", _ending(".csv", ".txt"), _ascend_dir),
    Loader("ascend.cann", folders=_ascend_dir),
    Loader("recording", folders=_recording_dir),  # a snapshot (or a tracked manifest) beside a trace
)


def _may_claim(loader: Loader, path: Path, folder: Callable[[Callable[[Path], bool]], bool]) -> bool:
    if loader.files is not None and loader.files(path.name.lower()):
        return True
    return loader.folders is not None and folder(loader.folders)


def may_claim(module: str, path: Path) -> bool:
    """Can a format of loader ``module`` claim ``path``? (By name; False means it would not.)"""
    loader = next(entry for entry in LOADERS if entry.module == module)
    return _may_claim(loader, path, lambda test: test(path))


_imported: set[str] = set()


def import_loaders(path: Path | None = None) -> None:
    """Import the loader modules that may claim ``path`` (every one when None) and are not imported
    yet; each registers its formats as it is imported."""
    answers: dict[Callable[[Path], bool], bool] = {}  # each folder test once per path (its stats)

    def folder(test: Callable[[Path], bool]) -> bool:
        if test not in answers:
            answers[test] = path is not None and test(path)
        return answers[test]

    for loader in LOADERS:
        if loader.module not in _imported and (path is None or _may_claim(loader, path, folder)):
            _imported.add(loader.module)
            importlib.import_module(f"memgate.loaders.{loader.module}")

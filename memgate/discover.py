"""Find the profiles under a ``--memgate`` root: one profile per rank's output.

Detection goes by file name and header only (FORMATS.md), never by guessing from values.
Each format registers a :class:`Format` with a ``claims`` test over a path and a ``load``.

Several profiles of one rank under one root are normal (the profiling cycles of one run, jobs of a
pipeline, runs side by side): each is its own profile, keyed by its path. Two that claim the same rank
and format *and* whose profiling windows overlap (their profiler_info says when they recorded) look
like one run's rank twice: a copied folder, or processes that all took the default rank. Both are
kept and gated, and the collision is stated in each one's ``metadata["notes"]``, never resolved
silently.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from memgate.errors import InputError, MemgateError, cannot_read

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
    # two profiles of one rank whose windows overlap are stated as a collision (module docstring).
    run_window: Callable[[Path], tuple[int, int] | None] | None = None
    # Is this file named as this format names its files? A file given directly that no format claims
    # goes to the loader whose name it bears, which says what is wrong with it (a pickle protocol,
    # a file that is not sqlite, an empty dump) instead of "not a profile file".
    named: Callable[[Path], bool] | None = None
    # What `memgate validate` loads with, where a load skips what no metric reads (a snapshot's
    # frames of frees): everything the schema covers is checked. None: ``load`` checks all already.
    load_thorough: Callable[[Path], Profile] | None = None


FORMATS: list[Format] = []  # in the order they are asked; each loader module registers its own


# Ascend output folders by name, and the files that make a folder a text export (FORMATS.md §1-3).
_ASCEND_DIR_SUFFIXES = ("_ascend_pt", "_ascend_ms")
_ASCEND_DIR_NAMES = ("ASCEND_PROFILER_OUTPUT", "mindstudio_profiler_output")
_ASCEND_EXPORTS = ("memory_record.csv", "operator_memory.csv", "trace_view.json")


def _ascend_dir(path: Path) -> bool:
    """A folder an Ascend loader may claim: named like a profiler's output, or holding a text export."""
    name = path.name
    if name.endswith(_ASCEND_DIR_SUFFIXES) or name.startswith("PROF_") or name in _ASCEND_DIR_NAMES:
        return path.is_dir()
    return path.is_dir() and any((path / name).is_file() or (path / _ASCEND_DIR_NAMES[0] / name).is_file()
                                 for name in _ASCEND_EXPORTS)


# The loader modules, in the order they register: the file names each module's formats may claim
# (by ending) and whether they claim Ascend folders (_ascend_dir). A loader is imported only when a
# path may be its own: `memgate inspect x.pickle` imports the snapshot loader alone, not the Ascend
# stack (tests/test_imports.py checks both the import graph and that no claim is missed).
LOADERS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("torch_npu", (), True),
    ("snapshot", (".pickle", ".pkl"), False),
    ("kineto", (".json", ".json.gz", ".raw.gz"), False),  # .raw.gz: a raw memory timeline as HTA names it
    ("msmemscope", (".csv", ".db"), False),
    ("ascend_db", (".db",), True),
    ("mindspore", (".csv", ".txt"), True),
    ("cann", (), True),
    ("recording", (), False),  # claims a folder holding a snapshot beside a trace (_recording_dir)
)
_SNAPSHOT_NAMES = (".pickle", ".pkl")
_TRACE_NAMES = (".json", ".json.gz")


def _recording_dir(path: Path) -> bool:
    """A folder the recording loader may claim: a snapshot and a trace by name, directly inside it."""
    if not path.is_dir():
        return False
    try:
        with os.scandir(path) as entries:
            names = [e.name.lower() for e in entries]
    except OSError:
        return False
    return any(n.endswith(_SNAPSHOT_NAMES) for n in names) and any(n.endswith(_TRACE_NAMES) for n in names)


def _may_claim(path: Path, names: tuple[str, ...], ascend: bool, ascend_dir: Callable[[], bool],
               module: str = "") -> bool:
    if module == "recording":
        return _recording_dir(path)
    return (bool(names) and path.name.lower().endswith(names)) or (ascend and ascend_dir())


def may_claim(module: str, path: Path) -> bool:
    """Can a format of loader ``module`` claim ``path``? (By name; False means it would not.)"""
    _, names, ascend = next(entry for entry in LOADERS if entry[0] == module)
    return _may_claim(path, names, ascend, lambda: _ascend_dir(path), module)


_imported: set[str] = set()


def register(fmt: Format, *, before: str | None = None) -> None:
    """Add a format (loaders of other writers call this when imported).

    ``before`` names a format this one must be asked before (a MindSpore ``*_ascend_ms`` directory
    also looks like a torch_npu one by its file names, so MindSpore claims first).
    """
    if any(f.name == fmt.name for f in FORMATS):
        return
    names = [f.name for f in FORMATS]
    FORMATS.insert(names.index(before) if before in names else len(FORMATS), fmt)


@dataclass(frozen=True)
class Found:
    path: Path
    format: Format
    notes: tuple[str, ...] = ()  # what discovery states about this profile (a rank collision)

    def __reduce__(self) -> tuple[object, tuple[str, str, tuple[str, ...]]]:
        # Formats hold plain functions and lambdas: send the name, look it up on the other side.
        return _found_by_name, (str(self.path), self.format.name, self.notes)


def _found_by_name(path: str, format_name: str, notes: tuple[str, ...] = ()) -> Found:
    import_loaders()
    return Found(Path(path), _format(format_name), notes)


def _format(name: str) -> Format:
    return next(f for f in FORMATS if f.name == name)


def _claim(path: Path) -> Format | None:
    import_loaders(path)
    for fmt in FORMATS:
        if fmt.claims(path):
            return fmt
    return None


def discover(root: str | os.PathLike[str]) -> list[Found]:
    """All profiles under ``root`` (or ``root`` itself), in a stable order."""
    root = Path(root)
    try:
        return _discover(root)
    except OSError as exc:  # an unreadable folder below the root: say so, never skip a rank silently
        raise cannot_read(exc, root,
                          expected="read and search permission on every folder under the profile root") from None


def _raise(exc: OSError) -> None:
    raise exc


def _file_kind(path: Path) -> str:
    mode = path.stat().st_mode
    kinds = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _discover(root: Path) -> list[Found]:
    if not root.exists():
        raise InputError("no such file or directory", file=root,
                         expected="a profile directory or file", found="nothing at this path")
    if not os.access(root, os.R_OK) or (root.is_dir() and not os.access(root, os.X_OK)):
        raise InputError("not readable (permission denied)", file=root,
                         expected="read permission" + (" and search (x) permission" if root.is_dir() else ""))
    if root.name == _ASCEND_DIR_NAMES[0] and root.is_dir():
        from memgate.loaders import torch_npu

        if torch_npu.is_profile_dir(root):
            # The output folder given directly: the profile is its parent (profiler_info, rank), in
            # the format that claims the parent (a MindSpore or db profile claims before torch_npu).
            parent_fmt = _claim(root.parent)
            return [Found(root.parent, parent_fmt) if parent_fmt else Found(root, _format("torch_npu"))]
    fmt = _claim(root)
    if fmt is not None:
        return [Found(root, fmt)]
    if not root.is_dir():
        named = next((f for f in FORMATS if f.named is not None and f.named(root)), None)
        if named is not None:
            return [Found(root, named)]
        if not root.is_file():  # a FIFO, a device (/dev/zero), a socket: never read (a read could block or never end)
            raise InputError("not a regular file", file=root, expected="a profile directory or file",
                             found=_file_kind(root))
        raise InputError("not a profile file of any known format", file=root,
                         expected="a profile directory or file (see `memgate inspect --help`)")
    found: list[Found] = []
    seen: set[tuple[int, int]] = set()
    for current, dirs, files in os.walk(root, onerror=_raise, followlinks=True):
        here = Path(current)
        st = here.stat()
        if (st.st_dev, st.st_ino) in seen:  # a symlink loop
            dirs[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()
        if here != root and (fmt := _claim(here)) is not None:
            found.append(Found(here, fmt))
            dirs[:] = []  # a profile's own subfolders are part of it
            continue
        for name in sorted(files):
            path = here / name
            if (fmt := _claim(path)) is not None:
                found.append(Found(path, fmt))
    if not found:
        raise InputError(
            "no profile found in this directory",
            file=root,
            expected="a *_ascend_pt / *_ascend_ms / PROF_* directory, a snapshot pickle, a Kineto trace "
            "or an msMemScope dump",
        )
    return _note_rank_collisions(found)


def _note_rank_collisions(found: list[Found]) -> list[Found]:
    """Each profile whose rank and format another one claims over an overlapping profiling window gets
    a note naming the other (module docstring)."""
    claims: dict[tuple[str, str], list[tuple[int, tuple[int, int]]]] = {}
    for index, entry in enumerate(found):
        window = _quietly(entry.format.run_window, entry.path)
        rank = rank_hint(entry) if window is not None else None
        if window is not None and rank is not None:
            claims.setdefault((entry.format.name, rank), []).append((index, window))
    notes: dict[int, list[str]] = {}
    for (name, rank), members in claims.items():
        for i, (a, (a_lo, a_hi)) in enumerate(members):
            for b, (b_lo, b_hi) in members[i + 1:]:
                if a_lo <= b_hi and b_lo <= a_hi:
                    for this, other in ((a, b), (b, a)):
                        notes.setdefault(this, []).append(
                            f"rank {rank} ({name}) is also claimed by {found[other].path}, recorded over an "
                            "overlapping window (the same run's rank twice? a copied folder, or processes that "
                            "all took the default rank): both are kept, each keyed by its path")
    return [replace(entry, notes=tuple(notes[i])) if i in notes else entry for i, entry in enumerate(found)]


def _quietly(fn: Callable[[Path], tuple[int, int] | None] | None, path: Path) -> tuple[int, int] | None:
    if fn is None:
        return None
    try:
        return fn(path)
    except (MemgateError, OSError):
        return None  # the load will report it


def rank_hint(found: Found) -> str | None:
    hint = found.format.rank_hint
    if hint is None:
        return None
    try:
        return hint(found.path)
    except MemgateError:
        return None  # the load will report it


def load(found: Found, *, thorough: bool = False) -> Profile:
    """``found``'s profile; ``thorough``: with every part its schema covers checked (``memgate validate``)."""
    from memgate.model import check_byte_ranges

    profile = (found.format.load_thorough if thorough and found.format.load_thorough else found.format.load)(found.path)
    check_byte_ranges(profile)  # before anything adds byte counts up in int64
    if found.notes:
        notes = [*profile.metadata.get("notes", []), *found.notes]
        profile = replace(profile, metadata={**profile.metadata, "notes": notes})
    return profile


def import_loaders(path: Path | None = None) -> None:
    """Import the loader modules that may claim ``path`` (every one when None) and are not imported
    yet; each registers its formats as it is imported."""
    import functools
    import importlib

    ascend_dir = functools.cache(lambda: path is not None and _ascend_dir(path))  # its stats once per path
    for module, names, ascend in LOADERS:
        if module not in _imported and (path is None or _may_claim(path, names, ascend, ascend_dir, module)):
            _imported.add(module)
            importlib.import_module(f"memgate.loaders.{module}")

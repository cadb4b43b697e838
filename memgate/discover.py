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
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from memgate.errors import InputError, MemgateError, cannot_read
from memgate.loaders import torch_npu
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


TORCH_NPU = Format("torch_npu", lambda p: p.is_dir() and torch_npu.is_profile_dir(p), torch_npu.load, torch_npu.rank_hint,
                   torch_npu.run_window)
FORMATS: list[Format] = [TORCH_NPU]


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
    _load_plugins()
    return Found(Path(path), next(f for f in FORMATS if f.name == format_name), notes)


def _claim(path: Path) -> Format | None:
    for fmt in FORMATS:
        if fmt.claims(path):
            return fmt
    return None


def discover(root: str | os.PathLike[str]) -> list[Found]:
    """All profiles under ``root`` (or ``root`` itself), in a stable order."""
    _load_plugins()
    root = Path(root)
    try:
        return _discover(root)
    except OSError as exc:  # an unreadable folder below the root: say so, never skip a rank silently
        raise cannot_read(exc, root,
                          expected="read and search permission on every folder under the profile root") from None


def _raise(exc: OSError) -> None:
    raise exc


def _discover(root: Path) -> list[Found]:
    if not root.exists():
        raise InputError("no such file or directory", file=root,
                         expected="a profile directory or file", found="nothing at this path")
    if not os.access(root, os.R_OK) or (root.is_dir() and not os.access(root, os.X_OK)):
        raise InputError("not readable (permission denied)", file=root,
                         expected="read permission" + (" and search (x) permission" if root.is_dir() else ""))
    if root.is_dir() and root.name == torch_npu.OUTPUT_DIR and torch_npu.is_profile_dir(root):
        # The output folder given directly: the profile is its parent (profiler_info, rank), in the
        # format that claims the parent (FORMATS[0] need not be torch_npu once others registered).
        parent_fmt = _claim(root.parent)
        return [Found(root.parent, parent_fmt) if parent_fmt else Found(root, TORCH_NPU)]
    fmt = _claim(root)
    if fmt is not None:
        return [Found(root, fmt)]
    if not root.is_dir():
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


def load(found: Found) -> Profile:
    profile = found.format.load(found.path)
    if found.notes:
        notes = [*profile.metadata.get("notes", []), *found.notes]
        profile = replace(profile, metadata={**profile.metadata, "notes": notes})
    return profile


_PLUGINS_LOADED = False


def _load_plugins() -> None:
    """Import the other loaders so they register themselves (kept lazy: import cost)."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    import importlib

    for module in ("snapshot", "kineto", "msmemscope", "ascend_db", "mindspore", "cann"):
        try:
            importlib.import_module(f"memgate.loaders.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"memgate.loaders.{module}":
                raise

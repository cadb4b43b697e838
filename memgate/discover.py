"""Find the profiles under a ``--memgate`` root: one profile per rank's output.

Detection goes by file name and header only (docs/formats-reference.md), never by guessing from values: each
format of :mod:`memgate.loaders.registry` says whether it claims a path, and loads it.

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
from memgate.loaders.registry import FORMATS, Format, format_named, import_loaders
from memgate.readers.files import LFS_POINTER, LFS_POINTER_MAX, check_not_lfs_file

if TYPE_CHECKING:
    from memgate.model import Profile


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
    return Found(Path(path), format_named(format_name), notes)


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


def _check_not_lfs_pointer(path: Path) -> None:
    """A file no format claims may be a Git LFS pointer to a profile: say so (the fix is a pull)."""
    try:
        check_not_lfs_file(path, path.stat().st_size)
    except OSError:  # unreadable: the general message stands
        return


def _by_content(path: Path, *, given: bool) -> Format | None:
    """The format a file whose name no format took is in by its first bytes (one read of them): a Git LFS
    pointer is the format that names it (``snapshot.pickle`` not pulled: found, its load says what it is;
    skipped, the profile would be missing from the run without a word); torch writes a snapshot as a
    pickle whatever the file is called (``_dump_snapshot("memory_snapshot.json")``, a real one in a public
    repository), and ``export_memory_timeline`` a ``[times, sizes]`` JSON under any name (that one only for a
    file ``given`` by name: in a folder, an array of arrays may be any data)."""
    try:
        if not path.is_file():
            return None
        with open(path, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return None
    if head.startswith(LFS_POINTER) and len(head) <= LFS_POINTER_MAX:
        return next((f for f in FORMATS if f.named is not None and f.named(path)), None)
    if head[:1] == b"\x80":  # a binary pickle's PROTO: only the snapshot loader reads pickles
        from memgate.loaders.snapshot import snapshot

        return format_named(snapshot.FORMAT) if snapshot.is_snapshot_head(head) else None
    if given:
        from memgate.loaders.kineto import memory_timeline

        return format_named(memory_timeline.TIMELINE_FORMAT) if memory_timeline.is_timeline_content(path) else None
    return None


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
    if (inside := _inside_profile(root)) is not None:
        return [inside]
    fmt = _claim(root)
    if fmt is not None:
        return [Found(root, fmt)]
    if not root.is_dir():
        named = next((f for f in FORMATS if f.named is not None and f.named(root)), None) \
            or _by_content(root, given=True)
        if named is not None:
            return [Found(root, named)]
        if not root.is_file():  # a FIFO, a device (/dev/zero), a socket: never read (a read could block or never end)
            raise InputError("not a regular file", file=root, expected="a profile directory or file",
                             found=_file_kind(root))
        _check_not_lfs_pointer(root)
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
            if (fmt := _claim(path) or _by_content(path, given=False)) is not None:
                found.append(Found(path, fmt))
    if not found:
        raise InputError(
            "no profile found in this directory",
            file=root,
            expected="a *_ascend_pt / *_ascend_ms / PROF_* directory, a snapshot pickle, a Kineto trace "
            "or an msMemScope dump",
        )
    return _note_rank_collisions(found)


def _inside_profile(root: Path) -> Found | None:
    """``root`` given directly where it is a part of a profile (torch_npu's ASCEND_PROFILER_OUTPUT): the
    profile it lies inside, in the format that claims that (a MindSpore or db profile claims before
    torch_npu); ``root`` itself in the format that knows it for a part, when none claims the profile."""
    import_loaders(root)
    for fmt in FORMATS:
        if fmt.profile_root is not None and (profile := fmt.profile_root(root)) is not None:
            owner = _claim(profile)
            return Found(profile, owner) if owner else Found(root, fmt)
    return None


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

"""One spelling of an owner that is a Python frame, whatever profile it comes from: ``function (file:line)``.

The writers spell a frame their own way: a Kineto trace ``train.py(12): step`` (torch writes the file
relative to the ``sys.path`` entry it was imported from), a snapshot frame ``{filename, line, name}``
(the file's absolute path), which memgate once wrote ``/src/train.py:12:step``. Every loader, the
recorder's allocation stacks and the reading of old baselines go through :func:`frame_owner`, so
one function of one file is one owner in every profile type, every output and every ``owner_caps``
glob: ``step (tests/train.py:12)``.

The file is shown relative to the working directory when it lies under it: an absolute path under it,
or a relative one found under it or under an import path (``sys.path`` entry) that is under it (the
trimmed name Kineto writes); any other file as written. Owners that are no Python frame (a module
path ``Net_0/Encoder_0``, msMemScope's ``PTA@…``, MindSpore's stacks) are the writer's text.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from pathlib import Path

# The formats whose owners can be Python frames (the files they name depend on the working directory).
FRAME_OWNER_FORMATS = frozenset({"kineto", "torch_snapshot", "torch_recording"})

# Kineto's python_function name: "train.py(12): step"
KINETO_FRAME = re.compile(r"\A(?P<file>.+)\((?P<line>[0-9]+)\): (?P<function>.+)\Z", re.DOTALL)
# the spelling memgate gave snapshot frames before 0.x: "/src/train.py:12:step" (the function may hold "::")
_OLD_SNAPSHOT = re.compile(r"\A(?P<file>.+?):(?P<line>[0-9]+):(?P<function>.+)\Z", re.DOTALL)
# the one spelling: "step (train.py:12)"
OWNER_FRAME = re.compile(r"\A(?P<function>.+) \((?P<file>.+):(?P<line>[0-9]+)\)\Z", re.DOTALL)


def frame_owner(file: str, line: int | str, function: str) -> str:
    """The owner a Python frame is: ``step (tests/train.py:12)`` (see the module docstring)."""
    return f"{function} ({shown_file(file)}:{line})"


def shown_file(file: str) -> str:
    """``file`` relative to the working directory where it lies under it, else as written."""
    return _shown(file, os.getcwd(), tuple(sys.path))


@functools.lru_cache(maxsize=4096)
def _shown(file: str, cwd: str, search: tuple[str, ...]) -> str:
    if not file or file.startswith("<"):
        return file  # <string>, <frozen ...>: no file
    base = Path(cwd)
    path = Path(file)
    if path.is_absolute():
        candidates = [path]
    else:  # a name relative to the cwd or to an import path under it (Kineto trims the import path)
        roots = [base] + [Path(entry) if Path(entry).is_absolute() else base / entry for entry in search if entry]
        candidates = [root / path for root in roots if _under(root, base)]
        candidates = [c for c in candidates if c.is_file()][:1]
    for candidate in candidates:
        for path, root in ((Path(os.path.normpath(candidate)), base), (candidate.resolve(), base.resolve())):
            if path.is_relative_to(root):  # as written, else with symlinks resolved (/tmp on macOS)
                return path.relative_to(root).as_posix()
    return file


def _under(path: Path, base: Path) -> bool:
    return Path(os.path.normpath(path)).is_relative_to(base)


def kineto_frame_owner(name: str) -> str | None:
    """The owner of a Kineto ``python_function`` frame name (``train.py(12): step``), None if it is none."""
    match = KINETO_FRAME.match(name)
    return None if match is None else frame_owner(match["file"], match["line"], match["function"])


def normalize_owner(owner: str) -> str:
    """An owner as this memgate spells it: a frame in an older spelling (Kineto's ``train.py(12): step``,
    memgate's former ``/src/train.py:12:step``) becomes ``step (train.py:12)``; any other owner, and one
    already spelled so, is returned as it is. For baselines and saved runs written before the spelling
    was one."""
    if OWNER_FRAME.match(owner):
        return owner
    for pattern in (KINETO_FRAME, _OLD_SNAPSHOT):
        match = pattern.match(owner)
        if match is not None and _looks_like_file(match["file"]):
            return frame_owner(match["file"], match["line"], match["function"])
    return owner


def _looks_like_file(file: str) -> bool:
    """A frame's file names a file with an extension (``x.py``, ``lib.so``): not a module path or an op."""
    return re.search(r"\.[A-Za-z0-9_]+\Z", file) is not None


# an owner_caps glob written on a former frame spelling: "train.py(*): step", "*train.py:*:step", "*:step"
_OLD_GLOB = (re.compile(r"\A(?P<file>.*)\((?:[0-9]+|\*)\): (?P<function>.+)\Z", re.DOTALL),
             re.compile(r"\A(?P<file>.*?):(?:[0-9]+|\*):(?P<function>[^:]+)\Z", re.DOTALL),
             re.compile(r"\A(?P<file>\*):(?P<function>[A-Za-z_][A-Za-z0-9_]*)\Z"))


def respelled_glob(glob: str) -> str | None:
    """The glob an owner_caps glob written on a former frame spelling means today (``train.py(*): step``
    → ``step (train.py:*)``), None when it is no such glob: for the error of a glob that matches nothing."""
    for pattern in _OLD_GLOB:
        match = pattern.match(glob)
        if match is not None:
            file = match["file"].strip("*")
            return f"{match['function']} (*{file}:*)" if file else f"{match['function']} (*)"
    return None

"""Find the profiles under a ``--memgate`` root: one profile per rank's output.

Detection goes by file name and header only (FORMATS.md), never by guessing from values.
Each format registers a :class:`Format` with a ``claims`` test over a path and a ``load``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memgate.errors import InputError
from memgate.loaders import torch_npu
from memgate.model import Profile


@dataclass(frozen=True)
class Format:
    name: str
    claims: Callable[[Path], bool]  # is this path (a file or a directory) one profile of mine?
    load: Callable[[Path], Profile]


FORMATS: list[Format] = [
    Format("torch_npu", lambda p: p.is_dir() and torch_npu.is_profile_dir(p), torch_npu.load),
]


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


def _claim(path: Path) -> Format | None:
    for fmt in FORMATS:
        if fmt.claims(path):
            return fmt
    return None


def discover(root: str | os.PathLike[str]) -> list[Found]:
    """All profiles under ``root`` (or ``root`` itself), in a stable order."""
    _load_plugins()
    root = Path(root)
    if not root.exists():
        raise InputError("no such file or directory", file=root)
    if not os.access(root, os.R_OK):
        raise InputError("not readable (permission denied)", file=root)
    if root.is_dir() and root.name == torch_npu.OUTPUT_DIR and torch_npu.is_profile_dir(root):
        return [Found(root.parent if _claim(root.parent) else root, FORMATS[0])]
    fmt = _claim(root)
    if fmt is not None:
        return [Found(root, fmt)]
    if not root.is_dir():
        raise InputError("not a profile file of any known format", file=root,
                         expected="a profile directory or file (see `memgate inspect --help`)")
    found: list[Found] = []
    seen: set[tuple[int, int]] = set()
    for current, dirs, files in os.walk(root, followlinks=True):
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
    return found


def load(found: Found) -> Profile:
    return found.format.load(found.path)


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

"""What every reader checks of a file before it opens it: there, a regular file, readable, not empty,
and not a Git LFS pointer standing in for the profile (a CI checkout without ``git lfs pull``).

Each failure is an InputError naming the file, before any read could block (a FIFO), fail half-way
or read nothing. The caps on what a file may hold are :mod:`memgate.readers.limits`'.
"""

from __future__ import annotations

import os
from pathlib import Path

from memgate.errors import InputError


def check_readable(path: Path) -> None:
    """The file exists, is a regular file, can be read and is not empty; InputError otherwise."""
    if not path.exists():
        raise InputError("no such file", file=path)
    if not path.is_file():
        raise InputError("not a regular file", file=path)
    if not os.access(path, os.R_OK):
        raise InputError("file is not readable (permission denied)", file=path)
    size = path.stat().st_size
    if size == 0:
        raise InputError("empty file (0 bytes)", file=path)
    check_not_lfs_file(path, size)


# Git LFS replaces a tracked file by a small text pointer (spec v1: this first line, an oid, a size)
# wherever LFS did not fetch it: the profile is not there, and its bytes must not be read as one.
LFS_POINTER = b"version https://git-lfs.github.com/spec/"
LFS_POINTER_MAX = 1024  # bytes: a pointer is ~130


def check_not_lfs_file(path: Path, size: int) -> None:
    """InputError where the file of ``size`` bytes at ``path`` is a Git LFS pointer (OSError where it
    cannot be read)."""
    if size <= LFS_POINTER_MAX:
        with open(path, "rb") as fh:
            check_not_lfs_pointer(path, fh.read(64))


def check_not_lfs_pointer(path: Path, head: bytes) -> None:
    """InputError where ``head`` (a file's first bytes) is a Git LFS pointer's."""
    if head.startswith(LFS_POINTER):
        raise InputError("a Git LFS pointer, not the file it stands for", file=path,
                         expected="the file's content: run `git lfs pull` (or check out with Git LFS installed)",
                         found=head.split(b"\n", 1)[0].decode("ascii", "replace"))

"""What every reader checks of a file before it opens it: there, a regular file, readable, not empty.

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
    if path.stat().st_size == 0:
        raise InputError("empty file (0 bytes)", file=path)

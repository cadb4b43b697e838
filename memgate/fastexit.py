"""Leaving big inputs to the process exit instead of freeing them one object at a time.

An unpickled snapshot is millions of small Python objects; freeing them takes ~0.2 s per 1M trace
entries, time the ``memgate`` command would spend just before its process ends and the OS takes
the memory back at once. The command's entry point (:func:`memgate.cli.as_command`) turns keeping on;
a loader offers what it is done with (:func:`keep`), and the command ends with :func:`exit`, which
flushes the output and ends the process without the interpreter's teardown (as mypy does). Within
a process that goes on (pytest, a library user) nothing is kept: keeping is off unless turned on.
Kept inputs are capped (:data:`_budget`): a folder of many snapshots does not pile up.
"""

from __future__ import annotations

import gc
import os
import sys

TYPE_CHECKING = False  # not typing's: importing typing costs ~3 ms of every `memgate --help`
if TYPE_CHECKING:
    from typing import NoReturn

_budget = 0  # input bytes still allowed to be kept (0: keeping is off)
_kept: list[object] = []
_command = False


def as_command(keep_bytes: int) -> None:
    """This process is the memgate command's own (never a pytest run's or a library user's): keep
    up to ``keep_bytes`` of input files' worth of objects, and let other modules do what only such
    a process may (:func:`is_command`; memgate.lazy.arrow_without_pandas)."""
    global _budget, _command
    _budget = max(0, keep_bytes)
    _command = True


def is_command() -> bool:
    return _command


def keep(objects: object, input_bytes: int) -> bool:
    """Hold ``objects`` (read from ``input_bytes`` of file) until the process exits, where keeping
    is on and the budget allows; True when they are kept (the caller's reference may go)."""
    global _budget
    if input_bytes > _budget:
        return False
    _budget -= input_bytes
    _kept.append(objects)
    gc.freeze()  # out of the cyclic collector's sight: its passes over millions of kept objects cost seconds
    return True


def exit(code: int) -> NoReturn:
    """End the process with ``code``: at once where inputs were kept (output flushed first), else
    as ``sys.exit`` does."""
    if not _kept:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said there
            pass
    os._exit(code)

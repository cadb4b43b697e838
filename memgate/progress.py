"""Progress for long loads: silent for the first ~2 s, then one self-updating line.

Shown on a terminal (or when asked), never in CI logs unless asked: a bar that redraws with
carriage returns turns into thousands of lines in a log file.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from memgate.sizes import format_size

DELAY_S = 2.0
INTERVAL_S = 0.5
SPINNER = "|/-\\"


def wanted(stream: TextIO, asked: bool | None) -> bool:
    """``asked`` True/False forces it; otherwise only on a terminal and outside CI."""
    if asked is not None:
        return asked
    return stream.isatty() and not os.environ.get("CI")


def input_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                continue
    return total


@contextmanager
def progress(label: str | Callable[[], str], write: Callable[[str], None] | None, *, delay: float = DELAY_S,
             interval: float = INTERVAL_S, done: str = "") -> Iterator[None]:
    """Report ``label`` with elapsed time once the block has run longer than ``delay``."""
    if write is None:
        yield
        return
    stop = threading.Event()
    start = time.monotonic()
    shown = threading.Event()

    def run() -> None:
        if stop.wait(delay):
            return
        shown.set()
        text = label() if callable(label) else label
        tick = 0
        while not stop.is_set():
            write(f"\r{SPINNER[tick % len(SPINNER)]} memgate: {text} … {time.monotonic() - start:.0f} s")
            tick += 1
            stop.wait(interval)

    thread = threading.Thread(target=run, name="memgate-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if shown.is_set():
            text = label() if callable(label) else label
            write(f"\r  memgate: {text} … done in {time.monotonic() - start:.1f} s{done}\n")


def stderr_writer() -> Callable[[str], None]:
    def write(text: str) -> None:
        sys.stderr.write(text)
        sys.stderr.flush()

    return write


def describe(path: Path) -> str:
    return f"loading {path} ({format_size(input_size(path))})"

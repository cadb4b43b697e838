"""memgate.progress: a long load shows one self-updating line after a delay, only on a terminal outside CI
(or when asked), and names what it loads with its size."""

from __future__ import annotations

import io
import time
from pathlib import Path

import pytest

from memgate.progress import describe, input_size, progress, stderr_writer, wanted


def test_progress_is_silent_for_fast_work_and_shown_for_slow() -> None:
    lines: list[str] = []
    with progress("fast", lines.append, delay=0.5):
        pass
    assert lines == []
    with progress(lambda: "loading slow", lines.append, delay=0.05, interval=0.02):
        time.sleep(0.2)
    assert any("memgate: loading slow …" in line for line in lines)
    assert lines[-1].startswith("\r  memgate: loading slow … done in ")


def test_progress_wanted_only_on_a_terminal_outside_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    assert wanted(Tty(), None) is True  # type: ignore[arg-type]
    monkeypatch.setenv("CI", "true")
    assert wanted(Tty(), None) is False  # type: ignore[arg-type]
    assert wanted(Tty(), True) is True  # type: ignore[arg-type]
    assert wanted(Tty(), False) is False  # type: ignore[arg-type]


def test_no_writer_is_no_progress() -> None:
    with progress("anything", None, delay=0.0):
        time.sleep(0.01)  # no thread, nothing to write to


def test_the_label_and_the_done_suffix_of_a_slow_load() -> None:
    lines: list[str] = []
    with progress("loading x", lines.append, delay=0.0, interval=0.01, done=" (3 ranks)"):
        deadline = time.monotonic() + 30
        while not lines and time.monotonic() < deadline:  # until the line shows, however busy the machine
            time.sleep(0.005)
    assert lines[0].startswith("\r| memgate: loading x … ")  # the spinner's first frame
    assert lines[-1].startswith("\r  memgate: loading x … done in ") and lines[-1].endswith(" s (3 ranks)\n")


def test_input_size_of_a_file_and_of_a_folder_tree(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(b"x" * 1000)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_bytes(b"y" * 2000)
    (tmp_path / "sub" / "gone").symlink_to(tmp_path / "missing")  # a dangling link counts nothing
    assert input_size(tmp_path / "a.csv") == 1000
    assert input_size(tmp_path) == 3000
    assert describe(tmp_path) == f"loading {tmp_path} (2.93 KiB)"


def test_stderr_writer_writes_and_flushes(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stream(io.StringIO):
        flushed = 0

        def flush(self) -> None:
            self.flushed += 1

    stream = Stream()
    monkeypatch.setattr("sys.stderr", stream)
    stderr_writer()("\r| memgate: x")
    assert stream.getvalue() == "\r| memgate: x" and stream.flushed == 1

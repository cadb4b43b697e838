"""memgate.readers.files: what every reader checks of a file before it opens it. Each failure is an
InputError naming the file, before a read could block (a named pipe), fail half-way or read nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memgate.errors import InputError
from memgate.readers.files import check_readable


def _refusal(path: Path) -> str:
    with pytest.raises(InputError) as info:
        check_readable(path)
    assert info.value.file == str(path)
    return info.value.one_line()


def test_a_readable_file_with_bytes_passes(tmp_path: Path) -> None:
    path = tmp_path / "memory_record.csv"
    path.write_text("Component\n")
    check_readable(path)


def test_what_is_not_a_readable_file_with_bytes_is_named(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    assert _refusal(tmp_path / "missing.csv") == f"{tmp_path / 'missing.csv'}: no such file"
    assert _refusal(tmp_path) == f"{tmp_path}: not a regular file"
    assert _refusal(empty) == f"{empty}: empty file (0 bytes)"
    dangling = tmp_path / "gone.csv"
    dangling.symlink_to(tmp_path / "nowhere")
    assert _refusal(dangling) == f"{dangling}: no such file"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
def test_a_named_pipe_is_refused_without_opening_it(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)
    assert _refusal(fifo) == f"{fifo}: not a regular file"  # an open() would wait for a writer forever


def test_a_file_without_read_permission(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "memory_record.csv"
    path.write_text("Component\n")
    real_access = os.access
    # what chmod 000 does for a non-root user (root reads any file, so the check is simulated)
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == path else real_access(p, mode))
    assert _refusal(path) == f"{path}: file is not readable (permission denied)"


POINTER = (b"version https://git-lfs.github.com/spec/v1\n"
           b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 150343767\n")


@pytest.mark.parametrize("name", ["operator_memory.csv", "trace.pt.trace.json", "snapshot.pickle", "profile.db",
                                  "unknown.bin"])
def test_a_git_lfs_pointer_is_named_as_one(tmp_path: Path, name: str) -> None:
    """A CI checkout without `git lfs pull` leaves pointers where the profiles were: whatever the file's
    name, memgate (the reader, or discovery where no format claims it) says what it is and how to fetch it."""
    from memgate.discover import discover, load

    path = tmp_path / name
    path.write_bytes(POINTER)
    with pytest.raises(InputError) as info:
        for found in discover(path):
            load(found)
    assert info.value.file == str(path)
    assert "a Git LFS pointer" in info.value.one_line() and "git lfs pull" in info.value.one_line()
    assert "version https://git-lfs.github.com/spec/v1'" in info.value.one_line()  # the first line only


def test_a_git_lfs_pointer_in_a_profile_folder_is_an_error_not_a_skip(tmp_path: Path) -> None:
    """In a folder, a pointer named like a profile (``memory.pickle``) is found and named as a pointer:
    skipped, the profile would be missing from the run without a word (rc 0). A pointer no format names
    (model weights kept in LFS beside the profiles) is not a profile, and stays out of the run."""
    from memgate.discover import discover, load

    (tmp_path / "memory.pickle").write_bytes(POINTER)
    (tmp_path / "weights.bin").write_bytes(POINTER)
    (found,) = discover(tmp_path)
    assert found.path == tmp_path / "memory.pickle"
    with pytest.raises(InputError, match="a Git LFS pointer"):
        load(found)


def test_a_file_that_only_mentions_lfs_is_not_a_pointer(tmp_path: Path) -> None:
    path = tmp_path / "memory_record.csv"
    path.write_bytes(b"Component,version https://git-lfs.github.com/spec/v1\n")
    check_readable(path)

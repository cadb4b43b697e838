"""memgate.discover: the profiles under a root, one per rank's output, in a stable order; what is not a
profile, or cannot be read, is an InputError naming the path (never a rank silently skipped).

Each format's own claims are tested with its loader; discovery over junk trees is fuzzed in
tests/test_fuzz.py; a rank two profiles claim over one window in tests/test_torch_npu.py.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
from helpers import PTA21_L1, SAMPLES, copy_sample

from memgate.discover import discover, load, rank_hint
from memgate.errors import InputError

TRACE = SAMPLES / "torch" / "cpu_train_profile_memory.json"
SNAPSHOT = SAMPLES / "torch" / "snapshot_modern_small_cs336.pickle"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """Two profiles, in folders listed out of order, beside a text file and a link back up the tree."""
    root = tmp_path / "run"
    (root / "b").mkdir(parents=True)
    (root / "a").mkdir()
    shutil.copyfile(TRACE, root / "b" / "rank1.pt.trace.json")
    shutil.copyfile(SNAPSHOT, root / "a" / "snap.pickle")
    (root / "a" / "notes.txt").write_text("not a profile\n")
    (root / "a" / "loop").symlink_to("..")  # followed once: its folder is the root, already walked
    return root


def test_every_profile_once_in_path_order(run: Path) -> None:
    found = discover(run)
    assert [(f.path.relative_to(run).as_posix(), f.format.name, rank_hint(f)) for f in found] == [
        ("a/snap.pickle", "torch_snapshot", "0"), ("b/rank1.pt.trace.json", "kineto", "1")]
    assert [f.notes for f in found] == [(), ()]
    assert discover(run / "b" / "rank1.pt.trace.json") == [found[1]]  # a profile file given directly


def test_a_found_profile_travels_to_worker_processes_by_its_formats_name(run: Path) -> None:
    found = discover(run)[0]
    again = pickle.loads(pickle.dumps(found))
    assert again == found and again.format is found.format
    profile = load(again)
    assert (profile.format, profile.rank, profile.path) == ("torch_snapshot", "0", str(run / "a" / "snap.pickle"))


@pytest.mark.parametrize(("where", "says"), [
    ("missing", "no such file or directory; expected a profile directory or file, found 'nothing at this path'"),
    ("empty", ("no profile found in this directory; expected a *_ascend_pt / *_ascend_ms / PROF_* directory, a "
              "snapshot pickle, a Kineto trace or an msMemScope dump")),
    ("a/notes.txt", ("not a profile file of any known format; expected a profile directory or file (see `memgate "
                    "inspect --help`)")),
])
def test_what_holds_no_profile_is_an_error_naming_the_path(run: Path, where: str, says: str) -> None:
    (run / "empty").mkdir()
    with pytest.raises(InputError) as info:
        discover(run / where)
    assert info.value.one_line() == f"{run / where}: {says}"


def test_unreadable_subfolder_is_an_error_not_a_skipped_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank folder that cannot be listed must not silently drop out of the gate."""
    root = tmp_path / "run"
    copy_sample(PTA21_L1, root / "host_1_ascend_pt")
    hidden = copy_sample(PTA21_L1, root / "host_2_ascend_pt")
    real_scandir = os.scandir

    def scandir(path: object = ".") -> object:
        if os.fspath(path) == os.fspath(hidden):  # type: ignore[arg-type]
            raise PermissionError(13, "Permission denied", os.fspath(hidden))
        return real_scandir(path)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "scandir", scandir)  # what chmod 000 on the folder does for a non-root user
    with pytest.raises(InputError) as info:
        discover(root)
    assert info.value.file == str(hidden)
    assert "Permission denied" in info.value.one_line()


@pytest.mark.parametrize(("name", "content", "says"), [
    ("snapshot.pickle", b"\x80\x06\x95\x03\x00\x00\x00\x00\x00\x00\x00N.", "unsupported pickle protocol 6"),
    ("ascend_pytorch_profiler_0.db", b"hello,world\n1,2\n", "not a sqlite database"),
    ("x_memscope_dump_20250428113810.csv", b"", "empty file (0 bytes)"),
])
def test_a_file_named_as_a_format_names_it_says_what_is_wrong(tmp_path: Path, name: str, content: bytes,
                                                               says: str) -> None:
    # given directly, a file no format claims by content goes to the loader whose name it bears
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        for found in discover(path):
            load(found)
    assert info.value.message.startswith(says) and info.value.file == str(path)
    (tmp_path / "other.bin").write_bytes(content)
    with pytest.raises(InputError, match="not a profile file of any known format"):
        discover(tmp_path / "other.bin")


def test_a_snapshot_or_a_memory_timeline_under_another_name_is_known_by_its_content(tmp_path: Path) -> None:
    """torch writes a snapshot as a pickle whatever the file is called (``_dump_snapshot("memory_snapshot.json")``,
    a real file in a public repository) and ``export_memory_timeline`` its ``[times, sizes]`` JSON under any
    name: given by name, each is read as what it is, not "not a profile file of any known format". In a
    folder the pickle is found too (skipped, the run would pass without it); a JSON array of arrays there may
    be any data, and stays out."""
    torch = SAMPLES / "torch"
    pickled = tmp_path / "memory_snapshot.json"
    shutil.copyfile(torch / "snapshot_modern_small_cs336.pickle", pickled)
    timeline = tmp_path / "train_memory.json"
    shutil.copyfile(torch / "cpu_memory_timeline.json", timeline)
    assert [(f.path, f.format.name) for f in discover(pickled)] == [(pickled, "torch_snapshot")]
    assert [(f.path, f.format.name) for f in discover(timeline)] == [(timeline, "torch_memory_timeline")]
    assert load(discover(pickled)[0]).devices and load(discover(timeline)[0]).devices
    assert [(f.path, f.format.name) for f in discover(tmp_path)] == [(pickled, "torch_snapshot")]
    other = tmp_path / "other.pickle"  # a pickle of anything else, under a snapshot's name: still not claimed
    other.write_bytes(pickle.dumps({"weights": [1, 2]}))
    assert [f.path for f in discover(tmp_path)] == [pickled]

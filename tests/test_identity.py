"""Profile identity across runs (memgate.identity): what a name keeps, and how two runs pair up.

Pure: every case is a list of (path, rank, format, devices) written out here, the pairing expected
by construction.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memgate.errors import AmbiguousProfiles
from memgate.identity import (
    NO_TIMESTAMP,
    STABLE,
    ProfileId,
    device_key,
    labels_under_root,
    pair_devices,
    pair_profiles,
    profile_labels,
    stable_name,
)


@pytest.mark.parametrize(("name", "stable", "no_timestamp"), [
    # torch_npu / MindSpore: {worker}_{pid}_{ts}_ascend_pt, the worker defaulting to the host name
    ("alexnet_3016828_20250109_ascend_pt", "alexnet_*_*_ascend_pt", "alexnet_3016828_*_ascend_pt"),
    ("host-0_4000_1736408883_ascend_pt", "host-0_*_*_ascend_pt", "host-0_4000_*_ascend_pt"),
    ("w0_20250109120000123_ascend_ms", "w0_*_ascend_ms", "w0_*_ascend_ms"),  # a worker_name of its own
    ("rank_3_20250109120000123_ascend_pt", "rank_*_*_ascend_pt", "rank_3_*_ascend_pt"),
    # torch.profiler tensorboard_trace_handler: {worker}.{time_ns or ms}.pt.trace.json[.gz]
    ("host_1234.1736408883123456789.pt.trace.json", "host_*.*.pt.trace.json", "host_1234.*.pt.trace.json"),
    ("trainer_0.1736408883123.pt.trace.json.gz", "trainer_*.*.pt.trace.json.gz", "trainer_0.*.pt.trace.json.gz"),
    # CANN msprof PROF_{n}_{ts}_{random id}, msprof_{ts}.db, msMemScope dumps
    ("PROF_000001_20230628101435646_FKFLNPEPPRRCHCAA", "PROF_*", "PROF_*"),
    ("msprof_20250101123456.db", "msprof_*.db", "msprof_*.db"),
    ("smoke_memscope_dump_20250428113810.csv", "smoke_memscope_dump_*.csv", "smoke_memscope_dump_*.csv"),
    ("leaks_dump_20250428113810.db", "leaks_dump_*.db", "leaks_dump_*.db"),
    # names without run-varying parts stay as they are
    ("ascend_pytorch_profiler_0.db", "ascend_pytorch_profiler_0.db", "ascend_pytorch_profiler_0.db"),
    ("rank_3", "rank_3", "rank_3"),
    ("snapshot.pickle", "snapshot.pickle", "snapshot.pickle"),
    ("resnet50_ascend_pt", "resnet50_ascend_pt", "resnet50_ascend_pt"),
])
def test_stable_name(name: str, stable: str, no_timestamp: str) -> None:
    assert (stable_name(name, STABLE), stable_name(name, NO_TIMESTAMP)) == (stable, no_timestamp)


def _id(path: str, rank: str = "0", fmt: str = "torch_npu", devices: tuple[str, ...] = ("npu:0",)) -> ProfileId:
    return ProfileId.of({"path": path, "rank": rank, "format": fmt, "devices": [{"device": d} for d in devices]})


def _pairs(base: list[ProfileId], current: list[ProfileId], **kw: bool) -> tuple[list[tuple[int, int]], list[int], list[int]]:
    p = pair_profiles(base, current, **kw)
    return p.pairs, p.base_only, p.current_only


def test_one_profile_per_rank_and_format_pairs_whatever_the_paths() -> None:
    base = [_id("/ci/main/prof/host_1_20250101000000_ascend_pt", "0"), _id("/ci/main/prof/x.pickle", "0", "torch_snapshot"),
            _id("/ci/main/prof/other_ascend_pt", "1")]
    current = [_id("/tmp/pr-17/renamed_ascend_pt", "1"), _id("/tmp/pr-17/snap.pickle", "0", "torch_snapshot"),
               _id("/tmp/pr-17/host_9_20250202000000_ascend_pt", "0"), _id("/tmp/pr-17/new_ascend_pt", "2")]
    assert _pairs(base, current) == ([(2, 0), (1, 1), (0, 2)], [], [3])


def test_several_profiles_of_a_rank_pair_by_their_stable_names() -> None:
    """A PR run and a main-branch run of one job: other roots, pids and timestamps; same workers."""
    base = [_id("/ci/main/prof/train_111_20250101000000123_ascend_pt"),
            _id("/ci/main/prof/eval_112_20250101000500456_ascend_pt")]
    current = [_id("/tmp/pr/prof-17/eval_9001_20250202000000123_ascend_pt"),
               _id("/tmp/pr/prof-17/train_9000_20250202000000999_ascend_pt")]
    assert _pairs(base, current) == ([(1, 0), (0, 1)], [], [])


def test_folders_below_the_root_tell_profiles_apart() -> None:
    base = [_id("/m/root/job_a/memscope_dump_20250101000000.csv", fmt="msmemscope"),
            _id("/m/root/job_b/memscope_dump_20250101000001.csv", fmt="msmemscope"),
            _id("/m/root/leaks.csv", fmt="msmemscope")]
    current = [_id("/p/other/job_b/memscope_dump_20250303000000.csv", fmt="msmemscope"),
               _id("/p/other/job_c/memscope_dump_20250303000001.csv", fmt="msmemscope"),
               _id("/p/other/leaks.csv", fmt="msmemscope")]
    # job_b pairs, leaks.csv pairs (one component tells it apart on both sides), job_a is gone, job_c new
    assert _pairs(base, current) == ([(1, 0), (2, 2)], [0], [1])


def test_device_kinds_tell_profiles_apart() -> None:
    base = [_id("/a/w.1.pt.trace.json", fmt="kineto", devices=("cpu",)),
            _id("/a/w.2.pt.trace.json", fmt="kineto", devices=("cuda:0",))]
    current = [_id("/b/w.7.pt.trace.json", fmt="kineto", devices=("cuda:0",)),
               _id("/b/w.8.pt.trace.json", fmt="kineto", devices=("cpu",))]
    assert _pairs(base, current) == ([(1, 0), (0, 1)], [], [])


def test_a_number_in_a_worker_name_pairs_when_the_stable_names_clash() -> None:
    """trainer_0 and trainer_1 look like pids to the stable name: kept, they pair across runs."""
    base = [_id("/r/trainer_0.1736408883123.pt.trace.json", fmt="kineto"),
            _id("/r/trainer_1.1736408883456.pt.trace.json", fmt="kineto")]
    current = [_id("/s/trainer_1.1799999999999.pt.trace.json", fmt="kineto"),
               _id("/s/trainer_0.1799999999000.pt.trace.json", fmt="kineto")]
    assert _pairs(base, current) == ([(1, 0), (0, 1)], [], [])


def test_profiles_only_pids_tell_apart_are_an_error_that_says_how_to_name_them() -> None:
    base = [_id("/ci/main/host_111_20250101000000123_ascend_pt"), _id("/ci/main/host_112_20250101000000456_ascend_pt")]
    current = [_id("/tmp/pr/host_901_20250202000000123_ascend_pt"), _id("/tmp/pr/host_902_20250202000000456_ascend_pt")]
    with pytest.raises(AmbiguousProfiles) as info:
        pair_profiles(base, current)
    text = info.value.one_line()
    assert "cannot tell which profile of rank 0 (torch_npu) is which in the other run" in text
    assert "/ci/main/host_111_20250101000000123_ascend_pt" in text and "host_*_*_ascend_pt" in text
    assert "worker_name" in text and "a folder of its own for each" in text


def test_a_run_compared_with_itself_pairs_even_where_only_pids_tell_profiles_apart() -> None:
    run = [_id("/r/host_111_20250101000000123_ascend_pt"), _id("/r/host_112_20250101000000456_ascend_pt")]
    assert _pairs(run, list(run)) == ([(0, 0), (1, 1)], [], [])
    # pytest compares one profile at a time with the baseline: it finds its own pair
    assert _pairs(run, [run[1]], current_is_whole_run=False) == ([(1, 0)], [0], [])


def test_one_side_with_one_profile_pairs_by_name_when_the_other_has_several() -> None:
    base = [_id("/b/train_ascend_pt"), _id("/b/eval_ascend_pt")]
    assert _pairs(base, [_id("/c/eval_ascend_pt")]) == ([(1, 0)], [0], [])
    assert _pairs(base, [_id("/c/infer_ascend_pt")]) == ([], [0, 1], [0])


def test_msmemscope_devices_pair_without_their_pids() -> None:
    devices = ["npu:0/pid100", "npu:1/pid100", "cpu/pid100"]
    assert [device_key(d, devices) for d in devices] == ["npu:0", "npu:1", "cpu"]
    two = ["npu:0/pid100", "npu:0/pid101"]  # two processes on one device: the labels themselves
    assert [device_key(d, two) for d in two] == two
    assert pair_devices(["npu:0/pid100", "cpu/pid100", "npu:1/pid100"], ["cpu/pid7", "npu:0/pid7", "npu:2/pid7"]) == [
        ("cpu/pid100", "cpu/pid7"), ("npu:0/pid100", "npu:0/pid7"), (None, "npu:2/pid7"), ("npu:1/pid100", None)]


def test_profile_labels() -> None:
    assert profile_labels(["/r/a/x", "/r/b/y"]) == ["x", "y"]
    assert profile_labels(["/r/a/x", "/r/b/x", "/r/b/y"]) == ["a/x", "b/x", "y"]
    assert profile_labels(["/r/a/x", "/r/a/x"]) == ["x", "x"]  # one profile twice: one label
    assert profile_labels(["x", "/r/x"]) == ["x", "r/x"]
    assert profile_labels([]) == []
    # a test by its whole node id, never shortened to its file's name
    assert profile_labels(["tests/test_a.py::test_x", "/r/x"]) == ["tests/test_a.py::test_x", "x"]


def test_labels_under_root_are_real_paths_below_the_root(tmp_path: Path) -> None:
    root = tmp_path / "profiles"
    (root / "rank_0").mkdir(parents=True)
    (root / "link").symlink_to(root / "rank_0")
    inside = [root / "rank_0" / "a.pt.trace.json", root / "link" / "b.pickle"]
    assert labels_under_root(inside, root) == ["rank_0/a.pt.trace.json", "rank_0/b.pickle"]
    assert labels_under_root([root], root) == ["profiles"]  # the root is the profile: its own name
    assert labels_under_root([Path("elsewhere/x.pickle")], root) == ["elsewhere/x.pickle"]

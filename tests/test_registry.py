"""The format registry (memgate.loaders.registry): the rank a name states, the loader modules each path
may import, the order formats are asked in, and the hook by which a format knows a part of its profile.

The rank rule is the one every loader reads names with; its cases are the names the profilers and
tools write (and those the samples bear), each with the names its loader asks, nearest first.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers import SAMPLES

from memgate.discover import discover, load
from memgate.loaders import registry
from memgate.loaders.ascend import torch_npu
from memgate.model import MAX_RANK

RANK_CASES = [  # (the names a loader asks, nearest first) -> the rank they state
    # torch_npu / MindSpore / ascend_db: the profile folder, then its parent
    (("msinsight_pta21_level0_rank0", "ascend"), "0"),
    (("node0_4011_20251127183437_ascend_pt", "rank_3"), "3"),
    (("job_rank3_ascend_pt", "prof"), "3"),
    (("vm_17630_20261128062002155_ascend_ms", "samples"), None),  # digits, but no "rank"
    # CANN: the PROF_ folder, then its parent
    (("PROF_000001_20250101000000_ABCDEFGH", "RANK-12"), "12"),
    # Kineto traces and snapshots: the file, then its folder
    (("rank7.pt.trace.json", "run"), "7"),
    (("worker0.1234.pt.trace.json.gz", "Rank_007"), "7"),
    (("train.1795846944832606968.pt.trace.json", "h200_trace_leak"), None),
    (("snapshot_rank2.pickle", "x"), "2"),
    (("run_rank2.raw.json.gz", "timeline"), "2"),
    # msMemScope: every folder above the dump, nearest first
    (("device_0", "rank_5", "rank_1", "jobs"), "5"),
    (("rankx", "rank-", "rank_04"), "4"),  # "rank" without digits states nothing
]


@pytest.mark.parametrize(("names", "rank"), RANK_CASES)
def test_the_rank_a_name_states(names: tuple[str, ...], rank: str | None) -> None:
    assert registry.rank_in_names(*names) == rank


def test_a_number_past_the_bound_is_no_rank_and_the_next_name_is_asked() -> None:
    """torch_npu's folders: a long number after "rank" is no rank, the parent's name is asked."""
    too_long = f"rank{MAX_RANK + 1}_ascend_pt"
    assert registry.rank_in_names(too_long, "rank_2") == str(MAX_RANK + 1)
    assert registry.rank_in_names(too_long, "rank_2", at_most=MAX_RANK) == "2"
    assert registry.rank_in_names(too_long, "prof", at_most=MAX_RANK) is None


def test_a_file_states_its_rank_else_its_folder_else_none(tmp_path: Path) -> None:
    assert registry.rank_of_file(tmp_path / "rank_1" / "rank3.pt.trace.json") == "3"
    assert registry.rank_of_file(tmp_path / "rank_1" / "trace.json") == "1"
    assert registry.rank_of_file(tmp_path / "run" / "trace.json") == "0"


def _sample_files() -> list[Path]:
    return sorted(p for p in SAMPLES.rglob("*") if p.is_file())


def test_a_file_name_states_the_rank_its_stem_does() -> None:
    """A snapshot's rank was read from its name without the suffix, a trace's from its whole name:
    for the names these formats claim (a suffix of letters after a dot) the two agree."""
    names = [p.name for p in _sample_files()] + [f"{stem}{suffix}" for stem in ("rank3", "a.rank_03", "x_Rank-9",
                                                                                 "rank", "plain")
                                                 for suffix in (".pickle", ".pkl", ".json", ".json.gz", ".raw.gz")]
    for name in names:
        assert registry.rank_in_names(name) == registry.rank_in_names(Path(name).stem), name


LOADER_CASES = {  # a file name -> the loader modules that may claim it (by name alone)
    "snapshot_modern_small_cs336.pickle": {"snapshot.snapshot"},
    "x.PKL": {"snapshot.snapshot"},
    "train.1795846944832606968.pt.trace.json": {"kineto.kineto"},
    "worker0.1234.pt.trace.json.gz": {"kineto.kineto"},
    "cpu_memory_timeline.json": {"kineto.kineto", "kineto.memory_timeline"},
    "run_rank2.raw.json.gz": {"kineto.kineto", "kineto.memory_timeline"},
    "memory_timeline.raw.gz": {"kineto.memory_timeline"},
    "smoke_memscope_dump_20250428113810.csv": {"msmemscope", "ascend.mindspore"},
    "ascend_pytorch_profiler_0.db": {"msmemscope", "ascend.ascend_db"},
    "cpu_ms_memory_record_0.txt": {"ascend.mindspore"},
    "notes.md": set(),
}


@pytest.mark.parametrize("name", sorted(LOADER_CASES))
def test_a_file_imports_the_loaders_whose_names_it_bears(name: str, tmp_path: Path) -> None:
    path = tmp_path / name  # need not exist: names alone decide for a file
    assert {loader.module for loader in registry.LOADERS if registry.may_claim(loader.module, path)} == LOADER_CASES[name]


def test_folders_import_the_ascend_loaders_or_the_recording_loader(tmp_path: Path) -> None:
    ascend = {"ascend.torch_npu", "ascend.ascend_db", "ascend.mindspore", "ascend.cann"}
    for name in ("host_1_2_ascend_pt", "host_1_2_ascend_ms", "PROF_000001_x", "ASCEND_PROFILER_OUTPUT"):
        (tmp_path / name).mkdir()
        assert {loader.module for loader in registry.LOADERS if registry.may_claim(loader.module, tmp_path / name)} \
            == ascend, name
    recording = tmp_path / "recording"
    recording.mkdir()
    (recording / "torch_trace.json").write_text("{}")
    (recording / "cuda_snapshot.pickle").write_bytes(b"")
    assert [loader.module for loader in registry.LOADERS if registry.may_claim(loader.module, recording)] == ["recording"]


def test_register_keeps_the_first_of_a_name_and_asks_one_before_another(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "FORMATS", [])

    def never(path: Path) -> bool:
        return False

    def fmt(name: str) -> registry.Format:
        return registry.Format(name, never, load=lambda path: pytest.fail("not loaded"))

    registry.register(fmt("a"))
    registry.register(fmt("b"), before="c")  # not registered yet: asked last
    registry.register(fmt("c"))
    registry.register(fmt("d"), before="a")
    first_a = registry.FORMATS[1]
    registry.register(fmt("a"))  # a second registration of a name changes nothing
    assert [f.name for f in registry.FORMATS] == ["d", "a", "b", "c"]
    assert registry.FORMATS[1] is first_a and registry.format_named("a") is first_a


# ---- the profile root hook ----------------------------------------------------------------------------


def _ascend_pt(tmp_path: Path) -> Path:
    """A torch_npu profile folder of the level1 sample: profiler_info beside ASCEND_PROFILER_OUTPUT."""
    sample = SAMPLES / "ascend" / "msinsight_pta21_level1_rank0"
    root = tmp_path / "node0_77_20250109_ascend_pt"
    out = root / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    for file in sample.iterdir():
        shutil.copyfile(file, (root if file.name.startswith("profiler_info") else out) / file.name)
    return root


def test_torch_npu_knows_its_output_folder_for_a_part_of_its_profile(tmp_path: Path) -> None:
    root = _ascend_pt(tmp_path)
    assert torch_npu.profile_root(root / "ASCEND_PROFILER_OUTPUT") == root
    assert torch_npu.profile_root(root) is None  # the profile itself
    empty = tmp_path / "other" / "ASCEND_PROFILER_OUTPUT"
    empty.mkdir(parents=True)
    assert torch_npu.profile_root(empty) is None  # no export in it: no torch_npu profile's part
    assert registry.format_named("torch_npu").profile_root is torch_npu.profile_root


def test_an_output_folder_given_directly_is_found_as_its_profile(tmp_path: Path) -> None:
    root = _ascend_pt(tmp_path)
    [found] = discover(root / "ASCEND_PROFILER_OUTPUT")
    assert (found.path, found.format.name) == (root, "torch_npu")
    assert load(found).rank == "0"  # from profiler_info_0.json, which the output folder does not hold

"""memgate.cache: exact round trips, content keys, atomic writes, corrupt entries, no writes into profiles."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from helpers import PTA21_L0, PTA21_L1, PTA271, SAMPLES, copy_sample
from hypothesis import given
from hypothesis import strategies as st

from memgate import cache as cache_mod
from memgate.cache import CACHE_LAYOUT, MANIFEST, ProfileCache, input_files, load_cached, profile_key
from memgate.discover import Found, discover, load
from memgate.errors import ConfigError, InputError
from memgate.metrics import profile_metrics
from memgate.model import Profile
from memgate.table import Ints, Table, Texts

SNAPSHOT = SAMPLES / "torch" / "snapshot_newest_compile_context_windows_decomfl.pickle"
MULTI_DEVICE = SAMPLES / "torch" / "snapshot_multidevice_expandable_notrace.pickle"
KINETO = SAMPLES / "torch" / "cpu_train_leak_profile_memory.json"
DB = SAMPLES / "ascend" / "msinsight_pta21_db_level0_rank0"
MSMEMSCOPE = SAMPLES / "msmemscope" / "smoke_memscope_dump_20250428113810.csv"
ROUND_TRIP = (PTA271, PTA21_L1, PTA21_L0, DB, SNAPSHOT, MULTI_DEVICE, KINETO, MSMEMSCOPE)


def found_of(path: Path) -> Found:
    (found,) = discover(path)
    return found


@cache
def loaded(path: Path) -> Profile:
    return load(found_of(path))


def frames_of(profile: Profile) -> dict[str, Table]:
    """Every table of a profile, by a name that says where it sits."""
    out = {"steps": profile.steps}
    for device in profile.devices:
        out[f"{device.device}/blocks"] = device.blocks
        for key, series in device.series.items():
            out[f"{device.device}/series/{key}"] = series.frame
    return out


def assert_same_profile(got: Profile, want: Profile) -> None:
    assert (got.path, got.format, got.rank, got.steps_source) == (want.path, want.format, want.rank, want.steps_source)
    assert got.metadata == want.metadata
    assert [d.device for d in got.devices] == [d.device for d in want.devices]
    for g, w in zip(got.devices, want.devices):
        assert g.blocks_source == w.blocks_source
        assert g.sum_components == w.sum_components
        assert list(g.series) == list(w.series)
        for key in w.series:
            assert (g.series[key].component, g.series[key].source) == (w.series[key].component, w.series[key].source)
    got_frames, want_frames = frames_of(got), frames_of(want)
    assert list(got_frames) == list(want_frames)
    for name, table in want_frames.items():
        other = got_frames[name]
        assert_same_table(other, table, name)
        as_frame, want_frame = other.to_pandas(), table.to_pandas()
        assert as_frame.dtypes.to_dict() == want_frame.dtypes.to_dict(), name
        pd.testing.assert_frame_equal(as_frame, want_frame, check_exact=True, check_index_type=True, obj=name)


def assert_same_table(got: Table, want: Table, name: str) -> None:
    """The same columns, kinds, values, missing cells and text names (unused ones too), in order."""
    assert got.columns == want.columns and len(got) == len(want), name
    for column in want.columns:
        g, w = got.column(column), want.column(column)
        assert type(g) is type(w), (name, column)
        if isinstance(w, Ints):
            assert isinstance(g, Ints)
            assert g.values.dtype == np.int64, (name, column)
            assert np.array_equal(g.isna(), w.isna()), (name, column)
            assert np.array_equal(g.values[g.present()], w.values[w.present()]), (name, column)
        else:
            assert isinstance(g, Texts) and isinstance(w, Texts)
            assert g.codes.dtype == np.int32, (name, column)
            assert g.names.tolist() == w.names.tolist(), (name, column)
            assert np.array_equal(g.codes, w.codes), (name, column)


def tree_digest(root: Path) -> dict[str, tuple[str, int, int]]:
    """Every entry under ``root``: content hash, mode and mtime (a write of any kind changes it)."""
    out = {}
    for path in sorted([root, *root.rglob("*")]):
        st = path.lstat()
        content = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        out[str(path.relative_to(root))] = (content, st.st_mode, st.st_mtime_ns)
    return out


def entries(cache_dir: Path) -> list[str]:
    return sorted(p.name for p in cache_dir.iterdir()) if cache_dir.exists() else []


# ---- round trip -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sample", ROUND_TRIP, ids=lambda p: p.name)
def test_round_trip_is_exact(tmp_path: Path, sample: Path) -> None:
    found = found_of(sample)
    want = loaded(sample)
    store = ProfileCache(tmp_path / "cache")
    assert store.get(found) is None
    store.put(found, want)
    assert len(entries(tmp_path / "cache")) == 1
    got = store.get(found)
    assert got is not None
    assert_same_profile(got, want)
    # and a fresh cache object (a new process) reads the same entry
    again = ProfileCache(tmp_path / "cache").get(found)
    assert again is not None
    assert_same_profile(again, want)
    assert [m.as_json() for m in profile_metrics(got)] == [m.as_json() for m in profile_metrics(want)]


@pytest.mark.parametrize("compression", [None, "lz4", "zstd"])
def test_round_trip_with_each_compression(tmp_path: Path, compression: str | None) -> None:
    found = found_of(PTA21_L1)
    store = ProfileCache(tmp_path / "cache", compression=compression)
    store.put(found, loaded(PTA21_L1))
    got = ProfileCache(tmp_path / "cache").get(found)  # a reader needs no setting: the files say it
    assert got is not None
    assert_same_profile(got, loaded(PTA21_L1))


def test_round_trip_keeps_nulls_strings_and_a_reordered_subset(tmp_path: Path) -> None:
    want = loaded(PTA271)
    device = want.devices[0]
    blocks = device.blocks
    # the 2.7.1 sample has blocks never freed (NA t_free) and GE-less PTA rows: real nulls to keep
    assert blocks.ints("t_free").isna().any() and blocks.ints("t_free").present().any()
    assert isinstance(blocks.column("op"), Texts) and isinstance(blocks.column("size"), Ints)
    found = found_of(PTA271)
    rows = np.arange(len(blocks))[::-3]  # reversed and strided: text names no row uses any more stay
    odd = blocks.take(rows)
    changed = Profile(want.path, want.format, want.rank,
                      (type(device)(device.device, device.series, odd, device.blocks_source, device.sum_components),),
                      want.steps, want.steps_source, {"a": [1, 2], "b": {"c": None, "d": "x"}})
    store = ProfileCache(tmp_path / "cache")
    store.put(found, changed)
    got = store.get(found)
    assert got is not None
    assert_same_profile(got, changed)
    assert got.devices[0].blocks.to_pandas().equals(blocks.to_pandas().iloc[rows].reset_index(drop=True))


def test_load_cached_second_call_hits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = found_of(PTA271)
    store = ProfileCache(tmp_path / "cache")
    first = load_cached(found, store)
    calls = []
    monkeypatch.setattr(cache_mod, "load", lambda f: calls.append(f) or load(f))
    second = load_cached(found, store)
    assert calls == []  # served from the cache
    assert_same_profile(second, first)
    assert load_cached(found, None).rank == first.rank  # no cache: a plain load


# ---- keys -----------------------------------------------------------------------------------------


@cache
def _pta271_key() -> str:
    return profile_key(found_of(PTA271))


@given(data=st.data())
def test_key_changes_when_any_byte_of_any_file_changes(tmp_path_factory: pytest.TempPathFactory, data: Any) -> None:
    root = copy_sample(PTA271, tmp_path_factory.mktemp("p") / "prof_rank0")
    files = sorted(p for p in root.rglob("*") if p.is_file())
    path = data.draw(st.sampled_from(files), label="file")
    raw = bytearray(path.read_bytes())
    at = data.draw(st.integers(0, len(raw) - 1), label="offset")
    flip = data.draw(st.integers(1, 255), label="xor")
    found = Found(root, found_of(PTA271).format)
    before = profile_key(found)
    raw[at] ^= flip
    path.write_bytes(bytes(raw))
    after = profile_key(found)
    assert after != before
    raw[at] ^= flip
    path.write_bytes(bytes(raw))
    assert profile_key(found) == before  # same bytes, same key: content, not mtime
    shutil.rmtree(root)


def test_key_covers_names_new_files_subdirs_format_and_path(tmp_path: Path) -> None:
    root = copy_sample(PTA271, tmp_path / "a" / "prof_rank0")
    fmt = found_of(PTA271).format
    base = profile_key(Found(root, fmt))
    (root / "extra.txt").write_text("x")
    with_extra = profile_key(Found(root, fmt))
    assert with_extra != base
    (root / "extra.txt").rename(root / "extra2.txt")
    assert profile_key(Found(root, fmt)) not in (base, with_extra)
    (root / "extra2.txt").unlink()
    (root / "sub").mkdir()
    (root / "sub" / "raw.bin").write_bytes(b"\0")
    assert profile_key(Found(root, fmt)) != base  # files in subfolders (PROF_*/...) count too
    shutil.rmtree(root / "sub")
    assert profile_key(Found(root, fmt)) == base
    other = copy_sample(PTA271, tmp_path / "b" / "prof_rank0")
    assert profile_key(Found(other, fmt)) != base  # another path: rank and sources come from it
    assert profile_key(Found(root, found_of(SNAPSHOT).format)) != base
    assert [f.rel for f in input_files(root)] == sorted(p.name for p in PTA271.iterdir())


def test_key_of_a_file_profile_is_its_bytes(tmp_path: Path) -> None:
    copy = tmp_path / "snap.pickle"
    shutil.copyfile(SNAPSHOT, copy)
    fmt = found_of(SNAPSHOT).format
    key = profile_key(Found(copy, fmt))
    (tmp_path / "neighbour.pickle").write_bytes(b"other")  # a file beside it is not its input
    assert profile_key(Found(copy, fmt)) == key
    raw = bytearray(copy.read_bytes())
    raw[-2] ^= 1
    copy.write_bytes(bytes(raw))
    assert profile_key(Found(copy, fmt)) != key


def test_changed_file_is_a_miss_and_reloads(tmp_path: Path) -> None:
    root = copy_sample(PTA21_L1, tmp_path / "prof_rank0")
    found = Found(root, found_of(PTA21_L1).format)
    store = ProfileCache(tmp_path / "cache")
    first = load_cached(found, store)
    record = root / "memory_record.csv"
    lines = record.read_bytes().splitlines(keepends=True)
    record.write_bytes(b"".join(lines[:-5]))  # drop the last samples
    assert store.get(found) is None
    second = load_cached(found, store)
    n_first = sum(len(s.frame) for s in first.devices[0].series.values() if s.source.endswith("memory_record.csv"))
    n_second = sum(len(s.frame) for s in second.devices[0].series.values() if s.source.endswith("memory_record.csv"))
    assert n_second == n_first - 5
    assert len(entries(tmp_path / "cache")) == 2


# ---- concurrency ----------------------------------------------------------------------------------


def _writer(cache_dir: str, sample: str, barrier: Any, rounds: int, queue: Any, fingerprint: str) -> None:
    # the parent's code fingerprint: other work may edit memgate's source while this test runs
    cache_mod.code_fingerprint = lambda: fingerprint  # type: ignore[assignment]
    found = found_of(Path(sample))
    profile = load(found)
    store = ProfileCache(cache_dir)
    for _ in range(rounds):
        barrier.wait()
        store.put(found, profile)
        barrier.wait()  # the parent checks and clears the cache between rounds
        barrier.wait()
    queue.put(os.getpid())


def test_two_processes_writing_the_same_key_never_corrupt_it(tmp_path: Path) -> None:
    rounds = 4
    cache_dir = tmp_path / "cache"
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with arrow threads
    barrier = ctx.Barrier(3)
    queue = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(str(cache_dir), str(PTA271), barrier, rounds, queue,
                                                     cache_mod.code_fingerprint()))
             for _ in range(2)]
    for p in procs:
        p.start()
    want = loaded(PTA271)
    found = found_of(PTA271)
    try:
        for _ in range(rounds):
            barrier.wait(timeout=120)  # both writers put at once
            barrier.wait(timeout=120)
            names = entries(cache_dir)
            assert len(names) == 1 and not names[0].startswith("."), names  # one entry, no temp dirs left
            got = ProfileCache(cache_dir).get(found)
            assert got is not None
            assert_same_profile(got, want)
            shutil.rmtree(cache_dir)
            barrier.wait(timeout=120)
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    assert sorted([queue.get(timeout=5), queue.get(timeout=5)]) == sorted(p.pid for p in procs)


def test_a_put_that_loses_the_race_discards_its_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = found_of(SNAPSHOT)
    want = loaded(SNAPSHOT)
    store = ProfileCache(tmp_path / "cache")
    real_rename = os.rename

    def rival_first(src: Any, dst: Any) -> None:
        # another writer renames its complete entry into place just before this one does
        if Path(src).name.startswith(".tmp-") and not Path(dst).exists():
            rival = Path(str(dst) + ".rival")
            shutil.copytree(src, rival)
            real_rename(rival, dst)
        real_rename(src, dst)

    monkeypatch.setattr(cache_mod.os, "rename", rival_first)
    store.put(found, want)
    monkeypatch.undo()
    assert entries(tmp_path / "cache") == [store.key(found)]
    got = store.get(found)
    assert got is not None
    assert_same_profile(got, want)


# ---- corrupt entries ------------------------------------------------------------------------------


def _stored(tmp_path: Path, sample: Path = PTA271) -> tuple[ProfileCache, Found, Path]:
    found = found_of(sample)
    store = ProfileCache(tmp_path / "cache")
    store.put(found, loaded(sample))
    return store, found, store.entry_dir(store.key(found))


def test_truncated_manifest_is_ignored_and_removed(tmp_path: Path) -> None:
    store, found, entry = _stored(tmp_path)
    manifest = entry / MANIFEST
    manifest.write_bytes(manifest.read_bytes()[: manifest.stat().st_size // 2])
    assert store.get(found) is None
    assert not entry.exists()
    assert_same_profile(load_cached(found, store), loaded(PTA271))  # reloaded and stored again
    assert entry.exists() and store.get(found) is not None


@pytest.mark.parametrize("damage", ["missing", "truncated", "flipped", "no_manifest", "wrong_key"])
def test_damaged_entry_is_never_trusted(tmp_path: Path, damage: str) -> None:
    store, found, entry = _stored(tmp_path)
    arrows = sorted(entry.glob("*.arrow"))
    victim = max(arrows, key=lambda p: p.stat().st_size)
    if damage == "missing":
        victim.unlink()
    elif damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:-100])
    elif damage == "flipped":  # same size, one bit off: only the hash notices
        raw = bytearray(victim.read_bytes())
        raw[len(raw) // 2] ^= 1
        victim.write_bytes(bytes(raw))
    elif damage == "no_manifest":
        (entry / MANIFEST).unlink()
    else:
        text = (entry / MANIFEST).read_text()
        (entry / MANIFEST).write_text(text.replace(entry.name, "0" * len(entry.name)))
    assert store.get(found) is None
    assert entries(tmp_path / "cache") == []


def test_an_entry_of_the_previous_layout_is_a_miss_and_removed(tmp_path: Path) -> None:
    """An entry written by the pandas-era layout (dtype tokens, no column kinds) is never read as tables."""
    store, found, entry = _stored(tmp_path)
    doc = json.loads((entry / MANIFEST).read_text())
    doc["layout"] = CACHE_LAYOUT - 1

    def pandas_era(spec: dict[str, Any]) -> None:
        kinds = spec.pop("kinds")
        spec["dtypes"] = {name: "Int64" if kind == "int64" else "string[python]" for name, kind in kinds.items()}

    pandas_era(doc["profile"]["steps"])
    for device in doc["profile"]["devices"]:
        pandas_era(device["blocks"])
        for series in device["series"]:
            pandas_era(series["frame"])
    (entry / MANIFEST).write_text(json.dumps(doc))
    assert store.get(found) is None
    assert entries(tmp_path / "cache") == []
    assert_same_profile(load_cached(found, store), loaded(PTA271))  # reloaded and stored in this layout
    assert json.loads((entry / MANIFEST).read_text())["layout"] == CACHE_LAYOUT


def test_a_cache_hit_imports_no_pandas(tmp_path: Path) -> None:
    """In the memgate command, reading an entry back builds the tables from Arrow and numpy, and
    storing one writes them from numpy: pandas (~0.4 s to import) stays out.

    The probe names the format without importing its loader (whose own imports are not the cache's).
    """
    store = ProfileCache(tmp_path / "cache")
    want = loaded(KINETO)
    store.put(found_of(KINETO), want)
    probe = ("import json, sys\n"
             "from pathlib import Path\n"
             "from memgate import cache\n"
             "from memgate.cache import ProfileCache\n"
             "from memgate.cli import as_command\n"
             "as_command()\n"
             "from memgate.discover import Found\n"
             "from memgate.loaders.registry import Format\n"
             "cache.code_fingerprint = lambda: sys.argv[3]  # the parent's: memgate's source may change meanwhile\n"
             "found = Found(Path(sys.argv[2]), Format(sys.argv[4], lambda p: True, lambda p: None))\n"
             "got = ProfileCache(sys.argv[1]).get(found)\n"
             "assert got is not None\n"
             "ProfileCache(sys.argv[1] + '-copy').put(found, got)  # and stored: no pandas either\n"
             "again = ProfileCache(sys.argv[1] + '-copy').get(found)\n"
             "rows = None if again is None else [len(d.blocks) for d in again.devices]\n"
             "print(json.dumps({'rows': rows, 'pandas': 'pandas' in sys.modules}))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMGATE_")}
    done = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "cache"), str(KINETO),
                           cache_mod.code_fingerprint(), found_of(KINETO).format.name], check=False,
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["rows"] == [len(d.blocks) for d in want.devices]  # a hit, not a miss
    assert report["pandas"] is False


def test_errors_are_not_cached(tmp_path: Path) -> None:
    root = copy_sample(PTA21_L1, tmp_path / "prof_rank0")
    record = root / "operator_memory.csv"
    lines = record.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b",", b",x", 1)  # a malformed Size cell
    record.write_bytes(b"".join(lines))
    found = Found(root, found_of(PTA21_L1).format)
    store = ProfileCache(tmp_path / "cache")
    for _ in range(2):
        with pytest.raises(InputError) as err:
            load_cached(found, store)
        assert err.value.line == 4
    assert [n for n in entries(tmp_path / "cache") if not n.startswith(".")] == []


def test_a_file_changed_while_loading_is_not_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_sample(PTA21_L1, tmp_path / "prof_rank0")
    found = Found(root, found_of(PTA21_L1).format)

    def load_then_touch(f: Found) -> Profile:
        profile = load(f)
        (root / "step_trace_time.csv").write_bytes((root / "step_trace_time.csv").read_bytes() + b"")
        os.utime(root / "step_trace_time.csv", ns=(1, 1))
        return profile

    monkeypatch.setattr(cache_mod, "load", load_then_touch)
    store = ProfileCache(tmp_path / "cache")
    load_cached(found, store)
    assert entries(tmp_path / "cache") == []


def test_metadata_that_json_cannot_hold_exactly_is_not_cached(tmp_path: Path) -> None:
    want = loaded(SNAPSHOT)
    odd = Profile(want.path, want.format, want.rank, want.devices, want.steps, want.steps_source,
                  {**want.metadata, "pair": (1, 2)})  # a tuple would come back as a list
    store = ProfileCache(tmp_path / "cache")
    store.put(found_of(SNAPSHOT), odd)
    assert store.get(found_of(SNAPSHOT)) is None
    assert entries(tmp_path / "cache") == []


# ---- the profile directory is never written -------------------------------------------------------


def test_nothing_is_written_into_the_profile_directory(tmp_path: Path) -> None:
    root = copy_sample(PTA271, tmp_path / "profiles" / "prof_rank0")
    found = Found(root, found_of(PTA271).format)
    before = tree_digest(tmp_path / "profiles")
    store = ProfileCache(tmp_path / "cache")
    load_cached(found, store)
    assert store.get(found) is not None
    load_cached(found, store)
    assert tree_digest(tmp_path / "profiles") == before
    assert len(entries(tmp_path / "cache")) == 1


def test_a_cache_inside_the_profile_directory_is_refused(tmp_path: Path) -> None:
    root = copy_sample(PTA271, tmp_path / "prof_rank0")
    found = Found(root, found_of(PTA271).format)
    before = tree_digest(root)
    for inside in (root / ".memgate-cache", root):
        with pytest.raises(ConfigError, match="inside the profile directory"):
            load_cached(found, ProfileCache(inside))
    assert tree_digest(root) == before


def test_the_key_of_a_profile_with_frame_owners_holds_the_working_directory(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace's or snapshot's owners name their files relative to the working directory (memgate.owners):
    an entry made in one directory is not served in another; other formats' keys do not depend on it."""
    (trace,) = discover(SAMPLES / "torch" / "cpu_train_profile_memory.json")
    (npu,) = discover(PTA271)
    here = (profile_key(trace), profile_key(npu))
    monkeypatch.chdir(tmp_path)
    assert profile_key(trace) != here[0]
    assert profile_key(npu) == here[1]

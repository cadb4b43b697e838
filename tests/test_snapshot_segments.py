"""A snapshot's final segments (memgate.loaders.snapshot.snapshot_segments): the pool at the dump, by plain loops
over the raw pickle, on every sample and on written cases."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from snapshot_reference import (
    LEGACY,
    MODERN,
    MULTI,
    PICKLES,
    allocator_written,
    as_dict,
    block_dict,
    devices_of,
    has_history,
    raw,
    segment_dict,
    write_pickle,
)

from memgate.loaders.snapshot import snapshot
from memgate.metric_specs import OPTIONAL_KEYS, Fact, keys_where
from memgate.metrics import profile_metrics

# ---- the pool at the dump (DeviceModel.dump_state) -----------------------------------------------


def pool_reference(data: dict[str, Any], dev: int) -> dict[str, int]:
    """The device's pool as its final segments record it, by plain loops over the raw pickle:
    active_allocated blocks by their block size, as torch.cuda.memory_allocated() sums them
    (active_pending_free ones were freed by the program), reserved = the segments' total_size,
    free = inactive blocks by their block size."""
    allocated = reserved = free_bytes = largest = 0
    for seg in data["segments"]:
        if seg["device"] != dev:
            continue
        reserved += seg["total_size"]
        for block in seg["blocks"]:
            if block["state"] == "active_allocated":
                allocated += block["size"]
            elif block["state"] == "inactive":
                free_bytes += block["size"]
                largest = max(largest, block["size"])
    return {"allocated": allocated, "reserved": reserved, "free_bytes": free_bytes, "largest_free_block": largest}


def _pool(model: Any) -> dict[str, int]:
    state = model.dump_state
    assert state is not None, model.device
    return {"allocated": state.allocated, "reserved": state.reserved, "free_bytes": state.free_bytes,
            "largest_free_block": state.largest_free_block}


def test_the_samples_cover_every_era_of_the_pool_state() -> None:
    assert len(PICKLES) >= 6  # every pickle sample is checked below
    datas = {p.name: raw(p) for p in PICKLES}
    assert any(not has_history(as_dict(d)) for d in datas.values())
    assert any(has_history(as_dict(d)) for d in datas.values())
    assert len(devices_of(datas[MULTI.name])) == 2 and not has_history(datas[MULTI.name])
    assert any(s["is_expandable"] for s in datas[MULTI.name]["segments"])
    assert any("history" in b for s in datas[LEGACY.name]["segments"] for b in s["blocks"])


@pytest.mark.parametrize("path", PICKLES, ids=lambda p: p.name)
def test_real_sample_dump_state_equals_the_segments(path: Path) -> None:
    data = as_dict(raw(path))
    profile = snapshot.load(path)
    assert [d.device for d in profile.devices] == [f"cuda:{d}" for d in devices_of(data)]
    for dev, model in zip(devices_of(data), profile.devices):
        assert _pool(model) == pool_reference(data, dev), model.device
        assert model.dump_state is not None
        # the caching allocator's blocks; a file none wrote (4 B blocks) keeps its sizes as requested
        basis = "rounded" if allocator_written(data) else "requested"
        assert model.dump_state.size_basis == basis == profile.metadata["size_basis"]
        assert model.dump_state.source == str(path)
        assert 0 <= model.dump_state.largest_free_block <= model.dump_state.free_bytes
        assert model.dump_state.allocated + model.dump_state.free_bytes <= model.dump_state.reserved


@pytest.mark.parametrize("path", [p for p in PICKLES if has_history(as_dict(raw(p)))], ids=lambda p: p.name)
def test_dump_state_ends_the_series_where_there_is_history(path: Path) -> None:
    """The pool at the dump is where the allocated and reserved series end: the same basis (the blocks)."""
    for model in snapshot.load(path).devices:
        frame = model.series["allocator"].frame.to_pandas()
        assert model.dump_state is not None
        assert model.dump_state.allocated == int(frame["allocated"].iloc[-1])
        assert model.dump_state.reserved == int(frame["reserved"].iloc[-1])


def test_no_history_keeps_history_metrics_unmeasurable_and_not_the_pool_state() -> None:
    for path in (MULTI, LEGACY):
        not_measurable = snapshot.load(path).metadata["not_measurable"]
        assert set(not_measurable) == set(keys_where(needs=Fact.HISTORY)) - set(OPTIONAL_KEYS) >= {
            "peak_allocated_bytes", "peak_reserved_bytes", "step_growth_bytes", "leaked_bytes", "top_at_peak"}
        assert not_measurable["fragmentation"].endswith("; free_block_fragmentation judges the pool at the dump")
        assert not set(not_measurable) & {"allocated_at_dump_bytes", "reserved_at_dump_bytes",
                                          "largest_free_block_bytes", "free_block_fragmentation"}
        assert all("_record_memory_history" in why for why in not_measurable.values())
    assert "not_measurable" not in snapshot.load(MODERN).metadata


def test_dump_state_without_free_blocks(tmp_path: Path) -> None:
    data = {"segments": [segment_dict(0, 1 << 20, [block_dict(1024, "active_allocated", 1000),
                                               block_dict(512, "active_pending_free", 500)])],
            "device_traces": []}
    [model] = snapshot.load(write_pickle(tmp_path, data)).devices
    assert model.dump_state is not None
    # the block of the 1000 B request (as torch.cuda.memory_allocated() counts it); the pending free is not allocated
    assert (model.dump_state.allocated, model.dump_state.reserved) == (1024, 1536)
    assert (model.dump_state.largest_free_block, model.dump_state.free_bytes) == (0, 0)
    assert int(model.series["allocator"].frame.to_pandas()["allocated"].iloc[-1]) == 1024


def test_dump_state_of_a_segment_all_free(tmp_path: Path) -> None:
    """A segment whose one block is free: nothing allocated, the whole segment is one free block.
    The free block's stale requested_size does not count."""
    data = [segment_dict(0, 1 << 21, [block_dict(2 << 20, "inactive", 7)])]  # a bare list of segments
    [model] = snapshot.load(write_pickle(tmp_path, data)).devices
    assert model.dump_state is not None
    assert (model.dump_state.allocated, model.dump_state.reserved) == (0, 2 << 20)
    assert (model.dump_state.largest_free_block, model.dump_state.free_bytes) == (2 << 20, 2 << 20)


def test_dump_state_per_device(tmp_path: Path) -> None:
    """Two devices: each device's pool from its own segments only; a device with a trace and no
    segment left (all released) has an empty pool."""
    segments = [
        segment_dict(0, 1 << 20, [block_dict(4096, "active_allocated", 4000), block_dict(8192, "inactive"),
                              block_dict(2048, "inactive")]),
        segment_dict(1, 1 << 22, [block_dict(1024, "inactive"), block_dict(3072, "active_allocated", 3000)]),
        segment_dict(1, 1 << 23, [block_dict(16384, "inactive")]),
    ]
    trace2 = [{"action": "segment_alloc", "addr": 1 << 24, "size": 4096, "stream": 0},
              {"action": "segment_free", "addr": 1 << 24, "size": 4096, "stream": 0}]
    data = {"segments": segments, "device_traces": [[], [], trace2]}
    profile = snapshot.load(write_pickle(tmp_path, data))
    states = {m.device: _pool(m) for m in profile.devices}
    assert states == {
        "cuda:0": {"allocated": 4096, "reserved": 14336, "free_bytes": 10240, "largest_free_block": 8192},
        "cuda:1": {"allocated": 3072, "reserved": 4096 + 16384, "free_bytes": 17408, "largest_free_block": 16384},
        "cuda:2": {"allocated": 0, "reserved": 0, "free_bytes": 0, "largest_free_block": 0},
    }
    for dev, model in enumerate(profile.devices):
        assert _pool(model) == pool_reference(data, dev)


def test_legacy_history_blocks_count_their_real_size(tmp_path: Path) -> None:
    """A legacy block (no requested_size) was requested at its history's real_size: that is its share of
    the requested peak; allocated counts its block, like every other."""
    block = {"size": 1536, "state": "active_allocated", "history": [{"addr": 1 << 20, "real_size": 1500}]}
    data = {"segments": [{"device": 0, "address": 1 << 20, "total_size": 2048, "stream": 0, "segment_type": "small",
                          "blocks": [block, {"size": 512, "state": "inactive"}]}], "device_traces": []}
    [model] = snapshot.load(write_pickle(tmp_path, data)).devices
    assert _pool(model) == {"allocated": 1536, "reserved": 2048, "free_bytes": 512, "largest_free_block": 512}
    # with a history (legacy era: the single 'free' action, no time_us): 500 B requested in the free 512 B
    at = (1 << 20) + 1536
    data["device_traces"] = [[{"action": "alloc", "addr": at, "size": 500, "stream": 0},
                              {"action": "free", "addr": at, "size": 500, "stream": 0}]]
    profile = snapshot.load(write_pickle(tmp_path, data))
    [m] = profile_metrics(profile)
    assert m.values["peak_requested_bytes"] == 1500 + 500
    assert m.values["peak_allocated_bytes"] == 1536 + 512
    assert sorted(profile.devices[0].blocks.to_pandas()["size"].tolist()) == [512, 1536]

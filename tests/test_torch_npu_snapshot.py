"""Real torch_npu snapshots (samples/torch_npu_snapshot): labelled npu, every request padded by 32 B
before it is rounded, as torch_npu's allocator does (round_size's AddPadSize).

Expected block sizes come from what the allocator wrote itself (the final segments' block ``size`` at
each address) and from its rule applied by hand to each request, never from memgate's own output.
"""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import SAMPLES, sample_pickle

from memgate.loaders.snapshot import block_sizes, snapshot
from memgate.metrics import profile_metrics

NPU = SAMPLES / "torch_npu_snapshot"
FILES = sorted(NPU.glob("*.pkl"))


def _raw(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = sample_pickle(path)
    return data


def _round512(n: int) -> int:
    return max(512, -(-n // 512) * 512)


def test_the_samples_are_there() -> None:
    assert [p.name for p in FILES] == ["npu_snapshot_empty_cache.pkl", "npu_snapshot_expandable.pkl"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_torch_npu_snapshot_is_npu_with_its_requests_padded(path: Path) -> None:
    """The expandable sample has no frame from a torch_npu directory: its block sizes tell."""
    profile = snapshot.load(path)
    assert [d.device for d in profile.devices] == ["npu:0"]
    assert profile.metadata["request_pad_bytes"] == block_sizes.NPU_PAD
    assert "blocks_at_rounded_size" not in profile.metadata["devices"]["npu:0"]  # every allocation placed


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_block_sizes_are_the_allocators(path: Path) -> None:
    """Each small-pool allocation (its padded, rounded size at most 1 MiB: the pool is chosen after
    rounding) holds round512(request + 32) exactly; each allocation still live at the dump holds the
    block the final segments show at its address."""
    raw = _raw(path)
    final = {b["address"]: b["size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
    allocs: dict[int, int] = {}  # address -> requested, of the allocations not freed again
    small: Counter[tuple[int, int]] = Counter()  # (address, round512(request + 32)) of the small-pool allocations
    for e in raw["device_traces"][0]:
        if e["action"] == "alloc":
            allocs[e["addr"]] = e["size"]
            if _round512(e["size"] + 32) <= block_sizes.SMALL_SIZE:
                small[(e["addr"], _round512(e["size"] + 32))] += 1
        elif e["action"] == "free_requested":
            allocs.pop(e["addr"], None)
    blocks = snapshot.load(path, addresses=True).devices[0].blocks
    in_window = ~blocks.ints("t_alloc").isna()
    got = Counter(zip(blocks.ints("addr").values[in_window].tolist(), blocks.ints("size").values[in_window].tolist()))
    assert len(small) > 1000 and not small - got  # every small allocation at its padded size
    live = Counter((a, final[a]) for a in allocs)
    assert len(live) > 100 and not live - got  # and every live one at the allocator's own block size


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_allocated_at_the_dump_is_the_final_segments(path: Path) -> None:
    raw = _raw(path)
    expected = sum(b["size"] for s in raw["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    [m] = profile_metrics(snapshot.load(path))
    assert m.values["allocated_at_dump_bytes"] == expected
    assert m.values["peak_allocated_bytes"] >= expected


def test_without_the_pad_the_replay_cannot_place_them(tmp_path: Path) -> None:
    """The same trace replayed as CUDA's allocator would (a CUDA conf in its settings) leaves hundreds
    of allocations unplaced and counts them smaller: the pad is what makes the layout add up."""
    raw = _raw(NPU / "npu_snapshot_empty_cache.pkl")
    raw["allocator_settings"] = {"PYTORCH_CUDA_ALLOC_CONF": ""}
    path = tmp_path / "as_cuda.pickle"
    path.write_bytes(pickle.dumps(raw))
    profile = snapshot.load(path)
    assert [d.device for d in profile.devices] == ["cuda:0"]
    assert "request_pad_bytes" not in profile.metadata
    assert "could not be placed" in profile.metadata["devices"]["cuda:0"]["blocks_at_rounded_size"]
    [cuda] = profile_metrics(profile)
    [npu] = profile_metrics(snapshot.load(NPU / "npu_snapshot_empty_cache.pkl"))
    assert cuda.values["peak_allocated_bytes"] < npu.values["peak_allocated_bytes"]


def test_pad_shown_reads_the_small_blocks() -> None:
    settings = block_sizes.Settings()
    size, req = np.array([1536, 512, 2 << 20]), np.array([1024, 100, 1 << 20])  # 1024+32 -> 1536; 2 MiB is large
    assert block_sizes.pad_shown(size, req, settings) == block_sizes.NPU_PAD
    assert block_sizes.pad_shown(np.array([1024, 512]), np.array([1000, 100]), settings) == 0  # 1000 -> 1024: CUDA
    assert block_sizes.pad_shown(np.array([512, 1536]), np.array([100, 1200]), settings) is None  # nothing tells
    assert block_sizes.pad_shown(np.array([1024]), np.array([1024]), settings) == 0  # 1024 B exactly: no pad


def test_one_devices_segments_decide_its_layout(tmp_path: Path) -> None:
    """A file joining two dumps (the expandable sample as device 0, the fixed-segment one as device 1)
    gives device 1 the figures of its own file: expandable segments on another device change nothing."""
    fixed, expandable = _raw(NPU / "npu_snapshot_empty_cache.pkl"), _raw(NPU / "npu_snapshot_expandable.pkl")
    for seg in fixed["segments"]:
        seg["device"] = 1
    joined = {"segments": expandable["segments"] + fixed["segments"],
              "device_traces": [expandable["device_traces"][0], fixed["device_traces"][0]]}
    path = tmp_path / "joined.pickle"
    path.write_bytes(pickle.dumps(joined))
    by_device = {m.device: m.values for m in profile_metrics(snapshot.load(path))}
    [alone] = profile_metrics(snapshot.load(NPU / "npu_snapshot_empty_cache.pkl"))
    [alone_expandable] = profile_metrics(snapshot.load(NPU / "npu_snapshot_expandable.pkl"))
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "allocated_at_dump_bytes"):
        assert by_device["npu:1"][key] == alone.values[key], key
        assert by_device["npu:0"][key] == alone_expandable.values[key], key

"""A snapshot's stacks (memgate.loaders.snapshot.snapshot_stacks): frames in torch_npu make a snapshot npu:N, an
allocator conf settles the label first, CUDA samples stay CUDA."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from helpers import in_process, sample_pickle
from snapshot_reference import (
    CUDA_LEAK,
    PICKLES,
    block_dict,
    segment_dict,
    write_pickle,
)

from memgate.loaders.snapshot import snapshot

# ---- torch_npu snapshots: device label ------------------------------------------------------------


def _labelled(tmp_path: Path, filenames: list[str], *, where: str = "trace", conf: str | None = None) -> str:
    frames = [{"name": "f", "filename": f, "line": 1} for f in filenames]
    block = block_dict(1024, "active_allocated", 1000)
    data: dict[str, Any] = {"segments": [segment_dict(0, 1 << 20, [block])], "device_traces": [[]]}
    if conf is not None:
        data["allocator_settings"] = {conf: "", "max_split_size": -1}
    if where == "trace":
        data["device_traces"] = [[{"action": "alloc", "addr": 1 << 20, "size": 1000, "stream": 0, "frames": frames}]]
    elif where == "block":
        block["frames"] = frames
    elif where == "history":  # legacy (<= 2.0): the block's frames are in its history
        block.pop("address")
        block["history"] = [{"addr": 1 << 20, "real_size": 1000, "frames": frames}]
    else:
        data["segments"][0]["frames"] = frames
    [model] = snapshot.load(write_pickle(tmp_path, data)).devices
    return model.device


NPU_PATHS = ["/usr/local/lib/python3.9/site-packages/torch_npu/npu/memory.py",
             "C:\\Python310\\Lib\\site-packages\\torch_npu\\utils\\_tensor.py",
             "/home/ci/build/torch_npu/csrc/core/npu/NPUCachingAllocator.cpp"]
NOT_NPU_PATHS = ["/usr/local/lib/python3.9/site-packages/torch/nn/modules/module.py",
                 "/home/me/torch_npu_helper/train.py", "/home/me/my_torch_npu/x.py", "/home/me/torch_npu.py",
                 "torch_npu", "??", ""]


@pytest.mark.parametrize("path", NPU_PATHS)
@pytest.mark.parametrize("where", ["trace", "block", "history", "segment"])
def test_frames_in_torch_npu_make_an_npu_snapshot(tmp_path: Path, path: str, where: str) -> None:
    assert _labelled(tmp_path, ["/work/train.py", path], where=where) == "npu:0"


@pytest.mark.parametrize("where", ["trace", "segment"])
def test_a_cuda_allocator_conf_settles_the_label_before_any_frame(tmp_path: Path, where: str) -> None:
    """torch's CUDA (and ROCm) allocator names its conf in allocator_settings; no torch_npu release writes
    allocator_settings, so a torch_npu frame there (a user's wrapper) leaves the snapshot CUDA's."""
    for conf in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        assert _labelled(tmp_path, ["/work/train.py", NPU_PATHS[0]], where=where, conf=conf) == "cuda:0"
    assert _labelled(tmp_path, ["/work/train.py", NPU_PATHS[0]], where=where, conf="PYTORCH_NPU_ALLOC_CONF") == "npu:0"
    # a conf of no known allocator (a newer torch's generic name) decides nothing: the frames still do
    assert _labelled(tmp_path, ["/work/train.py", NPU_PATHS[0]], where=where, conf="PYTORCH_ALLOC_CONF") == "npu:0"


@pytest.mark.parametrize("cuda", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"])
@pytest.mark.parametrize("npu_first", [True, False])
def test_a_cuda_conf_settles_cuda_whatever_else_the_settings_hold(tmp_path: Path, cuda: str, npu_first: bool) -> None:
    """Both confs (a CUDA file relabelled by an NPU key beside its own), in either order, and torch_npu's
    workspace entries at the front of the trace: the CUDA conf settles it (formats-reference §4)."""
    confs = ["PYTORCH_NPU_ALLOC_CONF", cuda][:: 1 if npu_first else -1]
    block = block_dict(1024, "active_allocated", 1000)
    workspace = {"action": "workspace_snapshot", "addr": 0, "size": 0, "stream": 0, "frames": []}
    alloc = {"action": "alloc", "addr": 1 << 20, "size": 1000, "stream": 0,
             "frames": [{"name": "f", "filename": NPU_PATHS[0], "line": 1}]}
    data = {"segments": [segment_dict(0, 1 << 20, [block])], "device_traces": [[workspace, alloc]],
            "allocator_settings": {**dict.fromkeys(confs, ""), "max_split_size": -1}}
    assert [d.device for d in snapshot.load(write_pickle(tmp_path, data)).devices] == ["cuda:0"]
    # a key that merely holds "NPU" is no torch_npu conf: without workspace entries or frames, CUDA
    data = {"segments": [segment_dict(0, 1 << 20, [block])], "device_traces": [[]],
            "allocator_settings": {"MY_NPU_NOTE": "", "max_split_size": -1}}
    assert [d.device for d in snapshot.load(write_pickle(tmp_path, data)).devices] == ["cuda:0"]


def test_a_real_cuda_snapshot_with_an_npu_conf_added_is_judged_as_cuda(tmp_path: Path, capsys: Any) -> None:
    """An H200 snapshot given a PYTORCH_NPU_ALLOC_CONF beside its PYTORCH_CUDA_ALLOC_CONF was labelled npu:0,
    so a cuda:* budget skipped it and a 725 MiB peak passed a 1 MiB limit with exit 0."""
    data = sample_pickle(CUDA_LEAK)
    data["allocator_settings"]["PYTORCH_NPU_ALLOC_CONF"] = "expandable_segments:False"
    (tmp_path / "snapshot.pickle").write_bytes(pickle.dumps(data))
    (tmp_path / "b.toml").write_text('[[budgets]]\nname = "gpu"\ndevices = "cuda:*"\npeak_allocated = "1 MiB"\n')
    rc, out, _ = in_process(["check", tmp_path / "snapshot.pickle", "--budgets", tmp_path / "b.toml"], capsys)
    assert rc == 1
    assert "peak_allocated 725.20 MiB exceeds budget 1.00 MiB by 724.20 MiB (+72419.6%) — rank 0 cuda:0, step 5" in out


@pytest.mark.parametrize("path", NOT_NPU_PATHS)
def test_other_frames_leave_a_cuda_snapshot(tmp_path: Path, path: str) -> None:
    assert _labelled(tmp_path, ["/work/train.py", path]) == "cuda:0"


def test_npu_frames_deep_in_a_shared_stack(tmp_path: Path) -> None:
    """torch shares frame dicts among entries; a torch_npu frame at the far end of a long stack counts."""
    shared = [{"name": f"f{i}", "filename": f"/usr/lib/python3/site-packages/torch/m{i}.py", "line": i}
              for i in range(300)]
    npu = {"name": "malloc", "filename": "/opt/site-packages/torch_npu/npu/memory.py", "line": 1}
    entries: list[dict[str, Any]] = [{"action": "alloc", "addr": (1 << 20) + 1024 * i, "size": 1000, "stream": 0,
                                      "frames": list(shared)} for i in range(50)]
    entries[-1]["frames"].append(npu)
    blocks = [block_dict(1024, "active_allocated", 1000) for _ in range(50)]
    data = {"segments": [segment_dict(0, 1 << 20, blocks)], "device_traces": [entries]}
    assert [m.device for m in snapshot.load(write_pickle(tmp_path, data)).devices] == ["npu:0"]
    entries[-1]["frames"].pop()
    assert [m.device for m in snapshot.load(write_pickle(tmp_path, data)).devices] == ["cuda:0"]


def test_real_cuda_samples_stay_cuda() -> None:
    for path in PICKLES:
        assert all(m.device.startswith("cuda:") for m in snapshot.load(path).devices), path.name

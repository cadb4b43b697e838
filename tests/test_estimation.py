"""memgate.estimate: CUDA code run on a CPU-only machine, its storages replayed through the caching
allocator's model, measured against torch.cuda's own counters of real NVIDIA H200 runs.

``tests/data/samples/torch_cuda/truth.json``: torch.cuda's counters of those runs (torch 2.11.0+cu130 on one H200,
driver 580.159.04); the models below are those of the script that made those runs (``make_cuda_samples.py``).
"""

from __future__ import annotations

import json
import pickle
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import H200_MARKER_TESTS

from memgate.errors import ConfigError
from memgate.estimation.allocator import Allocator
from memgate.estimation.api import ESTIMATE_SNAPSHOT, Target, allocator_settings
from memgate.estimation.workspaces import DEVICES, sizes
from memgate.loaders.snapshot.block_sizes import Settings
from memgate.session import measure

SAMPLES = Path(__file__).parent / "data" / "samples" / "torch_cuda"
TRUTH = json.loads((SAMPLES / "truth.json").read_text())
LEAK = 3 * 1024 * 1024 + 4096
MIB = 1 << 20


def _step(model: Any, opt: Any, x: Any) -> None:
    loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _run(torch: Any, directory: Path, *, steps: int, leak_from: int, hidden: int = 8192) -> dict[str, Any]:
    """make_cuda_samples.py's training loop, estimated; the figures memgate gives its estimate."""
    import memgate

    nn = torch.nn
    kept = []  # freed after the estimate stops, as the script's list outlives its recorder
    with memgate.estimate(directory) as est:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(2048, hidden), nn.GELU(), nn.Linear(hidden, 2048)).to("cuda")
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(512, 2048, device="cuda")
        for i in range(steps):
            _step(model, opt, x)
            if i >= leak_from:
                kept.append(torch.empty(LEAK, dtype=torch.uint8, device="cuda"))
            est.step()
    del kept
    (measured,) = measure(directory)
    (device,) = measured.devices
    return dict(device.values)


@pytest.fixture(scope="module")
def shared_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    torch = pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("estimates")
    return {
        "h200_record_leak": _run(torch, root / "record_leak", steps=8, leak_from=0),
        "h200_record_clean": _run(torch, root / "record_clean", steps=8, leak_from=8),
        # the trace run: the same 8 steps; torch's counters covered its 6 active steps (the peak is in the last)
        "h200_trace_leak": _run(torch, root / "trace_leak", steps=8, leak_from=0),
        # the snapshot run: one warm-up step, then 6 steps keeping a block each
        "h200_snapshot_leak": _run(torch, root / "snapshot_leak", steps=7, leak_from=1),
    }


def test_estimates_equal_torch_cuda_counters_of_h200_runs(shared_runs: dict[str, dict[str, Any]]) -> None:
    head = (f"{'run':<22} {'peak allocated (estimate / H200)':>36} {'peak reserved (estimate / H200)':>34} "
            f"{'step growth (estimate / leak)':>30}")
    rows = [head]
    for name, values in shared_runs.items():
        truth = TRUTH[name]
        rows.append(f"{name:<22} {values['peak_allocated_bytes']:>17} / {truth['peak_allocated']:<16} "
                    f"{values['peak_reserved_bytes']:>15} / {truth['peak_reserved']:<16} "
                    f"{values['step_growth_bytes']:>12} / {truth['leak_per_step']}")
    print("\n" + "\n".join(rows))
    for name, values in shared_runs.items():
        truth = TRUTH[name]
        assert values["peak_allocated_bytes"] == truth["peak_allocated"], name
        assert values["peak_reserved_bytes"] == truth["peak_reserved"], name
        assert values["step_growth_bytes"] == truth["leak_per_step"], name


# Every figure memgate reads from the real recording of the run (its snapshot's blocks) that an estimate models.
SAME_AS_RECORDED = ("peak_allocated_bytes", "peak_requested_bytes", "peak_reserved_bytes", "allocated_at_dump_bytes",
                    "reserved_at_dump_bytes", "step_growth_bytes", "leaked_bytes", "leak_undetermined_bytes",
                    "fragmentation", "external_fragmentation", "largest_free_block_bytes", "free_block_fragmentation",
                    "live_at_peak_count")


@pytest.mark.parametrize("name", ["h200_record_leak", "h200_record_clean"])
def test_every_figure_equals_memgates_of_the_real_recording(shared_runs: dict[str, dict[str, Any]], name: str) -> None:
    (recorded,) = measure(SAMPLES / name)
    real = {d.device: d.values for d in recorded.devices}["cuda:0"]
    estimate = shared_runs[name]
    assert {k: estimate[k] for k in SAME_AS_RECORDED} == {k: real[k] for k in SAME_AS_RECORDED}
    assert estimate["allocated_at_dump_bytes"] == TRUTH[name]["allocated_end"]
    assert [h["size"] for h in estimate["top_at_peak"]] == [h["size"] for h in real["top_at_peak"]]


def test_estimate_is_named_as_one_with_its_assumptions(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    _run(torch, tmp_path, steps=2, leak_from=2, hidden=256)
    from memgate.loaders.snapshot import snapshot
    from memgate.platforms import device_platform

    profile = snapshot.load(tmp_path / ESTIMATE_SNAPSHOT)
    platform = device_platform(profile.metadata, "cuda:0")
    assert platform.device_name == "estimated: NVIDIA H200"
    assert platform.label().startswith("estimated: NVIDIA H200 / torch ")
    assert profile.metadata["notes"][0].startswith("an estimate for NVIDIA H200, made on a machine without it")
    record = profile.metadata["estimate"]
    assert record["workspaces"]["allocated"] == ["cublas workspace of 33554432 B for the forward thread",
                                                 "cublaslt workspace of 1048576 B for the forward thread",
                                                 "cublas workspace of 33554432 B for the backward thread"]
    assert "not_measurable" not in profile.metadata


def test_a_fused_optimizer_is_not_measurable_with_why(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import memgate

    with memgate.estimate(tmp_path) as est:
        model = torch.nn.Linear(64, 64).cuda()
        opt = torch.optim.AdamW(model.parameters(), fused=True)
        model(torch.randn(8, 64, device="cuda")).sum().backward()
        opt.step()
        est.step()
    (measured,) = measure(tmp_path)
    (device,) = measured.devices
    why = measured.profile.metadata["not_measurable"]["peak_allocated_bytes"]
    assert why.startswith("an estimate cannot follow aten::_fused_adamw_ (fused Adam/AdamW")
    assert device.values.get("peak_allocated_bytes") is None


def test_values_asked_of_an_estimated_tensor_are_zeros_and_said(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import memgate

    with memgate.estimate(tmp_path) as est:
        x = torch.ones(4, device="cuda")
        assert x.sum().item() == 0.0
        assert x.cpu().tolist() == [0.0] * 4
        est.step()
    record = pickle.loads((tmp_path / ESTIMATE_SNAPSHOT).read_bytes())["memgate_estimate"]
    assert any(text.startswith("values: .item()") for text in record["not_modelled"])


# ---- the allocator model ----------------------------------------------------------------------------


def _blocks(allocator: Allocator) -> list[tuple[int, str]]:
    return [(b["size"], b["state"]) for s in allocator.snapshot_segments() for b in s["blocks"]]


def test_a_large_request_keeps_a_remainder_of_at_most_1_mib() -> None:
    allocator = Allocator(Settings())
    first = allocator.malloc(4 * MIB, [], 1)  # a 20 MiB segment; its 16 MiB rest split off
    for _ in range(5):  # the fifth leaves 1028096 B (not over 1 MiB): its block keeps them
        allocator.malloc(LEAK, [], 2)
    assert _blocks(allocator) == [(4 * MIB, "active_allocated")] + [(LEAK, "active_allocated")] * 4 + [
        (4177920, "active_allocated")]
    assert [s["total_size"] for s in allocator.snapshot_segments()] == [20 * MIB]
    allocator.free(first, 3)
    assert _blocks(allocator)[0] == (4 * MIB, "inactive")


def test_small_requests_round_to_512_and_split_in_a_2_mib_segment() -> None:
    allocator = Allocator(Settings())
    a = allocator.malloc(4, [], 1)
    allocator.malloc(1000, [], 2)
    assert _blocks(allocator) == [(512, "active_allocated"), (1024, "active_allocated"),
                                  (2 * MIB - 1536, "inactive")]
    allocator.free(a, 3)
    allocator.malloc(512, [], 4)  # best fit: the freed 512 B block, not the large rest
    assert _blocks(allocator)[0] == (512, "active_allocated")


def test_large_segments_and_expandable_pages() -> None:
    allocator = Allocator(Settings())
    allocator.malloc(64 * MIB + 1, [], 1)
    assert [s["total_size"] for s in allocator.snapshot_segments()] == [66 * MIB]
    grown = Allocator(allocator_settings("expandable_segments:True"))
    grown.malloc(3 * MIB, [], 1)
    grown.malloc(30 * MIB, [], 2)
    assert [s["total_size"] for s in grown.snapshot_segments()] == [40 * MIB]
    assert [a["action"] for a in grown.trace] == ["segment_map", "alloc", "segment_map", "alloc"]
    assert _blocks(grown) == [(3 * MIB, "active_allocated"), (30 * MIB, "active_allocated"), (7 * MIB, "inactive")]


def test_max_split_size_keeps_oversize_blocks_for_oversize_requests() -> None:
    allocator = Allocator(allocator_settings("max_split_size_mb:40"))
    big = allocator.malloc(60 * MIB, [], 1)
    allocator.free(big, 2)
    allocator.malloc(30 * MIB, [], 3)  # under the limit: the 60 MiB free block may not serve it
    assert [s["total_size"] for s in allocator.snapshot_segments()] == [60 * MIB, 30 * MIB]


# ---- the target and the settings ------------------------------------------------------------------


def test_target_names_a_modelled_device() -> None:
    assert Target.parse("cuda").device.name == "NVIDIA H200"
    assert Target.parse("cuda:nvidia a100-sxm4-80gb").device.name == "NVIDIA A100-SXM4-80GB"
    with pytest.raises(ConfigError, match="no model of device 'RTX 9999'"):
        Target.parse("cuda:RTX 9999")
    with pytest.raises(ConfigError, match="invalid --memgate-estimate 'npu'"):
        Target.parse("npu")
    with pytest.raises(ConfigError, match="invalid allocator setting 'pinned_num_register_threads:4'"):
        allocator_settings("pinned_num_register_threads:4")


def test_workspace_sizes_say_where_they_come_from() -> None:
    assert sizes(DEVICES["NVIDIA H200"], "2.11.0+cu130", {}) == (32 * MIB, MIB, "measured on NVIDIA H200 with torch 2.11")
    blas, lt, source = sizes(DEVICES["NVIDIA A100-SXM4-80GB"], "2.13.0", {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"})
    assert (blas, lt) == (32 * MIB, MIB)
    assert source == ("torch's defaults for compute capability 8.0 (not measured on NVIDIA A100-SXM4-80GB with "
                      "torch 2.13); cuBLAS workspace from CUBLAS_WORKSPACE_CONFIG")
    assert np.int64(sizes(DEVICES["NVIDIA L4"], "2.13.0", {})[0]) == 8 * MIB + 128 * 1024


# ---- the pytest option ------------------------------------------------------------------------------

MARKED = """
import pytest, torch, torch.nn as nn

HIDDEN = {hidden}

@pytest.mark.memgate(peak_allocated="{limit}", devices="cuda:*")
def test_train(memgate_record):
    model = nn.Sequential(nn.Linear(1024, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(256, 1024, device="cuda")
    for _ in range(3):
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        memgate_record.step()
"""


def _peak_of(pytester: pytest.Pytester, hidden: int) -> int:
    torch = pytest.importorskip("torch")
    import memgate

    nn = torch.nn
    with memgate.estimate(pytester.path / f"direct{hidden}") as est:
        model = nn.Sequential(nn.Linear(1024, hidden), nn.GELU(), nn.Linear(hidden, 1024)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(256, 1024, device="cuda")
        for _ in range(3):
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            est.step()
    (measured,) = measure(pytester.path / f"direct{hidden}")
    return int(measured.devices[0].values["peak_allocated_bytes"])


def test_a_marked_test_estimated_on_cpu_fails_when_its_model_grows_by_a_quarter(pytester: pytest.Pytester) -> None:
    pytest.importorskip("torch")
    peak = _peak_of(pytester, 4096)
    assert _peak_of(pytester, 5120) > peak * 1.1  # the bigger model's estimate is well over the budget
    pytester.makepyfile(test_model=MARKED.format(hidden=4096, limit=peak))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memgate-estimate=cuda", "-rA")
    result.assert_outcomes(passed=1)
    pytester.makepyfile(test_model=MARKED.format(hidden=5120, limit=peak))  # 25 % more hidden units
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memgate-estimate=cuda:NVIDIA H200", "-rA")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*peak_allocated * exceeds budget * (estimate for NVIDIA H200)*"])


def test_an_unknown_device_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memgate-estimate=cuda:RTX 9999")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*invalid --memgate-estimate 'cuda:RTX 9999': no model of device 'RTX 9999'*"])


def test_the_ini_twin_names_the_device_too(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nmemgate_estimate = cuda:RTX 9999\n")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*invalid --memgate-estimate 'cuda:RTX 9999': no model of device 'RTX 9999'*"])
    pytester.makeini("[pytest]\nmemgate_estimate = npu\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.stderr.fnmatch_lines(["*invalid --memgate-estimate 'npu'*expected cuda or cuda:DEVICE NAME*"])


def test_attention_through_sdpa_is_not_measurable(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import memgate

    with memgate.estimate(tmp_path) as est:
        q = torch.randn(2, 4, 16, 8, device="cuda")
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
        est.step()
    (measured,) = measure(tmp_path)
    why = measured.profile.metadata["not_measurable"]["peak_reserved_bytes"]
    assert why == ("an estimate cannot follow torch.nn.functional.scaled_dot_product_attention "
                   "(scaled_dot_product_attention picks a CUDA backend (flash, memory-efficient, cuDNN) whose "
                   "allocations no meta kernel shows)")


def test_tracked_models_give_categories_and_holders_their_lines(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import memgate

    nn = torch.nn
    with memgate.estimate(tmp_path) as est:
        model = nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)).cuda()
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(512, 2048, device="cuda")
        est.track(model, opt)
        for _ in range(2):
            loss = model(x).float().pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            est.step()
    (measured,) = measure(tmp_path)
    values = measured.devices[0].values
    assert values["peak_allocated_bytes"] == TRUTH["h200_record_clean"]["peak_allocated"]
    params = 2 * 8192 * 2048 * 4 + (8192 + 2048) * 4
    assert values["category_bytes_at_peak"] == {
        "parameters": params, "buffers": 0, "gradients": params, "optimizer_state": 2 * params,
        "activations": TRUTH["h200_record_clean"]["peak_allocated"] - 4 * params, "other": 0}
    top = values["top_at_peak"][0]
    assert (top["size"], top["op"]) == (67108864, "aten::_to_copy")  # a weight, moved to cuda by .cuda()
    assert top["owner"].startswith("test_tracked_models_give_categories_and_holders_their_lines (")
    assert "test_estimation.py:" in top["owner"] and top["category"] == "parameters", top


def test_inspect_says_it_is_an_estimate_and_how_to_mark_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    import memgate
    from memgate.cli import main

    with memgate.estimate(tmp_path, device="NVIDIA A100-SXM4-80GB") as est:
        torch.empty(1024, device="cuda")
        est.step()
    assert main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("  estimate: an estimate for NVIDIA A100-SXM4-80GB, made on a machine without it")
    assert "    capacity                 80.00 GiB (85899345920 B), headroom" in "\n".join(out)
    growth = next(line for line in out if line.lstrip().startswith("step_growth_bytes"))
    assert growth.endswith("call est.step() once per training step of memgate.estimate, at least 6 times "
                           "(5 counted after 1 warm-up), or lower warmup_steps")


def test_a_share_of_the_estimated_device_is_a_limit(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    import memgate
    from memgate.budgets import load_budget_file
    from memgate.discover import discover, load
    from memgate.judge import judge
    from memgate.metric_cache import MetricCache

    with memgate.estimate(tmp_path / "prof", device="NVIDIA L4") as est:
        kept = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")  # 3 GiB of the L4's 22.49 GiB
        est.step()
    del kept
    (tmp_path / "memgate.toml").write_text('[[budgets]]\nname = "share"\npeak_reserved = "10%"\n')
    budget = load_budget_file(tmp_path / "memgate.toml").budgets[0]
    (found,) = discover(tmp_path / "prof")
    outcome = judge(MetricCache(load(found)), budget, "peak_reserved")
    assert not outcome.passed
    assert outcome.message.startswith("peak_reserved 3.00 GiB exceeds budget 2.25 GiB by ")
    assert "rank 0 cuda:0 (estimate for NVIDIA L4)" in outcome.message


def test_the_h200_marker_test_estimated_finds_its_leak(pytester: pytest.Pytester) -> None:
    """h200_marker_test_leaks (samples/torch_cuda/PROVENANCE.md), its tests as written for CUDA: the leak of 3149824 B
    a step fails, the clean loop passes."""
    pytest.importorskip("torch")
    pytester.makepyfile(test_cuda_budget=H200_MARKER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--memgate-estimate=cuda")
    result.assert_outcomes(failed=1, passed=1)
    line = "step_growth 3.00 MiB exceeds budget 1.00 MiB by 2.00 MiB (+200.4%) — rank 0 cuda:0 (estimate for NVIDIA H200)*"
    result.stdout.fnmatch_lines([line])


@pytest.mark.parametrize("conf", ["", "expandable_segments:True", "max_split_size_mb:20"])
def test_the_allocator_keeps_its_segments_tiled_and_merged(conf: str) -> None:
    """Random requests and frees: the blocks tile every segment, no two free neighbours stay apart, the pools
    hold exactly the free blocks, and the snapshot the loader reads accounts for every byte."""
    rng = np.random.default_rng(7)
    allocator = Allocator(allocator_settings(conf))
    live: list[int] = []
    for t in range(3000):
        if live and rng.random() < 0.45:
            allocator.free(live.pop(int(rng.integers(len(live)))), t)
        else:
            size = int(rng.choice([4, 700, 4096, 1 << 20, (1 << 20) + 1, 3 * MIB + 4096, 12 * MIB, 50 * MIB]))
            live.append(allocator.malloc(size, [], t))
    for segment in allocator.snapshot_segments():
        blocks = segment["blocks"]
        assert blocks[0]["address"] == segment["address"]
        assert sum(b["size"] for b in blocks) == segment["total_size"]
        assert all(a["address"] + a["size"] == b["address"] for a, b in pairwise(blocks))
        assert not any(a["state"] == b["state"] == "inactive" for a, b in pairwise(blocks))
    free = sorted((b.size, b.addr) for b in allocator.blocks.values() if b.free)
    assert sorted(allocator.pools[True] + allocator.pools[False]) == free
    assert len(live) == sum(1 for b in allocator.blocks.values() if not b.free)

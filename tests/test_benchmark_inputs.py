"""The benchmark's generated torch_npu profile is shaped like a real one where it decides which code
runs: its blocks agree with their recorded allocator totals on one baseline, as a real profile's do
(the reconciliation then confirms a majority instead of sorting millions of estimates)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from memgate import discover
from memgate.reconcile import reconcile

GENERATE = Path(__file__).resolve().parents[1] / "benchmarks" / "generate.py"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("memgate_bench_generate", GENERATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_blocks_agree_with_their_allocator_totals(tmp_path: Path) -> None:
    generate = _generator()
    info = generate.make_csv(tmp_path / "csv", 0.001)
    (found,) = discover.discover(Path(info["path"]))
    profile = discover.load(found)
    (device,) = profile.devices
    facts = reconcile(device).components
    assert sum(c.blocks for c in facts.values()) == info["operator_memory_rows"]
    for component in facts.values():
        assert component.consistency == 1.0, component
        assert component.baseline_bytes == generate.BASE_ALLOCATED


def test_generated_kineto_trace_is_a_valid_record_with_one_baseline(tmp_path: Path) -> None:
    """Replicas of the sample trace reuse its addresses: each replica frees every block it allocates
    (what the window cut is left out), so no address is allocated twice, and the blocks of every
    replica agree with their recorded totals as the sample's do."""
    generate = _generator()
    info = generate.make_kineto(tmp_path / "kineto", 0.002)
    assert info["replicas"] > 1
    (found,) = discover.discover(Path(info["path"]))
    profile = discover.load(found)  # an address allocated twice would be an InputError
    for device in profile.devices:
        for component in reconcile(device).components.values():
            assert component.pre_window_blocks == 0 and component.open_blocks == 0
            assert component.consistency is not None and component.consistency > 0.5, component


def test_generated_snapshot_is_in_time_order_as_torch_records(tmp_path: Path) -> None:
    """torch records a trace in time order (segments first, then the allocs that use them): a generated
    trace that is not would make every load sort it, a cost no real torch snapshot has."""
    import pickle

    generate = _generator()
    info = generate.make_snapshot(tmp_path / "snapshot", 0.01)
    with open(info["path"], "rb") as fh:
        (trace,) = pickle.load(fh)["device_traces"]
    times = [entry["time_us"] for entry in trace]
    assert times == sorted(times) and trace[0]["action"] == "segment_alloc"
    (found,) = discover.discover(Path(info["path"]).parent)
    assert discover.load(found).devices

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

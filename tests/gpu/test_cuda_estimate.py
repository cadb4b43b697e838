"""memgate.estimate against torch.cuda's counters, live on a CUDA machine (skips without one: conftest.py).

Each scenario of test_cuda_truth.py runs twice: recorded on the GPU by a fresh child Python (its allocator
settings in ``PYTORCH_CUDA_ALLOC_CONF``, its cuBLAS workspaces allocated in the run, as in a test process),
and estimated in this process on meta tensors for the same settings; the estimate's peak allocated and peak
reserved must be within 2 % of torch.cuda's (the table is printed), its step growth the planted leak's block.
A model trained by the fused AdamW is not measurable as an estimate, with why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memgate.session import measure

HERE = Path(__file__).resolve().parent
TOLERANCE = 0.02
CHILD = """\
import json, sys
sys.path.insert(0, {here!r})
import torch
assert torch.cuda.is_available()
import test_cuda_truth
truth = test_cuda_truth.recorded_run({directory!r}, {model!r}, leak=True)
with open({out!r}, "w") as fh:
    json.dump(truth, fh)
"""


def _measured(tmp_path: Path, model: str, alloc_conf: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    env["PYTORCH_CUDA_ALLOC_CONF"] = alloc_conf
    out = tmp_path / "truth.json"
    script = CHILD.format(here=str(HERE), directory=str(tmp_path / "rec"), model=model, out=str(out))
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    truth: dict[str, Any] = json.loads(out.read_text())
    return truth


def _estimated(torch: Any, directory: Path, model: str, alloc_conf: str) -> Any:
    sys.path.insert(0, str(HERE))
    import test_cuda_truth as scenarios

    import memgate

    with memgate.estimate(directory, alloc_conf=alloc_conf) as est:
        torch.manual_seed(0)
        net, opt, x = scenarios.MODELS[model]()
        kept = []
        for _ in range(8):
            scenarios._train_step(net, opt, x)
            kept.append(torch.empty(scenarios.LEAK, dtype=torch.uint8, device="cuda"))
            est.step()
        del kept
    (profile,) = measure(directory)
    return profile


@pytest.mark.parametrize(("model", "alloc_conf"), [("mlp", ""), ("mlp", "expandable_segments:True"),
                                                   ("mlp", "roundup_power2_divisions:4"), ("checkpointed", "")])
def test_estimate_against_the_gpu(cuda_torch: Any, tmp_path: Path, model: str, alloc_conf: str) -> None:
    truth = _measured(tmp_path, model, alloc_conf)
    values = _estimated(cuda_torch, tmp_path / "estimate", model, alloc_conf).devices[0].values
    print(f"\n{model} [{alloc_conf or 'defaults'}]: peak allocated {values['peak_allocated_bytes']} / "
          f"{truth['peak_allocated']}, peak reserved {values['peak_reserved_bytes']} / {truth['peak_reserved']}, "
          f"step growth {values['step_growth_bytes']} / blocks {sorted(set(truth['leak_blocks']))}")
    for key, want in (("peak_allocated_bytes", truth["peak_allocated"]), ("peak_reserved_bytes", truth["peak_reserved"])):
        assert abs(values[key] - want) <= TOLERANCE * want, (key, values[key], want)
    assert values["step_growth_bytes"] == min(truth["leak_blocks"])  # an unsplit rest kept: a one-time jump


def test_a_fused_optimizer_is_not_measurable(cuda_torch: Any, tmp_path: Path) -> None:
    profile = _estimated(cuda_torch, tmp_path, "transformer_bf16", "")
    assert "aten::_fused_adamw_" in profile.profile.metadata["not_measurable"]["peak_allocated_bytes"]

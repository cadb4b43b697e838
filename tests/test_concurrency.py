"""Many ranks, many processes, one shared cache: the same verdicts as a serial run, no torn entry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from groundtruth import Block, Trace
from writers.torch_npu import NpuOptions, write_profile

from memgate.cache import ProfileCache
from memgate.cli import main
from memgate.discover import discover

RANKS = 64
T0 = 1_700_000_000_000_000_000


def _trace(rank: int) -> Trace:
    """A small two-step run whose peak grows with the rank (so every rank's numbers differ)."""
    ms = 1_000_000
    blocks = (
        Block((rank + 1) << 20, T0, T0 + 5 * ms, "aten::mm"),
        Block(1 << 20, T0 + ms, None, "aten::add"),
        Block(2 << 20, T0 + 11 * ms, T0 + 15 * ms, "aten::mm"),
    )
    steps = ((1, T0, T0 + 10 * ms), (2, T0 + 10 * ms, T0 + 20 * ms))
    return Trace(device_id=rank % 8, hidden_baseline=rank << 10, blocks=blocks, steps=steps, t_start=T0,
                 t_end=T0 + 20 * ms)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("ranks")
    for rank in range(RANKS):
        write_profile(_trace(rank), base / f"rank_{rank}", NpuOptions(rank=rank, step_source="trace_view"))
    return base


def _project(tmp: Path) -> None:
    (tmp / "memgate.toml").write_text('[[budgets]]\nname = "b"\npeak_allocated = "40 MiB"\npeak_reserved = "64 MiB"\n')
    (tmp / "pytest.ini").write_text("[pytest]\n")


def _pytest(cwd: Path, root: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    return subprocess.Popen([sys.executable, "-m", "pytest", f"--memgate={root}", "-q", "-p", "no:randomly", *args],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_parallel_runs_share_the_cache_and_match_a_serial_run(root: Path, tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    _project(tmp_path)
    cache = tmp_path / "shared-cache"
    serial = _pytest(tmp_path, root, "--memgate-json=serial.json", "-p", "no:cacheprovider")
    assert serial.wait(timeout=600) == 1, serial.stdout.read() if serial.stdout else ""
    runs = [_pytest(tmp_path, root, "-n", "4", f"--memgate-cache-dir={cache}", f"--memgate-json=parallel{i}.json")
            for i in range(2)]
    for run in runs:
        assert run.wait(timeout=600) == 1, run.stdout.read() if run.stdout else ""
    reports = [json.loads((tmp_path / name).read_text()) for name in ("serial.json", "parallel0.json", "parallel1.json")]
    verdicts = [sorted((o["profile"], o["metric"], o["value"], o["passed"]) for o in r["budgets"]) for r in reports]
    assert len(verdicts[0]) == 2 * RANKS
    assert verdicts[0] == verdicts[1] == verdicts[2]
    assert reports[0]["profiles"] == reports[1]["profiles"] == reports[2]["profiles"]
    failed = [o for o in reports[0]["budgets"] if o["passed"] is False and o["metric"] == "peak_allocated"]
    # peak = (rank + 1) MiB + 1 MiB + rank KiB of baseline, over 40 MiB from rank 38 on
    assert sorted(int(o["rank"]) for o in failed) == list(range(38, RANKS))
    # Every profile has one whole, verifiable entry in the shared cache.
    shared = ProfileCache(cache)
    assert all(shared.get(found) is not None for found in discover(root))
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no temp or trash left behind


def test_cli_cache_dir_reads_back_the_same_report(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["inspect", str(root / "rank_7"), "--json", "--cache-dir", str(tmp_path / "c")]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert any((tmp_path / "c").iterdir())
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out) == first

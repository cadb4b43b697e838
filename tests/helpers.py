"""Small helpers shared by the tests: run the CLI, copy a sample, rewrite a file's lines, skip without torch."""

from __future__ import annotations

import importlib.util
import os
import pickle
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "tests" / "data" / "samples"
ASCEND = SAMPLES / "ascend"
PTA271 = ASCEND / "msinsight_st_pta271_level2_rank0"
PTA21_L1 = ASCEND / "msinsight_pta21_level1_rank0"
PTA21_L0 = ASCEND / "msinsight_pta21_level0_rank0"
PRE21 = ASCEND / "msinsight_ut_pre21_rank0"  # torch_npu before 2.1: no Active or Stream Ptr columns
TORCH_NPU_SAMPLES = (PTA271, PTA21_L1, PTA21_L0, PRE21)
NEEDS_TORCH = "recording needs torch (pip install 'pytest-memgate[torch]')"


class _NoClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"class {module}.{name} refused")


def sample_pickle(path: Path) -> Any:
    """A sample snapshot as plain Python data, read without memgate by an Unpickler that refuses every
    class (the samples are plain data: PROVENANCE.md)."""
    with open(path, "rb") as fh:
        return _NoClasses(fh).load()


def skip_without_torch(reason: str = NEEDS_TORCH) -> None:
    """Skip unless torch is installed, found without importing it: pytester unloads what a test imports."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip(reason)


@dataclass(frozen=True)
class CliResult:
    rc: int
    stdout: str
    stderr: str

    def __iter__(self):  # type: ignore[no-untyped-def]  # allows ``rc, out, err = run_cli(...)``
        return iter((self.rc, self.stdout, self.stderr))


def run_cli(
    args: Sequence[str | os.PathLike[str]],
    *,
    cwd: str | os.PathLike[str] | None = None,
    prelude: str = "",
    timeout: float = 120,
) -> CliResult:
    """Run ``python -m memgate ARGS`` in a fresh interpreter.

    ``prelude`` is Python run in that interpreter before the CLI (e.g. to simulate a permission
    error when the tests run as root, where chmod 000 does not stop reads).
    """
    argv = [str(a) for a in args]
    if prelude:
        code = f"{prelude}\nimport sys\nfrom memgate.cli import main\nsys.exit(main({argv!r}))"
        command = [sys.executable, "-c", code]
    else:
        command = [sys.executable, "-m", "memgate", *argv]
    env = {k: v for k, v in os.environ.items() if k != "MEMGATE_DEBUG"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    return CliResult(done.returncode, done.stdout, done.stderr)


SCRIPT = Path(sys.executable).parent / "memgate"  # the console script pip installed


def run_cli_all(
    commands: Sequence[Sequence[str | os.PathLike[str]]],
    *,
    prelude: str = "",
    script: Sequence[bool] = (),
    timeout: float = 120,
) -> list[CliResult]:
    """Run several CLI commands at once (each in its own interpreter) and wait for all of them.

    Interpreter start-up (pandas, pyarrow) dominates a CLI run; overlapping them halves the wait.
    ``script[i]`` runs command ``i`` through the ``memgate`` console script instead of
    ``python -m memgate`` (ignored with a ``prelude``, which needs ``python -c``).
    """
    env = {k: v for k, v in os.environ.items() if k != "MEMGATE_DEBUG"}
    procs = []
    for i, args in enumerate(commands):
        argv = [str(a) for a in args]
        if prelude:
            code = f"{prelude}\nimport sys\nfrom memgate.cli import main\nsys.exit(main({argv!r}))"
            command = [sys.executable, "-c", code]
        elif i < len(script) and script[i]:
            command = [str(SCRIPT), *argv]
        else:
            command = [sys.executable, "-m", "memgate", *argv]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        results.append(CliResult(proc.returncode, out, err))
    return results


def copy_sample(sample: Path, dest: Path) -> Path:
    """Copy a sample directory to ``dest`` (created) and make it writable (the originals are read-only)."""
    shutil.copytree(sample, dest, copy_function=shutil.copyfile)
    for path in [dest, *dest.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR | stat.S_IRUSR | (stat.S_IXUSR if path.is_dir() else 0))
    return dest


def read_lines(path: Path) -> list[bytes]:
    """The file's lines with their line endings kept (CRLF stays CRLF)."""
    return path.read_bytes().splitlines(keepends=True)


def write_lines(path: Path, lines: Sequence[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def eol_of(line: bytes) -> bytes:
    return b"\r\n" if line.endswith(b"\r\n") else b"\n" if line.endswith(b"\n") else b""


def split_row(line: bytes) -> tuple[list[str], bytes]:
    """A simple CSV row (no quoted commas) as fields plus its line ending."""
    eol = eol_of(line)
    return line[: len(line) - len(eol)].decode("utf-8").split(","), eol


def join_row(fields: Sequence[str], eol: bytes) -> bytes:
    return ",".join(fields).encode("utf-8") + eol


def one_stderr_line(stderr: str) -> str:
    """The single line the CLI must print on a usage or input error."""
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected exactly one stderr line, got {len(lines)}:\n{stderr}"
    assert "Traceback" not in stderr
    assert lines[0].startswith("memgate: error: "), lines[0]
    return lines[0]


def in_process(args: Sequence[str | os.PathLike[str]], capsys: Any) -> CliResult:
    """``memgate ARGS`` through ``memgate.cli.main`` in this process (what ``python -m memgate`` runs).

    For large error matrices: a subprocess costs ~1 s of imports each; a few subprocess tests
    cover the real entry points. ``capsys`` is pytest's fixture.
    """
    from memgate import cli

    capsys.readouterr()
    rc = cli.main([str(a) for a in args])
    captured = capsys.readouterr()
    return CliResult(rc, captured.out, captured.err)


def db_exec(path: Path, *sql: str) -> None:
    """Run the SQL statements on the sqlite file at ``path``; no journal file is left beside it."""
    conn = sqlite3.connect(path)
    try:
        for statement in sql:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()
    for extra in ("-journal", "-wal", "-shm"):
        Path(str(path) + extra).unlink(missing_ok=True)


def edited_db(source: Path, target: Path, *statements: str) -> Path:
    """``source`` copied to ``target`` with the SQL ``statements`` run on the copy."""
    shutil.copyfile(source, target)
    db_exec(target, *statements)
    return target


class _Computed:
    """A result store that already holds a profile's metrics."""

    def __init__(self, metrics: list[Any]) -> None:
        self.metrics = metrics

    def get(self, options: Any) -> list[Any] | None:
        return self.metrics

    def put(self, options: Any, metrics: list[Any]) -> None:  # pragma: no cover
        raise AssertionError


def computed_cache(metrics: list[Any], metadata: dict[str, Any] | None = None) -> Any:
    """A ``MetricCache`` serving ``metrics`` (DeviceMetrics) as already computed; loading the profile
    fails the test."""
    from memgate.metric_cache import MetricCache
    from memgate.model import ProfileInfo

    def load() -> Any:
        raise AssertionError("not loaded")

    return MetricCache(info=ProfileInfo("p", "fmt", "0", metadata or {}, ()), load=load, store=_Computed(metrics))


def judged_pta271() -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    """The PTA271 sample loaded, its report entry, and its outcomes of one budget over four metrics (its
    peak_allocated limit exceeded): what the HTML report and the curve image draw."""
    from memgate.budgets import budget_from_mapping
    from memgate.discover import discover, load
    from memgate.judge import judge
    from memgate.metric_cache import MetricCache
    from memgate.metrics import profile_metrics
    from memgate.model import ProfileInfo
    from memgate.report import outcome_entry, profile_entry

    [found] = discover(PTA271)
    profile = load(found)
    entry = profile_entry(ProfileInfo.of(profile), profile_metrics(profile))
    budget = budget_from_mapping(
        {"name": "train-step", "peak_allocated": "10 GiB", "peak_reserved": "11 GiB",
         "peak_app_reserved": "80 GiB", "fragmentation": 0.1},
        origin="test",
    )
    cache = MetricCache(profile)
    outcomes = [outcome_entry(judge(cache, budget, metric)) for metric in budget.checks()]
    return profile, entry, outcomes


def ring_buffer_cut(source: Path, into: Path) -> None:
    """``source``'s snapshot as a filled ring buffer leaves it: the oldest entries gone, up to and including
    a free_requested whose free_completed stays."""
    data = sample_pickle(source)
    trace = data["device_traces"][0]
    cut = next(i for i in range(20, len(trace) - 1) if trace[i]["action"] == "free_requested"
               and trace[i + 1]["action"] == "free_completed" and trace[i + 1]["addr"] == trace[i]["addr"])
    data["device_traces"][0] = trace[cut + 1:]
    into.write_bytes(pickle.dumps(data))


# A python_function event as torch 2.13 writes it (with_stack=True): the quotes in its name left unescaped,
# so the file is not JSON until memgate.readers.jsonstream repairs the name line.
ODD_NAME = 'torch/profiler/_cupti_monitor.py(0):     "seed",'
ODD_EVENT = """  {
    "ph": "X",
    "cat": "python_function",
    "name": "torch/profiler/_cupti_monitor.py(0):     "seed",",
    "pid": 15437,
    "tid": 15437,
    "ts": 4633982515560.000,
    "dur": 1.5
  },
"""

# The marked tests of samples/torch_cuda/h200_marker_test_leaks (its PROVENANCE.md), as written for CUDA: run
# on a GPU by tests/gpu and estimated on the CPU by tests/test_estimation.py.
H200_MARKER_TESTS = """
import pytest
import torch
import torch.nn as nn

LEAK = 3 * 1024 * 1024 + 4096


def train(rec, leak):
    model = nn.Sequential(nn.Linear(2048, 8192), nn.GELU(), nn.Linear(8192, 2048)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(512, 2048, device="cuda")
    kept = []
    for _ in range(8):
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if leak:
            kept.append(torch.empty(LEAK, dtype=torch.uint8, device="cuda"))
        rec.step()


@pytest.mark.memgate(step_growth="1 MiB", devices="cuda:*")
def test_leaks(memgate_record):
    train(memgate_record, True)


@pytest.mark.memgate(step_growth="1 MiB", devices="cuda:*")
def test_clean(memgate_record):
    train(memgate_record, False)
"""

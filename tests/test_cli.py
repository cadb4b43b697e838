"""``memgate inspect|check|validate``: exit codes 0/1/2, one stderr line on errors, the JSON report.

Real samples throughout; the numbers the CLI must print are derived here from the raw CSV.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Self

import jsonschema
import pytest
from helpers import (
    PTA21_L0,
    PTA21_L1,
    PTA271,
    REPO,
    SAMPLES,
    copy_sample,
    in_process,
    one_stderr_line,
    run_cli,
    run_cli_all,
)

from memgate import cli
from memgate.budgets import load_budget_file
from memgate.errors import ConfigError

MIB = 2**20
CUDA = SAMPLES / "torch_cuda"
TORCH = SAMPLES / "torch"


def peak(sample: Path, column: str, component: str = "PTA+GE") -> int:
    """max of a memory_record.csv column over one component's rows, in bytes (MB = 2**20 bytes)."""
    with open(sample / "memory_record.csv", newline="", encoding="utf-8") as fh:
        values = [Decimal(r[column]) for r in csv.DictReader(fh) if r["Component"] == component and r[column]]
    return int(max(values) * MIB)


def budget_file(tmp_path: Path, body: str, name: str = "memgate.toml") -> Path:
    path = tmp_path / name
    path.write_text(body, "utf-8")
    return path


def report_schema() -> dict:
    return json.loads((REPO / "schemas" / "report.schema.json").read_text())


# ---- inspect / validate ------------------------------------------------------------------------


def test_inspect_text_shows_exact_bytes_per_profile() -> None:
    rc, out, err = run_cli(["inspect", PTA271])
    assert (rc, err) == (0, "")
    assert out.splitlines()[0] == f"{PTA271}  [torch_npu, rank 0]"
    assert f"peak_allocated_bytes     10.04 GiB ({peak(PTA271, 'Total Allocated(MB)')} B)" in out
    assert f"({peak(PTA271, 'Total Reserved(MB)')} B)" in out
    assert f"({peak(PTA271, 'Total Reserved(MB)', 'APP')} B)" in out
    assert "step_growth_bytes        not measurable: needs at least 5 counted steps" in out


def test_inspect_json_is_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = in_process(["inspect", PTA21_L1, "--json"], capsys)
    assert (rc, err) == (0, "")
    report = json.loads(out)
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    (profile,) = report["profiles"]
    assert profile["path"] == str(PTA21_L1) and profile["rank"] == "0"
    assert profile["devices"][0]["metrics"]["peak_allocated_bytes"] == peak(PTA21_L1, "Total Allocated(MB)")
    assert report["budgets"] == [] and report["errors"] == []


def test_inspect_bad_rank_does_not_hide_the_good_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "prof"
    copy_sample(PTA21_L1, root / "a_rank0_ascend_pt")
    bad = copy_sample(PTA21_L1, root / "b_rank1_ascend_pt")
    (bad / "memory_record.csv").write_bytes(b"")
    rc, out, err = in_process(["inspect", root, "--json"], capsys)
    assert rc == 2
    line = one_stderr_line(err)
    assert str(bad / "memory_record.csv") in line
    report = json.loads(out)
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    assert [p["rank"] for p in report["profiles"]] == ["0"]
    assert [e["profile"] for e in report["errors"]] == [str(bad)]


def test_validate_lists_every_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for sample in (PTA271, PTA21_L1, PTA21_L0):
        assert tuple(in_process(["validate", sample], capsys)) == (0, f"{sample} [torch_npu]: ok\n", "")
    root = tmp_path / "prof"
    ok = copy_sample(PTA21_L0, root / "a_rank0_ascend_pt")
    bad = copy_sample(PTA21_L0, root / "b_rank1_ascend_pt")
    (bad / "trace_view.json").write_text("{}")
    rc, out, err = run_cli(["validate", root])  # the real entry point once
    assert rc == 2
    invalid = (
        f"{bad} [torch_npu]: INVALID: {bad / 'trace_view.json'}:1: trace_view.json must be a JSON array of events; "
        "expected a JSON array of events, found 'a JSON object'"
    )
    assert out.splitlines() == [f"{ok} [torch_npu]: ok", invalid]
    assert one_stderr_line(err) == "memgate: error: " + out.splitlines()[1].split("INVALID: ", 1)[1]


# ---- check -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("delta", "rc"), [(0, 0), (-1, 1)], ids=["at-limit-passes", "one-byte-over-fails"])
def test_check_at_the_exact_boundary(delta: int, rc: int, tmp_path: Path) -> None:
    limit = peak(PTA271, "Total Allocated(MB)") + delta
    budgets = budget_file(tmp_path, f'[[budgets]]\nname = "train"\npeak_allocated = {limit}\n')
    result = run_cli(["check", PTA271, "--budgets", budgets])
    assert (result.rc, result.stderr) == (rc, "")
    verdict = "pass" if rc == 0 else "FAIL"
    assert any(line.split()[-2:] == [verdict, PTA271.name] and "peak_allocated" in line
               for line in result.stdout.splitlines())
    if rc == 1:
        assert (f"FAILED {PTA271.name}::train::peak_allocated: peak_allocated 10.04 GiB exceeds budget 10.04 GiB "
                "by 1 B") in result.stdout
        assert "rank 0 npu:0, step 13" in result.stdout


def test_check_one_failing_budget_among_passing_ones_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    budgets = budget_file(tmp_path, """
[[budgets]]
name = "roomy"
peak_allocated = "2 GiB"
peak_reserved = "2 GiB"
peak_app_reserved = "3 GiB"
fragmentation = 0.5

[[budgets]]
name = "tight-matmul"
op_caps = { "aten::mm" = "100 MiB", "cann::*" = "1 GiB" }
""")
    rc, out, err = in_process(["check", PTA21_L1, "--budgets", budgets], capsys)
    assert (rc, err) == (1, "")
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    assert failed == [
        (
            "FAILED msinsight_pta21_level1_rank0::tight-matmul::op_caps[aten::mm]: op_caps[aten::mm] 144.00 MiB "
            "exceeds budget 100.00 MiB "
            "by 44.00 MiB (+44.0%) — rank 0 npu:0, op aten::mm"
        )
    ]
    assert sum(line.split()[-2:] == ["pass", PTA21_L1.name] for line in out.splitlines()) == 5


def test_check_uses_profiles_from_the_budget_file_relative_to_it(tmp_path: Path) -> None:
    copy_sample(PTA21_L1, tmp_path / "ci" / "prof" / "n_rank0_ascend_pt")
    budget_file(tmp_path / "ci", '[tool.memgate]\nprofiles = "prof"\n\n[[tool.memgate.budgets]]\nname = "b"\n'
                'peak_allocated = "2 GiB"\n', name="pyproject.toml")
    rc, out, err = run_cli(["check"], cwd=tmp_path / "ci")
    assert (rc, err) == (0, "")
    (row,) = [line.split() for line in out.splitlines() if "peak_allocated" in line]
    assert row == ["0", "npu:0", "b", "peak_allocated", "1.23", "GiB", "2.00", "GiB", "pass", "n_rank0_ascend_pt"]


BAD_BUDGETS = {
    "invalid-toml": ('[[budgets]\nname = "b"\n', ("invalid TOML", "memgate.toml:1: ")),
    "unknown-key": ('[[budgets]]\nname = "b"\npeak_alocated = "12 GiB"\n', ("'peak_alocated'",)),
    "bad-size": ('[[budgets]]\nname = "b"\npeak_allocated = "12 GB!"\n', ("'12 GB!'", "B, KiB, MiB, GiB, TiB")),
    "unknown-unit": ('[[budgets]]\nname = "b"\npeak_allocated = "12 XB"\n',
                     ("memgate.toml:3: ", "unknown unit 'XB'", "B, KiB, MiB, GiB, TiB")),
    "no-budgets": ('profiles = "prof"\n', ("no budgets",)),
    "duplicate-names": ('[[budgets]]\nname = "b"\nleaked = 1\n[[budgets]]\nname = "b"\nleaked = 2\n', ("duplicate", "'b'")),
    "ratio-out-of-range": ('[[budgets]]\nname = "b"\nfragmentation = 1.5\n', ("fragmentation",)),
}


@pytest.mark.parametrize("case", sorted(BAD_BUDGETS))
def test_check_bad_budget_file_exits_2(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body, says = BAD_BUDGETS[case]
    budgets = budget_file(tmp_path, body)
    rc, _, err = in_process(["check", PTA21_L1, "--budgets", budgets], capsys)
    assert rc == 2
    line = one_stderr_line(err)
    assert str(budgets) in line
    for fragment in says:
        assert fragment in line, line


def test_check_prints_every_budget_file_error_in_file_order(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "b"\nfragmentation = 1.5\n[[budgets]]\nname = "b"\n'
                                    'leaked = "12 GB!"\npeak_alocated = 1\n')
    rc, out, err = in_process(["check", PTA21_L1, "--budgets", budgets], capsys)
    assert rc == 2 and out == "" and "Traceback" not in err
    lines = err.splitlines()
    assert all(line.startswith(f"memgate: error: {budgets}:") for line in lines), err
    assert [line.removeprefix(f"memgate: error: {budgets}:").split(":")[0] for line in lines] == ["3", "5", "6", "7"]
    assert "fragmentation: 1.5 is greater than the maximum of 1" in lines[0]
    assert "duplicate budget name(s) 'b'" in lines[1]
    assert "invalid b.leaked '12 GB!'" in lines[2]
    assert "unknown budget key 'peak_alocated' (did you mean 'peak_allocated'?)" in lines[3]


def test_check_prints_each_misspelled_key_on_its_own_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "b"\npeak_alocated = 1\nleaked = "64 kB"\nleakd = 2\n'
                                    'step_grwth = 3\n')
    rc, out, err = in_process(["check", PTA21_L1, "--budgets", budgets], capsys)
    assert rc == 2 and out == ""
    with pytest.raises(ConfigError) as info:
        load_budget_file(budgets)
    assert err.splitlines() == [f"memgate: error: {line}" for line in info.value.lines()]
    assert [line.removeprefix(f"memgate: error: {budgets}:").split(":")[0] for line in err.splitlines()] == [
        "3", "5", "6"]  # "64 kB" is a size (64 KiB) in a file as in a marker


def test_check_missing_budget_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = in_process(["check", PTA21_L1, "--budgets", tmp_path / "nope.toml"], capsys)
    assert rc == 2
    assert one_stderr_line(err) == f"memgate: error: {tmp_path / 'nope.toml'}: budget file not found"


def test_check_not_measurable_says_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A leak budget on a one-step profile is an error, never a silent pass."""
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "leak"\nstep_growth = "16 MiB"\n')
    rc, out, err = in_process(["check", PTA271, "--budgets", budgets], capsys)
    assert rc == 2
    line = one_stderr_line(err)
    assert "step_growth is not measurable" in line
    assert "needs at least 5 counted steps" in line and "1 step(s) (13)" in line
    assert "pass" not in out


# ---- check --json --------------------------------------------------------------------------------


def test_check_json_report_replaces_the_file_atomically(tmp_path: Path) -> None:
    target = tmp_path / "out" / "memgate.json"
    target.parent.mkdir()
    target.write_text("old report\n")
    old_inode = target.stat().st_ino
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "b"\npeak_allocated = "1 GiB"\n')
    rc, _, err = run_cli(["check", PTA21_L1, "--budgets", budgets, "--json", target])
    assert (rc, err) == (1, "")  # 1.23 GiB > 1 GiB
    report = json.loads(target.read_text())
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    (outcome,) = report["budgets"]
    assert (outcome["metric"], outcome["value"], outcome["limit"], outcome["passed"]) == (
        "peak_allocated", peak(PTA21_L1, "Total Allocated(MB)"), 2**30, False)
    assert target.stat().st_ino != old_inode  # renamed into place, not rewritten in place
    assert sorted(p.name for p in target.parent.iterdir()) == ["memgate.json"]  # no temp file left


def test_check_json_failure_keeps_the_old_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "memgate.json"
    target.write_text('{"old": true}\n')
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "b"\npeak_allocated = "2 GiB"\n')

    real_fdopen = os.fdopen

    class HalfWritten:
        """The disk fills up after the first bytes of the report."""

        def __init__(self, fh) -> None:  # type: ignore[no-untyped-def]
            self.fh = fh

        def __enter__(self) -> Self:
            return self

        def __exit__(self, *exc: object) -> None:
            self.fh.close()

        def write(self, text: str) -> None:
            self.fh.write(text[:20])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr("memgate.report.os.fdopen", lambda fd, *a, **k: HalfWritten(real_fdopen(fd, *a, **k)))
    rc = cli.main(["check", str(PTA21_L1), "--budgets", str(budgets), "--json", str(target)])
    assert rc == 2
    err = capsys.readouterr().err
    assert one_stderr_line(err) == (f"memgate: error: {target}: cannot write the JSON report: No space left on device; "
                                    "expected a writable file path for --json")
    assert target.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memgate.json", "memgate.toml"]


def test_check_json_into_a_file_path_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "blocker").write_text("a file where a folder should be")
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "b"\npeak_allocated = "2 GiB"\n')
    rc, _, err = in_process(["check", PTA21_L1, "--budgets", budgets, "--json", tmp_path / "blocker" / "r.json"], capsys)
    assert rc == 2
    assert "cannot write the JSON report" in one_stderr_line(err)


# ---- usage -------------------------------------------------------------------------------------

USAGE = {
    "no-command": ([], "required: command"),
    "unknown-command": (["frobnicate", "x"], "invalid choice: 'frobnicate'"),
    "inspect-without-path": (["inspect"], "required: path"),
    "validate-without-path": (["validate"], "required: path"),
    "unknown-option": (["inspect", "x", "--bogus"], "unrecognized arguments: --bogus"),
    "bad-int": (["inspect", "x", "--warmup-steps", "two"], "invalid int value: 'two'"),
}


def test_usage_errors_exit_2_with_one_line() -> None:
    results = run_cli_all([args for args, _ in USAGE.values()])
    for (case, (_, says)), result in zip(USAGE.items(), results):
        assert result.rc == 2, case
        assert result.stdout == "", case
        line = one_stderr_line(result.stderr)
        assert says in line, (case, line)


def test_check_without_budgets_anywhere_exits_2(tmp_path: Path) -> None:
    rc, _, err = run_cli(["check", PTA21_L1], cwd=tmp_path)
    assert rc == 2
    assert "no budgets declared" in one_stderr_line(err)


def test_version_and_help_exit_0() -> None:
    version, help_ = run_cli_all([["--version"], ["--help"]])
    from memgate.readers.compiled import reader_name

    assert (version.rc, version.stdout.strip()) == (0, f"memgate {cli.__version__} (snapshot reader: {reader_name()})")
    assert help_.rc == 0 and "inspect" in help_.stdout and "validate" in help_.stdout


def test_internal_errors_are_one_line_without_traceback(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A bug in memgate is exit 3 with one line; MEMGATE_DEBUG=1 shows the traceback."""

    def boom(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr("memgate.session.run_profiles", boom)
    monkeypatch.delenv("MEMGATE_DEBUG", raising=False)
    assert cli.main(["inspect", str(PTA21_L1)]) == cli.EXIT_INTERNAL
    line = capsys.readouterr().err.strip()
    assert line == "memgate: internal error: ZeroDivisionError: division by zero (set MEMGATE_DEBUG=1 for a traceback)"
    monkeypatch.setenv("MEMGATE_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        cli.main(["inspect", str(PTA21_L1)])


_SMALL_SNAPSHOT = REPO / "tests" / "data" / "samples" / "torch" / "snapshot_modern_small_cs336.pickle"


def test_the_command_leaves_a_snapshots_objects_to_its_exit_and_still_says_everything(tmp_path: Path) -> None:
    """memgate.fastexit: the command ends without freeing the unpickled snapshot one object at a
    time (os._exit), after flushing its output, with the exit code main() returned."""
    env = {k: v for k, v in os.environ.items() if k != "MEMGATE_DEBUG"}
    probe = ("import sys\nfrom memgate import cli, fastexit\n"
             "real = fastexit.exit\n"
             "def spy(code):\n    print('kept', len(fastexit._kept), file=sys.stderr)\n    real(code)\n"
             "fastexit.exit = spy\nsys.argv = ['memgate', *sys.argv[1:]]\ncli.entry()\n")
    done = subprocess.run([sys.executable, "-c", probe, "inspect", "--json", str(_SMALL_SNAPSHOT)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert (done.returncode, done.stderr) == (0, "kept 1\n")
    assert json.loads(done.stdout)["profiles"][0]["format"] == "torch_snapshot"  # all of it, flushed
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "tiny"\npeak_allocated = "1KB"\n')
    failed = subprocess.run([sys.executable, "-m", "memgate", "check", str(_SMALL_SNAPSHOT), "--budgets", str(budgets)],
                            capture_output=True, text=True, env=env, timeout=120, check=False)
    assert failed.returncode == 1 and "tiny" in failed.stdout  # a failed gate's exit code, after its table


def test_keeping_is_off_unless_the_command_turns_it_on_and_stays_within_its_budget() -> None:
    code = ("import gc\nfrom memgate import fastexit\n"
            "off = fastexit.keep([1], 1)\n"
            "fastexit.as_command(100)\n"
            "print(off, fastexit.keep([2], 60), fastexit.keep([3], 60), fastexit.keep([4], 40), gc.get_freeze_count() > 0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.split() == ["False", "True", "False", "True", "True"]


def test_every_bad_profile_of_a_folder_is_named_not_only_the_first(tmp_path: Path) -> None:
    """Of 64 ranks, the third bad one is named too: each unreadable profile gets its one line on stderr (the
    JSON report's errors list them all), the good one is reported, and the exit code is 2."""
    for name in ("a.pt.trace.json", "b.pt.trace.json"):
        (tmp_path / name).write_text('{"traceEvents": []}')
    (tmp_path / "c.pickle").write_bytes(_SMALL_SNAPSHOT.read_bytes())
    for command in (["inspect"], ["validate"], ["inspect", "--json"]):
        result = run_cli([*command, tmp_path])
        assert result.rc == 2, result.stderr
        lines = result.stderr.splitlines()
        assert [line.split(":")[0] for line in lines] == ["memgate"] * 2, lines
        assert [str(tmp_path / n) in line for n, line in zip(("a.pt.trace.json", "b.pt.trace.json"), lines)] == [True] * 2
        assert "c.pickle" in result.stdout


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="counts threads in /proc (Linux)")
def test_the_command_keeps_numpys_blas_to_one_thread_unless_the_user_set_it() -> None:
    """OpenBLAS starts a spinning thread per core when numpy is imported; memgate multiplies no matrices.
    The command's process (and its --jobs workers, which inherit its environment) runs one thread; a
    value the user set stands."""
    probe = ("import os, re\nfrom memgate.cli import as_command\nas_command()\nimport numpy\n"
             "print(os.environ['OPENBLAS_NUM_THREADS'], re.search(r'Threads:\\s+(\\d+)', "
             "open('/proc/self/status').read()).group(1))\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60,
                          check=True)
    assert done.stdout.split() == ["1", "1"]
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True,
                          env={**env, "OPENBLAS_NUM_THREADS": "2"})
    assert done.stdout.split()[0] == "2"


@pytest.mark.parametrize("profile", [PTA21_L1, _SMALL_SNAPSHOT], ids=["csv", "snapshot-kept-until-exit"])
def test_broken_pipe_is_not_an_error(profile: Path) -> None:
    """`memgate inspect --json | head -c0`: the reader is gone before memgate writes; no error, no
    traceback (a snapshot's objects are also left to the exit: memgate.fastexit flushes first)."""
    read_end, write_end = os.pipe()
    env = {k: v for k, v in os.environ.items() if k != "MEMGATE_DEBUG"}
    proc = subprocess.Popen([sys.executable, "-m", "memgate", "inspect", str(profile), "--json"],
                            stdout=write_end, stderr=subprocess.PIPE, env=env)
    os.close(write_end)
    os.close(read_end)  # long before the child has imported its libraries and written a byte
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err.decode()) == (141, "")


# ---- check: several profiles, every error, budgets for other devices ---------------------------


def table_rows(lines: list[str]) -> list[dict[str, str]]:
    """The summary table's rows as {column: cell}, cut where the header's columns start."""
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    return [{name: line[a:b].strip() for name, a, b in zip(names, starts, [*starts[1:], None])} for line in lines[2:]]


def test_check_lists_every_profile_and_explains_every_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two profiles of rank 0, a step_growth budget neither can measure, a budget for CUDA devices
    only (allowed to select nothing), and one profile that cannot be read: each gets its own line."""
    root = tmp_path / "prof"
    copy_sample(PTA21_L1, root / "train_ascend_pt")
    copy_sample(PTA271, root / "eval_ascend_pt")
    broken = copy_sample(PTA21_L1, root / "broken_ascend_pt")
    (broken / "memory_record.csv").write_bytes(b"")
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "b"\npeak_allocated = "2 GiB"\nstep_growth = "1 MiB"\n\n'
                          '[[budgets]]\nname = "gpu"\ndevices = "cuda:*"\npeak_allocated = "1 GiB"\n')
    rc, out, err = in_process(["check", root, "--budgets", budgets, "--allow-unselected"], capsys)
    assert rc == 2
    lines = out.splitlines()
    assert lines[0].split() == ["rank", "budget", "metric", "measured", "limit", "result", "profile"]
    rows = table_rows(lines[:8])
    # ordered by profile, then budget, then metric in the order of the budget keys
    assert [(r["profile"], r["budget"], r["metric"], r["result"]) for r in rows] == [
        ("eval_ascend_pt", "b", "peak_allocated", "FAIL"), ("eval_ascend_pt", "b", "step_growth", "error"),
        ("eval_ascend_pt", "gpu", "peak_allocated", "not selected"),
        ("train_ascend_pt", "b", "peak_allocated", "pass"), ("train_ascend_pt", "b", "step_growth", "error"),
        ("train_ascend_pt", "gpu", "peak_allocated", "not selected")]
    explained = [line for line in lines if line.startswith(("FAILED ", "ERROR ", "SKIPPED "))]
    assert [line.split(": ")[0] for line in explained] == [
        "FAILED eval_ascend_pt::b::peak_allocated", "ERROR eval_ascend_pt::b::step_growth",
        "SKIPPED eval_ascend_pt::gpu::peak_allocated", "ERROR train_ascend_pt::b::step_growth",
        "SKIPPED train_ascend_pt::gpu::peak_allocated", f"ERROR {broken}"]
    assert "step_growth is not measurable" in explained[1] and "needs at least 5 counted steps" in explained[1]
    assert explained[2].endswith("not selected: budget 'gpu' selects devices='cuda:*', the profile has npu:0")
    assert str(broken / "memory_record.csv") in explained[5]
    line = one_stderr_line(err)  # the first error, and how many more the table lists
    assert "step_growth is not measurable" in line and line.endswith("(and 2 more error(s), each listed above)")


def test_check_budget_for_devices_the_run_lacks_is_an_error_naming_them(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A budget for CUDA on a run of NPU profiles only (a relabelled device) passed as a skip with exit 0."""
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "gpu"\ndevices = "cuda:*"\npeak_allocated = "1 GiB"\n'
                          'peak_reserved = "1 GiB"\n')
    root = tmp_path / "prof"
    copy_sample(PTA21_L1, root / "a_ascend_pt")
    copy_sample(PTA271, root / "b_ascend_pt")
    rc, out, err = in_process(["check", root, "--budgets", budgets, "--json", tmp_path / "r.json"], capsys)
    assert rc == 2
    why = "budget 'gpu': devices 'cuda:*' selects no device of the run (it has npu:0)"
    assert one_stderr_line(err).startswith(f"memgate: error: {why}; expected ranks and devices that select a device "
                                           "of the run, or --memgate-allow-unselected where they are optional")
    # one error row per check of the budget, for the run (no per-profile skip beside it)
    assert [(r["budget"], r["metric"], r["result"], r["profile"]) for r in table_rows(out.splitlines()[:4])] == [
        ("gpu", "peak_allocated", "error", "prof"), ("gpu", "peak_reserved", "error", "prof")]
    assert f"ERROR prof::gpu::peak_allocated: {why}" in out
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    assert [(o["budget"], o["passed"], "skipped" in o, o["error"].startswith(why)) for o in report["budgets"]] == [
        ("gpu", None, False, True), ("gpu", None, False, True)]


def test_check_budget_for_a_rank_the_run_lacks_is_an_error_naming_its_ranks(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A renamed rank: the budget's ranks select no profile, so no check was judged at all."""
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "r3"\nranks = "3"\npeak_allocated = "1 GiB"\n')
    rc, _, err = in_process(["check", PTA21_L1, "--budgets", budgets], capsys)
    assert rc == 2
    assert one_stderr_line(err).startswith("memgate: error: budget 'r3': ranks '3' selects no rank of the run (it has 0)")
    rc, _out, err = in_process(["check", PTA21_L1, "--budgets", budgets, "--allow-unselected"], capsys)
    assert (rc, err) == (0, "")  # as before: no check of it


def test_check_a_budget_for_some_profiles_of_the_run_skips_the_others(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A cuda budget in a run of a CUDA snapshot and a CPU trace: the CPU profile skips it, as before."""
    root = tmp_path / "prof"
    for folder in ("gpu", "cpu"):  # apart: a snapshot beside a trace is one recording
        (root / folder).mkdir(parents=True)
    (root / "gpu" / "snapshot.pickle").write_bytes((CUDA / "h200_snapshot_leak" / "snapshot.pickle").read_bytes())
    (root / "cpu" / "cpu.json").write_bytes((TORCH / "cpu_train_profile_memory.json").read_bytes())
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "gpu"\ndevices = "cuda:*"\npeak_allocated = "1 GiB"\n')
    rc, out, err = in_process(["check", root, "--budgets", budgets], capsys)
    assert (rc, err) == (0, "")
    assert sorted((r["profile"], r["result"]) for r in table_rows(out.splitlines()[:4])) == [
        ("cpu.json", "not selected"), ("snapshot.pickle", "pass")]


@pytest.mark.parametrize("flag", ["--allow-unselected", "--memgate-allow-unselected"])
def test_check_budget_for_other_devices_only_is_a_skip_where_allowed(tmp_path: Path, flag: str,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "gpu"\ndevices = "cuda:*"\npeak_allocated = "1 GiB"\n')
    rc, out, err = in_process(["check", PTA21_L1, "--budgets", budgets, "--json", tmp_path / "r.json", flag], capsys)
    assert (rc, err) == (0, "")
    assert table_rows(out.splitlines()[:3])[0]["result"] == "not selected"
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    (outcome,) = report["budgets"]
    assert outcome["passed"] is None and "error" not in outcome and outcome["skipped"].startswith(
        f"{PTA21_L1}: not selected: budget 'gpu'")


def test_check_json_dash_is_stdout_and_the_table_goes_to_stderr(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    budgets = budget_file(tmp_path, '[[budgets]]\nname = "b"\npeak_allocated = "1 GiB"\n')
    rc, out, err = in_process(["check", PTA21_L1, "--budgets", budgets, "--json", "-"], capsys)
    assert rc == 1
    report = json.loads(out)
    jsonschema.Draft202012Validator(report_schema()).validate(report)
    assert [o["passed"] for o in report["budgets"]] == [False]
    assert err.splitlines()[0].split()[0] == "rank" and f"FAILED {PTA21_L1.name}::b::peak_allocated: " in err
    assert not (Path.cwd() / "-").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["memgate.toml"]


def test_every_argument_has_help() -> None:
    import argparse

    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {action.dest}" for name, parser in sub.choices.items() for action in parser._actions
               if not isinstance(action, argparse._HelpAction) and not action.help]
    assert missing == []
    assert "a profile (a *_ascend_pt folder" in sub.choices["check"].format_help()

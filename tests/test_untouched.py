"""memgate never writes into a profile tree (docs/design.md "Bad input": never a write into the profile dir).

A tree holding every real sample and a writer-made profile of every format is hashed -- content,
mode and mtime of every file, mtime of every folder (a temp file created and removed again still
moves it), symlink targets -- before and after every CLI command (inspect, inspect --json, check
passing / failing, validate, diff, suggest) and every pytest mode (passing, failing, erroring,
--memgate-json, --memgate-save-baseline); it must be byte-identical, with no new file (no sqlite
-journal / -wal / -shm next to a db). Reports and baselines land where they were asked to.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from corpus import (
    cann_prof,
    kineto_file,
    mm_csv,
    mm_db,
    ms_profile,
    msprof_db,
    npu_profile,
    snapshot_file,
    timeline_file,
    torch_db,
)
from helpers import SAMPLES, in_process, run_cli

PASS = '[[budgets]]\nname = "roomy"\npeak_allocated = "1 TiB"\n'
FAIL = '[[budgets]]\nname = "tight"\npeak_allocated = 1\n'
Snapshot = dict[str, tuple[object, ...]]


def tree_state(root: Path) -> Snapshot:
    """Every entry under ``root``: kind, mode, mtime (ns) and content hash / link target."""
    state: Snapshot = {}
    for current, dirs, files in os.walk(root, followlinks=False):
        for name in [".", *dirs, *files]:
            path = Path(current) / name
            st = path.lstat()
            key = str(path.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                state[key] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                state[key] = ("dir", st.st_mode, st.st_mtime_ns)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                state[key] = ("file", st.st_mode, st.st_mtime_ns, st.st_size, digest)
    return state


def assert_untouched(root: Path, before: Snapshot, what: str) -> None:
    after = tree_state(root)
    new = sorted(set(after) - set(before))
    gone = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    assert not (new or gone or changed), f"{what}: new {new}, removed {gone}, changed {changed}"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """All samples (read-only, as checked out) and one writer-made profile per format."""
    root = tmp_path_factory.mktemp("profiles")
    shutil.copytree(SAMPLES, root / "samples", copy_function=shutil.copy2)
    made = root / "written"
    for name, make in (("npu", npu_profile), ("db", torch_db), ("msprof", msprof_db), ("ms", ms_profile),
                       ("cann", cann_prof), ("snap", snapshot_file), ("kineto", kineto_file),
                       ("timeline", timeline_file), ("memscope_csv", mm_csv), ("memscope_db", mm_db)):
        make(made / name)
    (made / "gz").mkdir()
    kineto_file(made / "gz", gz=True)
    pending_wal_db(tmp_path_factory.mktemp("wal_writer"), made / "wal")
    raw_timeline_file(made / "timeline_raw")
    (made / "link_to_npu").symlink_to("npu")  # a link inside the tree is followed, never rewritten
    for path in [root, *root.rglob("*")]:  # read-only, like a downloaded CI artifact
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o222)
    yield root
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)


def raw_timeline_file(dest: Path) -> Path:
    """``prof.export_memory_timeline("*.raw.json.gz")``: [t_ns, action, bytes, category] rows."""
    dest.mkdir(parents=True)
    path = dest / "run_memory_timeline.raw.json.gz"
    rows = [[-1, 1, 4096, 1], [1_000, 2, 2048, 2], [2_000, 4, -2048, 2]]  # preexisting, create, destroy
    path.write_bytes(gzip.compress(json.dumps(rows).encode()))
    return path


WAL_PEAK = 123_456_789_012  # every MEMORY_RECORD total, as committed to the -wal only


def pending_wal_db(work: Path, dest: Path) -> Path:
    """A torch_npu db whose last transaction sits in a -wal never checkpointed (an artifact copied while
    its writer still had it open): the db and the -wal, no -shm, copied into ``dest``."""
    src = torch_db(work)
    writer = sqlite3.connect(src)
    try:
        writer.execute("PRAGMA journal_mode = WAL")
        writer.execute("PRAGMA wal_autocheckpoint = 0")
        writer.execute(f"UPDATE MEMORY_RECORD SET totalAllocated = {WAL_PEAK}, totalReserved = {WAL_PEAK}")
        writer.commit()
        dest.mkdir(parents=True)
        for suffix in ("", "-wal"):
            shutil.copyfile(str(src) + suffix, str(dest / src.name) + suffix)
    finally:
        writer.close()
    return dest / src.name


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree with one good and one truncated profile (the erroring modes)."""
    root = tmp_path_factory.mktemp("broken")
    npu_profile(root / "good")
    bad = next(npu_profile(root / "bad").rglob("operator_memory.csv"))
    bad.write_bytes(bad.read_bytes()[:-7])
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    (tmp_path / "memgate.toml").write_text(PASS)
    (tmp_path / "tight.toml").write_text(FAIL)
    return tmp_path


def test_tree_covers_every_format(tree: Path) -> None:
    from memgate.discover import discover
    from memgate.loaders.registry import FORMATS, import_loaders

    import_loaders()
    found = discover(tree)
    assert {f.format.name for f in found} == {f.name for f in FORMATS}
    assert tree_state(tree) == tree_state(tree)  # the hash itself is stable


CLI_COMMANDS = {
    "inspect": ["inspect", "{tree}"],
    "inspect-json": ["inspect", "--json", "{tree}"],
    # check: the writer-made profiles (every one measures peak_allocated; some samples only APP memory)
    "check-passing": ["check", "{tree}/written", "--budgets", "{out}/memgate.toml", "--json", "{out}/check.json"],
    "check-failing": ["check", "{tree}/written", "--budgets", "{out}/tight.toml"],
    "validate": ["validate", "{tree}"],
    "validate-jobs": ["validate", "--jobs", "2", "{tree}"],
    "diff": ["diff", "{tree}/samples/ascend", "{tree}/written/npu"],
    "suggest": ["suggest", "{tree}/samples/torch"],
}
EXPECTED_RC = {"check-failing": 1}


@pytest.mark.parametrize("name", list(CLI_COMMANDS))
def test_cli_command_leaves_the_tree_untouched(name: str, tree: Path, outside: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.format(tree=tree, out=outside) for a in CLI_COMMANDS[name]]
    before = tree_state(tree)
    result = in_process(args, capsys)
    assert result.rc == EXPECTED_RC.get(name, 0), result.stderr
    assert_untouched(tree, before, " ".join(args))
    if name == "check-passing":
        assert json.loads((outside / "check.json").read_text())["budgets"]  # the report went where asked
    if name == "inspect-json":
        assert {p["format"] for p in json.loads(result.stdout)["profiles"]} >= {"torch_npu", "kineto", "cann"}


def test_cli_in_a_subprocess_leaves_the_tree_untouched(tree: Path, outside: Path) -> None:
    before = tree_state(tree)
    result = run_cli(["check", tree / "written", "--budgets", outside / "memgate.toml"], cwd=outside)
    assert result.rc == 0, result.stderr
    assert_untouched(tree, before, "python -m memgate check")
    assert sorted(p.name for p in outside.iterdir()) == ["memgate.toml", "tight.toml"]  # nothing else written


def test_erroring_cli_leaves_the_tree_untouched(broken: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = tree_state(broken)
    for args in (["validate", broken], ["inspect", "--json", broken]):
        assert in_process(args, capsys).rc == 2
        assert_untouched(broken, before, f"{args[0]} on a broken tree")


PYTEST_MODES = {
    "passing": (["--memgate-budgets=memgate.toml"], {"passed": 1}),
    "failing": (["--memgate-budgets=tight.toml"], {"failed": 1}),
    "json-report": (["--memgate-budgets=memgate.toml", "--memgate-json=out/report.json"], {"passed": 1}),
    "save-baseline": (["--memgate-budgets=memgate.toml", "--memgate-save-baseline=out/baseline.json"],
                      {"passed": 1}),
}


@pytest.mark.parametrize("mode", list(PYTEST_MODES))
def test_pytest_mode_leaves_the_tree_untouched(mode: str, tree: Path, pytester: pytest.Pytester) -> None:
    args, outcomes = PYTEST_MODES[mode]
    pytester.makefile(".toml", memgate=PASS, tight=FAIL)
    (pytester.path / "out").mkdir()
    target = tree / "written" / "npu"  # one profile: one item per budget metric
    before = tree_state(tree)
    result = pytester.runpytest(f"--memgate={target}", *args, "-p", "no:cacheprovider")
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(**outcomes)
    assert_untouched(tree, before, f"pytest {mode}")
    written = sorted(p.name for p in (pytester.path / "out").iterdir())
    assert written == {"json-report": ["report.json"], "save-baseline": ["baseline.json"]}.get(mode, [])
    for name in written:
        assert json.loads((pytester.path / "out" / name).read_text())


def test_pytest_over_every_format(tree: Path, pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", memgate=PASS)
    before = tree_state(tree)
    result = pytester.runpytest(f"--memgate={tree / 'written'}", "--memgate-budgets=memgate.toml",
                                f"--memgate-json={pytester.path / 'all.json'}", "-p", "no:cacheprovider")
    assert "INTERNALERROR" not in result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 10 and not outcomes.get("errors")
    assert_untouched(tree, before, "pytest --memgate over every format")
    assert (pytester.path / "all.json").is_file()


def test_pytest_erroring_leaves_the_tree_untouched(broken: Path, pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", memgate=PASS)
    before = tree_state(broken)
    result = pytester.runpytest(f"--memgate={broken}", "--memgate-budgets=memgate.toml",
                                f"--memgate-json={pytester.path / 'r.json'}", "-p", "no:cacheprovider")
    assert "INTERNALERROR" not in result.stdout.str()
    result.assert_outcomes(passed=1, errors=1)
    assert_untouched(broken, before, "pytest with an erroring profile")


def test_a_db_with_a_pending_wal_is_read_and_left_alone(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Reading a -wal needs SQLite's wal-index (-shm): memgate reads a private copy, never the tree's."""
    wal_dir = tree / "written" / "wal"
    assert sorted(p.name for p in wal_dir.iterdir()) == ["ascend_pytorch_profiler_0.db", "ascend_pytorch_profiler_0.db-wal"]
    before = tree_state(tree)
    for args in (["inspect", "--json", wal_dir], ["validate", wal_dir]):
        result = in_process(args, capsys)
        assert result.rc == 0, result.stderr
        if args[0] == "inspect":
            (profile,) = json.loads(result.stdout)["profiles"]
            assert [d["metrics"]["peak_allocated_bytes"] for d in profile["devices"]] == [WAL_PEAK]  # the -wal's rows
        assert_untouched(tree, before, " ".join(map(str, args)))

"""Every malformed input of the corpus (tests/corpus.py) is one clear memgate error, three ways.

(a) the loader API (discover + load) raises ``InputError`` -- never another exception type --
    naming the file, and the line / JSON path / db table where one exists;
(b) ``memgate validate PATH`` exits 2 with exactly one ``memgate: error:`` stderr line, no
    traceback (in-process through ``memgate.cli.main``; a few through ``python -m memgate``);
(c) a sample through ``pytest --memgate=PATH``: an error item naming the file, no INTERNALERROR.

Pickles that try to import or call code must not run it: each would create a side-effect file,
which must not exist after any of the three. Deep-JSON cases run in a memory-capped subprocess
(an unguarded parser takes gigabytes), and a last test shows peak RSS stays bounded on 200 MB
adversarial JSON.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import corpus
import pytest
from corpus import ACCEPTED, CASES, Accepted, Case, Expect, writable
from corpus_boundary import BOUNDARY
from corpus_json import JSON_CASES, raw_timeline_file
from helpers import in_process, one_stderr_line, run_cli_all
from writers.torch_npu import NpuOptions
from writers.torch_npu import write_profile as write_npu_profile

from memgate.discover import discover, load
from memgate.errors import InputError
from memgate.metrics import profile_metrics
from memgate.model import Profile
from memgate.readers import limits

BUDGETS = '[[budgets]]\nname = "gate"\npeak_allocated = "64 GiB"\n'
FORMATS = {c.format for c in CASES}


def _params(cases: list[Case]) -> list[Any]:
    marks = {c.id: [pytest.mark.xfail(strict=True, reason=c.defect)] if c.defect else [] for c in cases}
    return [pytest.param(c, marks=marks[c.id], id=c.id) for c in cases]


IN_PROCESS = [c for c in CASES if not c.isolate]


# ---- simulated unreadable files (root ignores chmod) ---------------------------------------------

def _deny(monkeypatch: pytest.MonkeyPatch, expect: Expect) -> None:
    if expect.deny is None:
        return
    target = os.fspath(expect.deny)
    real_open, real_access = builtins.open, os.access

    def fake_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, bytes, os.PathLike)) and os.fsdecode(file) == target:
            raise PermissionError(13, "Permission denied", target)
        return real_open(file, *args, **kwargs)

    def fake_access(path: Any, mode: int, *args: Any, **kwargs: Any) -> bool:
        if isinstance(path, (str, bytes, os.PathLike)) and os.fsdecode(path) == target and mode & os.R_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    monkeypatch.setattr(io, "open", fake_open)
    if expect.deny_access:
        monkeypatch.setattr(os, "access", fake_access)


@pytest.fixture
def broken(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Expect]:
    case: Case = request.param
    expect = case.make(tmp_path)
    _deny(monkeypatch, expect)
    yield expect
    monkeypatch.undo()
    if expect.side_effect is not None:
        assert not expect.side_effect.exists(), "code from the pickle ran"
    writable(tmp_path)


def load_all(root: Path) -> list[Profile]:
    return [load(found) for found in discover(root)]


def _check_error(err: BaseException, expect: Expect, *, locate: bool) -> None:
    assert isinstance(err, InputError), f"{type(err).__name__}: {err}"
    text = err.one_line()
    assert "\n" not in text
    assert err.file == str(expect.file), text
    assert text.startswith(err.location() + ":")
    for fragment in expect.says:
        assert fragment.lower() in text.lower(), f"{fragment!r} not in {text!r}"
    if locate:
        if expect.line is not None:
            assert err.line == expect.line, text
        if expect.column is not None:
            assert expect.column in (err.column or ""), text


# ---- (a) the loader API ----------------------------------------------------------------------------

def test_the_corpus_covers_every_format() -> None:
    from memgate.loaders.registry import FORMATS as REGISTERED
    from memgate.loaders.registry import import_loaders

    import_loaders()
    assert {f.name for f in REGISTERED} <= FORMATS
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("broken", _params([*IN_PROCESS, *BOUNDARY, *JSON_CASES]), indirect=True)
def test_loader_raises_input_error(broken: Expect) -> None:
    try:
        load_all(broken.root)
    except BaseException as exc:  # noqa: BLE001 - the point: nothing but InputError may escape
        _check_error(exc, broken, locate=True)
    else:
        pytest.fail(f"{broken.root} loaded without an error")


# ---- (b) the CLI -------------------------------------------------------------------------------------

@pytest.mark.parametrize("broken", _params(IN_PROCESS), indirect=True)
def test_cli_validate_exits_2_with_one_line(broken: Expect, capsys: pytest.CaptureFixture[str]) -> None:
    result = in_process(["validate", broken.root], capsys)
    assert result.rc == 2, result
    assert "Traceback" not in result.stdout + result.stderr
    line = one_stderr_line(result.stderr)
    assert str(broken.file) in line


SUBPROCESS_IDS = ("npu-csv-utf16", "db-cut-mid-page", "pickle-global-reduce-os-system")


def test_cli_subprocess(tmp_path: Path) -> None:
    """The real entry point (`python -m memgate validate`), for a few cases at once."""
    chosen = [c for c in CASES if c.id in SUBPROCESS_IDS]
    expects = [c.make(tmp_path / c.id) for c in chosen]
    results = run_cli_all([["validate", e.root] for e in expects])
    for expect, result in zip(expects, results):
        assert result.rc == 2, result
        assert str(expect.file) in one_stderr_line(result.stderr)
        if expect.side_effect is not None:
            assert not expect.side_effect.exists()


@pytest.mark.parametrize("case", [c for c in CASES if c.id in corpus.RUNS_CODE], ids=lambda c: c.id)
def test_the_hostile_pickles_do_run_code_under_plain_pickle(case: Case, tmp_path: Path) -> None:
    """The control: what memgate refuses really is an attack (plain pickle.loads creates the file)."""
    expect = case.make(tmp_path)
    assert expect.side_effect is not None and not expect.side_effect.exists()
    code = f"import pickle; pickle.loads(open({str(expect.file)!r}, 'rb').read())"
    subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, check=False)
    assert expect.side_effect.exists()


# ---- (a)+(b) in a memory-capped subprocess ------------------------------------------------------------

ISOLATED_RUN = textwrap.dedent("""
    import io, json, resource, sys
    # Cap the address space at what the interpreter holds now + 1 GiB: an unguarded parser
    # fails fast with MemoryError instead of taking the machine.
    with open("/proc/self/status") as fh:
        vm = next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmSize:"))
    from memgate import cli
    from memgate.discover import discover, load
    with open("/proc/self/status") as fh:
        vm = next(int(l.split()[1]) * 1024 for l in fh if l.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))
    out = {}
    try:
        [load(f) for f in discover(sys.argv[1])]
        out["error"] = None
    except BaseException as exc:
        out["error"] = {"type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
                        "file": getattr(exc, "file", None), "line": getattr(exc, "line", None),
                        "column": getattr(exc, "column", None), "text": str(exc)[:500]}
    err = io.StringIO()
    sys.stderr, real = err, sys.stderr
    try:
        out["rc"] = cli.main(["validate", sys.argv[1]])
    except BaseException as exc:
        out["rc"] = repr(exc)
    sys.stderr = real
    out["stderr"] = err.getvalue()
    print(json.dumps(out))
""")


@pytest.mark.parametrize("case", _params([c for c in CASES if c.isolate]))
def test_isolated_case(case: Case, tmp_path: Path) -> None:
    expect = case.make(tmp_path)
    done = subprocess.run([sys.executable, "-c", ISOLATED_RUN, str(expect.root)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-2000:]}"
    out = json.loads(done.stdout.splitlines()[-1])
    err = out["error"]
    assert err is not None, "loaded without an error"
    assert "InputError" in err["mro"], err
    assert err["file"] == str(expect.file), err
    if expect.column is not None:
        assert expect.column in (err["column"] or ""), err
    for fragment in expect.says:
        assert fragment.lower() in err["text"].lower(), err
    assert out["rc"] == 2, out
    assert str(expect.file) in one_stderr_line(out["stderr"])


# ---- (c) pytest ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("broken", _params([c for c in CASES if c.pytest_sample]), indirect=True)
def test_pytest_shows_an_error_item(broken: Expect, pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", gate_budgets=BUDGETS)
    result = pytester.runpytest(f"--memgate={broken.root}", "--memgate-budgets=gate_budgets.toml", "-p",
                                "no:cacheprovider")
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output
    assert "Traceback" not in output
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*memgate: error: {broken.file}*"])


# ---- accepted: a UTF-8 BOM, rows out of order ---------------------------------------------------------------

def _values(profiles: list[Profile]) -> list[Any]:
    return [(p.format, p.rank, [(m.device, m.values) for m in profile_metrics(p)]) for p in profiles]


@pytest.mark.parametrize("accepted", ACCEPTED, ids=[a.id for a in ACCEPTED])
def test_accepted_variants_load_like_the_original(accepted: Accepted, tmp_path: Path) -> None:
    damaged, original = accepted.make(tmp_path)
    assert _values(load_all(damaged)) == _values(load_all(original))


# ---- peak RSS on adversarial JSON -------------------------------------------------------------------------

RSS_RUN = textwrap.dedent("""
    import resource, sys
    from pathlib import Path
    from memgate.discover import discover, load
    from memgate.errors import InputError
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        [load(f) for f in discover(Path(sys.argv[1]))]
        kind = "loaded"
    except InputError as exc:
        kind = "InputError: " + str(exc)[:200]
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((after - before) * 1024, kind)
""")
RSS_MB = 200


def _write_huge_string(root: Path) -> Path:
    path = root / "run_ascend_pt" / "trace_view.json"
    path.parent.mkdir()
    with open(path, "wb") as fh:
        fh.write(b'[{"ph": "X", "name": "')
        fh.writelines(b"x" * (1 << 20) for _ in range(RSS_MB))
        fh.write(b'"}]')
    return path


def _write_deep(root: Path) -> Path:
    path = root / "run_ascend_pt" / "trace_view.json"
    path.parent.mkdir()
    half = RSS_MB << 19
    with open(path, "wb") as fh:
        fh.write(b"[" * half)
        fh.write(b"]" * half)
    return path


def _write_list_bomb(root: Path) -> Path:
    path = root / "snapshot.pickle"  # 8 MB of EMPTY_LIST inside a snapshot-looking dict, never finished
    path.write_bytes(b"\x80\x02}X\x08\x00\x00\x00segments" + b"]" * (8 << 20))
    return path


def _write_memo_bomb(root: Path) -> Path:
    path = root / "snapshot.pickle"  # a snapshot's first key, stored by LONG_BINPUT at memo slot 2^31 - 1
    path.write_bytes(b"\x80\x02}X\x08\x00\x00\x00segmentsr" + struct.pack("<I", 2**31 - 1))  # a 32 GiB memo
    return path


@pytest.mark.parametrize("make", [
    pytest.param(_write_huge_string, id="json-one-huge-string"),
    pytest.param(_write_memo_bomb, id="pickle-memo-bomb"),  # refused by the address-space cap (256 MiB)
    pytest.param(_write_deep, id="json-deep-nesting"),
    pytest.param(_write_list_bomb, id="pickle-list-bomb"),  # 8M one-byte lists: refused at ~1M (memgate.readers.limits)
])
def test_peak_rss_stays_bounded(make: Callable[[Path], Path], tmp_path: Path) -> None:
    path = make(tmp_path)
    done = subprocess.run([sys.executable, "-c", RSS_RUN, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    extra, kind = done.stdout.strip().split(" ", 1)
    assert kind.startswith("InputError"), kind
    assert str(path) in kind
    assert int(extra) < 300 << 20, f"{int(extra) >> 20} MiB extra"


# ---- size and row caps (memgate.readers.limits) through every loader; the caps themselves: tests/test_limits.py -----

# The torch_npu / CANN / MindSpore / msMemScope CSVs go through csvtable.read_csv, trace_view.json
# through jsonstream, the dbs through sqlitetable.open_db. The cap is set 1 byte below the largest
# file of the profile, so that file (and no other) trips it.
CAPPED: dict[str, Callable[[Path], Path]] = {
    "torch_npu-csv": lambda tmp: write_npu_profile(corpus.small_trace(), tmp, NpuOptions(step_source="trace_view")),
    "trace_view": lambda tmp: corpus.sample_dir(corpus.PTA21_L0, tmp),
    "ascend_db": corpus.torch_db,
    "msmemscope-csv": corpus.mm_csv,
    "msmemscope-db": corpus.mm_db,
    "mindspore": corpus.ms_profile,
    "cann": corpus.cann_prof,
    "snapshot": corpus.snapshot_file,
    "kineto": corpus.kineto_file,
}
UNCAPPED: dict[str, Callable[[Path], Path]] = {}  # every loader calls memgate.readers.limits now
NO_LIMITS = "memgate/loaders/{} does not call memgate.readers.limits (file size before reading, events after)"


def _capped_params() -> list[Any]:
    return [*CAPPED, *(pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=NO_LIMITS.format(k + ".py")))
                       for k in UNCAPPED)]


def _target(name: str, tmp: Path) -> tuple[Path, Path]:
    root = {**CAPPED, **UNCAPPED}[name](tmp)
    files = [p for p in [root, *root.rglob("*")] if p.is_file()]
    return root, max(files, key=lambda p: p.stat().st_size)


@pytest.mark.parametrize("name", _capped_params())
def test_file_size_cap(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                       capsys: pytest.CaptureFixture[str]) -> None:
    root, path = _target(name, tmp_path)
    size = path.stat().st_size
    monkeypatch.setenv(limits.FILE_BYTES_ENV, str(size - 1))
    with pytest.raises(InputError) as info:
        load_all(root)
    err = info.value
    assert err.file == str(path)
    assert f"{size} bytes" in (err.found or "")
    assert f"at most {size - 1} bytes" in (err.expected or "")
    assert f"raise the limit with ${limits.FILE_BYTES_ENV}" in err.one_line()
    assert "--" not in err.one_line().split("raise the limit")[1]  # names no option that does not exist
    result = in_process(["validate", root], capsys)
    assert result.rc == 2 and str(path) in one_stderr_line(result.stderr)
    monkeypatch.setenv(limits.FILE_BYTES_ENV, str(size))  # exactly at the cap: fine
    assert load_all(root)


@pytest.mark.parametrize("name", _capped_params())
def test_row_cap(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, _ = _target(name, tmp_path)
    monkeypatch.setenv(limits.ROWS_ENV, "3")
    with pytest.raises(InputError) as info:
        load_all(root)
    err = info.value
    assert "over the limit of 3" in err.message
    assert limits.ROWS_ENV in (err.expected or "")
    assert err.file is not None and Path(err.file).exists()


@pytest.mark.parametrize("value", ["lots", "-5", "0", "12 parsecs"])
def test_a_bad_limit_is_a_usage_error(value: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    root = corpus.npu_profile(tmp_path)
    monkeypatch.setenv(limits.FILE_BYTES_ENV, value)
    result = in_process(["validate", root], capsys)
    assert result.rc == 2
    assert limits.FILE_BYTES_ENV in one_stderr_line(result.stderr)


# ==== issue 11: CSV / sqlite / cross-file boundary cases (tests/corpus_boundary.py) ===========================
# Kept apart from CASES (their own block); the loader API check above runs them too, then the CLI and one through pytest.


def test_the_boundary_cases_cover_their_classes() -> None:
    assert len({c.id for c in BOUNDARY}) == len(BOUNDARY) >= 15
    assert {c.format for c in BOUNDARY} == {"torch_npu", "ascend_db", "msmemscope", "mindspore", "cann"}
    assert not {c.id for c in BOUNDARY} & {c.id for c in CASES}


@pytest.mark.parametrize("broken", _params([*BOUNDARY, *JSON_CASES]), indirect=True)
def test_boundary_cli_validate_exits_2_with_one_line(broken: Expect, capsys: pytest.CaptureFixture[str]) -> None:
    result = in_process(["validate", broken.root], capsys)
    assert result.rc == 2, result
    assert "Traceback" not in result.stdout + result.stderr
    assert str(broken.file) in one_stderr_line(result.stderr)


@pytest.mark.parametrize("broken", _params([c for c in BOUNDARY if c.id == "db-view-over-an-endless-recursive-query"]
                                           + [c for c in JSON_CASES if c.pytest_sample]), indirect=True)
def test_boundary_pytest_shows_an_error_item(broken: Expect, pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", gate_budgets=BUDGETS)
    result = pytester.runpytest(f"--memgate={broken.root}", "--memgate-budgets=gate_budgets.toml", "-p",
                                "no:cacheprovider")
    output = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in output and "Traceback" not in output
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*memgate: error: {broken.file}*"])


# ==== issue 11: JSON boundary cases (tests/corpus_json.py) ====================================================
# Repeated keys, inflated bytes, Addr on some events only, the raw memory timeline, a value repr() cannot
# write: checked with the boundary cases above (loader API, CLI, a few through pytest), and here.

FORMATS.update(c.format for c in JSON_CASES)  # the raw memory timeline is a registered format: covered here


def test_the_json_boundary_cases_cover_their_classes() -> None:
    assert len({c.id for c in JSON_CASES}) == len(JSON_CASES) >= 15
    assert {c.format for c in JSON_CASES} == {"kineto", "torch_npu", "torch_memory_timeline_raw", "torch_snapshot"}
    assert not {c.id for c in JSON_CASES} & {c.id for c in CASES}


def test_the_raw_timeline_size_and_row_caps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = raw_timeline_file(tmp_path)
    size = path.stat().st_size
    monkeypatch.setenv(limits.FILE_BYTES_ENV, str(size - 1))
    with pytest.raises(InputError) as info:
        load_all(path)
    assert info.value.file == str(path) and f"{size} bytes" in (info.value.found or "")
    monkeypatch.setenv(limits.FILE_BYTES_ENV, str(size))
    assert load_all(path)
    monkeypatch.delenv(limits.FILE_BYTES_ENV)
    monkeypatch.setenv(limits.ROWS_ENV, "3")
    with pytest.raises(InputError, match="over the limit of 3"):
        load_all(path)

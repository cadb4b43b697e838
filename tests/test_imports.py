"""The CLI imports what a path needs and nothing else (issue: lean imports).

`memgate --help` imports none of numpy, pandas, pyarrow or jsonschema; `memgate inspect` of a
snapshot or a Kineto trace imports its own loader only (not the Ascend stack, not jsonschema, which
checks budget files). Discovery imports a loader only when a path passes the loader's name test
(memgate.loaders.registry.LOADERS, may_claim): that test must hold for every path the loader's formats claim, checked
here over the real samples and every input the corpus builds. (How memgate.lazy binds a module on
first use and keeps pandas from pyarrow: tests/test_lazy.py.)
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import corpus
import corpus_boundary
import corpus_json
import pytest
from helpers import SAMPLES

from memgate.loaders import registry

TORCH = SAMPLES / "torch"
HEAVY = ("numpy", "pandas", "pyarrow", "jsonschema", "ijson")
LOADERS = tuple(f"memgate.loaders.{entry.module}" for entry in registry.LOADERS)

_PROBE = """
import json, sys
from memgate.cli import as_command, main
as_command()  # what the memgate command's entry point sets up, without its os._exit
try:
    rc = main(sys.argv[1:])
except SystemExit as exc:
    rc = exc.code
print(json.dumps({"rc": rc, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


# What the interpreter holds before memgate is imported: site, .pth files or a sitecustomize of the
# environment may import anything (even numpy); only what memgate adds to that is memgate's doing.
_BEFORE = 'import json, sys\nprint(json.dumps({"rc": 0, "modules": sorted(sys.modules)}), file=sys.stderr)\n'


def _modules_after(code: str, *args: str | Path) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMGATE_")}
    done = subprocess.run([sys.executable, "-c", code, *map(str, args)], check=False, capture_output=True,
                          text=True, env=env, timeout=120)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["rc"] in (0, 1), done.stderr
    return set(report["modules"])


@functools.cache
def _at_start() -> frozenset[str]:
    return frozenset(_modules_after(_BEFORE))


def imported_by(*args: str | Path) -> set[str]:
    """The modules ``memgate ARGS`` adds to what a fresh interpreter holds (its exit code checked)."""
    return _modules_after(_PROBE, *args) - _at_start()


def top_level(modules: set[str]) -> set[str]:
    return {name.split(".")[0] for name in modules}


def test_help_imports_no_core_library() -> None:
    modules = imported_by("--help")
    assert not top_level(modules) & set(HEAVY)
    assert not {m for m in modules if m.startswith("memgate.")} - {"memgate.cli", "memgate.errors", "memgate.fastexit"}
    assert "typing" not in modules  # ~3 ms of a start-up that is ~15 ms over bare Python's
    assert "shutil" not in modules  # argparse's way to the terminal width: with zlib, bz2 and lzma, ~2 ms


@pytest.mark.parametrize("columns", [None, "0", "-3", "x", "", "50", "200"])
def test_help_is_as_wide_as_shutil_would_make_it(monkeypatch: pytest.MonkeyPatch, columns: str | None) -> None:
    import shutil

    from memgate import cli

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert cli._terminal_columns() == shutil.get_terminal_size().columns


@pytest.mark.parametrize(("sample", "loader", "also_not"), [
    (TORCH / "snapshot_modern_small_cs336.pickle", "memgate.loaders.snapshot.snapshot",
     ("pandas", "memgate.readers.csvtable", "multiprocessing")),
    (TORCH / "cpu_train_profile_memory.json", "memgate.loaders.kineto.kineto", ("memgate.readers.csvtable",)),
], ids=["snapshot", "kineto"])
def test_inspect_imports_its_loader_only(sample: Path, loader: str, also_not: tuple[str, ...]) -> None:
    modules = imported_by("inspect", "--json", sample)
    assert loader in modules
    assert {m for m in LOADERS if m in modules} == {loader}
    # a budget file is what jsonschema checks; the Ascend readers and the outputs stay out
    for name in ("jsonschema", "memgate.readers.sqlitetable", "memgate.loaders.ascend.trace_view", "memgate.compare",
                 "memgate.html_report", "memgate.plot", "memgate.cache", *also_not):
        assert name not in modules, name


def test_a_folder_of_snapshots_imports_no_ascend_loader(tmp_path: Path) -> None:
    for name in ("a.pickle", "b.pickle"):
        (tmp_path / name).write_bytes((TORCH / "snapshot_modern_small_cs336.pickle").read_bytes())
    modules = imported_by("inspect", tmp_path)
    assert {m for m in LOADERS if m in modules} == {"memgate.loaders.snapshot.snapshot"}


def _paths(root: Path) -> Iterator[Path]:
    yield root
    if root.is_dir() and not root.is_symlink():
        for current, dirs, files in os.walk(root):
            for name in dirs + files:
                yield Path(current) / name


def _corpus_inputs(tmp: Path) -> Iterator[Path]:
    for index, case in enumerate([*corpus.CASES, *corpus_boundary.BOUNDARY, *corpus_json.JSON_CASES]):
        where = tmp / f"c{index}"
        where.mkdir()
        yield case.make(where).root


def _recording(tmp: Path) -> Path:
    """A folder the recording loader claims: a Kineto trace and a snapshot side by side (what
    memgate.record writes), whatever samples/torch_cuda holds."""
    folder = tmp / "recording"
    folder.mkdir()
    shutil.copyfile(TORCH / "cpu_train_profile_memory.json", folder / "torch_trace.json")
    shutil.copyfile(TORCH / "snapshot_modern_small_cs336.pickle", folder / "cuda_snapshot.pickle")
    return folder


def test_every_claimed_path_passes_its_loaders_name_test(tmp_path: Path) -> None:
    registry.import_loaders()
    module_of = {fmt.name: fmt.load.__module__.removeprefix("memgate.loaders.") for fmt in registry.FORMATS}
    assert set(module_of.values()) == {entry.module for entry in registry.LOADERS}  # every format from a listed loader
    claimed: dict[str, int] = {}
    for root in [SAMPLES, _recording(tmp_path), *_corpus_inputs(tmp_path)]:
        for path in _paths(root):
            for fmt in registry.FORMATS:
                try:
                    claims = fmt.claims(path)
                except OSError:
                    continue
                if claims:
                    claimed[fmt.name] = claimed.get(fmt.name, 0) + 1
                    assert registry.may_claim(module_of[fmt.name], path), f"{fmt.name} claims {path}, its name test does not"
    assert set(claimed) == set(module_of), f"formats never seen claiming: {set(module_of) - set(claimed)}"


def _pytest_modules(tmp_path: Path, *plugins: str) -> set[str]:
    """The modules a fresh ``pytest`` of one plain test holds at its end, with only ``plugins`` loaded:
    other installed plugins (pytest-randomly imports numpy) are not memgate's, so none is autoloaded."""
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
    probe = ("import json, sys, pytest\n"
             "rc = pytest.main(['-q', '-p', 'no:cacheprovider', *sys.argv[2:], sys.argv[1]])\n"
             "print(json.dumps({'rc': int(rc), 'modules': sorted(sys.modules)}), file=sys.stderr)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMGATE_", "PYTEST_"))}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    args = [str(tmp_path / "test_plain.py")] + [a for name in plugins for a in ("-p", name)]
    done = subprocess.run([sys.executable, "-c", probe, *args], check=False,
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    report = json.loads(done.stderr.strip().splitlines()[-1])
    assert report["rc"] == 0, done.stdout
    return set(report["modules"])


def test_a_pytest_run_that_gates_nothing_imports_no_core_library(tmp_path: Path) -> None:
    """pytest loads the plugin on every run: a run without --memgate, markers or fixtures pays for
    none of the libraries a gate needs."""
    (entry,) = importlib.metadata.entry_points(group="pytest11", name="memgate")
    assert entry.value == "memgate.plugin"  # what pytest autoloads, loaded by name below
    without = _pytest_modules(tmp_path)
    modules = _pytest_modules(tmp_path, "memgate.plugin")
    assert "memgate.plugin" in modules and "memgate.plugin" not in without  # the plugin was loaded ...
    assert not top_level(modules - without) & set(HEAVY)  # ... and imported none of them


@pytest.mark.parametrize("sample", [
    TORCH / "snapshot_modern_small_cs336.pickle",
    TORCH / "cpu_train_profile_memory.json",
    SAMPLES / "torch_cuda" / "h200_trace_leak" / "train.1795846944832606968.pt.trace.json",
], ids=["snapshot", "kineto-cpu", "kineto-h200"])
def test_inspect_of_a_snapshot_or_a_kineto_trace_imports_no_pandas(sample: Path) -> None:
    """pandas is the engine of the tabular (Ascend) formats only: a snapshot or a Kineto trace is read
    with numpy and pyarrow (~0.15-0.2 s of start-up less; issue 30, declared = used)."""
    modules = top_level(imported_by("inspect", sample))
    assert "pandas" not in modules
    assert {"numpy", "pyarrow"} <= modules  # what these paths do use, all of it declared

"""Saved runs under ``.memgate/`` (``--memgate-autosave``) and finding one to compare with
(``--memgate-compare[=ID]``), as pytest-benchmark users know them from ``.benchmarks/``.

Layout (version 1; the folder name carries it)::

    .memgate/v1/<configuration>/<NNNN>_<commit>.json

- ``<configuration>`` names what must match for numbers to be comparable, and nothing about the
  machine: the profile format, device type, framework / CANN versions and world size
  (:func:`memgate.baselines.comparable_key`), as readable text plus a hash of the exact key, e.g.
  ``torch_npu-npu-torch_npu2.1.0-ws8-1a2b3c4d``. A run whose profiles differ in these writes one
  file per configuration, all with the run's number.
- ``<NNNN>`` numbers the runs from 0001 across configurations; ``<commit>`` is the git commit of
  the checkout (12 hex digits, ``-dirty`` with uncommitted changes to tracked files) or ``nogit``.
- Each file is a baseline (:func:`memgate.baselines.baseline_from_entries`) plus a ``memgate_run``
  record: ``{"layout": 1, "id", "commit", "dirty", "saved_at", "configuration"}``. Any file can be
  given to ``--memgate-baseline`` or ``memgate diff`` as is.

A profile is compared with the file of its own configuration: the latest run (the highest number),
run ``NNNN``, or the latest run of a commit (a hex prefix). ``memgate runs`` lists the saved runs
(:func:`run_summaries`); ``memgate diff A B`` takes two run IDs (:func:`run_files`) as well as files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memgate.baselines import (
    RUN_LAYOUT,
    baseline_entries,
    baseline_from_entries,
    comparable_key,
    for_platform,
    history_platforms,
    no_history,
)
from memgate.documents import load_baseline
from memgate.errors import ConfigError, MemgateError, remembered, show
from memgate.platforms import entry_platform
from memgate.report import write_json_atomic

LAYOUT = RUN_LAYOUT  # memgate_run.layout, checked on read (memgate.documents.load_baseline)
LAYOUT_DIR = f"v{LAYOUT}"
_RUN_FILE = re.compile(r"\A(?P<number>0*[0-9]{4,9})_(?P<commit>[0-9a-f]{4,40}|nogit)(?P<dirty>-dirty)?\.json\Z")
# A run number as written: ASCII digits, at most 9 past leading zeros. str.isdigit() would take '²'
# (int() raises) and '٣' (int() reads 3); the store travels as a CI cache and is read as untrusted.
_RUN_NUMBER = re.compile(r"0*[0-9]{1,9}")
MAX_RUN = 10**9 - 1
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._+]+")
# comparable_key names → the short prefix they get in a configuration name
_KEY_PREFIX = {"torch_version": "torch", "torch_npu_version": "torch_npu", "cann_version": "cann",
               "mindspore_version": "mindspore", "world_size": "ws"}


@dataclass(frozen=True)
class SavedRun:
    path: Path
    number: int
    commit: str | None


def run_number(text: str) -> int | None:
    """The run number ``text`` writes (``3``, ``0003``), else None."""
    return int(text) if _RUN_NUMBER.fullmatch(text) else None


def configuration_name(key: dict[str, Any]) -> str:
    """A folder name for a comparability key: readable, and exact through a hash of the key."""
    parts = [str(key.get("format") or "unknown"), str(key.get("device_type") or "nodevice")]
    parts += [f"{_KEY_PREFIX.get(name, name)}{value}" for name, value in sorted(key.items())
              if name not in ("format", "device_type") and value is not None]
    readable = "-".join(_SLUG_UNSAFE.sub("_", p).strip("_") or "_" for p in parts)[:96]
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]
    return f"{readable}-{digest}"


def git_commit(directory: Path) -> tuple[str | None, bool]:
    """(HEAD commit, whether tracked files have uncommitted changes), or (None, False) outside a git
    checkout or without git."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=directory, capture_output=True, text=True, timeout=30,
                                  check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "--verify", "HEAD")
    if not commit or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", commit):
        return None, False
    status = git("status", "--porcelain", "--untracked-files=no")
    return commit, bool(status)


def saved_runs(storage: Path, configuration: str | None = None) -> list[SavedRun]:
    """The saved runs of one configuration (every configuration: None), by number."""
    root = storage / LAYOUT_DIR
    runs = []
    try:
        folders = [root / configuration] if configuration is not None else (
            sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else [])
        for folder in folders:
            if not folder.is_dir():
                continue
            for path in folder.iterdir():
                match = _RUN_FILE.match(path.name)
                # whatever the entry is (a dangling link, a folder): a run's file, which reading it names
                if match is not None:
                    commit = None if match.group("commit") == "nogit" else match.group("commit")
                    runs.append(SavedRun(path, int(match.group("number")), commit))
    except OSError as exc:
        raise _store_error(exc, root) from None
    return sorted(runs, key=lambda r: (r.number, r.path.name))


def _store_error(exc: OSError, where: Path) -> ConfigError:
    return ConfigError(f"cannot use the saved runs' folder: {exc.strerror or exc}", file=exc.filename or where,
                       expected="a folder memgate can read and write (--memgate-storage / --storage)")


def storage_problem(storage: Path) -> ConfigError | None:
    """Why ``storage`` cannot hold saved runs, checked before a session uses it: a file where it or a
    folder of its layout belongs, a symbolic link loop or one to nothing, a folder that cannot be
    searched; None when it can (it need not exist yet)."""
    for inner in (storage / LAYOUT_DIR / ".ids", storage / LAYOUT_DIR):
        if os.path.lexists(inner):
            return _folder_problem(inner)
    path = storage
    while not os.path.lexists(path) and path.parent != path:  # the nearest that is there (a file on the way: it)
        path = path.parent
    return _folder_problem(path)


def _folder_problem(path: Path) -> ConfigError | None:
    expected = "a folder for saved runs (--memgate-storage / --storage DIR)"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return ConfigError("a symbolic link to nothing", file=path, expected=expected)
    except OSError as exc:  # ELOOP: a symbolic link loop; EACCES
        return ConfigError(f"cannot use the saved runs' folder: {exc.strerror or exc}", file=path, expected=expected)
    return None if stat.S_ISDIR(mode) else ConfigError("not a folder", file=path, expected=expected)


def check_storage(storage: Path) -> Path:
    """``storage``, or the ConfigError of :func:`storage_problem`."""
    problem = storage_problem(storage)
    if problem is not None:
        raise problem
    return storage


def _one_file_each(runs: list[SavedRun]) -> None:
    """A ConfigError naming both files where one run number is saved twice for one configuration (two
    stores merged, e.g. two CI caches): which one is the run cannot be told."""
    seen: dict[tuple[Path, int], SavedRun] = {}
    for run in runs:
        first = seen.setdefault((run.path.parent, run.number), run)
        if first is not run:
            raise ConfigError(f"run {run.number:04d} is saved twice for one configuration: {first.path.name} and "
                              f"{run.path.name} (two stores merged?)", file=run.path.parent,
                              expected="one file per run and configuration: remove or renumber one")


def check_run_id(run_id: str) -> str:
    """``""`` / ``latest``, a run number, or a commit prefix (4+ hex digits); else a ConfigError."""
    text = run_id.strip()
    if text in ("", "latest") or run_number(text) is not None or re.fullmatch(r"[0-9a-f]{4,40}", text):
        return text
    raise ConfigError(f"invalid --memgate-compare {show(run_id)}",
                      expected="nothing (the latest saved run), a run number (3 or 0003) or a git commit prefix; "
                               "a bare --memgate-compare takes the next argument as its ID: write --memgate-compare=ID")


def find_run(storage: Path, key: dict[str, Any], run_id: str = "", *,
             besides: Collection[Path] = (), accept: Callable[[SavedRun], bool] | None = None) -> SavedRun | None:
    """The saved run to compare a profile of comparability ``key`` with: the latest (``""``), run
    number ``run_id``, or the latest run at a commit starting with ``run_id``; never one of the files
    in ``besides`` (what this session saved: a run is not compared with itself). ``accept``: whether a
    run holds history of the profile's platform; the latest that does is taken."""
    runs = [r for r in saved_runs(storage, configuration_name(key)) if r.path not in besides]
    run_id = run_id.strip()
    number = run_number(run_id)
    if run_id in ("", "latest"):
        chosen = runs
    elif number is not None and any(r.number == number for r in runs):
        chosen = [r for r in runs if r.number == number]
    else:
        chosen = [r for r in runs if r.commit is not None and r.commit.startswith(run_id.lower())]
    if accept is not None:
        first = next((r for r in reversed(chosen) if accept(r)), None)  # read from the latest back, no further
        chosen = [first] if first is not None else []
    if not chosen:
        return None
    _one_file_each([r for r in runs if r.number == chosen[-1].number])
    return chosen[-1]


def missing_run(storage: Path, key: dict[str, Any], run_id: str = "") -> str:
    """Why :func:`find_run` found nothing, with the configurations that do have saved runs."""
    name = configuration_name(key)
    which = "no saved run" if run_id.strip() in ("", "latest") else f"no saved run {run_id.strip()!r}"
    others = sorted({r.path.parent.name for r in saved_runs(storage)} - {name})
    text = f"{which} for configuration {name} in {storage / LAYOUT_DIR} (save one with --memgate-autosave)"
    if others:
        text += f"; saved configurations: {', '.join(others[:3])}" + (" …" if len(others) > 3 else "")
    return text


def _claim_number(root: Path) -> int:
    """The next run number, claimed with an exclusive create so two sessions never share one."""
    ids = root / ".ids"
    ids.mkdir(parents=True, exist_ok=True)
    used = [r.number for r in saved_runs(root.parent)]
    used += [n for n in map(run_number, os.listdir(ids)) if n is not None]  # any other name is not ours
    number = max(used, default=0) + 1
    while True:
        if number > MAX_RUN:
            raise ConfigError(f"no run number left: the store claims run {number - 1}", file=ids,
                              expected=f"run numbers up to {MAX_RUN}: start a new storage folder")
        try:
            os.close(os.open(ids / f"{number:04d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return number
        except FileExistsError:
            number += 1


def save_run(storage: Path, entries: Iterable[dict[str, Any]], *, commit: str | None, dirty: bool,
             now: datetime | None = None) -> list[Path]:
    """Write this run's profile entries as run NNNN, one file per configuration; return the files."""
    groups: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    for entry in entries:
        key = comparable_key(entry)
        groups.setdefault(configuration_name(key), (key, []))[1].append(entry)
    if not groups:
        return []
    root = storage / LAYOUT_DIR
    try:
        return _save_run(root, groups, commit=commit, dirty=dirty, now=now)
    except OSError as exc:  # the store changed under the session (a file where a folder belongs)
        raise _store_error(exc, root) from None


def _save_run(root: Path, groups: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]], *, commit: str | None,
              dirty: bool, now: datetime | None) -> list[Path]:
    number = _claim_number(root)
    stamp = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    name = f"{number:04d}_{commit[:12] if commit else 'nogit'}{'-dirty' if dirty else ''}.json"
    written = []
    for configuration, (key, group) in sorted(groups.items()):
        document = baseline_from_entries(group, commit=commit, dirty=dirty)
        document["memgate_run"] = {"layout": LAYOUT, "id": number, "commit": commit, "dirty": dirty,
                                   "saved_at": stamp, "configuration": key}
        path = root / configuration / name
        write_json_atomic(path, document)
        written.append(path)
    return written


class BaselineFinder:
    """What a profile entry is compared with: ``--memgate-baseline=FILE``, else the saved run
    ``--memgate-compare[=ID]`` picks for the entry's configuration. Each file is read once (its error
    kept too, said again to every entry that needs it)."""

    def __init__(self, baseline_path: Path | None, compare_id: str | None, storage: Path,
                 platform_mode: str = "same", besides: Collection[Path] = ()) -> None:
        assert baseline_path is not None or compare_id is not None
        self.baseline_path = baseline_path
        self.compare_id = compare_id
        self.storage = storage
        self.platform_mode = platform_mode  # --memgate-compare-platform: same, or any
        self.besides = besides  # what this session saved: a run is not compared with itself
        self._read: dict[Path, dict[str, Any] | MemgateError] = {}

    def read(self, path: Path) -> dict[str, Any]:
        return remembered(self._read, path, lambda: load_baseline(path))

    def for_entry(self, entry: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """(the baseline to compare ``entry`` with, where it is) — (None, why) when there is none,
        for the missing-baseline policy. Only the history of the entry's platform is given
        (:func:`memgate.baselines.for_platform`); where it is, a note on the platforms is added."""
        platform = entry_platform(entry)
        if self.baseline_path is not None:
            if not self.baseline_path.exists():
                return None, f"baseline {self.baseline_path} does not exist"
            document = self.read(self.baseline_path)
            kept, note = for_platform(document, platform, self.platform_mode)
            if kept is None:
                return None, no_history(platform, str(self.baseline_path), history_platforms(document))
            return kept, _noted(str(self.baseline_path), note)
        assert self.compare_id is not None
        key = comparable_key(entry)

        def accept(run: SavedRun) -> bool:
            return for_platform(self.read(run.path), platform, self.platform_mode)[0] is not None

        run = find_run(self.storage, key, self.compare_id, besides=self.besides, accept=accept)
        if run is None:
            other = find_run(self.storage, key, self.compare_id, besides=self.besides)
            if other is None:
                return None, missing_run(self.storage, key, self.compare_id)
            return None, no_history(platform, f"the saved runs of configuration {configuration_name(key)}",
                                    history_platforms(self.read(other.path)))
        kept, note = for_platform(self.read(run.path), platform, self.platform_mode)
        assert kept is not None
        return kept, _noted(str(run.path), note)


def _noted(where: str, note: str) -> str:
    return f"{where} ({note})" if note else where


RUN_ID_HELP = "latest, previous, a run number (3 or 0003) or a git commit prefix (4+ hex digits)"


def default_storage(start: Path) -> Path:
    """Where the CLI finds saved runs: the nearest ``.memgate`` folder at or above ``start`` (pytest
    saves under its rootdir, which may be above the folder a command is run in), else ``start/.memgate``."""
    for folder in (start, *start.parents):
        if (folder / ".memgate" / LAYOUT_DIR).is_dir():
            return folder / ".memgate"
    return start / ".memgate"


def is_run_id(text: str) -> bool:
    """Whether ``text`` reads as a saved run's ID (:data:`RUN_ID_HELP`) rather than a path."""
    text = text.strip().lower()
    return text in ("latest", "previous") or run_number(text) is not None or \
        re.fullmatch(r"[0-9a-f]{4,40}", text) is not None


def run_files(storage: Path, run_id: str) -> list[SavedRun]:
    """Every file of one saved run (one per configuration): ``latest``, ``previous`` (the run before
    the latest), run number ``run_id``, or the latest run at a commit starting with ``run_id``. A
    ConfigError naming the runs there are when none matches."""
    runs = saved_runs(storage)
    numbers = sorted({r.number for r in runs})
    text = run_id.strip().lower()
    chosen: int | None = None
    if text == "latest" and numbers:
        chosen = numbers[-1]
    elif text == "previous" and len(numbers) > 1:
        chosen = numbers[-2]
    elif run_number(text) in numbers:
        chosen = run_number(text)
    elif text not in ("latest", "previous") and re.fullmatch(r"[0-9a-f]{4,40}", text):
        at_commit = [r.number for r in runs if r.commit is not None and r.commit.startswith(text)]
        chosen = max(at_commit, default=None)
    if chosen is None:
        have = (f"saved: {', '.join(f'{n:04d}' for n in numbers[-5:])}"
                + (f" and {len(numbers) - 5} earlier" if len(numbers) > 5 else "")) if numbers else \
            "none saved: pytest --memgate-autosave saves one"
        raise ConfigError(f"no saved run {show(run_id.strip())} in {storage / LAYOUT_DIR} ({have})",
                          expected=RUN_ID_HELP)
    files = [r for r in runs if r.number == chosen]
    _one_file_each(files)
    return files


def run_entries(storage: Path, run_id: str) -> list[dict[str, Any]]:
    """The profile entries of one saved run, every configuration's file read back and validated."""
    return [entry for run in run_files(storage, run_id) for entry in baseline_entries(load_baseline(run.path))]


@dataclass(frozen=True)
class RunSummary:
    """One saved run as ``memgate runs`` lists it."""
    number: int
    commit: str | None
    dirty: bool
    saved_at: str | None
    configurations: tuple[str, ...]
    profiles: tuple[str, ...]  # profile paths, marked tests by node id
    problems: tuple[str, ...]  # files of the run that could not be read (each one line)
    platforms: tuple[str, ...] = ()  # the platforms' labels (memgate.platforms), "unknown" for a run saved before


def run_summaries(storage: Path) -> list[RunSummary]:
    """Every saved run, oldest first; a file that cannot be read is named in ``problems``, not fatal."""
    by_number: dict[int, list[SavedRun]] = {}
    for run in saved_runs(storage):
        by_number.setdefault(run.number, []).append(run)
    summaries = []
    for number, files in sorted(by_number.items()):
        profiles: list[str] = []
        problems: list[str] = []
        try:
            _one_file_each(files)
        except ConfigError as exc:
            problems.append(exc.one_line())
        saved_at: str | None = None
        dirty = False
        platforms: list[str] = []
        for run in files:
            try:
                document = load_baseline(run.path)
            except MemgateError as exc:
                problems.append(exc.one_line())
                continue
            record = document.get("memgate_run") or {}
            saved_at = saved_at or record.get("saved_at")
            dirty = dirty or bool(record.get("dirty"))
            profiles += [str(p.get("path") or key) for key, p in document["profiles"].items()]
            platforms += [p.label() for p in history_platforms(document)]
        summaries.append(RunSummary(number, files[0].commit, dirty or files[0].path.stem.endswith("-dirty"), saved_at,
                                    tuple(r.path.parent.name for r in files), tuple(profiles), tuple(problems),
                                    tuple(dict.fromkeys(platforms))))
    return summaries

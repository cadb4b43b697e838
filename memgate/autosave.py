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
import subprocess
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memgate.baselines import RUN_LAYOUT, baseline_entries, baseline_from_entries, comparable_key
from memgate.documents import load_baseline
from memgate.errors import ConfigError, MemgateError, remembered
from memgate.report import write_json_atomic

LAYOUT = RUN_LAYOUT  # memgate_run.layout, checked on read (memgate.documents.load_baseline)
LAYOUT_DIR = f"v{LAYOUT}"
_RUN_FILE = re.compile(r"\A(?P<number>[0-9]{4,})_(?P<commit>[0-9a-f]{4,40}|nogit)(?P<dirty>-dirty)?\.json\Z")
_SLUG_UNSAFE = re.compile(r"[^A-Za-z0-9._+]+")
# comparable_key names → the short prefix they get in a configuration name
_KEY_PREFIX = {"torch_version": "torch", "torch_npu_version": "torch_npu", "cann_version": "cann",
               "mindspore_version": "mindspore", "world_size": "ws"}


@dataclass(frozen=True)
class SavedRun:
    path: Path
    number: int
    commit: str | None


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
    folders = [root / configuration] if configuration is not None else (
        sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else [])
    runs = []
    for folder in folders:
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            match = _RUN_FILE.match(path.name)
            if match is not None and path.is_file():
                commit = None if match.group("commit") == "nogit" else match.group("commit")
                runs.append(SavedRun(path, int(match.group("number")), commit))
    return sorted(runs, key=lambda r: (r.number, r.path.name))


def check_run_id(run_id: str) -> str:
    """``""`` / ``latest``, a run number, or a commit prefix (4+ hex digits); else a ConfigError."""
    text = run_id.strip()
    if text in ("", "latest") or text.isdigit() or re.fullmatch(r"[0-9a-f]{4,40}", text):
        return text
    raise ConfigError(f"invalid --memgate-compare {run_id!r}",
                      expected="nothing (the latest saved run), a run number (3 or 0003) or a git commit prefix; "
                               "a bare --memgate-compare takes the next argument as its ID: write --memgate-compare=ID")


def find_run(storage: Path, key: dict[str, Any], run_id: str = "", *,
             besides: Collection[Path] = ()) -> SavedRun | None:
    """The saved run to compare a profile of comparability ``key`` with: the latest (``""``), run
    number ``run_id``, or the latest run at a commit starting with ``run_id``; never one of the files
    in ``besides`` (what this session saved: a run is not compared with itself)."""
    runs = [r for r in saved_runs(storage, configuration_name(key)) if r.path not in besides]
    run_id = run_id.strip()
    if run_id in ("", "latest"):
        return runs[-1] if runs else None
    if run_id.isdigit():
        chosen = [r for r in runs if r.number == int(run_id)]
        if chosen:
            return chosen[-1]
    chosen = [r for r in runs if r.commit is not None and r.commit.startswith(run_id.lower())]
    return chosen[-1] if chosen else None


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
    used += [int(p.name) for p in ids.iterdir() if p.name.isdigit()]
    number = max(used, default=0) + 1
    while True:
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

    def __init__(self, baseline_path: Path | None, compare_id: str | None, storage: Path) -> None:
        assert baseline_path is not None or compare_id is not None
        self.baseline_path = baseline_path
        self.compare_id = compare_id
        self.storage = storage
        self._read: dict[Path, dict[str, Any] | MemgateError] = {}

    def read(self, path: Path) -> dict[str, Any]:
        return remembered(self._read, path, lambda: load_baseline(path))

    def for_entry(self, entry: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """(the baseline to compare ``entry`` with, where it is) — (None, why) when there is none,
        for the missing-baseline policy."""
        if self.baseline_path is not None:
            if not self.baseline_path.exists():
                return None, f"baseline {self.baseline_path} does not exist"
            return self.read(self.baseline_path), str(self.baseline_path)
        assert self.compare_id is not None
        key = comparable_key(entry)
        run = find_run(self.storage, key, self.compare_id)
        if run is None:
            return None, missing_run(self.storage, key, self.compare_id)
        return self.read(run.path), str(run.path)


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
    return text in ("latest", "previous") or text.isdigit() or re.fullmatch(r"[0-9a-f]{4,40}", text) is not None


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
    elif text.isdigit() and int(text) in numbers:
        chosen = int(text)
    elif text not in ("latest", "previous") and re.fullmatch(r"[0-9a-f]{4,40}", text):
        at_commit = [r.number for r in runs if r.commit is not None and r.commit.startswith(text)]
        chosen = max(at_commit, default=None)
    if chosen is None:
        have = (f"saved: {', '.join(f'{n:04d}' for n in numbers[-5:])}"
                + (f" and {len(numbers) - 5} earlier" if len(numbers) > 5 else "")) if numbers else \
            "none saved: pytest --memgate-autosave saves one"
        raise ConfigError(f"no saved run {run_id.strip()!r} in {storage / LAYOUT_DIR} ({have})", expected=RUN_ID_HELP)
    return [r for r in runs if r.number == chosen]


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


def run_summaries(storage: Path) -> list[RunSummary]:
    """Every saved run, oldest first; a file that cannot be read is named in ``problems``, not fatal."""
    by_number: dict[int, list[SavedRun]] = {}
    for run in saved_runs(storage):
        by_number.setdefault(run.number, []).append(run)
    summaries = []
    for number, files in sorted(by_number.items()):
        profiles: list[str] = []
        problems: list[str] = []
        saved_at: str | None = None
        dirty = False
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
        summaries.append(RunSummary(number, files[0].commit, dirty or files[0].path.stem.endswith("-dirty"), saved_at,
                                    tuple(r.path.parent.name for r in files), tuple(profiles), tuple(problems)))
    return summaries

"""Which profile of one run is which profile of another: pairing for baselines, diffs and reports.

A profile is identified by what stays the same from one run to the next: its rank, its format,
the kinds of device it recorded (``npu``, ``cuda``, ``cpu``) and, where a run holds several
profiles of one rank and format, its path with the run-varying parts of the writers' naming
schemes replaced by ``*`` (:func:`stable_name`): the pid and timestamp of
``{worker}_{pid}_{ts}_ascend_pt`` and ``{worker}.{ts}.pt.trace.json``, CANN ``PROF_{n}_{ts}_{id}``
folders, the timestamp of msMemScope ``memscope_dump_{ts}.csv``.

The path is compared from its end, as deep as it takes to tell the profiles of one side apart,
so the folders above the profile root (``/ci/pr-17/...`` against ``/ci/main/...``) never matter.
Profiles that only their pids or timestamps tell apart cannot be paired with another run: that is
an error saying how to name them apart, unless the two runs hold them under the very same paths
(a run compared with itself). Pure: works on report entries (``path``, ``format``, ``rank``,
``devices``), so saved reports and baselines pair the same way as freshly loaded profiles.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from memgate.errors import AmbiguousProfiles

# Timestamps: 8+ digits (YYYYMMDD..., epoch s/ms/us/ns), optionally a time part after a separator.
_TS = r"\d{8,}(?:[_T-]\d{6,})?"
_PROF = re.compile(r"\APROF_\d+_\d+_[A-Za-z]+\Z")  # CANN msprof: PROF_000001_20230628101435646_FKFLNPEPPRRCHCAA
_TS_PART = re.compile(rf"(?<![0-9A-Za-z]){_TS}(?![0-9])")
# A pid right before the suffix of torch_npu / MindSpore folders and torch.profiler traces (after
# the timestamp is starred): host_1234_*_ascend_pt, host_1234.*.pt.trace.json.
_PID_BEFORE = re.compile(r"_\d+(?=_\*_ascend_(?:pt|ms)\Z|\.\*\.pt\.trace\.json(?:\.gz)?\Z)")

STABLE, NO_TIMESTAMP, RAW = 0, 1, 2  # how much of a name is dropped: pid and timestamp, timestamp, nothing


def stable_name(component: str, level: int = STABLE) -> str:
    """One path component with its run-varying parts starred (``alexnet_*_*_ascend_pt``)."""
    if level == RAW:
        return component
    if _PROF.match(component):
        return "PROF_*"
    name = _TS_PART.sub("*", component)
    if level == STABLE:
        name = _PID_BEFORE.sub("_*", name)
    return name


def device_kinds(devices: Iterable[str]) -> tuple[str, ...]:
    """``npu:0``, ``npu:1/pid42`` → ``("npu",)``: what kind of device, never which one."""
    return tuple(sorted({d.split("/")[0].split(":")[0] for d in devices}))


def device_key(device: str, devices: Sequence[str]) -> str:
    """A device's label without the process id msMemScope adds (``npu:0/pid42`` → ``npu:0``), where
    that leaves it unique in its profile; else the label itself (pairs only within one run)."""
    short = re.sub(r"/pid\d+\Z", "", device)
    if short != device and sum(re.sub(r"/pid\d+\Z", "", d) == short for d in devices) > 1:
        return device
    return short


def pair_devices(base: Sequence[str], current: Sequence[str]) -> list[tuple[str | None, str | None]]:
    """(base device, current device) in current's order, then the base's unpaired ones."""
    base_by_key = {device_key(d, base): d for d in base}
    pairs: list[tuple[str | None, str | None]] = []
    used: set[str] = set()
    for d in current:
        match = base_by_key.get(device_key(d, current))
        if match is not None and match not in used:
            used.add(match)
            pairs.append((match, d))
        else:
            pairs.append((None, d))
    pairs.extend((d, None) for d in base if d not in used)
    return pairs


@dataclass(frozen=True)
class ProfileId:
    """What a profile is recognized by in another run."""

    rank: str
    format: str
    kinds: tuple[str, ...]
    path: str

    @classmethod
    def of(cls, entry: dict[str, Any]) -> ProfileId:
        """From a report entry (:func:`memgate.report.profile_entry`) or a baseline's profile."""
        return cls(str(entry.get("rank")), str(entry.get("format")),
                   device_kinds(str(d["device"]) for d in entry.get("devices") or []), str(entry.get("path", "")))

    def parts(self, level: int) -> tuple[str, ...]:
        return tuple(stable_name(p, level) for p in _split(self.path))


def _split(path: str) -> tuple[str, ...]:
    parts = PurePath(path).parts
    return tuple(p for p in parts if p not in (os.sep, "/")) or (path,)


@dataclass(frozen=True)
class Pairing:
    """Indexes into the two sides: pairs, and the profiles only one side has."""

    pairs: list[tuple[int, int]] = field(default_factory=list)
    base_only: list[int] = field(default_factory=list)
    current_only: list[int] = field(default_factory=list)


def pair_profiles(base: Sequence[ProfileId], current: Sequence[ProfileId], *, current_is_whole_run: bool = True) -> Pairing:
    """Pair the profiles of two runs (see the module docstring); raise :class:`AmbiguousProfiles`
    where only run-varying parts of their names tell profiles apart and the runs' paths differ.

    ``current_is_whole_run=False``: ``current`` is some profiles of a run, not all of it (pytest
    compares each profile on its own); then only they must find their pair.
    """
    groups: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
    for i, pid in enumerate(base):
        groups.setdefault((pid.rank, pid.format), ([], []))[0].append(i)
    for j, pid in enumerate(current):
        groups.setdefault((pid.rank, pid.format), ([], []))[1].append(j)
    result = Pairing()
    for (rank, fmt), (b_idx, c_idx) in groups.items():
        if len(b_idx) <= 1 and len(c_idx) <= 1:  # one each: the same job, whatever the paths say
            if b_idx and c_idx:
                result.pairs.append((b_idx[0], c_idx[0]))
            else:
                result.base_only.extend(b_idx)
                result.current_only.extend(c_idx)
            continue
        pairs = _pair_group([base[i] for i in b_idx], [current[j] for j in c_idx], rank, fmt, current_is_whole_run)
        paired_b = {b for b, _ in pairs}
        paired_c = {c for _, c in pairs}
        result.pairs.extend((b_idx[b], c_idx[c]) for b, c in pairs)
        result.base_only.extend(b_idx[b] for b in range(len(b_idx)) if b not in paired_b)
        result.current_only.extend(c_idx[c] for c in range(len(c_idx)) if c not in paired_c)
    result.pairs.sort(key=lambda p: p[1])
    result.base_only.sort()
    result.current_only.sort()
    return result


_Key = tuple[tuple[str, ...], tuple[str, ...]]  # (device kinds, path components)


def _keys(side: Sequence[ProfileId], members: Iterable[int], level: int) -> dict[int, _Key]:
    return {i: (side[i].kinds, side[i].parts(level)) for i in members}


def _distinct(keys: dict[int, _Key]) -> list[int]:
    """Members whose key differs from every other member's (some depth tells them apart)."""
    counts: dict[_Key, int] = {}
    for key in keys.values():
        counts[key] = counts.get(key, 0) + 1
    return [i for i, key in keys.items() if counts[key] == 1]


def _tail(parts: tuple[str, ...], k: int) -> tuple[str, ...]:
    return parts[max(len(parts) - k, 0):]


def _depth(i: int, keys: dict[int, _Key]) -> int:
    """The fewest trailing components that, with the device kinds, tell member ``i`` from the others."""
    kinds, parts = keys[i]
    others = [key for j, key in keys.items() if j != i and key[0] == kinds]
    return next(k for k in range(len(parts) + 1) if all(_tail(o[1], k) != _tail(parts, k) for o in others))


def _match(b_keys: dict[int, _Key], c_keys: dict[int, _Key]) -> list[tuple[int, int]]:
    """Pairs (b, c) of distinct members whose kinds and trailing components agree as deep as either
    side needs to tell its profile apart. One-to-one: two profiles that one side tells apart cannot
    both agree with a third that deep."""
    b_depth = {i: _depth(i, b_keys) for i in _distinct(b_keys)}
    c_depth = {j: _depth(j, c_keys) for j in _distinct(c_keys)}
    pairs = []
    taken: set[int] = set()
    for j in sorted(c_depth):
        kinds, parts = c_keys[j]
        for i in sorted(b_depth):
            m = max(b_depth[i], c_depth[j])
            if i not in taken and b_keys[i][0] == kinds and _tail(b_keys[i][1], m) == _tail(parts, m):
                pairs.append((i, j))
                taken.add(i)
                break
    return pairs


def _pair_group(base: Sequence[ProfileId], current: Sequence[ProfileId], rank: str, fmt: str,
                whole_run: bool) -> list[tuple[int, int]]:
    # Phase 1: the profiles their stable names tell apart.
    b_keys, c_keys = _keys(base, range(len(base)), STABLE), _keys(current, range(len(current)), STABLE)
    pairs = _match(b_keys, c_keys)
    clash_b = sorted(set(b_keys) - set(_distinct(b_keys)))
    clash_c = sorted(set(c_keys) - set(_distinct(c_keys)))
    if not clash_b and not clash_c:
        return pairs
    # Phase 2: profiles only pids or timestamps tell apart pair by a name that keeps the pid (a
    # worker name that ends in a number), else by their very paths (a run compared with itself);
    # every one of them must find its pair, or the pairing would be a guess.
    b_left = [i for i in b_keys if i not in {b for b, _ in pairs}]
    c_left = [j for j in c_keys if j not in {c for _, c in pairs}]
    for level in (NO_TIMESTAMP, RAW):
        more = _match(_keys(base, b_left, level), _keys(current, c_left, level))
        got_b, got_c = {b for b, _ in more}, {c for _, c in more}
        if all(j in got_c for j in clash_c) and (not whole_run or all(i in got_b for i in clash_b)):
            return pairs + more
    clash = [base[i] for i in clash_b] + [current[j] for j in clash_c]
    name = "/".join(clash[0].parts(STABLE)[-2:])
    paths = sorted({p.path for p in clash})
    raise AmbiguousProfiles(
        f"cannot tell which profile of rank {rank} ({fmt}) is which in the other run: "
        f"{', '.join(paths[:4])}{' …' if len(paths) > 4 else ''} differ only in a pid or timestamp "
        f"(each is {name} without them)",
        expected="profiles of one rank and format named apart: a distinct worker_name for each "
                 "(torch_npu / torch.profiler tensorboard_trace_handler(dir, worker_name=...)) or a folder "
                 "of its own for each (e.g. rank_0/train/, rank_0/eval/)",
    )


def is_test_id(path: str) -> bool:
    """A pytest node id (``tests/test_train.py::test_step``): a marked test's history keys its profile so."""
    return "::" in path


def profile_labels(paths: Sequence[str]) -> list[str]:
    """Short labels: each path's fewest trailing components (at least its own name) that no other
    path of ``paths`` ends with; the same path twice gets the same label. A test is named by its whole
    node id (``tests/test_train.py::test_step``), as pytest names it, never shortened."""
    split = [_split(p) for p in paths]
    distinct = set(split)
    labels = []
    for path, parts in zip(paths, split):
        if is_test_id(path):
            labels.append(path)
            continue
        others = [o for o in distinct if o != parts]
        k = next((k for k in range(1, len(parts) + 1) if all(_tail(o, k) != _tail(parts, k) for o in others)),
                 len(parts))
        labels.append("/".join(_tail(parts, k)))
    return labels


def labels_under_root(paths: Sequence[Path], root: Path) -> list[str]:
    """The plugin's item-id labels: each profile's real path relative to the --memgate root
    (``rank_0/host_1234.1700000000.pt.trace.json``; the root's own name where the root is the profile), as
    ``memgate check`` and the reports name it: unique under one root, and the same while the files keep their names."""
    base = root.resolve()
    labels = []
    for path in paths:
        try:
            relative = path.resolve().relative_to(base).as_posix()
        except ValueError:
            relative = path.as_posix()
        labels.append(relative if relative != "." else base.name or str(root))
    return labels

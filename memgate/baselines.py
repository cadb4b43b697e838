"""Baseline documents: a run's profile entries kept as a small JSON file, and read back as entries.

A baseline is keyed by rank (rank and path where one rank has several profiles), holding each
profile's metrics and what makes its numbers comparable (:func:`comparable_key`: device type,
framework/CANN versions, world size, format). A saved run (:mod:`memgate.autosave`) is a baseline
plus a ``memgate_run`` record. Reading one back from a file is :mod:`memgate.documents`' (untrusted input).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memgate import __version__
from memgate.identity import Pairing, ProfileId, device_kinds, pair_devices, pair_profiles, profile_labels
from memgate.metric_specs import keys_where
from memgate.owners import FRAME_OWNER_FORMATS, normalize_owner
from memgate.platforms import Platform, primary

BASELINE_FORMAT = 1
RUN_LAYOUT = 1  # a saved run's memgate_run.layout (memgate.autosave.LAYOUT: .memgate/v1/)
COMPARABLE_KEYS = ("format", "device_type", "torch_version", "torch_npu_version", "cann_version", "mindspore_version", "world_size")


def comparable_key(entry: dict[str, Any]) -> dict[str, Any]:
    """What must match for two profiles' numbers to be comparable."""
    meta = entry.get("metadata", {}) or {}
    kinds = device_kinds(str(d["device"]) for d in entry.get("devices", []))
    key: dict[str, Any] = {"format": entry.get("format"), "device_type": ",".join(kinds) or None}
    for name in COMPARABLE_KEYS[2:]:
        if meta.get(name) is not None:
            key[name] = meta[name]
    return key


def pair_entries(base: list[dict[str, Any]], current: list[dict[str, Any]], *,
                 current_is_whole_run: bool = True) -> Pairing:
    """Which profile of ``base`` is which of ``current`` (:mod:`memgate.identity`)."""
    return pair_profiles([ProfileId.of(e) for e in base], [ProfileId.of(e) for e in current],
                         current_is_whole_run=current_is_whole_run)


def _baseline_keys(entries: list[dict[str, Any]]) -> list[str]:
    """A baseline's keys: the rank where one profile has it (readable, and what baselines of one
    profile per rank always used), else rank and the profile's path below the others'."""
    ranks = [str(e["rank"]) for e in entries]
    labels = profile_labels([str(e["path"]) for e in entries])
    keys: list[str] = []
    for rank, label in zip(ranks, labels):
        key = rank if ranks.count(rank) == 1 else f"{rank}:{label}"
        while key in keys:  # the same path twice (two reports merged): never overwrite
            key += "+"
        keys.append(key)
    return keys


# who held the peak and how many blocks were live then: not numbers a baseline compares
_NOT_BASELINED = keys_where(baselined=False)  # who held the peak, not a number


def baseline_from_entries(entries: list[dict[str, Any]], *, commit: str | None = None,
                          dirty: bool = False) -> dict[str, Any]:
    """Every metric of every device (all of LIMITS' keys, op_max_block_bytes, and the bytes live at
    the peak per operator and per owner, ``op_bytes_at_peak`` / ``owner_bytes_at_peak``: top N plus
    ``(other)``), and the pool each per-pool metric comes from; ``top_at_peak`` is left out (it is
    who held the peak, not a number). Each profile keeps its rank, format and path, by which a later
    run's profile finds it, and a marked test's profile its test's node id (``test``: ``memgate suggest
    --form marker`` of a saved run gives each test its marker). ``commit`` (the git checkout's HEAD, :func:`memgate.autosave.git_commit`)
    goes into ``metadata`` so a failed comparison can say what it compared with."""
    profiles: dict[str, Any] = {}
    for key, entry in zip(_baseline_keys(entries), entries):
        profiles[key] = {
            "rank": str(entry["rank"]),
            "path": entry["path"],
            "key": comparable_key(entry),
            "devices": {
                d["device"]: {
                    "metrics": {k: v for k, v in d["metrics"].items() if k not in _NOT_BASELINED},
                    "pool_of": dict(d.get("pool_of") or {}),
                    **({"platform": Platform.of(d["platform"]).as_json()} if d.get("platform") else {}),
                }
                for d in entry["devices"]
            },
        }
        test = (entry.get("metadata") or {}).get("test")
        if test:
            profiles[key]["test"] = str(test)
    document: dict[str, Any] = {"memgate_baseline": BASELINE_FORMAT, "memgate_version": __version__}
    if commit is not None:
        document["metadata"] = {"git_commit": commit, "git_dirty": dirty}
    document["profiles"] = profiles
    return document


def baseline_commit(baseline: dict[str, Any]) -> str | None:
    """The git commit a baseline was saved at (``-dirty`` with uncommitted changes), or None: from
    its ``metadata``, else a saved run's ``memgate_run`` record; baselines saved without one have none."""
    for record, commit_key, dirty_key in ((baseline.get("metadata"), "git_commit", "git_dirty"),
                                          (baseline.get("memgate_run"), "commit", "dirty")):
        if isinstance(record, dict) and isinstance(record.get(commit_key), str) and record[commit_key]:
            return str(record[commit_key]) + ("-dirty" if record.get(dirty_key) else "")
    return None


def ratchet(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Keep, per profile/device/metric, the better (smaller) of the old and new baseline values.

    Profiles pair as in every comparison (:mod:`memgate.identity`). A per-pool metric keeps the
    pool of the value kept. A key the old baseline lacks (saved before memgate measured it) takes
    the new value. One baseline per platform (:mod:`memgate.platforms`): the old profiles of a platform the
    new run is not on are kept as they are (their keys marked ``@platform``), never merged with the new.
    """
    merged: dict[str, Any] = json.loads(json.dumps(new))
    platforms = history_platforms(merged)
    elsewhere = {k: p for k, p in old["profiles"].items()
                 if not any(profile_platform(p).same_as(platform) for platform in platforms)}
    old = {**old, "profiles": {k: p for k, p in old["profiles"].items() if k not in elsewhere}}
    old_entries, new_entries = baseline_entries(old), baseline_entries(merged)
    new_keys = list(merged["profiles"])
    for key, profile in elsewhere.items():
        kept = key if "@" in key else f"{key}@{profile_platform(profile).label()}"
        while kept in merged["profiles"]:
            kept += "+"
        merged["profiles"][kept] = profile
    for b, c in pair_entries(old_entries, new_entries).pairs:
        before, profile = old_entries[b]["baseline"], merged["profiles"][new_keys[c]]
        if before.get("key") != profile.get("key"):
            continue
        devices = list(profile["devices"])
        for old_name, name in pair_devices(list(before.get("devices", {})), devices):
            if old_name is None or name is None:
                continue
            values, old_device = profile["devices"][name], before["devices"][old_name]
            old_metrics = old_device.get("metrics", {})
            pools = values.setdefault("pool_of", {})
            for key, value in values["metrics"].items():
                previous = old_metrics.get(key)
                if isinstance(value, (int, float)) and isinstance(previous, (int, float)) and previous < value:
                    values["metrics"][key] = previous
                    old_pool = (old_device.get("pool_of") or {}).get(key)
                    if old_pool is not None:
                        pools[key] = old_pool
                    else:
                        pools.pop(key, None)
    return merged


def baseline_entries(baseline: dict[str, Any]) -> list[dict[str, Any]]:
    """A baseline's profiles as report-shaped entries (for :func:`memgate.compare.diff_entries`), pools included.
    ``key`` is the stored comparability key; ``baseline`` the stored record itself; a marked test's
    profile has its test's node id in ``metadata.test``, as in a JSON report."""
    commit = baseline_commit(baseline)
    return [
        {"rank": str(p.get("rank", key)), "path": p.get("path", ""), "format": p.get("key", {}).get("format"),
         "key": p.get("key", {}), "baseline": p, "baseline_commit": commit,
         "devices": [{"device": d, "metrics": v.get("metrics", {}), "pool_of": v.get("pool_of") or {},
                      **({"platform": v["platform"]} if v.get("platform") else {})}
                     for d, v in p.get("devices", {}).items()],
         **({"metadata": {"test": p["test"]}} if p.get("test") else {})}
        for key, p in baseline["profiles"].items()
    ]


def history_entry(entry: dict[str, Any], profiles_of_test: int = 1) -> dict[str, Any]:
    """A marked test's profile entry as its history keys it: by the test's node id (its recording lives
    in a temporary folder whose name changes every run); several profiles of one test by their folder too."""
    meta = entry.get("metadata") or {}
    test = str(meta.get("test") or entry["path"])
    path = test if profiles_of_test <= 1 else f"{test}/{Path(str(entry['path'])).name}"
    return {**entry, "path": path, "metadata": {**meta, "profile_dir": entry["path"]}}


def respelled_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """A device's metrics with its owners in this memgate's spelling (:func:`memgate.owners.normalize_owner`):
    the keys of ``owner_bytes_at_peak`` (two old owners of one new name are summed) and each holder's owner."""
    out = dict(metrics)
    owners = metrics.get("owner_bytes_at_peak")
    if isinstance(owners, dict):
        merged: dict[str, Any] = {}
        for owner, size in owners.items():
            name = normalize_owner(owner)
            merged[name] = merged[name] + size if name in merged and isinstance(size, int) else size
        out["owner_bytes_at_peak"] = merged
    holders = metrics.get("top_at_peak")
    if isinstance(holders, list):
        out["top_at_peak"] = [{**h, "owner": normalize_owner(h["owner"])} if isinstance(h, dict)
                              and isinstance(h.get("owner"), str) else h for h in holders]
    return out


def respelled_baseline(baseline: dict[str, Any]) -> dict[str, Any]:
    """A baseline or saved run whose profiles' owners are spelled as this memgate spells them (those of
    the formats whose owners are frames, read from a document written before the one spelling)."""
    profiles = {}
    for key, p in (baseline.get("profiles") or {}).items():
        if isinstance(p, dict) and (p.get("key") or {}).get("format") in FRAME_OWNER_FORMATS:
            p = {**p, "devices": {d: {**v, "metrics": respelled_metrics(v.get("metrics") or {})}
                                  for d, v in (p.get("devices") or {}).items()}}
        profiles[key] = p
    return {**baseline, "profiles": profiles}


def respelled_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A JSON report's profile entries with their owners spelled as this memgate spells them."""
    return [{**e, "devices": [{**d, "metrics": respelled_metrics(d.get("metrics") or {})} for d in e.get("devices") or []]}
            if e.get("format") in FRAME_OWNER_FORMATS else e for e in entries]


# ---- platforms ----------------------------------------------------------------------------------


def profile_platform(profile: dict[str, Any]) -> Platform:
    """A baseline profile's platform (:func:`memgate.platforms.primary` of its devices'); unknown where it
    was saved before memgate recorded platforms."""
    devices: dict[str, Any] = profile["devices"] if isinstance(profile.get("devices"), dict) else {}
    return primary((str(d), Platform.of(v.get("platform") if isinstance(v, dict) else None)) for d, v in devices.items())


def history_platforms(baseline: dict[str, Any]) -> list[Platform]:
    """The distinct platforms a baseline or saved run holds history for, in its order."""
    return list(dict.fromkeys(profile_platform(p) for p in (baseline.get("profiles") or {}).values()
                              if isinstance(p, dict)))


def no_history(platform: Platform, where: str, held: list[Platform]) -> str:
    """``no history for NVIDIA H200 / torch 2.11 in FILE (it holds: ...)``: the missing-baseline policy's reason."""
    holds = ", ".join(dict.fromkeys(p.label() for p in held)) or "nothing"
    return (f"no history for {platform.label()} in {where} (it holds: {holds}; --memgate-compare-platform=any "
            "compares across platforms)")


def for_platform(baseline: dict[str, Any], platform: Platform, mode: str = "same") -> tuple[dict[str, Any] | None, str]:
    """``baseline`` holding only the profiles of ``platform`` (:meth:`Platform.same_as`), and a note for
    the comparison ("" where there is none to make); (None, "") where it holds none of that platform and
    ``mode`` is ``same``. With ``any``, a baseline of other platforms only gives its first platform's
    profiles, and the note names both platforms: the comparison was asked across them."""
    profiles = {k: p for k, p in (baseline.get("profiles") or {}).items() if isinstance(p, dict)}
    same = {k: p for k, p in profiles.items() if profile_platform(p).same_as(platform)}
    note = ""
    if same:
        if any(profile_platform(p).known != platform.known for p in same.values()):  # both unknown: nothing to say
            note = "platform unknown on one side (saved before memgate recorded platforms, or a profile that " \
                   "names none): compared as the same"
    elif mode == "any" and profiles:
        other = profile_platform(next(iter(profiles.values())))
        same = {k: p for k, p in profiles.items() if profile_platform(p) == other}
        note = f"compared across platforms (--memgate-compare-platform=any): history on {other.label()}, " \
               f"this run on {platform.label()}"
    else:
        return None, ""
    return {**baseline, "profiles": same}, note

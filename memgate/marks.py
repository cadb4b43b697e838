"""``@pytest.mark.memgate(...)``: a test's own budget, judged on the profile the test wrote (its
``memgate_record`` recording, its ``memgate_profile_dir``, or ``profile='path'``) after its body.

No pytest here: :mod:`memgate.plugin` finds the marker and the test's fixtures, and turns the
:class:`MarkedVerdict` into the test's failure or error. The marker's budget is named after its test,
so two marked tests are two rows in every table, report and annotation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memgate.baselines import baseline_entries, history_entry
from memgate.budgets import Budget, budget_from_mapping
from memgate.compare import CompareRule, Regression, compare_pair
from memgate.discover import discover, load
from memgate.errors import ConfigError, MemgateError, NotMeasurable, NotSelected, printable
from memgate.hints import RECORDED_BY_FIXTURE
from memgate.judge import Offered, judge, selects_nothing
from memgate.metric_cache import MetricCache
from memgate.model import Profile
from memgate.report import profile_entry
from memgate.rows import CheckRow, Declared
from memgate.verdict import Outcome

MARKER = "memgate"


def marker_budget(test: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], where: Declared, *,
                  has_profile_dir: bool, leak_horizon_steps: int) -> Budget:
    """The marker's budget, named after its test; a ConfigError naming the test, the file and line,
    and the key (with the closest valid key for a misspelling)."""

    def error(message: str, cause: MemgateError | None = None) -> ConfigError:
        return ConfigError(f"memgate marker of {test}: {message}", file=where.file, line=where.line,
                           expected=cause.expected if cause else None, found=cause.found if cause else None)

    if args:
        raise error(f"takes keywords only, got {args!r}")
    profile = kwargs.get("profile")
    if profile is not None and not isinstance(profile, (str, os.PathLike)):
        raise error(f"invalid profile {profile!r}", ConfigError("", expected="a path (str or pathlib.Path)"))
    try:
        budget = budget_from_mapping(dict(kwargs), origin=test, default_name="marker", extra_keys=("profile",),
                                     default_leak_horizon=leak_horizon_steps)
    except ConfigError as exc:
        first = error(exc.message, exc)
        first.also = tuple(error(e.message, e) for e in exc.also)  # every bad keyword, each its own line
        raise first from None
    if budget.rank_imbalance:
        raise error("rank_imbalance compares the ranks of a run: declare it in a budget file, not a marker")
    if profile is None and not has_profile_dir:
        raise error("needs a profile: use the memgate_record fixture (or memgate_profile_dir) or pass profile='path'")
    # Named after its test, so two marked tests are two rows in every table, report and annotation.
    return dataclasses.replace(budget, name=test if "name" not in kwargs else f"{test} ({budget.name})")


# ---- recordings ----------------------------------------------------------------------------------


def artifact_name(test: str) -> str:
    """A folder name for a test: its id with path separators and odd characters replaced, and a
    short hash of the exact id (two ids that read alike never share a folder)."""
    readable = re.sub(r"[^A-Za-z0-9._=+-]+", "_", test.replace("::", ".")).strip("._")[:120]
    return f"{readable}-{hashlib.sha256(test.encode()).hexdigest()[:8]}"


def keep_recording(files: Iterable[Path], keep: Path, test: str) -> str:
    """Copy a test's recorded files to ``keep/<test>`` (a CI artifact); the folder."""
    target = keep / artifact_name(test)
    target.mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copy2(path, target / path.name)
    return str(target)


def kept_path(kept: str | None, recorder: Any, path: str | Path) -> str:
    """Where a recorded profile's kept copy lies (the path reports and saved runs give), else ``path``."""
    if kept is None or recorder is None:
        return str(path)
    try:
        inside = Path(path).relative_to(recorder.directory)
    except ValueError:
        return str(path)
    return str(Path(kept) / inside) if inside.parts else kept


def _outliving(text: str, kept: str | None, recorder: Any) -> str:
    """``text`` with the recording's temporary folder named by its kept copy (a report's paths outlive pytest)."""
    if kept is None or recorder is None:
        return text
    return text.replace(str(recorder.directory), kept)


def made_by(profile: Profile, recorder: Any) -> Profile:
    """A profile memgate_record wrote says so, so its hints speak of the fixture, not of torch.profiler."""
    if recorder is None:
        return profile
    return dataclasses.replace(profile, metadata={**profile.metadata, "recorded_by": RECORDED_BY_FIXTURE,
                                                  "recorded_steps": recorder.steps})


def recorded_trace(profile: Profile) -> Path | None:
    """The Kineto trace of a recorded profile, whose Python frames name who allocated a block; None for
    a snapshot alone (its blocks carry their own frames) and other formats."""
    if profile.format == "kineto":
        return Path(profile.path)
    if profile.format == "torch_recording":  # the trace beside the snapshot (whose blocks carry frames)
        return Path(profile.path) / str((profile.metadata.get("files") or {}).get("trace"))
    return None


def with_stacks(trace: Path | None, outcomes: list[Outcome]) -> list[Outcome]:
    """``outcomes`` with the Python functions that allocated their blocks (the recorded trace, read
    once): new outcomes, the judged ones and the metrics they came from stay as they were."""
    from memgate.record import with_allocation_stacks

    if trace is None or not outcomes:
        return outcomes
    blocks = [list(o.holders) + list(o.cause.holders if o.cause is not None else ()) for o in outcomes]
    stacked = iter(with_allocation_stacks(trace, [h for group in blocks for h in group]))
    out = []
    for outcome, group in zip(outcomes, blocks):
        mine = [next(stacked) for _ in group]
        out.append(outcome.with_holders(tuple(mine[:len(outcome.holders)]), tuple(mine[len(outcome.holders):])))
    return out


def _entry_with_stacks(entry: dict[str, Any], trace: Path | None) -> dict[str, Any]:
    """A profile's report entry whose holders at the peak name their allocating functions (a copy)."""
    from memgate.record import with_allocation_stacks

    if trace is None:
        return entry
    devices = []
    for device in entry.get("devices") or []:
        metrics = device.get("metrics") or {}
        holders = metrics.get("top_at_peak") or []
        if holders and not any("stack" in h for h in holders):
            device = {**device, "metrics": {**metrics, "top_at_peak": with_allocation_stacks(trace, holders)}}
        devices.append(device)
    return {**entry, "devices": devices}


def left_by_test(recorder: Any, test: str) -> list[dict[str, Any]]:
    """``--memgate-report-left``: what a recorded test left allocated, per device of each profile it
    recorded (:meth:`memgate.leftover.LeftOn.summary`); a recording memgate cannot read says so as one
    not-measurable entry, never an error of the test."""
    from memgate.leftover import left_behind

    if recorder.memory_events == 0:
        return []  # nothing allocated while recording: nothing left
    try:
        profiles = [load(found) for found in discover(recorder.directory)]
    except MemgateError:
        return [{"test": test, "device": "?", "bytes": None, "count": 0, "largest": None}]
    return [left.summary(test) for profile in profiles for left in left_behind(profile)]


# ---- judging a marked test -----------------------------------------------------------------------


@dataclass
class MarkedVerdict:
    """A marked test's checks: a row for each (its verdict or its error, its comparisons with its
    history), the profiles it measured (report entries), the budgets and comparisons it failed, and
    the errors."""

    rows: list[CheckRow] = field(default_factory=list)
    profiles: list[dict[str, Any]] = field(default_factory=list)
    failed: list[Outcome] = field(default_factory=list)
    regressions: list[tuple[Regression, str]] = field(default_factory=list)  # failed: (regression, baseline)
    errors: list[MemgateError] = field(default_factory=list)

    def failure(self, top: int) -> tuple[str, str] | None:
        """(the failure line, the detail) when a budget or a compare rule failed: the first failure's
        line; under it, each failed check as its own section (its line, then its evidence), then the
        errors."""
        # each message one line (a name's newline must not start a line of the detail: a `::` command in CI)
        sections = [(printable(o.message), o.detail(top)) for o in self.failed] + [
            (printable(r.message), "\n".join(filter(None, [r.detail, printable(f"baseline: {where}")])))
            for r, where in self.regressions]
        if not sections:
            return None
        errors = [f"memgate: error: {e.one_line()}" for e in self.errors]
        if len(sections) == 1:
            return sections[0][0], "\n".join([sections[0][1], *errors])
        parts = [f"{len(sections)} checks failed:"]
        for number, (line, detail) in enumerate(sections, 1):
            parts += ["", f"[{number}/{len(sections)}] {line}", detail]
        return sections[0][0], "\n".join(parts + ([""] + errors if errors else []))


# An entry of the test's history → (each compare rule's regression and where its baseline is, the errors met)
Compare = Callable[[dict[str, Any]], tuple[list[tuple[Regression, str]], list[MemgateError]]]


def judge_marked_test(path: Path, budget: Budget, recorder: Any, *, test: str, kept: str | None,
                      keep_profiles: bool, compare: Compare | None, allow_unselected: bool = False) -> MarkedVerdict:
    """Judge the profile(s) under ``path`` against the marker's ``budget``, once. ``recorder``: the
    test's memgate_record (its recording is what ``path`` holds), else None; ``keep_profiles``: give
    every profile's report entry (an output needs it); ``compare``: judge each against the test's history.
    A marker whose ``ranks`` / ``devices`` select no device of any of them is an error, its checks' rows
    too (``allow_unselected``: they skip, as where it selects none of one profile's devices)."""
    verdict = MarkedVerdict()
    try:
        if recorder is not None and recorder.memory_events == 0:
            raise NotMeasurable("memgate_record recorded no tensor allocation: the test body allocated no torch "
                                "memory while it recorded (the fixture records with profile_memory=True)",
                                file=path, expected="a test body that allocates tensors, or no memgate marker")
        profiles = [made_by(load(found), recorder) for found in discover(path)]
    except MemgateError as exc:
        verdict.rows.extend(CheckRow.unjudged(None, str(path), budget, metric, exc) for metric in budget.checks())
        verdict.errors.append(exc)
        return verdict
    for profile in profiles:
        cache = MetricCache(profile)
        trace = recorded_trace(profile) if recorder is not None else None
        shown = kept_path(kept, recorder, profile.path)
        _judge_profile(verdict, cache, budget, trace, shown, lambda text: _outliving(text, kept, recorder))
        if not keep_profiles and compare is None:
            continue
        entry = profile_entry(cache.info, cache.get())
        entry["path"] = shown
        entry["devices"] = [{**d, "source": _outliving(d["source"], kept, recorder)} if d.get("source") else d
                            for d in entry.get("devices") or []]
        entry["metadata"] = {**entry.get("metadata", {}), "test": test}
        if keep_profiles:
            verdict.profiles.append(_entry_with_stacks(entry, trace))
        if compare is not None:
            judged, errors = compare(history_entry(entry, len(profiles)))
            for regression, where in judged:
                verdict.rows.append(CheckRow.compared(regression, shown, where, f"{test} (baseline)"))
                if not regression.passed:
                    verdict.regressions.append((regression, where))
            verdict.errors += errors
    error = None if allow_unselected else selects_nothing(
        budget, [Offered(p.rank, tuple(d.device for d in p.devices)) for p in profiles],
        where="the test's profiles", has="they have")
    if error is not None:
        verdict.rows = [row for row in verdict.rows if row.skipped is None]
        shown = kept_path(kept, recorder, path)
        verdict.rows += [CheckRow.unjudged(None, shown, budget, metric, error) for metric in budget.checks()]
        verdict.errors.insert(0, error)
    return verdict


def _judged(cache: MetricCache, budget: Budget, metric: str) -> Outcome | MemgateError:
    try:
        return judge(cache, budget, metric)
    except MemgateError as exc:
        return exc


def _judge_profile(verdict: MarkedVerdict, cache: MetricCache, budget: Budget, trace: Path | None,
                   shown: str, outliving: Callable[[str], str]) -> None:
    """Every check of the marker on one profile, judged once; a recording's failed checks get the
    Python functions that allocated their blocks (``trace``). Rows name the profile ``shown``, failures
    the files that outlive pytest (``outliving``)."""
    if not budget.selects_rank(cache.info.rank):
        skip = NotSelected(f"not selected: budget {budget.name!r} selects ranks={budget.ranks!r}, the profile is "
                           f"rank {cache.info.rank}", file=cache.info.path)
        verdict.rows += [replace(CheckRow.unjudged(cache.info, shown, budget, metric, skip), profile=shown)
                         for metric in budget.checks()]
        return
    outcomes = [o if isinstance(o, MemgateError) else replace(o, where=outliving(o.where))
                for o in (_judged(cache, budget, metric) for metric in budget.checks())]
    failed = with_stacks(trace, [o for o in outcomes if isinstance(o, Outcome) and not o.passed])
    stacked = iter(failed)
    for metric, outcome in zip(budget.checks(), outcomes):
        if isinstance(outcome, MemgateError):
            if not isinstance(outcome, NotSelected):  # not selected: a skipped row, no error
                verdict.errors.append(outcome)
            verdict.rows.append(replace(CheckRow.unjudged(cache.info, shown, budget, metric, outcome), profile=shown))
            continue
        if not outcome.passed:
            outcome = next(stacked)
            verdict.failed.append(outcome)
        verdict.rows.append(replace(CheckRow.judged(outcome), profile=shown))


def compare_with_history(entry: dict[str, Any], rules: Iterable[CompareRule], baseline: dict[str, Any] | None,
                         where: str, *, test: str, missing: Callable[[str], None]
                         ) -> tuple[list[tuple[Regression, str]], list[MemgateError]]:
    """``--memgate-compare-fail`` rules judged on a marked test's history entry against ``baseline``
    (at ``where``; None: there is none, ``where`` says why): every rule's regression, passed or not. A test is compared with itself only, by
    its node id, never with another test of the same rank; where it has no history ``missing``
    applies the missing-baseline policy (once per test, not once per rule)."""
    found: list[tuple[Regression, str]] = []
    errors: list[MemgateError] = []
    same = [b for b in baseline_entries(baseline) if b.get("path") == entry["path"]] if baseline is not None else []
    for rule in rules:
        if not same:
            try:
                missing(where if baseline is None else f"{test} is not in {where}")  # the test is new since
            except MemgateError as exc:
                errors.append(exc)
            break
        try:
            regression = compare_pair(same[0], entry, rule)
        except MemgateError as exc:
            errors.append(exc)
            continue
        found.append((regression, where))
    return found, errors

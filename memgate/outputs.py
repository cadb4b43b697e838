"""What a run writes when it ends, for both shells: the JSON report, the HTML report, baselines (and
their ratchet), saved runs, benchmark JSON, the GitHub step summary and annotations, and the lines
that say what was written.

:class:`RunOutputs` is the pytest run's writer, kept on the process that writes (the controller under
pytest-xdist): it collects each test's :class:`~memgate.rows.ReportPayload`, writes every output the
options ask for at the session's end, and gives the terminal summary. The CLI calls the writers
themselves. Rows become JSON here, at the edge.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memgate.autosave import BaselineFinder, git_commit, save_run
from memgate.baselines import baseline_entries, baseline_from_entries, history_entry, ratchet
from memgate.ci import benchmark_export, github_annotations, step_summary_markdown
from memgate.documents import load_baseline
from memgate.errors import MemgateError, printable
from memgate.report import build_report, summary_table, write_json_atomic, write_text_atomic
from memgate.rows import CheckRow, ErrorRow, ReportPayload
from memgate.sizes import format_size

if TYPE_CHECKING:
    from memgate.settings import Settings


def rows_json(rows: Iterable[CheckRow]) -> list[dict[str, Any]]:
    return [row.as_json() for row in rows]


def errors_json(errors: Iterable[ErrorRow]) -> list[dict[str, Any]]:
    return [error.as_json() for error in errors]


def json_report(entries: Sequence[dict[str, Any]], rows: Iterable[CheckRow], errors: Iterable[ErrorRow]
                ) -> dict[str, Any]:
    """The JSON report (schemas/report.schema.json) of profile entries, rows and errors."""
    return build_report(entries, rows_json(rows), errors_json(errors))


def write_json_report(path: str | os.PathLike[str], entries: Sequence[dict[str, Any]], rows: Iterable[CheckRow],
                      errors: Iterable[ErrorRow]) -> None:
    write_json_atomic(path, json_report(entries, rows, errors))


def html_page(entries: list[dict[str, Any]], rows: Iterable[CheckRow], errors: Iterable[ErrorRow],
              profiles: list[Any] | None = None, left: list[dict[str, Any]] | None = None) -> str:
    """The self-contained HTML report; ``profiles`` (for the curves) are loaded from the entries' paths
    when not given, a profile whose files are gone (a recording's temporary folder) left without curves."""
    from memgate.html_report import render_html  # drawing code loads only when asked for

    if profiles is None:
        from memgate.discover import discover, load

        profiles = []
        for entry in entries:
            try:
                profiles.extend(load(found) for found in discover(entry["path"]))
            except MemgateError:
                continue  # its tables still show
    return render_html(entries, rows_json(rows), profiles, errors=errors_json(errors), left=left)


def save_baseline(path: Path, entries: list[dict[str, Any]], rootdir: Path, *, keep_smaller: bool) -> None:
    """The entries as a baseline at ``path``, with the checkout's commit; ``keep_smaller`` (the
    ratchet): each value no larger than in the baseline already there. A baseline that cannot be read
    raises, and is kept as it is."""
    commit, dirty = git_commit(rootdir)
    baseline = baseline_from_entries(entries, commit=commit, dirty=dirty)
    if keep_smaller and path.exists():
        baseline = ratchet(load_baseline(path), baseline)
    write_json_atomic(path, baseline)


def comparison_lines(entries: list[dict[str, Any]], storage: Path, compare_id: str,
                     saved: Sequence[Path] = (), platform_mode: str = "same") -> list[str]:
    """Every metric's change against the saved run each profile is compared with (``--memgate-compare``),
    of its own platform (``platform_mode`` ``any``: of any); ``saved``: the files this session saved
    (``--memgate-autosave``), which are not that run."""
    from memgate.compare import diff_entries, diff_text  # only with --memgate-compare

    finder = BaselineFinder(None, compare_id, storage, platform_mode, besides=saved)
    groups: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
    lines = []
    for entry in entries:
        try:
            baseline, where = finder.for_entry(entry)
        except MemgateError as exc:
            lines.append(f"memgate: error: {exc.one_line()}")
            continue
        if baseline is None:
            lines.append(f"memgate: {where}")
        else:
            groups.setdefault(where, (baseline, []))[1].append(entry)
    lines = list(dict.fromkeys(lines))
    for where, (baseline, group) in sorted(groups.items()):
        lines.append(f"compared with {where}:")
        lines.extend(printable(line) for line in diff_text(diff_entries(baseline_entries(baseline), group,
                                                                           platform_mode)))
    return lines


def repository_path(file: str, rootdir: Path) -> str:
    """A declared file relative to the GitHub workspace (else the rootdir), as annotations need."""
    path = Path(file)
    absolute = path if path.is_absolute() else rootdir / path
    for base in (os.environ.get("GITHUB_WORKSPACE"), str(rootdir)):
        if base:
            try:
                return absolute.resolve().relative_to(Path(base).resolve()).as_posix()
            except ValueError:
                continue
    return path.as_posix()


# A line of the terminal summary: "section" (a heading), "error" (said in red) or "line"
SummaryLine = tuple[str, str]


def left_lines(left: list[dict[str, Any]]) -> list[str]:
    """``--memgate-report-left``: each recorded test that left device memory allocated when its body
    ended, largest first (the test that makes a later one run out of memory comes first)."""
    held = sorted((e for e in left if e.get("bytes")), key=lambda e: (-int(e["bytes"]), str(e["test"]), str(e["device"])))
    tests = len({e["test"] for e in left})
    lines = [] if held else [f"no recorded test left memory allocated ({tests} test(s) recorded)"]
    for e in held:
        largest = e.get("largest") or {}
        what = f"; largest {format_size(largest['size'])} {largest['what']}".rstrip() if largest.get("size") else ""
        lines.append(f"{format_size(e['bytes']):>12}  {e['device']}  {e['test']}  ({e['count']} block(s){what})")
    unmeasured = sorted({f"{e['test']} {e['device']}" for e in left if e.get("bytes") is None})
    return lines + [f"not measurable: {name}" for name in unmeasured]


class RunOutputs:
    """A pytest run's results, gathered from each test's payload (also those xdist workers send), and
    the outputs written from them."""

    def __init__(self, settings: Settings, rootdir: Path) -> None:
        self.settings = settings
        self.rootdir = rootdir
        self.rows: list[CheckRow] = []
        self.entries: dict[str, dict[str, Any]] = {}  # --memgate profiles, by path
        self.marker_entries: dict[str, dict[str, Any]] = {}  # marked tests' profiles, by path
        self.errors: list[ErrorRow] = []
        self.counts: dict[str, int] = {}  # memgate's tests, counted as pytest counts them
        self.kept: list[str] = []
        self.left: list[dict[str, Any]] = []  # --memgate-report-left: per recorded test and device
        self.late_errors: list[str] = []  # found at the session's end (an unreadable baseline to ratchet)
        self.saved: list[Path] = []
        self.save_failed = False  # --memgate-autosave could not write the run (said in late_errors)
        self.profile_names: dict[str, str] = {}  # a marked test's temporary profile path → what the table calls it

    def add(self, payload: ReportPayload, word: str | None) -> None:
        """One report's payload; ``word``: what pytest's summary counts the report as (None: not counted)."""
        if word is not None and payload.test is not None:  # memgate's own items and marked tests
            self.counts[word] = self.counts.get(word, 0) + 1
        self.rows.extend(payload.rows)
        self.profile_names.update(self._marked_names(payload))
        if payload.profile is not None:
            self.entries.setdefault(payload.profile["path"], payload.profile)
        for entry in payload.marker_profiles:
            self.marker_entries.setdefault(entry["path"], entry)
        if payload.error is not None:
            self.errors.append(payload.error)
        if payload.kept is not None:
            self.kept.append(payload.kept)
        self.left.extend(payload.left)

    def _marked_names(self, payload: ReportPayload) -> dict[str, str]:
        """A marked test's profiles outside the rootdir (the temporary folder memgate_record and
        memgate_profile_dir write into, gone with pytest's temporary folders) by what outlives them: the
        kept copy (``memgate-recordings/<test>/...``, relative to the rootdir), else the test's node id."""
        if payload.test is None or not payload.marker_profiles and not any(  # a marker's row: budget "test (name)"
                row.budget.startswith(payload.test) for row in payload.rows):
            return {}  # not a marked test: a --memgate profile is named by its real path
        paths = sorted({row.profile for row in payload.rows if row.profile and not self._in_rootdir(row.profile)})
        names = {}
        for path in paths:
            name = Path(path).name
            if payload.kept is not None:
                kept = Path(payload.kept) / name  # the kept copy is flat: the recording's files by name
                shown = kept if kept.exists() else Path(payload.kept)
                names[path] = self._shown(shown)
            else:
                names[path] = payload.test if len(paths) == 1 else f"{payload.test}/{name}"
        return names

    def _in_rootdir(self, path: str) -> bool:
        return Path(path).resolve().is_relative_to(self.rootdir.resolve())

    def _shown(self, path: Path) -> str:
        try:
            return path.resolve().relative_to(self.rootdir.resolve()).as_posix()
        except ValueError:
            return str(path)

    def sorted_rows(self) -> list[CheckRow]:
        return sorted(self.rows, key=lambda r: (r.profile, r.budget, r.metric))

    def profile_entries(self) -> list[dict[str, Any]]:
        """The --memgate profiles, then every marked test's profile, each by path (the reports' profiles)."""
        return ([self.entries[k] for k in sorted(self.entries)]
                + [self.marker_entries[k] for k in sorted(self.marker_entries)])

    def history_entries(self) -> list[dict[str, Any]]:
        """What baselines, saved runs, comparisons and benchmark JSON keep: the --memgate profiles and
        every marked test's profile, keyed by its node id."""
        per_test: dict[str, int] = {}
        for entry in self.marker_entries.values():
            test = str((entry.get("metadata") or {}).get("test"))
            per_test[test] = per_test.get(test, 0) + 1
        tests = [history_entry(e, per_test[str((e.get("metadata") or {}).get("test"))])
                 for e in self.marker_entries.values()]
        return [self.entries[k] for k in sorted(self.entries)] + sorted(tests, key=lambda e: str(e["path"]))

    def write(self) -> bool:
        """Every output the options ask for; False when one could not be written as asked (the run's
        exit status says so)."""
        s = self.settings
        rows, entries = self.sorted_rows(), self.history_entries()
        written = True
        if s.json_path is not None:
            write_json_report(s.json_path, self.profile_entries(), rows, self.errors)
        if s.save_baseline is not None and not entries:
            self.late_errors.append(f"memgate: warning: --memgate-save-baseline={s.save_baseline} wrote nothing: no "
                                    "--memgate=PATH profile and no marked test was measured in this run")
        if s.save_baseline is not None and entries:
            try:
                save_baseline(s.save_baseline, entries, self.rootdir, keep_smaller=s.ratchet)
            except MemgateError as exc:  # a baseline that cannot be read is kept as it is, and said
                self.late_errors.append(f"memgate: error: {exc.one_line()} (the baseline was not rewritten)")
                written = False
        if s.autosave and entries:
            commit, dirty = git_commit(self.rootdir)
            try:
                self.saved = save_run(s.storage, entries, commit=commit, dirty=dirty)
            except MemgateError as exc:  # the store changed under the session (a file where a folder was)
                self.late_errors.append(f"memgate: error: {exc.one_line()} (the run was not saved)")
                self.save_failed, written = True, False
        if s.benchmark_json is not None:
            write_json_atomic(s.benchmark_json, benchmark_export(entries))
        if s.html_path is not None:
            write_text_atomic(s.html_path, html_page(self.profile_entries(), rows, self.errors, left=self.left))
        summary_file = os.environ.get("GITHUB_STEP_SUMMARY")
        if summary_file and (rows or self.errors):
            with open(summary_file, "a", encoding="utf-8", errors="backslashreplace") as fh:
                fh.write(step_summary_markdown(rows_json(rows), errors_json(self.errors), self.counts))
        return written

    def summary(self) -> list[SummaryLine]:
        """The terminal summary: late errors, the table, the comparison, annotations, what was written."""
        s = self.settings
        out: list[SummaryLine] = [("error", printable(line)) for line in self.late_errors]
        rows = self.sorted_rows()
        if rows:
            out.append(("section", "memgate"))
            out += [("line", printable(line)) for line in summary_table(rows_json(rows), self.profile_names)]
        if s.compare_id is not None and (self.entries or self.marker_entries):
            lines = comparison_lines(self.history_entries(), s.storage, s.compare_id, self.saved,
                                     s.compare_platform)
            out += [("section", "memgate compare"), *(("line", printable(line)) for line in lines)]
        if s.report_left:
            out += [("section", "memgate: memory left allocated by tests"),
                    *(("line", printable(line)) for line in left_lines(self.left))]
        if os.environ.get("GITHUB_ACTIONS") == "true":
            annotations = github_annotations(rows_json(rows), errors_json(self.errors),
                                             lambda file: repository_path(file, self.rootdir))
            out += [("line", printable(line)) for line in annotations]
        return out + [("line", printable(line)) for line in self._written()]

    def _written(self) -> list[str]:
        s = self.settings
        lines = [f"memgate: {what} written to {path}" for what, path in (
            ("JSON report", s.json_path), ("baseline", s.save_baseline), ("benchmark JSON", s.benchmark_json),
            ("HTML report", s.html_path)) if path is not None and path.exists()]
        if self.kept:
            lines.append(f"memgate: recordings of {len(self.kept)} test(s) kept in {s.keep_traces}")
        if s.autosave and not self.save_failed:  # the session's end (which saves) comes before this summary
            lines.append(f"memgate: run saved to {', '.join(str(p) for p in self.saved)}" if self.saved
                         else "memgate: --memgate-autosave saved nothing: no --memgate=PATH profile and no marked "
                              "test was measured in this run")
        return lines

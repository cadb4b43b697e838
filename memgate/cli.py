"""``memgate inspect|check|validate|report|diff|suggest|runs``: a thin shell over :mod:`memgate.session`.

Exit codes: 0 ok, 1 a budget exceeded, 2 bad input or usage (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from memgate import __version__
from memgate.errors import ConfigError, MemgateError, printable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up time; mypy reads it the same)
if TYPE_CHECKING:
    from typing import Any, NoReturn, TextIO

    from memgate.compare import Regression
    from memgate.metrics import MetricOptions
    from memgate.rows import ErrorRow
    from memgate.session import ProfileResult

# The core (pandas, pyarrow: ~0.5 s to import) is imported inside the commands, so usage errors,
# --help and --version answer at once.

EXIT_OK, EXIT_EXCEEDED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
MAX_HEADROOM = 1000  # % of suggest --headroom: a limit 11 times what was measured is no budget
PATH_HELP = "a profile (a *_ascend_pt folder, PROF_* folder, snapshot, trace, dump...) or a folder holding profiles"
RUN_HELP = ("a profile or folder of profiles, a JSON report / baseline memgate saved, or a saved run's ID "
            "(latest, previous, a run number or a commit prefix: memgate runs lists them)")
STORAGE_HELP = ("where saved runs are (default: the nearest .memgate folder at or above the current one, "
                "as pytest --memgate-autosave writes it)")


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``, without importing shutil (and with it zlib, bz2 and
    lzma: ~2 ms of every ``memgate --help``, which argparse would import only to ask this)."""
    try:
        columns = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):  # no stdout, or not a terminal
            columns = 0
    return columns if columns > 0 else 80


class _HelpFormatter(argparse.HelpFormatter):
    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         _terminal_columns() - 2 if width is None else width)  # argparse's own margin


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        print(f"memgate: error: {message} (see 'memgate --help')", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _say(lines: Iterable[str], file: TextIO | None = None) -> None:
    """Print text lines of a command's output, each kept to one line of printable text (names
    and paths in them come from profile files: :func:`memgate.errors.printable`)."""
    for line in lines:
        print(printable(line), file=file)


def _int(text: str) -> int:
    """An integer option's value: ASCII digits (``int()`` would take ``'１０'``, ``'٣'`` and ``'1_000'``)."""
    from memgate.errors import show
    from memgate.sizes import int_text

    number = int_text(text)
    if number is None:
        raise argparse.ArgumentTypeError(f"invalid int value: {show(text)} (expected ASCII digits, at most 18)")
    return number


def _loading_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", "-j", type=_int, default=1, metavar="N", help="load profiles (ranks) in N processes (default 1)")
    p.add_argument("--cache-dir", metavar="DIR", default=os.environ.get("MEMGATE_CACHE_DIR"),
                   help="keep loaded profiles here, keyed on file content: a second run over unchanged "
                        "files reads them back (default: $MEMGATE_CACHE_DIR; none when unset)")
    shown = p.add_mutually_exclusive_group()
    shown.add_argument("--progress", action="store_true", default=None,
                       help="show progress of loads over ~2 s even when stderr is not a terminal")
    shown.add_argument("--no-progress", action="store_false", dest="progress", help="never show progress")


def _inspect_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="+", help=PATH_HELP + " (several: each in turn, e.g. a shell glob)")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of text")
    p.add_argument("--warmup-steps", type=_int, default=1, metavar="N",
                   help="timed steps dropped before step_growth and leaked are measured (default 1)")
    p.add_argument("--leak-horizon-steps", type=_int, default=1, metavar="N",
                   help="last counted steps whose live blocks count as leak_undetermined, not leaked (default 1)")


def _check_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help=PATH_HELP + " (default: 'profiles' of the budget file, relative to it)")
    p.add_argument("--budgets", metavar="FILE", help="memgate.toml or pyproject.toml (default: ./memgate.toml, ./pyproject.toml)")
    p.add_argument("--json", metavar="FILE", dest="json_out",
                   help="also write the JSON report to FILE ('-': to stdout, the table then goes to stderr)")
    p.add_argument("--allow-unselected", "--memgate-allow-unselected", action="store_true", dest="allow_unselected",
                   help="a budget whose ranks/devices select no device of any profile is skipped, not an error "
                        "(for runs whose devices are optional; pytest's --memgate-allow-unselected)")


def _validate_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help=PATH_HELP)


def _report_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help=PATH_HELP)
    p.add_argument("--html", metavar="FILE", help="the HTML report (opens offline: no external request; '-': to stdout)")
    p.add_argument("--image", metavar="FILE",
                   help="the memory curves as .png or .svg (needs pytest-memgate[plot]); with several profiles one image "
                        "each, FILE's name plus the profile's")
    p.add_argument("--budgets", metavar="FILE", help="draw these budgets' limits (default: ./memgate.toml, ./pyproject.toml)")


def _diff_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", help="the earlier run: " + RUN_HELP)
    p.add_argument("current", help="the run to judge: " + RUN_HELP)
    p.add_argument("--fail", action="append", default=[], metavar="EXPR",
                   help="exit 1 when a metric grew past EXPR, e.g. peak_allocated:5%%, peak_allocated:2.5%%+256MiB")
    p.add_argument("--json", action="store_true", help="print the diff as JSON (to stdout)")
    p.add_argument("--compare-platform", choices=("same", "any"), default="same",
                   help="diff profiles measured on another platform too (any); default: same platform only")
    p.add_argument("--top", type=_int, default=10, metavar="N", help="operators listed per change kind (default 10)")
    p.add_argument("--storage", metavar="DIR", help=STORAGE_HELP)


def _suggest_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help=RUN_HELP)
    p.add_argument("--headroom", default="10%", metavar="PCT",
                   help="added to every measured value (default 10%%); sizes are rounded up, peaks and caps never "
                        "below 1 MiB, ratios never below 0.010 nor at 1 or more (a limit that cannot fail is left out); "
                        "growth and leak limits come from the cleanest profile, a measured 0 B stays 0 B")
    p.add_argument("--name", default="default", metavar="NAME", help="budget name (default 'default')")
    p.add_argument("--form", choices=("pyproject", "toml", "marker"), default="pyproject",
                   help="pyproject: a [tool.memgate] block (default); toml: a memgate.toml; marker: "
                        "@pytest.mark.memgate(...) lines, one per marked test of a saved run or report")
    p.add_argument("--storage", metavar="DIR", help=STORAGE_HELP)


def _runs_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", metavar="DIR", help=STORAGE_HELP)
    p.add_argument("--json", action="store_true", help="print the runs as JSON (to stdout)")


# Each command: its one-line help and what adds its arguments (after the loading options).
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "inspect": ("print the metrics of every profile under PATH", _inspect_options),
    "check": ("judge every profile under PATH against the budgets", _check_options),
    "validate": ("validate every profile file under PATH against its schema", _validate_options),
    "report": ("write the self-contained HTML report and/or a PNG/SVG of the curves", _report_options),
    "diff": ("metric and per-operator deltas between two runs (profiles, JSON reports or baselines)", _diff_options),
    "suggest": ("print budgets (pyproject, memgate.toml or markers) from the measured values plus headroom",
                _suggest_options),
    "runs": ("list the runs pytest --memgate-autosave saved (compare any two with memgate diff A B)", _runs_options),
}


class _Version(argparse.Action):
    """``--version``: memgate's version and the snapshot reader a load uses (looked up only when asked:
    ``--help`` imports nothing more)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from memgate.readers.compiled import reader_name

        print(f"memgate {__version__} (snapshot reader: {reader_name()})")
        parser.exit()


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser; given ``argv``, only the command it names gets its arguments (argparse's
    per-argument cost is most of `memgate --help`'s start-up; the others only need their names)."""
    parser = _Parser(prog="memgate", description="Memory budgets for ML runs, from profiler output.")
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and the snapshot reader in use")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    named = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    for name, (text, add_options) in COMMANDS.items():
        p = sub.add_parser(name, help=text)
        if argv is None or name == named:
            _loading_options(p)
            add_options(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    try:
        commands = {"inspect": _inspect, "check": _check, "validate": _validate, "diff": _diff, "suggest": _suggest,
                    "report": _report, "runs": _runs}
        return commands[args.command](args)
    except MemgateError as exc:
        for line in exc.lines():  # one error; or a budget file's every error, in file order
            print(f"memgate: error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `memgate inspect --json | head`: the reader left; no error to report
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not fail again
        return 141  # 128 + SIGPIPE, what a shell reports for a writer killed by the pipe
    except Exception as exc:  # never a traceback for a user; MEMGATE_DEBUG=1 shows it
        if os.environ.get("MEMGATE_DEBUG"):
            raise
        print(printable(f"memgate: internal error: {type(exc).__name__}: {exc} (set MEMGATE_DEBUG=1 for a traceback)"),
              file=sys.stderr)
        return EXIT_INTERNAL


def _run(args: argparse.Namespace, root: str | Path, budgets: Sequence[Any] = (),
         options: MetricOptions | None = None, *, thorough: bool = False) -> list[ProfileResult]:
    from memgate.progress import stderr_writer, wanted
    from memgate.session import run_profiles

    if args.jobs < 1:
        raise ConfigError(f"invalid --jobs {args.jobs}", expected="a number of processes >= 1")
    write = stderr_writer() if wanted(sys.stderr, args.progress) else None
    cache = None
    if args.cache_dir:
        from memgate.cache import ProfileCache

        cache = ProfileCache(args.cache_dir)
    return run_profiles(root, budgets, options=options, jobs=args.jobs, write_progress=write, cache=cache,
                        thorough=thorough)


def _report_errors(results: list[ProfileResult]) -> list[ErrorRow]:
    return [r.error_row() for r in results if r.error is not None]


def _exit_status(results: list[ProfileResult]) -> int:
    """2 with every bad profile's one-line error on stderr (the third bad rank of 64 is named too), else 0."""
    errors = [r.error.one_line() for r in results if r.error is not None]
    for error in errors:
        print(f"memgate: error: {error}", file=sys.stderr)
    return EXIT_BAD_INPUT if errors else EXIT_OK


def _inspect(args: argparse.Namespace) -> int:
    import json

    from memgate.metrics import MetricOptions
    from memgate.outputs import json_report
    from memgate.report import inspect_text
    from memgate.rows import ErrorRow

    if args.warmup_steps < 0:
        raise ConfigError(f"invalid --warmup-steps {args.warmup_steps}", expected="an integer >= 0")
    if args.leak_horizon_steps < 1:
        raise ConfigError(f"invalid --leak-horizon-steps {args.leak_horizon_steps}", expected="an integer >= 1")
    options = MetricOptions(warmup_steps=args.warmup_steps, leak_horizon_steps=args.leak_horizon_steps)
    paths = list(dict.fromkeys(args.path))
    if len(paths) == 1:
        results = _run(args, paths[0], options=options)
        bad: list[MemgateError] = []
    else:  # each path in turn: one that is no profile is said, the others still inspected
        results, bad = [], []
        for path in paths:
            try:
                results.extend(_run(args, path, options=options))
            except MemgateError as failure:
                bad.append(failure)
    entries = [r.entry for r in results if r.entry is not None]
    if args.json:
        errors = _report_errors(results) + [ErrorRow(e.file, e.one_line()) for e in bad]
        print(json.dumps(json_report(entries, [], errors), indent=2))
    else:
        for entry in entries:
            _say(inspect_text(entry))
    for line in (e.one_line() for e in bad):
        print(f"memgate: error: {line}", file=sys.stderr)
    status = _exit_status(results)
    return EXIT_BAD_INPUT if bad else status


def _check(args: argparse.Namespace) -> int:
    from memgate.judge import Offered, judge_cross_rank, judge_selection
    from memgate.outputs import json_report, rows_json
    from memgate.report import outcome_labels, outcome_order, profile_label, summary_table
    from memgate.settings import declared_root, find_budgets

    budget_file = find_budgets(args.budgets or None, [Path.cwd()])
    if budget_file is None or not budget_file.budgets:
        raise ConfigError("no budgets declared", file=budget_file.path if budget_file else None,
                          expected="[[budgets]] entries in --budgets FILE, ./memgate.toml or [tool.memgate] in ./pyproject.toml")
    root = args.path or declared_root(budget_file)
    if root is None:
        raise ConfigError("no profile path", file=budget_file.path,
                          expected="PATH, or 'profiles = \"DIR\"' in the budget file")
    results = _run(args, root, budget_file.budgets)
    cross = judge_cross_rank(budget_file.budgets, [r.rank_values for r in results], str(root))
    rows = [*(o for r in results for o in r.outcomes), *cross]
    if not args.allow_unselected:  # a budget that selects nothing in the whole run: its error, not its skips
        offered = [Offered.of_entry(r.entry) for r in results if r.entry is not None]
        unselected = judge_selection(budget_file.budgets, offered, str(root))
        rows = [row for row in rows if row.skipped is None or row.budget not in unselected]
        rows += [row for budget_rows in unselected.values() for row in budget_rows]
    rows.sort(key=lambda row: outcome_order(row.as_json()))
    errors = _report_errors(results)
    # With the JSON report on stdout, what people read goes to stderr.
    out = sys.stderr if args.json_out == "-" else sys.stdout
    table = rows_json(rows)
    _say(summary_table(table), out)
    labels = outcome_labels(table)
    for row, o in zip(rows, table):  # every verdict that is not a pass, explained, in the table's order
        word = "FAILED" if row.passed is False else "ERROR" if row.error else "SKIPPED" if row.skipped else None
        if word is not None:
            _say([f"{word} {profile_label(o, labels)}::{row.budget}::{row.metric}: {row.message}"], out)
    _say([f"ERROR {e.profile}: {e.error}" for e in errors], out)
    if args.json_out:
        entries = [r.entry for r in results if r.entry is not None]
        _write_json(args.json_out, json_report(entries, rows, errors), "the JSON report")
    problems = [row.error for row in rows if row.error] + [e.error for e in errors]  # as listed
    if problems:
        more = f" (and {len(problems) - 1} more error(s), each listed above)" if len(problems) > 1 else ""
        print(f"memgate: error: {problems[0]}{more}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_EXCEEDED if any(row.passed is False for row in rows) else EXIT_OK


def _write_json(target: str, data: Any, what: str) -> None:
    """``-``: stdout; else the file, atomically."""
    import json

    from memgate.report import write_json_atomic

    if target == "-":
        print(json.dumps(data, indent=2))
        return
    try:
        write_json_atomic(target, data)
    except OSError as exc:
        raise ConfigError(f"cannot write {what}: {exc.strerror or exc}", file=target,
                          expected="a writable file path for --json") from None


def _validate(args: argparse.Namespace) -> int:
    results = _run(args, args.path, thorough=True)  # what a load may skip (no metric reads it) is checked too
    for r in results:
        status = "ok" if r.error is None else f"INVALID: {r.error.one_line()}"
        _say([f"{r.path} [{r.format}]: {status}"])
    return _exit_status(results)


def _storage(args: argparse.Namespace) -> Path:
    from memgate.autosave import check_storage, default_storage

    return check_storage(Path(args.storage) if args.storage else default_storage(Path.cwd()))


def _entries_of(args: argparse.Namespace, path: str) -> list[dict[str, Any]]:
    """Profile entries of a run: a JSON report or baseline file as saved (validated: untrusted input),
    a saved run named by its ID (where no file of that name exists), else the profiles under PATH."""
    from memgate.autosave import is_run_id, run_entries
    from memgate.documents import load_entries, looks_like_memgate_json

    if looks_like_memgate_json(Path(path)):
        return load_entries(path)
    if not os.path.lexists(path) and is_run_id(path):
        return run_entries(_storage(args), path)
    results = _run(args, path)
    for r in results:
        if r.error is not None:
            raise r.error
    return [r.entry for r in results if r.entry is not None]


def _diff(args: argparse.Namespace) -> int:
    import json

    from memgate.baselines import pair_entries
    from memgate.compare import compare_pair, diff_entries, diff_text, parse_rule

    rules = [parse_rule(r) for r in args.fail]
    base, current = _entries_of(args, args.base), _entries_of(args, args.current)
    diff = diff_entries(base, current, args.compare_platform)  # pairs the profiles; ambiguous: an error here
    other = {r["profile"] for r in diff["ranks"] if r.get("status") == "other platform"}
    pairs = [(b, c) for b, c in pair_entries(base, current).pairs if current[c]["path"] not in other]
    labels = {r["profile"]: r["label"] for r in diff["ranks"]}
    ranks = [e["rank"] for e in current]
    regressions: list[tuple[dict[str, Any], Regression]] = []
    errors: list[tuple[dict[str, Any], MemgateError]] = []
    for rule in rules:
        for b, c in pairs:
            try:
                regressions.append((current[c], compare_pair(base[b], current[c], rule)))
            except MemgateError as exc:  # every pair is judged; each error is listed
                errors.append((current[c], exc))

    def where(entry: dict[str, Any]) -> str:
        return f"  [{labels[entry['path']]}]" if ranks.count(entry["rank"]) > 1 else ""

    if args.json:
        diff["regressions"] = [r.__dict__ for _, r in regressions]
        diff["errors"] = [{"profile": e["path"], "error": problem.one_line()} for e, problem in errors]
        print(json.dumps(diff, indent=2))
    else:
        _say(diff_text(diff, top=args.top))
        for entry, r in regressions:
            _say([("FAILED " if not r.passed else "ok     ") + r.message + where(entry)])
            if not r.passed and r.detail:  # what grew most at the peak, and the baseline's commit
                _say("       " + line for line in r.detail.splitlines())
        for _, problem in errors:
            print(f"ERROR  {problem.one_line()}")
    if errors:
        more = f" (and {len(errors) - 1} more error(s), each listed above)" if len(errors) > 1 else ""
        print(f"memgate: error: {errors[0][1].one_line()}{more}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return EXIT_EXCEEDED if any(not r.passed for _, r in regressions) else EXIT_OK


def _suggest(args: argparse.Namespace) -> int:
    from decimal import Decimal

    from memgate.errors import show
    from memgate.suggest import suggest_toml

    # Decimal() alone takes NaN, Infinity, 1e999999, '１０' and '1_0': a percentage is written in ASCII digits
    text = args.headroom.strip().removesuffix("%").strip()
    if not re.fullmatch(r"[0-9]{1,4}(\.[0-9]{1,6})?", text) or Decimal(text) > MAX_HEADROOM:
        raise ConfigError(f"invalid --headroom {show(args.headroom)}",
                          expected=f"a percentage from 0% to {MAX_HEADROOM}% such as 10%")
    headroom = Decimal(text)
    print(suggest_toml(_entries_of(args, args.path), headroom, name=args.name, form=args.form), end="")
    return EXIT_OK


def _relative(path: str) -> str:
    """A saved profile's path as short as it is exact: relative where it lies under the current folder."""
    try:
        return str(Path(path).relative_to(Path.cwd())) if os.path.isabs(path) else path
    except ValueError:
        return path


def _runs(args: argparse.Namespace) -> int:
    import json

    from memgate.autosave import LAYOUT_DIR, run_summaries

    storage = _storage(args)
    runs = run_summaries(storage)
    if args.json:
        print(json.dumps({"storage": str(storage / LAYOUT_DIR),
                          "runs": [{"id": r.number, "commit": r.commit, "dirty": r.dirty, "saved_at": r.saved_at,
                                    "configurations": list(r.configurations), "platforms": list(r.platforms),
                                    "profiles": list(r.profiles), "problems": list(r.problems)} for r in runs]},
                         indent=2))
        return EXIT_BAD_INPUT if any(r.problems for r in runs) else EXIT_OK
    if not runs:
        _say([f"no saved runs in {storage / LAYOUT_DIR} (pytest --memgate-autosave saves one)"])
        return EXIT_OK
    rows = [("run", "commit", "saved (UTC)", "platform", "profiles")]
    for r in runs:
        commit = (r.commit[:12] if r.commit else "nogit") + ("-dirty" if r.dirty else "")
        shown = ", ".join(_relative(p) for p in r.profiles[:3]) + (f" +{len(r.profiles) - 3} more"
                                                                   if len(r.profiles) > 3 else "")
        rows.append((f"{r.number:04d}", commit, r.saved_at or "?", "; ".join(r.platforms) or "unknown",
                     f"{len(r.profiles)}: {shown}"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    _say([f"saved runs in {storage / LAYOUT_DIR}"]
         + ["  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows])
    for r in runs:
        for problem in r.problems:
            print(f"memgate: error: run {r.number:04d}: {problem}", file=sys.stderr)
    if len(runs) > 1:
        _say([f"compare two: memgate diff {runs[-2].number:04d} {runs[-1].number:04d} (or: memgate diff previous latest)"])
    return EXIT_BAD_INPUT if any(r.problems for r in runs) else EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from memgate.discover import discover, load
    from memgate.outputs import html_page
    from memgate.report import write_text_atomic
    from memgate.settings import find_budgets

    if not args.html and not args.image:
        raise ConfigError("nothing to write", expected="--html FILE and/or --image FILE.png|.svg")
    budget_file = find_budgets(args.budgets or None, [Path.cwd()])
    results = _run(args, args.path, budget_file.budgets if budget_file else ())
    entries = [r.entry for r in results if r.entry is not None]
    rows = [o for r in results for o in r.outcomes]
    # The pictures need the series themselves, not only the metrics: load again here (the first
    # pass may have run in other processes).
    paths = {e["path"] for e in entries}
    profiles = [load(found) for found in discover(args.path) if str(found.path) in paths]
    said = sys.stderr if "-" in (args.html, args.image) else sys.stdout
    if args.html:
        page = html_page(entries, rows, _report_errors(results), profiles)
        if args.html == "-":
            sys.stdout.write(page)
        else:
            write_text_atomic(args.html, page)
            print(f"memgate: HTML report written to {args.html}", file=said)
    if args.image:
        _write_images(Path(args.image), profiles, entries, [row.as_json() for row in rows], said)
    for r in results:  # what no picture shows, said by name
        if r.error is not None and args.image:
            print(printable(f"memgate: left out of the images: {r.path} (it could not be read)"), file=said)
    return _exit_status(results)


def _write_images(target: Path, profiles: list[Any], entries: list[dict[str, Any]], outcomes: list[dict[str, Any]],
                  said: Any) -> None:
    """One image of one profile at ``target``; of several, one each beside it, named
    ``{stem}-{profile label}{suffix}``."""
    from memgate.identity import profile_labels
    from memgate.plot import write_curve_image

    if not profiles:
        raise ConfigError("no loadable profile to draw", file=str(target))
    by_path = {e["path"]: e for e in entries}
    if len(profiles) == 1:
        targets = [target]
    else:
        labels = profile_labels([p.path for p in profiles])
        names: list[str] = []
        for label in labels:
            name = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._") or "profile"
            while name in names:  # labels that clean up alike
                name += "_"
            names.append(name)
        targets = [target.with_name(f"{target.stem}-{name}{target.suffix}") for name in names]
    for profile, path in zip(profiles, targets):
        write_curve_image(profile, by_path[profile.path], path, outcomes=outcomes)
        print(printable(f"memgate: curves of {profile.path} written to {path}"), file=said)


def entry() -> None:
    """The ``memgate`` command: :func:`main` in a process of its own (:func:`as_command`)."""
    from memgate import fastexit

    as_command()
    fastexit.exit(main())


def as_command() -> None:
    """What only the command's own process may do: leave the loads' Python objects to the process
    exit (memgate.fastexit) instead of freeing them one by one just before it, and let Arrow read
    a snapshot without importing pandas (memgate.lazy.arrow_without_pandas); and keep numpy's BLAS
    to one thread (before numpy is imported)."""
    from memgate import fastexit

    # OpenBLAS starts a thread per core when numpy is imported, and they spin waiting for work:
    # memgate multiplies no matrices, and on a 2-core runner the spinning thread took the other
    # core (~9% of a snapshot load's CPU samples, ~0.1 s). The --jobs workers inherit it; a value
    # the user set stands. Never in the pytest plugin: the tests' own numpy is theirs.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    fastexit.as_command(_physical_memory() // 32)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): keep nothing
        return 0


if __name__ == "__main__":  # pragma: no cover
    entry()

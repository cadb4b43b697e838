"""CI outputs: GitHub annotations and step summary, github-action-benchmark export. Pure text."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from memgate.errors import printable
from memgate.metric_specs import BUDGET_SPECS, OOM
from memgate.sizes import format_size


def _escape_annotation(text: str) -> str:
    # GitHub workflow commands: %, CR and LF must be escaped in the message; then what else a terminal or
    # a log viewer acts on, or ends a line at (printable), so the command is one line, whatever a name holds.
    return printable(text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A"))


def _property(text: str) -> str:
    # Workflow-command properties also escape ':' and ','.
    return _escape_annotation(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(outcomes: list[dict[str, Any]], errors: Iterable[dict[str, Any]] = (),
                       path_of: Callable[[str], str] | None = None) -> list[str]:
    """``::error`` lines for failed and erroring checks and for errors of their own (a bad marker),
    on the line that declared them (``declared_in``: the test, or the budget's key in its file)
    and titled with the test; ``path_of`` makes a declared file relative to the repository."""
    lines = []
    for o in [*[o for o in outcomes if o.get("passed") is False or o.get("error")], *errors]:
        where = ""
        declared = o.get("declared_in") or {}
        if declared.get("file"):
            where = f"file={_property(path_of(declared['file']) if path_of else declared['file'])},"
            if declared.get("line"):
                where += f"line={declared['line']},"
        if o.get("test"):  # a marker's checks share their test's id: the metric tells them apart
            title = f"memgate {o['test']}" + (f" {o['metric']}" if o.get("budget") == o["test"] else "")
        else:
            title = f"memgate {o.get('budget', '?')}::{o.get('metric', '?')} (rank {o.get('rank') or '-'})"
        lines.append(f"::error {where}title={_property(title)}::{_escape_annotation(o.get('error') or o['message'])}")
    return lines


def check_kind(check: str) -> str:
    """``"size"``, ``"ratio"`` or ``"count"`` for what a check measures: a budget key by the metric table,
    ``op_caps[glob]`` / ``owner_caps[glob]`` a size, ``rank_imbalance[metric]`` a ratio, ``oom`` a count."""
    base = check.split("[")[0]
    if base == "rank_imbalance":
        return "ratio"
    if base == OOM:
        return "count"
    return BUDGET_SPECS[base].kind if base in BUDGET_SPECS else "size"


def unit_of(metric: str) -> str:
    """The unit word of a metric's values in JUnit properties and benchmark records."""
    kind = check_kind(metric)
    return "ratio" if kind == "ratio" else "count" if kind == "count" else "bytes"


# Inline Markdown a name could use to format, link, show an image or write HTML in the step summary, and the
# table's cell separator. Backslash-escaped (any ASCII punctuation may be): the cell shows the name as it is.
# An underscore between letters or digits never emphasizes (test_a.py stays as it is written).
_MARKDOWN = re.compile(r"([\\`*\[\]<>|!&~]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")


def md_text(text: Any) -> str:
    """``text`` as one line of Markdown table cell (or list item) that shows exactly it: no line break
    (:func:`memgate.errors.printable`), no ``|`` that ends the cell, no inline markup."""
    return _MARKDOWN.sub(r"\\\1", printable(str(text)))


def md_code(text: Any) -> str:
    """``text`` as a code span in a table cell; as :func:`md_text` where it holds a backtick or a
    backslash (a code span cannot escape them, and a backslash before ``\\|`` would undo the pipe's escape)."""
    shown = printable(str(text))
    if "`" in shown or "\\" in shown:
        return md_text(shown)
    return "`" + shown.replace("|", "\\|") + "`"


def _cell(metric: str, value: Any) -> str:
    if value is None:
        return "–"
    kind = check_kind(metric)
    return f"{value:.3f}" if kind == "ratio" else str(value) if kind == "count" else format_size(value)


PYTEST_ORDER = ("failed", "passed", "skipped", "xfailed", "xpassed", "error")


def counts_text(counts: dict[str, int]) -> str:
    """``1 failed, 2 passed, 1 error``: pytest's words, order and plurals, zero counts left out."""
    parts = []
    for word in PYTEST_ORDER:
        n = counts.get(word, 0)
        if n:
            parts.append(f"{n} {word}{'s' if word == 'error' and n > 1 else ''}")
    return ", ".join(parts) or "no tests ran"


def step_summary_markdown(outcomes: list[dict[str, Any]], errors: Iterable[dict[str, Any]] = (),
                          counts: dict[str, int] | None = None) -> str:
    """A Markdown table for ``$GITHUB_STEP_SUMMARY``: one row per check (measured vs limit), with its
    test; the heading counts tests as pytest does (``counts``), else checks."""
    errors = list(errors)
    failed = sum(1 for o in outcomes if o.get("passed") is False)
    broken = sum(1 for o in outcomes if o.get("error"))
    if counts is not None:
        head = f"### memgate: {counts_text(counts)} ({len(outcomes)} checks)\n\n"
    else:
        head = f"### memgate: {len(outcomes) - failed - broken} passed, {failed} failed, {broken} errors\n\n"
    rows = ["| result | test | rank | device | budget | metric | measured | limit |",
            "|---|---|---|---|---|---|---|---|"]
    order = {"error": 0, "FAIL": 1, "pass": 2}

    def result(o: dict[str, Any]) -> str:
        return "error" if o.get("error") else ("FAIL" if o.get("passed") is False else "pass")

    for o in sorted(outcomes, key=lambda o: (order[result(o)], str(o.get("test", "")), str(o.get("rank")),
                                               o["budget"], o["metric"])):
        icon = {"error": "⚠️ error", "FAIL": "❌ FAIL", "pass": "✅ pass"}[result(o)]
        test = md_code(o["test"]) if o.get("test") else "–"
        budget = "marker" if o.get("test") and o["budget"] == o["test"] else o["budget"]
        rows.append(f"| {icon} | {test} | {md_text(o.get('rank') or '–')} | {md_text(o.get('device') or '–')} | "
                    f"{md_text(budget)} | {md_code(o['metric'])} | {_cell(o['metric'], o.get('value'))} | "
                    f"{_cell(o['metric'], o.get('limit'))} |")
    for e in errors:
        rows.append(f"| ⚠️ error | {md_code(e.get('test') or e.get('item', '?'))} | – | – | – | – | – | – |")
    table = "\n".join(rows) + "\n"
    if errors:
        table += "\n" + "\n".join(f"- {md_code(e.get('test') or e.get('item', '?'))}: {md_text(e.get('error', ''))}"
                                    for e in errors) + "\n"
    return head + table


def benchmark_export(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """github-action-benchmark ``customSmallerIsBetter`` records, one per rank/device/metric."""
    records = []
    for entry in sorted(entries, key=lambda e: (e["rank"], e["path"])):
        for dev in entry["devices"]:
            for budget_key, spec in BUDGET_SPECS.items():
                metric_key = spec.key
                value = dev["metrics"].get(metric_key)
                if value is None:
                    continue
                records.append({
                    "name": f"rank {entry['rank']} {dev['device']} {budget_key}",
                    "unit": unit_of(budget_key),
                    "value": value,
                    "extra": f"{entry['format']} {entry['path']}",
                })
    return records

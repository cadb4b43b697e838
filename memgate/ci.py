"""CI outputs: GitHub annotations and step summary, github-action-benchmark export. Pure text."""

from __future__ import annotations

from typing import Any

from memgate.budgets import LIMITS
from memgate.sizes import format_size


def _escape_annotation(text: str) -> str:
    # GitHub workflow commands: %, CR and LF must be escaped in the message.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def github_annotations(outcomes: list[dict[str, Any]]) -> list[str]:
    """``::error`` lines for failed and erroring items (GitHub shows them on the run and the PR)."""
    lines = []
    for o in outcomes:
        if o.get("passed") is False or o.get("error"):
            title = f"memgate {o['budget']}::{o['metric']} (rank {o.get('rank', '?')})"
            lines.append(f"::error title={_escape_annotation(title).replace(',', '%2C').replace(':', '%3A')}::"
                         f"{_escape_annotation(o.get('error') or o['message'])}")
    return lines


def metric_kind(metric: str) -> str:
    """``"size"`` or ``"ratio"`` for an outcome's metric: a LIMITS budget key by its kind there,
    ``op_caps[glob]`` a size."""
    base = metric.split("[")[0]
    return LIMITS[base][1] if base in LIMITS else "size"


def unit_of(metric: str) -> str:
    """The unit word of a metric's values in JUnit properties and benchmark records."""
    return "ratio" if metric_kind(metric) == "ratio" else "bytes"


def _cell(metric: str, value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if metric_kind(metric) == "ratio" else format_size(value)


def step_summary_markdown(outcomes: list[dict[str, Any]]) -> str:
    """A Markdown table for ``$GITHUB_STEP_SUMMARY``: measured vs limit per rank."""
    failed = sum(1 for o in outcomes if o.get("passed") is False)
    errors = sum(1 for o in outcomes if o.get("error"))
    head = f"### memgate: {len(outcomes) - failed - errors} passed, {failed} failed, {errors} errors\n\n"
    rows = ["| result | rank | device | budget | metric | measured | limit |", "|---|---|---|---|---|---|---|"]
    order = {"error": 0, "FAIL": 1, "pass": 2}
    def result(o: dict[str, Any]) -> str:
        return "error" if o.get("error") else ("FAIL" if o.get("passed") is False else "pass")
    for o in sorted(outcomes, key=lambda o: (order[result(o)], str(o.get("rank")), o["budget"], o["metric"])):
        icon = {"error": "⚠️ error", "FAIL": "❌ FAIL", "pass": "✅ pass"}[result(o)]
        metric = o["metric"].replace("|", "\\|")
        rows.append(f"| {icon} | {o.get('rank', '?')} | {o.get('device') or '–'} | {o['budget']} | `{metric}` | "
                    f"{_cell(o['metric'], o.get('value'))} | {_cell(o['metric'], o.get('limit'))} |")
    return head + "\n".join(rows) + "\n"


def benchmark_export(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """github-action-benchmark ``customSmallerIsBetter`` records, one per rank/device/metric."""
    records = []
    for entry in sorted(entries, key=lambda e: (e["rank"], e["path"])):
        for dev in entry["devices"]:
            for budget_key, (metric_key, _) in LIMITS.items():
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

"""The JSON report (``--memgate-json``, ``memgate inspect --json``) and the text summary table."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memgate import __version__
from memgate.budgets import CROSS_RANK
from memgate.identity import profile_labels
from memgate.metric_specs import BUDGET_SPECS, OOM, keys_where
from memgate.metrics import DeviceMetrics
from memgate.model import ProfileInfo
from memgate.platforms import device_platform
from memgate.reconcile import series_consistency_sentence
from memgate.sizes import format_size
from memgate.verdict import Outcome, oom_sentence


def profile_entry(info: ProfileInfo, metrics: list[DeviceMetrics]) -> dict[str, Any]:
    """A profile's report entry; each device with its platform (:mod:`memgate.platforms`)."""
    return {**info.as_json(), "devices": [{**m.as_json(), "platform": device_platform(info.metadata, m.device).as_json()}
                                          for m in metrics]}


def outcome_entry(outcome: Outcome) -> dict[str, Any]:
    return {
        "profile": outcome.profile_path,
        "rank": outcome.rank,
        "budget": outcome.budget,
        "metric": outcome.metric,
        "limit": outcome.limit,
        "value": outcome.value,
        "passed": outcome.passed,
        "device": outcome.device,
        "message": outcome.message,
        **({"limit_share": outcome.share} if outcome.share is not None else {}),
    }


def build_report(
    profiles: Iterable[dict[str, Any]], outcomes: Iterable[dict[str, Any]], errors: Iterable[dict[str, Any]] = ()
) -> dict[str, Any]:
    return {
        "memgate_version": __version__,
        "profiles": list(profiles),
        "budgets": list(outcomes),
        "errors": list(errors),
    }


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write next to ``path`` and rename into place, so readers never see half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 would hide a CI artifact from its readers
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as fh:  # a non-UTF-8 path's byte: \udcff
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


def _cell(metric: str, value: Any) -> str:
    """A summary-table value of a budget key (``metric``): a ratio with 3 decimals, a count, else a size."""
    if value is None:
        return "-"
    if metric == OOM:
        return str(value)
    if metric == CROSS_RANK or (metric in BUDGET_SPECS and BUDGET_SPECS[metric].kind == "ratio"):
        return f"{value:.3f}"
    return format_size(value)


_METRIC_ORDER = {key: i for i, key in enumerate(BUDGET_SPECS)}


def outcome_order(outcome: dict[str, Any]) -> tuple[str, str, int, str]:
    """The order rows are listed in, by the CLI and by pytest alike: profile, budget, then the
    metrics in the order of the budget keys (op caps last, by glob)."""
    metric = str(outcome["metric"])
    return (str(outcome.get("profile", "")), str(outcome["budget"]), _METRIC_ORDER.get(metric, len(_METRIC_ORDER)),
            metric)


def result_word(outcome: dict[str, Any]) -> str:
    """pass, FAIL, error, or "not selected" (a budget whose devices glob selects none of the profile's)."""
    if outcome.get("skipped"):
        return "not selected"
    if outcome.get("error"):
        return "error"
    return "pass" if outcome["passed"] else "FAIL"


def outcome_labels(outcomes: list[dict[str, Any]]) -> dict[str, str]:
    """Each outcome's profile as the table shows it: as much of its path as tells it from the
    other profiles of the table (:func:`memgate.identity.profile_labels`)."""
    paths = sorted({str(o.get("profile", "")) for o in outcomes})
    return dict(zip(paths, profile_labels(paths)))


def profile_label(outcome: dict[str, Any], labels: dict[str, str]) -> str:
    return labels.get(str(outcome.get("profile", "")), str(outcome.get("profile", "?")))


def summary_table(outcomes: list[dict[str, Any]], names: dict[str, str] | None = None) -> list[str]:
    """Measured vs limit, one row per (profile, budget, metric), in :func:`outcome_order`; the
    profile last (its label's width varies most). ``names``: what a profile is called instead of its
    path (a marked test's recording: its kept copy, else the test)."""
    header = ("rank", "budget", "metric", "measured", "limit", "result", "profile")
    named = names or {}
    labels = {**outcome_labels([o for o in outcomes if str(o.get("profile", "")) not in named]), **named}
    rows = []
    for o in sorted(outcomes, key=outcome_order):
        rows.append((
            str(o.get("rank") or "-") + (f" {o['device']}" if o.get("device") else ""),  # "": nothing was loaded
            o["budget"],
            o["metric"],
            _cell(o["metric"].split("[")[0], o.get("value")),
            o["limit_text"] if o.get("limit_text") else _cell(o["metric"].split("[")[0], o["limit"])
            + (f" ({o['limit_share'] * 100:.6g}%)" if o.get("limit_share") is not None else ""),
            result_word(o),
            profile_label(o, labels),
        ))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*r).rstrip() for r in [header, tuple("-" * w for w in widths), *rows]]


# The rows of ``memgate inspect``: every single-number metric, the sizes first, then the ratios.
_SIZE_ROWS = keys_where(unit="bytes", shape="value")
_RATIO_ROWS = keys_where(unit="ratio")


def capacity_headroom(entry: dict[str, Any], dev: dict[str, Any]) -> tuple[int, int] | None:
    """The device's capacity as the profile records it, and what its peak (reserved, else allocated)
    leaves of it; None where the capacity or the peak is not known."""
    capacity = (entry.get("metadata", {}).get("device_capacity_bytes") or {}).get(dev["device"])
    m = dev["metrics"]
    peak = m.get("peak_reserved_bytes") if m.get("peak_reserved_bytes") is not None else m.get("peak_allocated_bytes")
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0 or peak is None:
        return None
    return capacity, capacity - int(peak)


def inspect_text(entry: dict[str, Any]) -> list[str]:
    """Human-readable metrics of one profile (``memgate inspect``)."""
    lines = [f"{entry['path']}  [{entry['format']}, rank {entry['rank']}]"]
    if isinstance(entry.get("metadata", {}).get("estimate"), dict):  # memgate.estimate's: said first, with its terms
        lines += [f"  estimate: {note}" for note in entry["metadata"].get("notes") or []]
    for dev in entry["devices"]:
        m = dev["metrics"]
        pool_of, notes = dev.get("pool_of", {}), dev.get("notes", {})
        lines.append(f"  {dev['device']}  series {dev['component'] or '-'}")
        headroom = capacity_headroom(entry, dev)
        if headroom is not None:
            capacity, room = headroom
            lines.append(f"    {'capacity':<24} {format_size(capacity)} ({capacity} B), headroom {format_size(room)} "
                         f"({room / capacity:.1%}) above the peak reserved")
        for key in (*_SIZE_ROWS, *_RATIO_ROWS):
            value = m.get(key)
            if value is None:
                shown = f"not measurable: {dev['not_measurable'].get(key, '-')}"
            elif key in _RATIO_ROWS:
                shown = f"{value:.4f}" + (f" (pool {pool_of[key]})" if key in pool_of else "")
            else:
                shown = f"{format_size(value)} ({value} B)"
            lines.append(f"    {key:<24} {shown}")
            if key in notes and value is not None:
                lines.append(f"    {'':<24} note: {notes[key]}")
        for name, pool in dev.get("pools", {}).items():
            frag = "-" if pool["fragmentation"] is None else f"{pool['fragmentation']:.4f}"
            lines.append(f"    pool {name}: peak allocated {format_size(pool['peak_allocated_bytes'])}, peak reserved "
                         f"{format_size(pool['peak_reserved_bytes'])}, fragmentation {frag}, external "
                         f"{pool['external_fragmentation']:.4f}"
                         + (", reserved before the window" if pool["reserved_before_window"] else ""))
        ops = sorted((m.get("op_max_block_bytes") or {}).items(), key=lambda kv: -kv[1])[:5]  # None: not measurable
        if ops:
            lines.append("    largest block per operator: " + ", ".join(f"{op} {format_size(v)}" for op, v in ops))
        owners = list((m.get("owner_bytes_at_peak") or {}).items())[:5]  # largest first
        if owners:
            lines.append("    owners at peak: " + ", ".join(f"{owner} {format_size(v)}" for owner, v in owners))
        categories = m.get("category_bytes_at_peak") or {}  # a tracked recording's
        if categories:
            lines.append("    categories at peak: " + ", ".join(f"{name} {format_size(v)} ({v} B)"
                                                              for name, v in categories.items()))
        for block in (m.get("top_at_peak") or [])[:5]:
            lines.append(f"    at peak: {format_size(block['size']):>12}  {block['op'] or block['owner'] or '(no op)'}"
                         + (f"  ({block['category']})" if block.get("category") else ""))
        if m.get("oom_count") is not None:
            lines.append(f"    {'oom_count':<24} {m['oom_count']}")
        for oom in m.get("ooms") or []:  # each out-of-memory error, then the blocks live at it
            lines.append(f"    {oom_sentence(oom, dev['device'])}")
            for block in (oom.get("holders") or [])[:5]:
                lines.append(f"    at the OOM: {format_size(block['size']):>12}  "
                             f"{block.get('op') or block.get('owner') or '(no op)'}"
                             + (f"  ({block['category']})" if block.get("category") else ""))
        reconciliation = dev["reconciliation"]
        for name, facts in reconciliation["components"].items():
            if facts["consistency"] is not None:
                lines.append(
                    f"    reconciled {name}: baseline {format_size(facts['baseline_bytes'])}, "
                    f"{facts['consistency']:.1%} of {facts['checked_blocks']} blocks agree on it"
                )
        for name, across in (reconciliation.get("consistency") or {}).items():
            lines.append(f"    {series_consistency_sentence(name, across)}")
    return lines

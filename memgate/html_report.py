"""One self-contained HTML page for a CI artifact: curves, steps, budgets, peak holders, metrics.

The page opens offline: CSS and SVG are inline, there is no script, no font, no image and no
URL of any kind (text that contains ``://`` is written with an entity so even a profile path that
looks like a URL is not one in the file). Curves are downsampled for drawing only (LTTB over the
change points of the step-shaped series, :mod:`memgate.lttb`); every number printed — peak,
budgets, holders, metrics — comes from the report entries, exact, never from the kept points.

The chart's data is :mod:`memgate.chart_data` (shared with :mod:`memgate.plot`, which draws the
same picture with matplotlib), its SVG :mod:`memgate.html_chart`; this module lays out the page
and its tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from memgate import __version__
from memgate.budgets import CROSS_RANK
from memgate.chart_data import budget_lines, device_curves, step_spans
from memgate.html_chart import chart
from memgate.html_text import escape as _e  # short: the markup calls it on every value
from memgate.html_text import exact_text, size_text, when_html
from memgate.metric_specs import BUDGET_SPECS, OOM, OOM_KEY, SPEC_OF, SPECS, keys_where
from memgate.model import DeviceModel, Profile
from memgate.reconcile import series_consistency_sentence
from memgate.sizes import format_size


def _find_device(profile: Profile | None, device: str) -> DeviceModel | None:
    if profile is None:
        return None
    return next((d for d in profile.devices if d.device == device), None)


# Budget keys and metric keys (they differ by ``_bytes``) whose values are ratios.
RATIO_METRICS = frozenset(k for budget_key, spec in BUDGET_SPECS.items() if spec.kind == "ratio"
                          for k in (budget_key, spec.key))


def _is_ratio(metric: str) -> bool:
    """A ratio check: a ratio metric, or a ``rank_imbalance[...]`` (1 − min/max over ranks, whatever it compares)."""
    return metric in RATIO_METRICS or metric.startswith(f"{CROSS_RANK}[")


def _metric_text(metric: str, value: float | None) -> str:
    if value is None:
        return "-"
    if _is_ratio(metric):
        return f"{value:.4f} ({value:.2%})"
    if metric in (OOM, OOM_KEY):  # a count of out-of-memory errors
        return str(value)
    return format_size(value)


# ---- what every figure means (tooltips and notes) -------------------------------------------

# Each metric's tooltip on the page.
METRIC_HELP = {spec.key: spec.description for spec in SPECS}
CONSISTENCY_NOTE = ("consistency: the share of the checked allocations (those the writer recorded an allocator "
                    "total for) at which that total equals the pre-window baseline plus the bytes of the blocks live "
                    "then; below 100% the totals count memory the block rows do not show (or the reverse), so a curve "
                    "rebuilt from blocks alone is approximate — the peaks above come from the recorded series")
SUM_CHECK_HELP = "a combined series (PTA+GE) checked row by row against the sum of its parts (PTA + GE)"
SERIES_CONSISTENCY_HELP = ("the blocks of a component against the series of the same name in another file: the "
                           "share of the blocks' time window the series covers, and how many blocks' recorded totals "
                           "equal a sample of the series at their allocation time (all of them when both files tell "
                           "of the same allocations)")
COLUMN_HELP = {
    # budgets
    "rank": "the rank (process) the profile belongs to; the link goes to the profile",
    "device": "the device whose value decided the verdict (a profile's value is its worst device)",
    "budget": "the budget's name in the budget file, or the test's marker",
    "metric": "the budget key judged (op_caps[glob]: the largest block of the operators matching glob)",
    "measured": "the profile's value (exact on hover)",
    "limit": "the budget's limit (exact on hover); a check passes when measured ≤ limit",
    "headroom": "limit − measured: room left before the check fails (negative: over by that much)",
    "result": "pass, FAIL, error (the value could not be measured: see the message) or not selected (the "
              "budget's devices select none of the profile's)",
    "message": "the verdict line, as pytest and memgate check print it",
    "test or profile": "the marked test (its node id) or the profile compared with its baseline",
    "baseline": "the value the baseline or saved run recorded (exact on hover)",
    "change": "measured − baseline, and as a share of the baseline",
    "allowed": "the largest value the compare rule lets pass against the baseline (exact on hover)",
    "baseline file": "the baseline file or saved run compared with",
    "test": "the test memgate_record recorded (its node id)",
    "left allocated": "device memory allocated in the test's recording and still allocated when its body ended",
    "blocks left": "how many blocks it left allocated",
    "largest": "the largest block it left, and what allocated it",
    # metrics
    "value": "the value, in IEC units or as a ratio and a percentage",
    "exact": "the exact value: bytes, or the ratio at full precision",
    "pool": "the allocator pool a per-pool metric comes from (its worst pool)",
    "note": "how to read the value, or why it could not be measured",
    # pools
    "peak allocated": "the pool's highest allocated bytes",
    "peak reserved": "the pool's highest reserved bytes",
    "fragmentation": "the pool's 1 − peak allocated ÷ peak reserved",
    "external fragmentation": "the pool's largest free share just before its reserved grew",
    "reserved at its peak from the first sample": "yes: the pool reserved its maximum before the window began, so "
                                                  "its fragmentation reflects memory reserved before profiling",
    # holders and operators
    "#": "rank of the block by size among the blocks live at the peak",
    "size": "the block's size (exact on hover)",
    "bytes": "the exact size in bytes",
    "op": "the operator that allocated the block",
    "stream": "the stream the block was allocated on",
    "owner": "the module, Python frame or owner tag that holds it, where the writer records one",
    "component": "the allocator (series) the block belongs to",
    "allocated at": "when the block was allocated, relative to the profile start (absolute time on hover)",
    "largest block": "the operator's largest block (exact on hover)",
    "live at the peak": "bytes of its blocks live at the device's peak allocated (exact on hover)",
    "category": "what holds the block, by address and lifetime: parameters, buffers, gradients, optimizer_state "
                "(storages the recording tracked), activations (else allocated inside a step), other",
    "share": "its share of the bytes live at the peak",
    # reconciliation
    "blocks": "block rows of this allocator in the window",
    "allocated before window": "blocks freed in the window but allocated before it began",
    "open at end": "blocks still live when the window ended",
    "pre-window baseline": "allocator bytes at the window start that no block row accounts for (exact on hover)",
    "baseline bytes": "the pre-window baseline in bytes",
    "consistency": CONSISTENCY_NOTE,
    "checked": "allocations with a recorded allocator total, checked against the baseline",
    # errors
    "profile": "the profile that could not be read",
    "error": "what was wrong, where",
}


# ---- tables ------------------------------------------------------------------------------------


def _table(head: Sequence[str], rows: Iterable[str], cls: str = "") -> str:
    """A table whose every column heading explains its figures on hover (:data:`COLUMN_HELP`)."""
    body = "".join(rows)
    return (f'<table class="{cls}"><thead><tr>'
            + "".join(f'<th title="{_e(COLUMN_HELP[h])}">{_e(h)}</th>' for h in head)
            + f"</tr></thead><tbody>{body}</tbody></table>")


def _size_cell(value: float | None) -> str:
    if value is None:
        return "<td>-</td>"
    return f'<td class="num" title="{_e(exact_text(value))}">{_e(size_text(value))}</td>'


def _share_text(share: float) -> str:
    return f"{share * 100:.6g}%"


def _limit_text(o: dict[str, Any], capacities: dict[tuple[str, str], int]) -> str:
    """The limit cell: the limit, and for a share of the device's capacity ``75% of 2.00 GiB``."""
    metric, limit = str(o.get("metric", "")), o.get("limit")
    if o.get("limit_text"):
        return str(o["limit_text"])  # a share whose capacity could not be resolved
    text = _metric_text(metric, limit)
    share = o.get("limit_share")
    if share is not None and limit is not None:
        capacity = capacities.get((str(o.get("profile")), str(o.get("device"))))
        if capacity is None and share > 0:
            capacity = round(limit / share)
        text += f" ({_share_text(share)} of {format_size(capacity)})" if capacity else f" ({_share_text(share)})"
    return text


def _measured_text(o: dict[str, Any]) -> str:
    """The measured cell; for a rank_imbalance the worst and the best rank (with their values) named."""
    metric = str(o.get("metric", ""))
    text = _metric_text(metric, o.get("value"))
    if metric.startswith(f"{CROSS_RANK}[") and o.get("worst_rank") is not None:
        inner = metric[len(CROSS_RANK) + 1:-1]
        parts = []
        for which in ("worst", "best"):
            value = o.get(f"{which}_value")
            shown = "" if value is None else " " + _metric_text(inner, value)
            parts.append(f"{which} rank {o.get(f'{which}_rank')}{shown}")
        text += " — " + ", ".join(parts)
    return text


def _capacities(entries: Iterable[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """(profile path, device) → the capacity in bytes the profile records (metadata ``device_capacity_bytes``)."""
    out = {}
    for e in entries:
        recorded = (e.get("metadata") or {}).get("device_capacity_bytes")
        if isinstance(recorded, dict):
            for device, cap in recorded.items():
                if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
                    out[(str(e.get("path")), str(device))] = cap
    return out


def _budget_rows(outcomes: list[dict[str, Any]], anchors: dict[str, str],
                 capacities: dict[tuple[str, str], int] | None = None) -> list[str]:
    rows = []
    for o in outcomes:
        metric = str(o.get("metric", ""))
        value, limit = o.get("value"), o.get("limit")
        if o.get("skipped"):
            result, cls = "not selected", "skipped"
        elif o.get("error") or o.get("passed") is None:
            result, cls = "error", "error"
        else:
            result, cls = ("pass", "pass") if o["passed"] else ("FAIL", "fail")
        headroom = "-"
        if o.get("limit_text"):
            pass  # the share's capacity is unknown: no limit to measure room against
        elif value is not None and limit is not None and metric == OOM:
            headroom = str(limit - value)
        elif value is not None and limit is not None and not _is_ratio(metric):
            headroom = format_size(limit - value)
        elif value is not None and limit is not None:
            headroom = f"{limit - value:+.4f}"
        anchor = anchors.get(str(o.get("profile")))
        rank = _e(o.get("rank") or "-")  # "": nothing was loaded
        rank_cell = f'<a href="#{anchor}">{rank}</a>' if anchor else rank
        rows.append(
            f'<tr class="{cls}"><td>{rank_cell}</td><td>{_e(o.get("device") or "-")}</td><td>{_e(o.get("budget"))}</td>'
            f"<td>{_e(metric)}</td>"
            f'<td class="num" title="{_e(exact_text(value))}">{_e(_measured_text(o))}</td>'
            f'<td class="num" title="{_e(exact_text(limit))}">{_e(_limit_text(o, capacities or {}))}</td>'
            f'<td class="num">{_e(headroom)}</td><td class="result">{result}</td>'
            f'<td class="msg">{_e(o.get("error") or o.get("skipped") or o.get("message") or "")}</td></tr>'
        )
    return rows


def _comparison_rows(compared: list[dict[str, Any]]) -> list[str]:
    """A row per comparison with a baseline: the value, the baseline's, the change, the allowed value, the verdict."""
    rows = []
    for o in compared:
        metric, value, base = str(o.get("metric", "")), o.get("value"), o.get("baseline_value")
        change = "-"
        if value is not None and base is not None:
            delta = value - base
            change = (("+" if delta >= 0 else "") + (_metric_text(metric, delta) if not _is_ratio(metric)
                                                      else f"{delta:.4f}")
                      + (f" ({delta / base * 100:+.1f}%)" if base else ""))
        result, cls = ("error", "error") if o.get("passed") is None else (
            ("pass", "pass") if o["passed"] else ("FAIL", "fail"))
        rows.append(
            f'<tr class="{cls}"><td class="path">{_e(o.get("test") or o.get("profile"))}</td>'
            f'<td>{_e(o.get("rank") or "-")}</td><td>{_e(o.get("device") or "-")}</td><td>{_e(metric)}</td>'
            f'<td class="num" title="{_e(exact_text(value))}">{_e(_metric_text(metric, value))}</td>'
            f'<td class="num" title="{_e(exact_text(base))}">{_e(_metric_text(metric, base))}</td>'
            f'<td class="num">{_e(change)}</td>'
            f'<td class="num" title="{_e(exact_text(o.get("limit")))}">{_e(_metric_text(metric, o.get("limit")))}</td>'
            f'<td class="result">{result}</td><td class="path">{_e(o.get("baseline"))}</td></tr>')
    return rows


def _left_rows(left: list[dict[str, Any]]) -> list[str]:
    """A row per (recorded test, device): what it left allocated when its body ended, largest first."""
    rows = []
    for e in sorted(left, key=lambda e: (-(e.get("bytes") or 0), str(e.get("test")), str(e.get("device")))):
        largest = e.get("largest") or {}
        size = e.get("bytes")
        rows.append(
            f'<tr class="{"fail" if size else "pass"}"><td class="path">{_e(e.get("test"))}</td>'
            f'<td>{_e(e.get("device"))}</td>'
            f'<td class="num" title="{_e(exact_text(size))}">{_e(format_size(size) if size is not None else "not measurable")}</td>'
            f'<td class="num">{_e(e.get("count"))}</td>'
            f'<td>{_e((format_size(largest["size"]) + " " + str(largest.get("what") or "")) if largest.get("size") else "-")}'
            "</td></tr>")
    return rows


# Every budgeted metric, in the budget keys' order; the snapshot pool state only where a snapshot recorded it.
_METRIC_ROWS = tuple(spec.key for spec in BUDGET_SPECS.values())
_DUMP_ROWS = keys_where(source="pool at the dump")
SNAPSHOT_FORMATS = frozenset({"torch_snapshot"})  # a recording's CPU device has no pool at the dump: no rows


def _metrics_table(device_entry: dict[str, Any], profile_format: str | None = None, t0: int | None = None) -> str:
    metrics = device_entry.get("metrics", {})
    missing = device_entry.get("not_measurable", {})
    pool_of = device_entry.get("pool_of") or {}
    notes = device_entry.get("notes") or {}
    snapshot = profile_format in SNAPSHOT_FORMATS or any(metrics.get(k) is not None for k in _DUMP_ROWS)
    rows = []
    for key in _METRIC_ROWS:
        if key in _DUMP_ROWS and not snapshot:
            continue
        value = metrics.get(key)
        if key in RATIO_METRICS:
            shown, exact = _metric_text(key, value), ("-" if value is None else repr(value))
        else:
            shown = size_text(value) + (" / step" if SPEC_OF[key].per_step and value is not None else "")
            exact = exact_text(value)
        pool = pool_of.get(key) if value is not None else None
        note = notes.get(key, "") if value is not None else "not measurable: " + missing.get(key, "no data")
        rows.append(f'<tr><td title="{_e(METRIC_HELP[key])}">{_e(key)}</td><td class="num">{_e(shown)}</td>'
                    f'<td class="num exact">{_e(exact)}</td>'
                    f'<td class="pool">{_e(pool or "")}</td><td class="note">{_e(note)}</td></tr>')
    ops = metrics.get("op_max_block_bytes") or {}
    note = missing.get("op_max_block_bytes", "")
    rows.append(f'<tr><td title="{_e(METRIC_HELP["op_max_block_bytes"])}">op_max_block_bytes</td>'
                f'<td class="num">{len(ops)} ops</td><td></td><td></td>'
                f'<td class="note">{_e("not measurable: " + note if note else "")}</td></tr>')
    where = []
    if device_entry.get("peak_t_ns") is not None:
        where.append("peak at " + when_html(int(device_entry["peak_t_ns"]), t0) + (" after the profile start" if t0 is not None else ""))
    if device_entry.get("peak_step") is not None:
        where.append(f"step {_e(device_entry['peak_step'])}")
    caption = f"series {_e(device_entry.get('component') or '-')}" + (f"; {', '.join(where)}" if where else "")
    facts = []
    if device_entry.get("window_relative"):
        carried = device_entry.get("carried_over_bytes")
        facts.append(f"window-relative totals (memory allocated before profiling started is not in them): "
                     f"carried_over_bytes = {carried} B ({format_size(carried or 0)}), left out of peak_allocated_bytes")
    return (f'<h4>Metrics</h4><p class="caption">{caption}</p>'
            + _table(("metric", "value", "exact", "pool", "note"), rows, "metrics")
            + "".join(f'<p class="fact">{_e(f)}</p>' for f in facts)
            + _pools_table(device_entry))


def _pools_table(device_entry: dict[str, Any]) -> str:
    """Each allocator pool's own figures: what fragmentation and external_fragmentation are judged on."""
    pools = device_entry.get("pools") or {}
    if not pools:
        return ""
    rows = []
    for name, pool in sorted(pools.items()):
        frag, external = pool.get("fragmentation"), pool.get("external_fragmentation")
        rows.append(
            f"<tr><td>{_e(name)}</td>{_size_cell(pool.get('peak_allocated_bytes'))}"
            f"{_size_cell(pool.get('peak_reserved_bytes'))}"
            f'<td class="num" title="{_e(repr(frag))}">{_e(_metric_text("fragmentation", frag))}</td>'
            f'<td class="num" title="{_e(repr(external))}">{_e(_metric_text("external_fragmentation", external))}</td>'
            f"<td>{'yes' if pool.get('reserved_before_window') else 'no'}</td></tr>"
        )
    return ("<h4>Allocator pools</h4>"
            + _table(("pool", "peak allocated", "peak reserved", "fragmentation", "external fragmentation",
                      "reserved at its peak from the first sample"), rows, "pools"))


HTML_HOLDERS = 10  # rows of the holders table


def _holders_table(device_entry: dict[str, Any], t0: int | None) -> str:
    holders = (device_entry.get("metrics", {}) or {}).get("top_at_peak") or []
    if not holders:
        return '<h4>Top holders at the peak</h4><p class="note">no per-block data at the peak</p>'
    rows = []
    categorized = any("category" in b for b in holders)  # a tracked recording's holders name their category
    for i, b in enumerate(holders[:HTML_HOLDERS], 1):  # the report keeps more, for -v in the terminal
        at = "before the window" if b.get("t_alloc") is None else when_html(int(b["t_alloc"]), t0)
        category = f'<td>{_e(b.get("category") or "-")}</td>' if categorized else ""
        rows.append(
            f'<tr><td class="num">{i}</td>{_size_cell(b.get("size"))}<td class="num exact">{_e(b.get("size"))}</td>'
            f'<td class="op">{_e(b.get("op") or "-")}</td><td>{_e(b.get("stream") or "-")}</td>'
            f'<td class="owner">{_e(b.get("owner") or "-")}</td>{category}<td>{_e(b.get("component") or "-")}</td>'
            f"<td>{at}</td></tr>"
        )
    head = ("#", "size", "bytes", "op", "stream", "owner", *(("category",) if categorized else ()), "component",
            "allocated at")
    return "<h4>Top holders at the peak</h4>" + _table(head, rows, "holders")


def _ops_table(device_entry: dict[str, Any], n: int = 10) -> str:
    ops = (device_entry.get("metrics", {}) or {}).get("op_max_block_bytes") or {}
    if not ops:
        return ""
    top = sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    rows = [f'<tr><td class="op">{_e(op)}</td>{_size_cell(size)}<td class="num exact">{size}</td></tr>'
            for op, size in top]
    return (f"<h4>Largest block per operator (top {len(top)} of {len(ops)})</h4>"
            + _table(("op", "largest block", "bytes"), rows, "ops"))


def _at_peak_table(device_entry: dict[str, Any], key: str, what: str, n: int = 10) -> str:
    """The bytes live at the peak per owner (``owner_bytes_at_peak``) or per operator (``op_bytes_at_peak``)."""
    named = (device_entry.get("metrics", {}) or {}).get(key) or {}
    if not isinstance(named, dict) or not named:
        return ""
    top = sorted(named.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    rows = [f'<tr><td class="{what}">{_e(name)}</td>{_size_cell(size)}<td class="num exact">{_e(size)}</td></tr>'
            for name, size in top]
    title = "Owners at the peak" if what == "owner" else "Operators at the peak"
    return (f"<h4>{title} (top {len(top)} of {len(named)})</h4>"
            + _table((what, "live at the peak", "bytes"), rows, f"{what}s-at-peak"))


def _categories_table(device_entry: dict[str, Any]) -> str:
    """The bytes live at the peak per category (``category_bytes_at_peak``, a tracked recording's), in
    their own order, with their share of the blocks live then."""
    categories = (device_entry.get("metrics", {}) or {}).get("category_bytes_at_peak") or {}
    if not isinstance(categories, dict) or not categories:
        return ""
    total = sum(categories.values())
    rows = [f'<tr><td class="category">{_e(name)}</td>{_size_cell(size)}<td class="num exact">{_e(size)}</td>'
            f'<td class="num">{f"{size / total:.1%}" if total else "-"}</td></tr>' for name, size in categories.items()]
    return ("<h4>Categories at the peak</h4>"
            + _table(("category", "live at the peak", "bytes", "share"), rows, "categories-at-peak"))


def _capacity_note(entry: dict[str, Any], device_entry: dict[str, Any]) -> str:
    """The device's recorded capacity and the room left above its peak (reserved, else allocated)."""
    recorded = ((entry.get("metadata") or {}).get("device_capacity_bytes") or {})
    capacity = recorded.get(str(device_entry.get("device"))) if isinstance(recorded, dict) else None
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
        return ""
    metrics = device_entry.get("metrics", {}) or {}
    for key, word in (("peak_reserved_bytes", "peak reserved"), ("peak_allocated_bytes", "peak allocated")):
        peak = metrics.get(key)
        if isinstance(peak, (int, float)) and not isinstance(peak, bool):
            room = capacity - peak
            return (f'<p class="capacity">device capacity <span title="{_e(exact_text(capacity))}">{_e(format_size(capacity))}'
                    f"</span>; headroom above the {word}: <span title=\"{_e(exact_text(room))}\">{_e(format_size(room))}"
                    f"</span> ({_e(f'{room / capacity:.2%}')} of the capacity)</p>")
    return (f'<p class="capacity">device capacity <span title="{_e(exact_text(capacity))}">{_e(format_size(capacity))}'
            "</span>; no peak measured</p>")


def _reconciliation(device_entry: dict[str, Any]) -> str:
    rec = device_entry.get("reconciliation") or {}
    comps = rec.get("components") or {}
    parts = ["<h4>Reconciliation</h4>"]
    if comps:
        rows = []
        for name, f in comps.items():
            consistency = f.get("consistency")
            rows.append(
                f"<tr><td>{_e(name)}</td><td class=\"num\">{_e(f.get('blocks'))}</td>"
                f"<td class=\"num\">{_e(f.get('pre_window_blocks'))}</td><td class=\"num\">{_e(f.get('open_blocks'))}</td>"
                f"{_size_cell(f.get('baseline_bytes'))}<td class=\"num exact\">{_e(f.get('baseline_bytes'))}</td>"
                f"<td class=\"num\" title=\"{_e(COLUMN_HELP['consistency'])}\">"
                f"{'-' if consistency is None else f'{consistency:.2%}'}</td>"
                f"<td class=\"num\">{_e(f.get('checked_blocks'))}</td></tr>"
            )
        parts.append(_table(("component", "blocks", "allocated before window", "open at end", "pre-window baseline",
                             "baseline bytes", "consistency", "checked"), rows, "recon"))
        parts.append(f'<p class="note">{_e(CONSISTENCY_NOTE)}</p>')
    else:
        parts.append('<p class="note">no per-block data to reconcile</p>')
    for name, across in (rec.get("consistency") or {}).items():
        parts.append(f'<p class="fact" title="{_e(SERIES_CONSISTENCY_HELP)}">'
                     f"{_e(series_consistency_sentence(name, across))}</p>")
    for total, share in (rec.get("sum_checks") or {}).items():
        parts.append(f'<p class="fact" title="{_e(SUM_CHECK_HELP)}">{_e(total)} equals the sum of its parts on '
                     f"{share:.2%} of its rows</p>")
    return "".join(parts)


# ---- the page ----------------------------------------------------------------------------------

_CSS = """
:root{--fg:#1d232b;--muted:#5b6470;--line:#d9dee5;--red:#d62728;--green:#1e8a3c;--bg:#fff}
*{box-sizing:border-box}
body{margin:0;padding:24px 32px;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--fg);background:var(--bg)}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-bottom:2px solid var(--line);padding-bottom:4px}
h3{font-size:16px;margin:20px 0 6px}h4{font-size:14px;margin:16px 0 6px}
.status{display:inline-block;padding:3px 10px;border-radius:4px;font-weight:600;color:#fff}
.status.ok{background:var(--green)}.status.bad{background:var(--red)}.status.none{background:var(--muted)}
.meta,.caption,.note,.path{color:var(--muted)}.path{font-family:ui-monospace,Menlo,Consolas,monospace;word-break:break-all}
table{border-collapse:collapse;margin:4px 0 10px;font-size:13px}
th,td{border:1px solid var(--line);padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f8;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.exact{color:var(--muted);font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
td.op{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
td.owner{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11px;white-space:pre-wrap;max-width:420px;word-break:break-all}
td.note{color:var(--muted);max-width:460px}td.msg{max-width:520px}
tr.fail td{background:#fdecec}tr.fail td.result{color:var(--red);font-weight:700}
tr.pass td.result{color:var(--green);font-weight:600}tr.error td.result{color:#a15c00;font-weight:700}
tr.skipped td{color:var(--muted)}th[title],td[title],.key[title]{cursor:help}
.legend{display:flex;flex-wrap:wrap;gap:6px 18px;margin:6px 0}
.key{display:inline-flex;align-items:center;gap:6px}.key small{color:var(--muted)}
.key i{display:inline-block;width:18px;height:3px}.key i.dash{height:0;border-top:2px dashed}
.device{border:1px solid var(--line);border-radius:6px;padding:8px 16px 12px;margin:12px 0}
.cols{display:flex;flex-wrap:wrap;gap:0 32px}.cols>div{min-width:420px}
svg.chart{display:block;max-width:100%;height:auto;font:12px system-ui,-apple-system,"Segoe UI",Roboto,Arial,sans-serif}
svg .plot{fill:#fff;stroke:var(--line)}svg .band0{fill:#e8eef7}svg .band1{fill:#f3f6fb}
svg .grid{stroke:#e6e9ee}svg .axis{stroke:#8a929c}
svg .ylabel{text-anchor:end;fill:var(--muted)}svg .xlabel{text-anchor:middle;fill:var(--muted)}
svg .xtitle{text-anchor:middle;fill:var(--muted)}svg .steplabel{text-anchor:middle;fill:#3b4b63;font-weight:600}
svg .curve{fill:none;stroke-width:1.6;stroke-linejoin:round}
svg .budgetline{stroke-width:1.6;stroke-dasharray:7 4}
svg .budgetlabel,svg .peaklabel,svg .steplabel{paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
svg .budgetlabel{text-anchor:start;font-weight:600;font-size:11px}svg .leader{stroke-width:1;opacity:.6}
svg .peak circle{fill:var(--red);stroke:#fff;stroke-width:1.5}svg .peakline{stroke:var(--red);stroke-dasharray:2 3}
svg .peaklabel{fill:var(--red);font-weight:700}svg .peaklabel .exact{font-weight:400}
nav ul{margin:4px 0;padding-left:20px}
"""


def render_html(
    entries: list[dict[str, Any]],
    outcomes: list[dict[str, Any]],
    profiles: list[Profile] | None = None,
    *,
    max_points: int = 2000,
    errors: list[dict[str, Any]] | None = None,
    left: list[dict[str, Any]] | None = None,
    title: str = "memgate report",
) -> str:
    """The whole page as a string.

    ``entries``: :func:`memgate.report.profile_entry` dicts; ``outcomes``: budget outcome dicts
    (:meth:`memgate.rows.CheckRow.as_json`: verdicts and the error rows of :meth:`memgate.rows.CheckRow.unjudged`);
    ``profiles``: the normalized profiles, matched to entries by ``path``, for the curves (without
    them the page has every table but no chart); ``max_points``: samples drawn per curve at most
    (+1 for the peak); ``errors``: profiles that failed to load (``{"profile", "error"}``); ``left``:
    what each recorded test left allocated (:meth:`memgate.leftover.LeftOn.summary`).
    """
    by_path = {p.path: p for p in profiles or []}
    anchors = {str(e.get("path")): f"p{i}" for i, e in enumerate(entries)}
    skipped = [o for o in outcomes if o.get("skipped")]
    checks = [o for o in outcomes if not o.get("skipped")]
    judged = [o for o in checks if o.get("passed") is not None and not o.get("error")]
    failed = sum(1 for o in judged if not o["passed"])
    broken = len(checks) - len(judged) + len(errors or [])
    aside = f", {len(skipped)} not selected" if skipped else ""
    if failed or broken:
        status = (f'<span class="status bad">{failed} of {len(checks)} budget checks failed'
                  + (f", {broken} error(s)" if broken else "") + aside + "</span>")
    elif checks:
        status = f'<span class="status ok">all {len(checks)} budget checks passed{aside}</span>'
    else:
        status = '<span class="status none">no budgets judged</span>'
    out = [
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1><p>{status}</p>",
        (f'<p class="meta">memgate {_e(__version__)} · {len(entries)} profile(s) · every number is exact '
         "(hover a value for its bytes); curves are downsampled for drawing only</p>"),
    ]
    out.append("<h2>Budgets</h2>")
    if outcomes:
        out.append(_table(("rank", "device", "budget", "metric", "measured", "limit", "headroom", "result", "message"),
                          _budget_rows(outcomes, anchors, _capacities(entries)), "budgets"))
    else:
        out.append('<p class="note">no budget was judged (run memgate check or pytest --memgate with budgets)</p>')
    compared = [o for o in outcomes if "baseline_value" in o]
    if compared:
        out.append("<h2>Comparisons</h2>")
        out.append(_table(("test or profile", "rank", "device", "metric", "measured", "baseline", "change", "allowed",
                           "result", "baseline file"), _comparison_rows(compared), "comparisons"))
    if left:
        out.append("<h2>Memory left allocated by tests</h2>")
        out.append(_table(("test", "device", "left allocated", "blocks left", "largest"), _left_rows(left), "left"))
    if errors:
        out.append("<h2>Profiles that could not be read</h2>")
        out.append(_table(("profile", "error"), (f"<tr><td class=\"path\">{_e(x.get('profile'))}</td>"
                                                  f"<td>{_e(x.get('error'))}</td></tr>" for x in errors), "errors"))
    if len(entries) > 1:
        out.append("<nav><h2>Profiles</h2><ul>" + "".join(
            f'<li><a href="#p{i}">rank {_e(e.get("rank"))}</a> <span class="path">{_e(e.get("path"))}</span></li>'
            for i, e in enumerate(entries)) + "</ul></nav>")
    for i, entry in enumerate(entries):
        out.append(_profile_section(i, entry, outcomes, by_path.get(str(entry.get("path"))), profiles is not None,
                                    max_points))
    out.append("</body></html>\n")
    return "".join(out)


def _profile_section(i: int, entry: dict[str, Any], outcomes: list[dict[str, Any]], profile: Profile | None,
                     profiles_given: bool, max_points: int) -> str:
    meta = entry.get("metadata") or {}
    steps = entry.get("steps") or []
    out = [f'<section class="profile" id="p{i}"><h2>rank {_e(entry.get("rank"))} · {_e(entry.get("format"))}</h2>',
           f'<p class="path">{_e(entry.get("path"))}</p>']
    facts = [f"{_e(k)} = {_e(v)}" for k, v in meta.items()]
    numbers = [str(s["step"]) for s in steps if s.get("step") is not None]
    facts.append(f"{len(steps)} step(s)" + (f": {_e(', '.join(numbers[:12]))}{' …' if len(numbers) > 12 else ''}"
                                             if numbers else ""))
    out.append(f'<p class="meta">{" · ".join(facts)}</p>')
    spans = step_spans(entry)
    for j, dev in enumerate(entry.get("devices") or []):
        name = str(dev.get("device"))
        out.append(f'<section class="device" id="p{i}-d{j}"><h3>{_e(name)} <small class="meta">series '
                   f'{_e(dev.get("component") or "-")} from <span class="path">{_e(dev.get("source") or "-")}'
                   "</span></small></h3>")
        out.append(_capacity_note(entry, dev))
        model = _find_device(profile, name)
        t0: int | None = None
        if model is not None:
            curves = device_curves(model, dev)
            svg, legend = chart(curves, spans, budget_lines(entry, dev, outcomes), dev, max_points)
            if svg:
                t0 = min(int(c.t_ns[0]) for c in curves if len(c.t_ns))
                out.append(f'<div class="legend">{"".join(legend)}</div>{svg}')
            else:
                out.append('<p class="note">no memory series on this device to draw</p>')
        else:
            out.append('<p class="note">' + ("the normalized profile was not given: no curves"
                                             if not profiles_given else "no curves for this device") + "</p>")
        out.append(f'<div class="cols"><div>{_metrics_table(dev, entry.get("format"), t0)}{_reconciliation(dev)}</div>'
                   f"<div>{_categories_table(dev)}{_holders_table(dev, t0)}{_ops_table(dev)}"
                   f'{_at_peak_table(dev, "owner_bytes_at_peak", "owner")}{_at_peak_table(dev, "op_bytes_at_peak", "op")}'
                   "</div></div></section>")
    out.append("</section>")
    return "".join(out)

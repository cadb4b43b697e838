"""Comparing a run with an earlier one: regression rules and diffs. Pure.

Comparison rules read ``peak_allocated:5%``, ``peak_allocated:+256MiB`` or
``peak_allocated:2.5%+256MiB`` (the last fails only when both the relative and the absolute growth
are exceeded); the earlier run is a baseline (:mod:`memgate.baselines`), a saved run or a JSON report.

Every budget key of :data:`memgate.budgets.LIMITS` is compared and diffed; its kind there ("size"
or "ratio") decides how it prints: sizes in IEC units, ratios with 3 decimals. A baseline saved
before a metric existed lacks its key: that metric is left out of the comparison (a rule that asks
for it says so), every other key still compares.

A regression names its cause: per device the baseline keeps the bytes live at the peak per
operator and per owner (and per category, of a recording that tracked its model and optimizer), and
the git commit it was saved at; :attr:`Regression.detail` lists the categories, operators and owners
whose bytes at the peak grew most, and that commit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from memgate.baselines import baseline_entries, comparable_key, pair_entries
from memgate.budgets import LIMITS
from memgate.errors import ConfigError, printable, show
from memgate.identity import is_test_id, pair_devices, profile_labels
from memgate.metric_specs import BUDGET_SPECS
from memgate.platforms import entry_platform
from memgate.sizes import format_size, parse_size

RATIO_DECIMALS = 3
# A percentage of at most 6 digits before the point (and 6 after): past 999999% a rule allows what no run
# can reach; a ratio likewise (its limit past 1 never fails).
_RULE = re.compile(r"\A(?P<metric>[a-z_]+):(?:(?P<pct>[0-9]{1,6}(?:\.[0-9]{1,6})?)%)?(?:\+(?P<abs>[^%]+))?\Z")
_RATIO_TEXT = re.compile(r"\A\s*[0-9]{1,6}(?:\.[0-9]{1,12})?\s*\Z")


def metric_kind(budget_key: str) -> str:
    """``"size"`` or ``"ratio"``: how a budget key's values are measured, printed and limited."""
    return BUDGET_SPECS[budget_key].kind


def format_metric(kind: str, value: float) -> str:
    """A value as reports print it: IEC size text, or a ratio with :data:`RATIO_DECIMALS` decimals."""
    return format_size(value) if kind == "size" else f"{value:.{RATIO_DECIMALS}f}"


def _signed(kind: str, delta: float) -> str:
    if kind == "size":
        return ("+" if delta >= 0 else "") + format_size(delta)
    return f"{delta:+.{RATIO_DECIMALS}f}"


@dataclass(frozen=True)
class CompareRule:
    """Fail when ``metric`` grew past the allowance. ``both``: relative and absolute must be exceeded."""

    metric: str  # budget key, e.g. peak_allocated
    percent: Decimal | None
    absolute: int | float | None
    text: str

    def allowed(self, base: float) -> int | float:
        """Largest value that still passes against ``base`` (the larger allowance when both are given)."""
        limits: list[Decimal] = []
        if self.percent is not None:
            limits.append(Decimal(str(base)) * (1 + self.percent / 100))
        if self.absolute is not None:
            limits.append(Decimal(str(base)) + Decimal(str(self.absolute)))
        best = max(limits)
        # Sizes are whole bytes: value <= x holds exactly when value <= floor(x).
        return int(best) if metric_kind(self.metric) == "size" else float(best)

    def describe(self) -> str:
        parts = []
        if self.percent is not None:
            parts.append(f"+{self.percent}%")
        if self.absolute is not None:
            kind = metric_kind(self.metric)
            parts.append("+" + (format_size(self.absolute) if kind == "size" else f"{self.absolute:g}"))
        return parts[0] if len(parts) == 1 else f"max({', '.join(parts)})"


def parse_rule(text: str) -> CompareRule:
    m = _RULE.match(text.strip())
    if m is None or (m.group("pct") is None and m.group("abs") is None):
        raise ConfigError(f"invalid compare rule {show(text)}",
                          expected="METRIC:P% or METRIC:+SIZE or METRIC:P%+SIZE, e.g. peak_allocated:2.5%+256MiB")
    metric = m.group("metric")
    if metric not in LIMITS:
        raise ConfigError(f"invalid compare rule {show(text)}: unknown metric {metric!r}", expected="one of " + ", ".join(LIMITS))
    absolute: int | float | None = None
    if m.group("abs") is not None:
        if metric_kind(metric) == "size":
            absolute = parse_size(m.group("abs"), what=f"compare rule {show(text)}")
        elif _RATIO_TEXT.match(m.group("abs")):  # float() would take nan, inf and 1e-3
            absolute = float(m.group("abs"))
        else:
            raise ConfigError(f"invalid compare rule {show(text)}", expected=f"a ratio after '+' for {metric}, e.g. "
                              f"{metric}:+0.02", found=m.group("abs"))
    percent = Decimal(m.group("pct")) if m.group("pct") is not None else None
    return CompareRule(metric=metric, percent=percent, absolute=absolute, text=text.strip())


class NotInBaseline(ConfigError):
    """No profile of the baseline pairs with this one: the missing-baseline policy applies."""

    def __str__(self) -> str:
        return self.one_line()


class MetricNotInBaseline(ConfigError):
    """A compare rule's metric is absent from a baseline saved before memgate measured it.

    Like a profile missing from the baseline, the plugin applies its missing-baseline policy (skip,
    warn, fail); a ConfigError for the CLI (``memgate diff --fail``: exit 2).
    """

    def __str__(self) -> str:
        return self.one_line()  # not KeyError's repr of the message


@dataclass(frozen=True)
class Regression:
    rank: str
    metric: str
    base: int | float | None
    value: int | float | None
    allowed: int | float | None
    passed: bool | None
    device: str | None
    message: str
    pool: str | None = None  # per-pool metrics: the pool of the current value
    base_pool: str | None = None  # and of the baseline value, when the baseline names it
    profile: str | None = None  # the current profile's path
    # what grew at the peak on the judged device: {"ops": [...], "owners": [...]}, each item
    # {"name", "base", "current", "delta"} (base None: not among the baseline's named ones)
    attribution: dict[str, list[dict[str, Any]]] | None = None
    baseline_commit: str | None = None  # the git commit the baseline was saved at

    @property
    def detail(self) -> str:
        """Lines to print under the failure line: what grew most at the peak, and the baseline's commit."""
        return "\n".join(map(printable, attribution_lines(self.attribution or {}, self.baseline_commit)))


ATTRIBUTION_TOP = 5
# attribution key → metric key (categories: a tracked recording's parameters, gradients, ... at the peak)
AT_PEAK = {"categories": "category_bytes_at_peak", "ops": "op_bytes_at_peak", "owners": "owner_bytes_at_peak"}


def grown_at_peak(before: dict[str, Any], now: dict[str, Any], top: int | None = ATTRIBUTION_TOP
                  ) -> dict[str, list[dict[str, Any]]]:
    """Per category, operator and owner, the names whose bytes live at the peak grew, most growth first
    (ties by name), at most ``top`` each; a kind one side lacks (a baseline saved before memgate
    kept them, a recording that tracked no model) is left out, so old baselines give ``{}``."""
    out: dict[str, list[dict[str, Any]]] = {}
    for what, key in AT_PEAK.items():
        a, b = (before.get("metrics") or {}).get(key), (now.get("metrics") or {}).get(key)
        if not isinstance(a, dict) or not isinstance(b, dict):
            continue
        rows = [{"name": name, "base": a.get(name), "current": size, "delta": size - int(a.get(name) or 0)}
                for name, size in b.items() if size > int(a.get(name) or 0)]
        rows.sort(key=lambda r: (-r["delta"], r["name"]))
        out[what] = rows if top is None else rows[:top]
    return out


def attribution_lines(attribution: dict[str, list[dict[str, Any]]], commit: str | None = None,
                      indent: str = "") -> list[str]:
    """``grew at the peak: op aten::mm 1.00 GiB -> 1.10 GiB (+102.40 MiB)``, one per name (the categories
    first: ``grew at the peak: category optimizer_state ...``), and the commit."""
    lines = []
    for what, word in (("categories", "category"), ("ops", "op"), ("owners", "owner")):
        for row in attribution.get(what, []):
            base = "-" if row["base"] is None else format_size(row["base"])
            lines.append(f"{indent}grew at the peak: {word} {row['name']} {base} -> {format_size(row['current'])} "
                         f"(+{format_size(row['delta'])})")
    if commit:
        lines.append(f"{indent}baseline saved at commit {commit}")
    return lines


def _fmt(metric: str, value: float) -> str:
    return format_metric(metric_kind(metric), value)


def _pool_text(now: str | None, then: str | None) -> str:
    if now is None and then is None:
        return ""
    if then is None or then == now:
        return f", pool {now}"
    return f", pool {now or '-'} (baseline pool {then})"


def compare_entry(entry: dict[str, Any], baseline: dict[str, Any], rule: CompareRule) -> Regression:
    """Judge one profile entry against its pair in the baseline under ``rule``; raise on
    incomparable input.

    :class:`NotInBaseline`: no baseline profile pairs with it; :class:`MetricNotInBaseline`:
    the baseline predates the rule's metric; :class:`~memgate.errors.AmbiguousProfiles`: only pids or
    timestamps tell the baseline's profiles apart; ConfigError: the runs are not comparable or the
    metric is measured in neither run on a common device.
    """
    base = baseline_entries(baseline)
    pairing = pair_entries(base, [entry], current_is_whole_run=False)
    if not pairing.pairs:
        raise NotInBaseline(f"rank {entry['rank']} ({entry.get('format')}) has no profile in the baseline to compare "
                            "with", file=entry.get("path"))
    ((b, _),) = pairing.pairs
    return compare_pair(base[b], entry, rule)


def compare_pair(base: dict[str, Any], entry: dict[str, Any], rule: CompareRule) -> Regression:
    """Judge ``entry`` against the baseline profile it pairs with (an entry of
    :func:`baseline_entries`, or of a JSON report)."""
    rank = entry["rank"]
    key_now, key_then = comparable_key(entry), base.get("key") or comparable_key(base)
    mismatched = [k for k in sorted(set(key_now) | set(key_then)) if key_now.get(k) != key_then.get(k)]
    if mismatched:
        details = ", ".join(f"{k}: baseline {key_then.get(k)!r}, now {key_now.get(k)!r}" for k in mismatched)
        raise ConfigError(f"rank {rank}: not comparable with the baseline ({details}); save a new baseline "
                          "for this configuration")
    metric_key = LIMITS[rule.metric][0]
    base_devices = {str(d["device"]): d for d in base.get("devices", [])}
    now_devices = {str(d["device"]): d for d in entry["devices"]}
    common = [(now_devices[now], base_devices[then])
              for then, now in pair_devices(list(base_devices), list(now_devices)) if then is not None and now is not None]
    if common and all(metric_key not in (then.get("metrics") or {}) for _, then in common):
        raise MetricNotInBaseline(f"rank {rank}: the baseline has no {rule.metric} (saved by a memgate that did not "
                                  f"measure it); nothing compared — save a new baseline to compare {rule.metric}")
    worst: tuple[float, dict[str, Any], dict[str, Any], int | float, int | float] | None = None
    for device, then in common:
        value = device["metrics"].get(metric_key)
        then_value = (then.get("metrics") or {}).get(metric_key)
        if value is None or then_value is None:
            continue
        margin = value - rule.allowed(then_value)
        if worst is None or margin > worst[0]:
            worst = (margin, device, then, then_value, value)
    if worst is None:
        why = next((d.get("not_measurable", {}).get(metric_key) for d, _ in common
                    if d.get("not_measurable", {}).get(metric_key)), None)
        raise ConfigError(f"rank {rank}: {rule.metric} is measured in neither run on a common device"
                          + (f" (now: {why})" if why else ""), file=entry.get("path"))
    _, device, then, base_value, value = worst
    allowed = rule.allowed(base_value)
    passed = value <= allowed
    growth = value - base_value
    pct = f" ({growth / base_value * 100:+.1f}%)" if base_value else ""
    change = f"{_signed(metric_kind(rule.metric), growth)}{pct}"
    if passed:
        head = f"{rule.metric} {_fmt(rule.metric, value)} vs baseline {_fmt(rule.metric, base_value)}: {change}"
    else:
        head = f"{rule.metric} {_fmt(rule.metric, value)} exceeds baseline {_fmt(rule.metric, base_value)} by {change.lstrip('+')}"
    pool = (device.get("pool_of") or {}).get(metric_key)
    base_pool = (then.get("pool_of") or {}).get(metric_key)
    message = printable(f"{head}, allowed {rule.describe()} — rank {rank} {device['device']}{_pool_text(pool, base_pool)}")
    return Regression(rank, rule.metric, base_value, value, allowed, passed, device["device"], message, pool, base_pool,
                      profile=entry.get("path"), attribution=grown_at_peak(then, device) or None,
                      baseline_commit=base.get("baseline_commit"))


# ---- diff ---------------------------------------------------------------------------------------


def _metric_rows(before: dict[str, Any], now: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every LIMITS metric of one (rank, device) pair: base, current, delta, unit, and pools."""
    rows: dict[str, dict[str, Any]] = {}
    base_metrics, metrics = before.get("metrics") or {}, now.get("metrics") or {}
    base_pools, pools = before.get("pool_of") or {}, now.get("pool_of") or {}
    for key, kind in LIMITS.values():
        a, b = base_metrics.get(key), metrics.get(key)
        row: dict[str, Any] = {"base": a, "current": b, "delta": (b - a) if a is not None and b is not None else None,
                               "unit": "bytes" if kind == "size" else "ratio"}
        if key in base_pools or key in pools:
            row["base_pool"], row["current_pool"] = base_pools.get(key), pools.get(key)
        if key not in base_metrics:
            row["note"] = "not in the base"  # a baseline or report saved before memgate measured it
        elif key not in metrics:
            row["note"] = "not in the current run"
        rows[key] = row
    return rows


def _device_diff(before: dict[str, Any], dev: dict[str, Any]) -> dict[str, Any]:
    ops_a = before["metrics"].get("op_max_block_bytes") or {}
    ops_b = dev["metrics"].get("op_max_block_bytes") or {}
    grew = sorted(((op, ops_a[op], ops_b[op]) for op in ops_b if op in ops_a and ops_b[op] > ops_a[op]),
                  key=lambda t: (t[1] - t[2], t[0]))
    shrank = sorted(((op, ops_a[op], ops_b[op]) for op in ops_b if op in ops_a and ops_b[op] < ops_a[op]),
                    key=lambda t: (t[2] - t[1], t[0]))
    metrics = _metric_rows(before, dev)
    out = {
        "device": dev["device"],
        "metrics": metrics,
        "ops_grew": [{"op": o, "base": a, "current": b, "delta": b - a} for o, a, b in grew],
        "ops_shrank": [{"op": o, "base": a, "current": b, "delta": b - a} for o, a, b in shrank],
        "ops_new": [{"op": o, "current": ops_b[o]} for o in sorted(set(ops_b) - set(ops_a), key=lambda o: -ops_b[o])],
        "ops_gone": [{"op": o, "base": ops_a[o]} for o in sorted(set(ops_a) - set(ops_b), key=lambda o: -ops_a[o])],
    }
    # what grew at the peak, per operator and per owner (absent when either side predates them)
    out["grew_at_peak"] = grown_at_peak(before, dev, top=None)
    if before["device"] != dev["device"]:
        out["base_device"] = before["device"]
    at_peak_changed = any(k in before["metrics"] and k in dev["metrics"] and before["metrics"][k] != dev["metrics"][k]
                          for k in AT_PEAK.values())
    out["changed"] = at_peak_changed or bool(out["ops_grew"] or out["ops_shrank"] or out["ops_new"] or out["ops_gone"]) or any(
        row["base"] != row["current"] or row.get("base_pool") != row.get("current_pool") for row in metrics.values())
    return out


def diff_entries(base: list[dict[str, Any]], current: list[dict[str, Any]], platform_mode: str = "same"
                 ) -> dict[str, Any]:
    """Metric and per-operator deltas of the profiles and devices that pair (:mod:`memgate.identity`).

    ``ranks``: one item per current profile, in its order (``status`` "new profile" where the base
    has none to pair with; "other platform" where its pair was measured on another platform and
    ``platform_mode`` is ``same``: a change of platform is no change of the model); each names its
    ``platform`` (and ``base_platform`` where that differs); ``missing_profiles``: the base's unpaired
    ones; ``changed``: whether anything differs at all.
    """
    pairing = pair_entries(base, current)
    base_of = {c: b for b, c in pairing.pairs}
    labels, base_labels = profile_labels([str(e["path"]) for e in current]), profile_labels([str(e["path"]) for e in base])
    ranks = []
    for j, entry in enumerate(current):
        platform = entry_platform(entry)
        item: dict[str, Any] = {"rank": entry["rank"], "profile": entry["path"], "label": labels[j],
                                "platform": platform.label()}
        if j not in base_of:
            ranks.append({**item, "status": "new profile", "devices": []})
            continue
        old = base[base_of[j]]
        base_platform = entry_platform(old)
        if base_platform.label() != platform.label():
            item["base_platform"] = base_platform.label()
        if not platform.same_as(base_platform) and platform_mode != "any":
            ranks.append({**item, "base_profile": old["path"], "status": "other platform", "devices": []})
            continue
        item["base_profile"] = old["path"]
        if old.get("baseline_commit"):
            item["base_commit"] = old["baseline_commit"]
        old_devices = {str(d["device"]): d for d in old["devices"]}
        now_devices = {str(d["device"]): d for d in entry["devices"]}
        devices: list[dict[str, Any]] = []
        for then, now in pair_devices(list(old_devices), list(now_devices)):
            if then is None:
                devices.append({"device": now, "status": "new device"})
            elif now is None:
                devices.append({"device": then, "status": "missing device"})
            else:
                devices.append(_device_diff(old_devices[then], now_devices[now]))
        ranks.append({**item, "devices": devices})
    missing = [{"rank": base[i]["rank"], "profile": base[i]["path"], "label": base_labels[i]} for i in pairing.base_only]
    changed = bool(missing) or any(r.get("status") or any(d.get("status") or d["changed"] for d in r["devices"])
                                   for r in ranks)
    return {"ranks": ranks, "missing_ranks": sorted(m["rank"] for m in missing), "missing_profiles": missing,
            "changed": changed}


_KIND_OF_METRIC = {spec.key: (budget_key, spec.kind) for budget_key, spec in BUDGET_SPECS.items()}


def diff_metric_line(key: str, row: dict[str, Any]) -> str:
    """``  fragmentation   0.182 ->  0.200  +0.018 (+9.9%)  pool PTA -> GE`` (key: a metric key)."""
    name, kind = _KIND_OF_METRIC[key]

    def show(value: float | None) -> str:
        return "-" if value is None else format_metric(kind, value)

    line = f"  {name:<24} {show(row['base']):>12} -> {show(row['current']):>12}"
    delta = row["delta"]
    if delta is not None:
        line += f"  {_signed(kind, delta)}" + (f" ({delta / row['base'] * 100:+.1f}%)" if row["base"] else "")
    if "current_pool" in row:
        then, now = row["base_pool"], row["current_pool"]
        # a side that names no pool (not measured, or a baseline saved before pools were named) is not a change
        line += f"  pool {then} -> {now}" if then is not None and now is not None and then != now else f"  pool {now or then}"
    if row.get("note"):
        line += f"  ({row['note']})"
    return line


def diff_text(diff: dict[str, Any], top: int = 10) -> list[str]:
    lines = []
    # Where one rank has several profiles, each header also names its profile.
    ranks = [r["rank"] for r in diff["ranks"]] + [m["rank"] for m in diff.get("missing_profiles", [])]
    shared = {r for r in ranks if ranks.count(r) > 1}

    def head(item: dict[str, Any], device: str | None = None) -> str:
        text = f"rank {item['rank']}" + (f" {device}" if device else "")
        named = item["rank"] in shared or is_test_id(str(item.get("profile", "")))  # a test: always its node id
        return text + (f"  [{item['label']}]" if named and item.get("label") else "")

    platforms = list(dict.fromkeys(str(r.get("platform") or "unknown") for r in diff["ranks"]))
    if platforms != ["unknown"] and platforms:
        lines.append(f"platform: {'; '.join(platforms)}")
    for rank in diff["ranks"]:
        if rank.get("status") == "other platform":
            lines.append(f"{head(rank)}: no history for {rank['platform']}: the base was measured on "
                         f"{rank['base_platform']} (a change of platform, not of the model; "
                         "--compare-platform any diffs them)")
            continue
        if rank.get("status"):
            lines.append(f"{head(rank)}: {rank['status']} (not in the base)")
            continue
        if rank.get("base_platform"):
            lines.append(f"{head(rank)}: base measured on {rank['base_platform']}")
        for dev in rank["devices"]:
            if dev.get("status"):
                lines.append(f"{head(rank, dev['device'])}: {dev['status']}")
                continue
            lines.append(head(rank, dev["device"]))
            for key, m in dev["metrics"].items():
                if m["base"] is None and m["current"] is None:
                    continue
                lines.append(diff_metric_line(key, m))
            for o in dev["ops_grew"][:top]:
                lines.append(f"  op grew: {o['op']} {format_size(o['base'])} -> {format_size(o['current'])} (+{format_size(o['delta'])})")
            for o in dev["ops_new"][:top]:
                lines.append(f"  new op:  {o['op']} {format_size(o['current'])}")
            for o in dev["ops_gone"][:top]:
                lines.append(f"  gone op: {o['op']} (was {format_size(o['base'])})")
            grew = {what: rows[:ATTRIBUTION_TOP] for what, rows in (dev.get("grew_at_peak") or {}).items()}
            lines.extend(attribution_lines(grew, indent="  "))
        if rank.get("base_commit"):
            lines.append(f"  base saved at commit {rank['base_commit']}")
    for missing in diff.get("missing_profiles", [{"rank": r} for r in diff["missing_ranks"]]):
        lines.append(f"{head(missing)}: missing from the current run")
    if not diff.get("changed", True):
        lines.append(f"no change: {len(diff['ranks'])} profile(s) paired, every metric and operator equal")
    return lines


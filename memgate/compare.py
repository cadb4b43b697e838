"""Baselines and diffs: compare a run's metrics with an earlier run's. Pure.

A baseline is a small JSON file keyed by rank, holding each profile's metrics and what makes its
numbers comparable (device type, framework/CANN versions, world size, format). Comparison rules
read ``peak_allocated:5%``, ``peak_allocated:+256MiB`` or ``peak_allocated:2.5%+256MiB`` (the
last fails only when both the relative and the absolute growth are exceeded).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from memgate import __version__
from memgate.budgets import LIMITS
from memgate.errors import ConfigError, InputError
from memgate.sizes import format_size, parse_size

BASELINE_FORMAT = 1
COMPARABLE_KEYS = ("format", "device_type", "torch_version", "torch_npu_version", "cann_version", "mindspore_version", "world_size")
_RULE = re.compile(r"\A(?P<metric>[a-z_]+):(?:(?P<pct>[0-9]+(?:\.[0-9]+)?)%)?(?:\+(?P<abs>[^%]+))?\Z")


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
        return int(best) if LIMITS[self.metric][1] == "size" else float(best)

    def describe(self) -> str:
        parts = []
        if self.percent is not None:
            parts.append(f"+{self.percent}%")
        if self.absolute is not None:
            kind = LIMITS[self.metric][1]
            parts.append("+" + (format_size(self.absolute) if kind == "size" else f"{self.absolute:g}"))
        return parts[0] if len(parts) == 1 else f"max({', '.join(parts)})"


def parse_rule(text: str) -> CompareRule:
    m = _RULE.match(text.strip())
    if m is None or (m.group("pct") is None and m.group("abs") is None):
        raise ConfigError(f"invalid compare rule {text!r}",
                          expected="METRIC:P% or METRIC:+SIZE or METRIC:P%+SIZE, e.g. peak_allocated:2.5%+256MiB")
    metric = m.group("metric")
    if metric not in LIMITS:
        raise ConfigError(f"invalid compare rule {text!r}: unknown metric {metric!r}", expected="one of " + ", ".join(LIMITS))
    absolute: int | float | None = None
    if m.group("abs") is not None:
        if LIMITS[metric][1] == "size":
            absolute = parse_size(m.group("abs"), what=f"compare rule {text!r}")
        else:
            try:
                absolute = float(m.group("abs"))
            except ValueError:
                raise ConfigError(f"invalid compare rule {text!r}", expected="a ratio after '+'") from None
    percent = Decimal(m.group("pct")) if m.group("pct") is not None else None
    return CompareRule(metric=metric, percent=percent, absolute=absolute, text=text.strip())


def comparable_key(entry: dict[str, Any]) -> dict[str, Any]:
    """What must match for two profiles' numbers to be comparable."""
    meta = entry.get("metadata", {}) or {}
    devices = sorted({d["device"].split(":")[0] for d in entry.get("devices", [])})
    key: dict[str, Any] = {"format": entry.get("format"), "device_type": ",".join(devices) or None}
    for name in COMPARABLE_KEYS[2:]:
        if meta.get(name) is not None:
            key[name] = meta[name]
    return key


def baseline_from_entries(entries: list[dict[str, Any]]) -> dict[str, Any]:
    profiles: dict[str, Any] = {}
    for entry in entries:
        profiles[entry["rank"]] = {
            "path": entry["path"],
            "key": comparable_key(entry),
            "devices": {
                d["device"]: {
                    "metrics": {k: v for k, v in d["metrics"].items() if k != "top_at_peak"},
                }
                for d in entry["devices"]
            },
        }
    return {"memgate_baseline": BASELINE_FORMAT, "memgate_version": __version__, "profiles": profiles}


def ratchet(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Keep, per rank/device/metric, the better (smaller) of the old and new baseline values."""
    merged = json.loads(json.dumps(new))
    for rank, profile in merged["profiles"].items():
        before = old.get("profiles", {}).get(rank)
        if before is None or before.get("key") != profile.get("key"):
            continue
        for device, values in profile["devices"].items():
            old_metrics = before.get("devices", {}).get(device, {}).get("metrics", {})
            for key, value in values["metrics"].items():
                previous = old_metrics.get(key)
                if isinstance(value, (int, float)) and isinstance(previous, (int, float)):
                    values["metrics"][key] = min(value, previous)
    return merged


def looks_like_memgate_json(path: Path) -> bool:
    """A JSON report or baseline written by memgate (they start with their version key)."""
    if not path.is_file() or path.suffix != ".json":
        return False
    with open(path, "rb") as fh:
        head = fh.read(256).lstrip()
    return head.startswith(b"{") and (b'"memgate_version"' in head or b'"memgate_baseline"' in head)


def load_baseline(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise InputError("baseline file not found", file=path) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc.msg}", file=path, line=exc.lineno, column=f"char {exc.colno}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read baseline: {exc}", file=path) from None
    if isinstance(data, dict) and "memgate_version" in data and "profiles" in data and isinstance(data["profiles"], list):
        return baseline_from_entries(data["profiles"])  # a JSON report works as a baseline too
    if not isinstance(data, dict) or data.get("memgate_baseline") != BASELINE_FORMAT or not isinstance(data.get("profiles"), dict):
        raise InputError("not a memgate baseline or JSON report", file=path,
                         expected=f'{{"memgate_baseline": {BASELINE_FORMAT}, "profiles": {{...}}}}')
    return data


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


def _fmt(metric: str, value: float) -> str:
    return format_size(value) if LIMITS[metric][1] == "size" else f"{value:.3f}"


def compare_entry(entry: dict[str, Any], baseline: dict[str, Any], rule: CompareRule) -> Regression:
    """Judge one profile entry against the baseline under ``rule``; raise on incomparable input."""
    rank = entry["rank"]
    base_profile = baseline["profiles"].get(rank)
    if base_profile is None:
        raise KeyError(rank)
    key_now, key_then = comparable_key(entry), base_profile.get("key", {})
    mismatched = [k for k in sorted(set(key_now) | set(key_then)) if key_now.get(k) != key_then.get(k)]
    if mismatched:
        details = ", ".join(f"{k}: baseline {key_then.get(k)!r}, now {key_now.get(k)!r}" for k in mismatched)
        raise ConfigError(f"rank {rank}: not comparable with the baseline ({details}); save a new baseline "
                          "for this configuration")
    metric_key = LIMITS[rule.metric][0]
    worst: tuple[float, str, int | float, int | float] | None = None
    for device in entry["devices"]:
        value = device["metrics"].get(metric_key)
        base = base_profile["devices"].get(device["device"], {}).get("metrics", {}).get(metric_key)
        if value is None or base is None:
            continue
        allowed = rule.allowed(base)
        margin = value - allowed
        if worst is None or margin > worst[0]:
            worst = (margin, device["device"], base, value)
    if worst is None:
        raise ConfigError(f"rank {rank}: {rule.metric} is measured in neither run on a common device")
    _, device, base, value = worst
    allowed = rule.allowed(base)
    passed = value <= allowed
    growth = value - base
    pct = f" ({growth / base * 100:+.1f}%)" if base else ""
    sign = "+" if growth >= 0 else "-"
    change = f"{sign}{_fmt(rule.metric, abs(growth))}{pct}"
    if passed:
        head = f"{rule.metric} {_fmt(rule.metric, value)} vs baseline {_fmt(rule.metric, base)}: {change}"
    else:
        head = f"{rule.metric} {_fmt(rule.metric, value)} exceeds baseline {_fmt(rule.metric, base)} by {change.lstrip('+')}"
    message = f"{head}, allowed {rule.describe()} — rank {rank} {device}"
    return Regression(rank, rule.metric, base, value, allowed, passed, device, message)


# ---- diff ---------------------------------------------------------------------------------------


def diff_entries(base: list[dict[str, Any]], current: list[dict[str, Any]]) -> dict[str, Any]:
    """Metric and per-operator deltas of matching (rank, device) pairs."""
    by_rank = {e["rank"]: e for e in base}
    ranks = []
    for entry in current:
        old = by_rank.get(entry["rank"])
        if old is None:
            ranks.append({"rank": entry["rank"], "status": "new rank", "devices": []})
            continue
        old_devices = {d["device"]: d for d in old["devices"]}
        devices = []
        for dev in entry["devices"]:
            before = old_devices.get(dev["device"])
            if before is None:
                devices.append({"device": dev["device"], "status": "new device"})
                continue
            metrics = {}
            for key in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_app_reserved_bytes", "fragmentation",
                        "step_growth_bytes", "leaked_bytes"):
                a, b = before["metrics"].get(key), dev["metrics"].get(key)
                metrics[key] = {"base": a, "current": b,
                                "delta": (b - a) if a is not None and b is not None else None}
            ops_a = before["metrics"].get("op_max_block_bytes") or {}
            ops_b = dev["metrics"].get("op_max_block_bytes") or {}
            grew = sorted(((op, ops_a[op], ops_b[op]) for op in ops_b if op in ops_a and ops_b[op] > ops_a[op]),
                          key=lambda t: (t[1] - t[2], t[0]))
            shrank = sorted(((op, ops_a[op], ops_b[op]) for op in ops_b if op in ops_a and ops_b[op] < ops_a[op]),
                            key=lambda t: (t[2] - t[1], t[0]))
            devices.append({
                "device": dev["device"],
                "metrics": metrics,
                "ops_grew": [{"op": o, "base": a, "current": b, "delta": b - a} for o, a, b in grew],
                "ops_shrank": [{"op": o, "base": a, "current": b, "delta": b - a} for o, a, b in shrank],
                "ops_new": [{"op": o, "current": ops_b[o]} for o in sorted(set(ops_b) - set(ops_a), key=lambda o: -ops_b[o])],
                "ops_gone": [{"op": o, "base": ops_a[o]} for o in sorted(set(ops_a) - set(ops_b), key=lambda o: -ops_a[o])],
            })
        ranks.append({"rank": entry["rank"], "devices": devices})
    missing = sorted(set(by_rank) - {e["rank"] for e in current})
    return {"ranks": ranks, "missing_ranks": missing}


def diff_text(diff: dict[str, Any], top: int = 10) -> list[str]:
    lines = []
    for rank in diff["ranks"]:
        if rank.get("status"):
            lines.append(f"rank {rank['rank']}: {rank['status']} (not in the base)")
            continue
        for dev in rank["devices"]:
            if dev.get("status"):
                lines.append(f"rank {rank['rank']} {dev['device']}: {dev['status']}")
                continue
            lines.append(f"rank {rank['rank']} {dev['device']}")
            for key, m in dev["metrics"].items():
                if m["base"] is None and m["current"] is None:
                    continue
                name = key.removesuffix("_bytes")
                if key == "fragmentation":
                    show = lambda v: "-" if v is None else f"{v:.3f}"
                else:
                    show = lambda v: "-" if v is None else format_size(v)
                delta = m["delta"]
                pct = f" ({delta / m['base'] * 100:+.1f}%)" if delta is not None and m["base"] else ""
                sign = "+" if delta is not None and delta >= 0 else ""
                lines.append(f"  {name:<20} {show(m['base']):>12} -> {show(m['current']):>12}"
                             + (f"  {sign}{show(delta) if key != 'fragmentation' else f'{delta:.3f}'}{pct}" if delta is not None else ""))
            for o in dev["ops_grew"][:top]:
                lines.append(f"  op grew: {o['op']} {format_size(o['base'])} -> {format_size(o['current'])} (+{format_size(o['delta'])})")
            for o in dev["ops_new"][:top]:
                lines.append(f"  new op:  {o['op']} {format_size(o['current'])}")
            for o in dev["ops_gone"][:top]:
                lines.append(f"  gone op: {o['op']} (was {format_size(o['base'])})")
    for rank in diff["missing_ranks"]:
        lines.append(f"rank {rank}: missing from the current run")
    return lines


def suggest_toml(entries: list[dict[str, Any]], headroom: Decimal, name: str = "default") -> str:
    """A ``[tool.memgate]`` budget block: the worst measured value over all ranks plus headroom."""
    worst: dict[str, int | float] = {}
    ops: dict[str, int] = {}
    for entry in entries:
        for dev in entry["devices"]:
            for budget_key, (metric_key, _) in LIMITS.items():
                value = dev["metrics"].get(metric_key)
                if isinstance(value, (int, float)) and value >= 0:
                    worst[budget_key] = max(worst.get(budget_key, value), value)
            for op, size in (dev["metrics"].get("op_max_block_bytes") or {}).items():
                ops[op] = max(ops.get(op, 0), size)
    factor = 1 + headroom / 100
    lines = ["[tool.memgate]", "", "[[tool.memgate.budgets]]", f'name = "{name}"']
    for budget_key, value in worst.items():
        if LIMITS[budget_key][1] == "size":
            lines.append(f'{budget_key} = "{_round_up_size(int(Decimal(value) * factor))}"  # measured {format_size(value)}')
        else:
            lines.append(f"{budget_key} = {min(1.0, float(Decimal(str(value)) * factor)):.3f}  # measured {value:.3f}")
    biggest = sorted(ops.items(), key=lambda kv: -kv[1])[:10]
    if biggest:
        caps = ", ".join(f'"{op}" = "{_round_up_size(int(Decimal(size) * factor))}"' for op, size in biggest)
        lines.append(f"op_caps = {{ {caps} }}")
    return "\n".join(lines) + "\n"


def _round_up_size(nbytes: int) -> str:
    """A readable size ≥ nbytes: whole MiB below 10 GiB, else 0.1 GiB steps."""
    mib = 1 << 20
    if nbytes < 10 * (1 << 30):
        return f"{-(-nbytes // mib)} MiB"
    tenth = (1 << 30) // 10
    return f"{Decimal(-(-nbytes // tenth)) / 10} GiB" if (-(-nbytes // tenth)) % 10 else f"{-(-nbytes // (1 << 30))} GiB"

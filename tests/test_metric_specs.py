"""The metric table (memgate.metric_specs) and what must stay in step with it: the JSON schemas of
the report, the baseline and the budget file, the budget keys (memgate.budgets.LIMITS), the lists the
rest of memgate derives from it, and the docs' metric table.

Each check is a function returning its problems; the last tests feed each one a modified copy of
the table, a schema or the docs and show it finds the difference.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from memgate import metric_specs
from memgate.budgets import BUDGET_KEYS, LIMITS
from memgate.loaders import registry
from memgate.metric_specs import SPECS, Fact, MetricSpec, budget_limits, keys_where, not_measurable, regained
from memgate.schemas import load_schema

ROOT = Path(__file__).resolve().parent.parent
Specs = tuple[MetricSpec, ...]

# A value of each (unit, shape) the report holds when measured, and values of another kind it must refuse.
_GOOD: dict[tuple[str, str], Any] = {
    ("bytes", "value"): 1 << 30, ("ratio", "value"): 0.25, ("count", "value"): 3,
    ("bytes", "by name"): {"aten::mm": 1 << 20}, ("bytes", "blocks"): [{"size": 1 << 20, "op": "aten::mm"}],
}
_WRONG: dict[tuple[str, str], list[Any]] = {
    ("bytes", "value"): [0.5, -1, "1 GiB", {}],
    ("ratio", "value"): [1.5, -0.1, "0.2", {}],
    ("count", "value"): [0.5, -1, {}],
    ("bytes", "by name"): [1 << 20, [], {"aten::mm": 0.5}],
    ("bytes", "blocks"): [{}, 1 << 20, [{"op": "aten::mm"}]],
}
# What a budget file may write for a limit of each kind, and what it must refuse.
_LIMIT_GOOD = {"size": ["24 GiB", 1 << 30, "92%"], "ratio": [0.15, 0, 1]}
_LIMIT_WRONG = {"size": [0.5, -1, "lots"], "ratio": ["24 GiB", 1.5, -0.1]}


def _accepts(schema: dict[str, Any], part: dict[str, Any], value: Any) -> bool:
    """Whether ``part`` (a property of ``schema``, its $refs resolved in ``schema``) accepts ``value``."""
    return Draft202012Validator({"$defs": schema.get("$defs", {}), **part}).is_valid(value)


def _metric_properties(schema: dict[str, Any], where: tuple[str, ...]) -> dict[str, Any]:
    node: Any = schema
    for step in where:
        node = node[step]
    assert isinstance(node, dict)
    return node


REPORT_METRICS = ("properties", "profiles", "items", "properties", "devices", "items", "properties", "metrics")
BASELINE_METRICS = ("$defs", "device", "properties", "metrics")


def _value_problems(spec: MetricSpec, schema: dict[str, Any], prop: dict[str, Any], where: str) -> list[str]:
    problems = []
    good, wrong = _GOOD[(spec.unit, spec.shape)], _WRONG[(spec.unit, spec.shape)]
    if not _accepts(schema, prop, good):
        problems.append(f"{where}: {spec.key} refuses a {spec.unit} {spec.shape} ({good!r})")
    problems += [f"{where}: {spec.key} accepts {bad!r} as a {spec.unit} {spec.shape}"
                 for bad in wrong if _accepts(schema, prop, bad)]
    if _accepts(schema, prop, None) != spec.nullable:
        problems.append(f"{where}: {spec.key} is {'' if spec.nullable else 'not '}null when not measurable, "
                        f"the schema says otherwise")
    if not spec.nullable and not _accepts(schema, prop, spec.empty):
        problems.append(f"{where}: {spec.key} refuses its not-measurable value {spec.empty!r}")
    return problems


def _metrics_problems(specs: list[MetricSpec], schema: dict[str, Any], props: dict[str, Any], where: str) -> list[str]:
    """``specs``, and only they, are ``props``, each of its unit, shape and nullability."""
    keys = {s.key for s in specs}
    problems = [f"{where}: {k} has no metric spec here" for k in props if k not in keys]
    for spec in specs:
        if spec.key not in props:
            problems.append(f"{where}: no property for {spec.key}")
        else:
            problems += _value_problems(spec, schema, props[spec.key], where)
    return problems


def report_schema_problems(specs: Specs, schema: dict[str, Any]) -> list[str]:
    """Every metric is a property of a device's metrics in report.schema.json, of its unit and shape,
    and every property there is a metric; the required ones are metrics."""
    metrics = _metric_properties(schema, REPORT_METRICS)
    problems = _metrics_problems(list(specs), schema, metrics["properties"], "report schema")
    return problems + [f"report schema: required {k} has no metric spec" for k in metrics.get("required", [])
                       if k not in {s.key for s in specs}]


def baseline_schema_problems(specs: Specs, schema: dict[str, Any]) -> list[str]:
    """The baselined metrics, and only they, are properties of baseline.schema.json's device metrics."""
    props = _metric_properties(schema, BASELINE_METRICS)["properties"]
    return _metrics_problems([s for s in specs if s.baselined], schema, props, "baseline schema")


def budgets_schema_problems(specs: Specs, schema: dict[str, Any]) -> list[str]:
    """Every budget key is a budget property of budgets.schema.json taking limits of its kind, and every
    limit property there (not a selector, cap or cross-rank check) is a budget key."""
    props = schema["$defs"]["budget"]["properties"]
    budgeted = {s.budget.key: s for s in specs if s.budget is not None}
    others = BUDGET_KEYS - set(LIMITS)  # selectors, op_caps, owner_caps, rank_imbalance, device_capacity
    problems = [f"budgets schema: {k} is no budget key" for k in props if k not in others and k not in budgeted]
    for key, spec in budgeted.items():
        if key not in props:
            problems.append(f"budgets schema: no property for budget key {key}")
            continue
        problems += [f"budgets schema: {key} refuses the {spec.kind} limit {v!r}"
                     for v in _LIMIT_GOOD[spec.kind] if not _accepts(schema, props[key], v)]
        problems += [f"budgets schema: {key} accepts {v!r} as a {spec.kind} limit"
                     for v in _LIMIT_WRONG[spec.kind] if _accepts(schema, props[key], v)]
    return problems


def limits_problems(specs: Specs, limits: dict[str, tuple[str, str]]) -> list[str]:
    """budgets.LIMITS is the table's budget keys, each with its report key and kind, in the table's order."""
    derived = budget_limits(specs)
    problems = [f"LIMITS: {k} has no metric spec" for k in limits if k not in derived]
    problems += [f"LIMITS: no {k}" for k in derived if k not in limits]
    problems += [f"LIMITS[{k}] = {limits[k]}, the table says {v}" for k, v in derived.items()
                 if k in limits and limits[k] != v]
    if not problems and list(limits) != list(derived):
        problems.append(f"LIMITS' order {list(limits)} is not the table's {list(derived)}")
    return problems


def _doc() -> tuple[str, str, str]:
    """(name, metric table, whole page) of the docs: docs/metrics.md where the repository has it, else
    README.md with its Metrics section as the table."""
    page = ROOT / "docs" / "metrics.md"
    if page.exists():
        text = page.read_text("utf-8")
        return "docs/metrics.md", text, text
    text = (ROOT / "README.md").read_text("utf-8")
    start = re.search(r"^## Metrics\b.*$", text, re.MULTILINE)
    assert start is not None, "README.md has no '## Metrics' section"
    end = re.search(r"^## ", text[start.end():], re.MULTILINE)
    return "README.md", text[start.start(): start.end() + end.start() if end else len(text)], text


def doc_problems(specs: Specs, table: str, page: str, name: str = "docs") -> list[str]:
    """Every metric is named in the first column of the docs' metric ``table``; a detail (such as
    live_at_peak_count, which qualifies top_at_peak) somewhere on the ``page``."""
    tabled = set()
    for line in table.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2:
            tabled.update(re.findall(r"`([a-z_]+)`", cells[1]))
    problems = [f"{name}: the metric table names no {s.key}" for s in specs
                if s.detail_of is None and s.key not in tabled]
    problems += [f"{name}: {s.key} is named nowhere" for s in specs
                 if s.detail_of is not None and not re.search(rf"\b{s.key}\b", page)]
    return problems


def _formats() -> set[str]:
    """Every format name a loader gives its profiles (its ``FORMAT``, ``*_FORMAT`` constants)."""
    names = set()
    for entry in registry.LOADERS:
        loader = importlib.import_module(f"memgate.loaders.{entry.module}")
        names |= {v for k, v in vars(loader).items() if (k == "FORMAT" or k.endswith("_FORMAT")) and isinstance(v, str)}
    return names


# ---- the table is in step ----------------------------------------------------------------------


def test_report_schema_is_in_step() -> None:
    assert report_schema_problems(SPECS, load_schema("report")) == []


def test_baseline_schema_is_in_step() -> None:
    assert baseline_schema_problems(SPECS, load_schema("baseline")) == []


def test_budgets_schema_is_in_step() -> None:
    assert budgets_schema_problems(SPECS, load_schema("budgets")) == []


def test_budget_limits_are_the_tables() -> None:
    assert limits_problems(SPECS, LIMITS) == []
    assert list(LIMITS.items()) == list(budget_limits().items())


def test_docs_name_every_metric() -> None:
    name, table, page = _doc()
    assert doc_problems(SPECS, table, page, name) == []


def test_formats_are_loaders_formats() -> None:
    known = _formats()
    assert {"torch_snapshot", "torch_recording", "torch_npu", "kineto"} <= known
    for spec in SPECS:
        assert set(spec.formats) <= known, spec.key


def test_what_memgate_derives_from_the_table() -> None:
    from memgate import html_report, metrics, report

    assert metrics.METRIC_KEYS == tuple(s.key for s in SPECS if s.detail_of is None)
    # memgate inspect: every single number but the counts (oom_count has its own lines), sizes first
    assert set(report._SIZE_ROWS + report._RATIO_ROWS) == {s.key for s in SPECS if s.shape == "value"} - {
        "live_at_peak_count", "oom_count"}
    assert report._RATIO_ROWS == ("fragmentation", "external_fragmentation", "free_block_fragmentation")
    assert html_report._METRIC_ROWS == tuple(key for key, _ in LIMITS.values())
    assert html_report.RATIO_METRICS == {k for b, (key, kind) in LIMITS.items() if kind == "ratio" for k in (b, key)}
    assert set(html_report.METRIC_HELP) == {s.key for s in SPECS}
    assert metric_specs.details_of("top_at_peak") == ("live_at_peak_count",)


# Constants other modules keep, derived from the table (module, name, what the table gives).
_DERIVED = [
    ("memgate.baselines", "_NOT_BASELINED", lambda: keys_where(baselined=False)),
    ("memgate.suggest", "GROWTH_KEYS", lambda: metric_specs.budget_keys_suggested("least")),
    ("memgate.suggest", "NO_FLOOR_KEYS", lambda: metric_specs.budget_keys_suggested("least", "worst, no floor")),
    ("memgate.suggest", "NOT_SUGGESTED", metric_specs.not_suggested),
    ("memgate.compare", "_KIND_OF_METRIC",
     lambda: {s.key: (b, s.kind) for b, s in metric_specs.BUDGET_SPECS.items()}),
]


@pytest.mark.parametrize(("module", "name", "derived"), _DERIVED, ids=[f"{m}.{n}" for m, n, _ in _DERIVED])
def test_lists_kept_elsewhere_agree_with_the_table(module: str, name: str, derived: Any) -> None:
    assert getattr(importlib.import_module(module), name) == derived()


def test_every_metric_is_computed() -> None:
    """device_metrics fills every key of the table (and its details) on any device, measured or not; an
    optional metric (a tracked recording's categories) only where measured, so other profiles report as before."""
    from memgate.categories import COLUMN
    from memgate.metrics import device_metrics
    from memgate.model import DeviceModel, Profile
    from memgate.table import Texts

    profile = Profile(path="p", format="kineto", rank="0", devices=(DeviceModel(device="cpu"),))
    values = device_metrics(profile, profile.devices[0]).values
    every = [s.key for s in SPECS if s.detail_of is None] + [s.key for s in SPECS if s.detail_of]
    assert metric_specs.OPTIONAL_KEYS == ("category_bytes_at_peak",)
    assert list(values) == [k for k in every if k not in metric_specs.OPTIONAL_KEYS]
    categorized = DeviceModel(device="cpu")
    categorized = dataclasses.replace(categorized, blocks=categorized.blocks.with_column(COLUMN, Texts.of([])))
    values = device_metrics(profile, categorized).values
    assert list(values) == every


# ---- each check finds a table, schema or page out of step --------------------------------------


def _without(specs: Specs, key: str) -> Specs:
    return tuple(s for s in specs if s.key != key)


def _changed(specs: Specs, which: str, **fields: Any) -> Specs:
    return tuple(dataclasses.replace(s, **fields) if s.key == which else s for s in specs)


def _schema_without(name: str, where: tuple[str, ...], key: str) -> dict[str, Any]:
    schema = copy.deepcopy(load_schema(name))
    del _metric_properties(schema, where)["properties"][key]
    return schema


def _schema_with(name: str, where: tuple[str, ...], key: str, prop: dict[str, Any]) -> dict[str, Any]:
    schema = copy.deepcopy(load_schema(name))
    _metric_properties(schema, where)["properties"][key] = prop
    return schema


def _budgets_schema(change: str) -> dict[str, Any]:
    schema = copy.deepcopy(load_schema("budgets"))
    props = schema["$defs"]["budget"]["properties"]
    if change == "drop":
        del props["leaked"]
    elif change == "extra":
        props["peak_everything"] = {"$ref": "#/$defs/size"}
    else:  # a ratio limit written as a size
        props["fragmentation"] = {"$ref": "#/$defs/size"}
    return schema


def _limits(change: str) -> dict[str, tuple[str, str]]:
    limits = dict(LIMITS)
    if change == "drop":
        del limits["largest_free_block"]
    elif change == "kind":
        limits["free_block_fragmentation"] = ("free_block_fragmentation", "size")
    elif change == "key":
        limits["leaked"] = ("leak_bytes", "size")
    else:  # the same entries in another order
        limits = dict(reversed(list(limits.items())))
    return limits


def _doc_without(key: str) -> tuple[str, str]:
    """The docs' (table, page) without the lines that name ``key``."""
    _, table, page = _doc()

    def cut(text: str) -> str:
        return "\n".join(line for line in text.splitlines() if key not in line)

    return cut(table), cut(page)


_REPORT, _BASELINE = load_schema("report"), load_schema("baseline")
_NEGATIVE = {
    # the table out of step with the schemas
    "spec missing": lambda: report_schema_problems(_without(SPECS, "free_block_fragmentation"), _REPORT),
    "spec extra": lambda: report_schema_problems(SPECS + (MetricSpec("made_up_bytes", "bytes", "blocks", "?"),), _REPORT),
    "unit changed": lambda: report_schema_problems(_changed(SPECS, "fragmentation", unit="bytes"), _REPORT),
    "shape changed": lambda: report_schema_problems(_changed(SPECS, "op_bytes_at_peak", shape="value"), _REPORT),
    "nullable changed": lambda: report_schema_problems(_changed(SPECS, "top_at_peak", nullable=True), _REPORT),
    "baselined changed": lambda: baseline_schema_problems(_changed(SPECS, "top_at_peak", baselined=True), _BASELINE),
    "not baselined": lambda: baseline_schema_problems(_changed(SPECS, "leaked_bytes", baselined=False), _BASELINE),
    # the schemas out of step with the table
    "report property missing": lambda: report_schema_problems(SPECS, _schema_without("report", REPORT_METRICS,
                                                                                      "leaked_bytes")),
    "report property extra": lambda: report_schema_problems(SPECS, _schema_with("report", REPORT_METRICS, "new_bytes",
                                                                                {"$ref": "#/$defs/bytes"})),
    "report property of another unit": lambda: report_schema_problems(SPECS, _schema_with(
        "report", REPORT_METRICS, "step_growth_bytes", {"$ref": "#/$defs/ratio"})),
    "baseline property missing": lambda: baseline_schema_problems(SPECS, _schema_without("baseline", BASELINE_METRICS,
                                                                                          "op_bytes_at_peak")),
    "baseline property extra": lambda: baseline_schema_problems(SPECS, _schema_with("baseline", BASELINE_METRICS,
                                                                                    "top_at_peak", {"type": "array"})),
    "budget key missing": lambda: budgets_schema_problems(SPECS, _budgets_schema("drop")),
    "budget key extra": lambda: budgets_schema_problems(SPECS, _budgets_schema("extra")),
    "budget key of another kind": lambda: budgets_schema_problems(SPECS, _budgets_schema("kind")),
    "budget key not in the table": lambda: budgets_schema_problems(_changed(SPECS, "leaked_bytes", budget=None),
                                                                   load_schema("budgets")),
    # LIMITS out of step with the table
    "LIMITS entry missing": lambda: limits_problems(SPECS, _limits("drop")),
    "LIMITS kind changed": lambda: limits_problems(SPECS, _limits("kind")),
    "LIMITS report key changed": lambda: limits_problems(SPECS, _limits("key")),
    "LIMITS order changed": lambda: limits_problems(SPECS, _limits("order")),
    # the docs out of step with the table
    "doc row missing": lambda: doc_problems(SPECS, *_doc_without("leak_undetermined_bytes")),
    "doc detail missing": lambda: doc_problems(SPECS, *_doc_without("live_at_peak_count")),
    "doc metric not in the table": lambda: doc_problems(
        SPECS + (MetricSpec("made_up_bytes", "bytes", "blocks", "?"),), *_doc()[1:]),
}


@pytest.mark.parametrize("case", list(_NEGATIVE))
def test_a_check_finds_what_is_out_of_step(case: str) -> None:
    assert _NEGATIVE[case]() != []


@pytest.mark.parametrize(("change", "message"), [
    ({"key": "peak_allocated_bytes"}, "report key listed twice"),
    ({"budget": metric_specs.Budgeted("peak_allocated")}, "budget key listed twice"),
    ({"budget": metric_specs.Budgeted("peak_requested"), "unit": "count"}, "no single size or ratio"),
    ({"budget": metric_specs.Budgeted("peak_requested", suggest="never")}, "says why"),
    ({"larger_is_worse": False}, "never suggested"),
    ({"detail_of": "no_such_metric"}, "which is no metric"),
    ({"optional": True}, "absent, never null"),
    ({"stand_in": "no_such_metric"}, "a stand-in is a metric"),
    ({"needs": frozenset(), "stand_in": "free_block_fragmentation"}, "a stand-in is a metric"),
    ({"key": "peak_requested_detail", "detail_of": "peak_allocated_bytes"}, "a detail needs what the metric"),
], ids=["key twice", "budget key twice", "budgeted count", "never without why", "no cost suggested",
        "detail of nothing", "optional yet nullable", "stand-in of nothing", "stand-in without history",
        "detail with needs"])
def test_the_table_checks_itself(change: dict[str, Any], message: str) -> None:
    specs = _changed(SPECS, "peak_requested_bytes", **change)
    with pytest.raises(ValueError, match=message):
        metric_specs._check(specs)


# What a metric needs (MetricSpec.needs): a loader names the facts a profile lacks, the table the metrics.
_LACKS = [
    (Fact.HISTORY, ("peak_allocated_bytes", "peak_requested_bytes", "peak_reserved_bytes", "fragmentation",
                    "external_fragmentation", "step_growth_bytes", "leaked_bytes", "leak_undetermined_bytes",
                    "top_at_peak", "op_bytes_at_peak", "owner_bytes_at_peak")),
    (Fact.PAIRING, ("leaked_bytes", "leak_undetermined_bytes", "top_at_peak", "op_bytes_at_peak",
                    "owner_bytes_at_peak")),
    (Fact.BLOCKS, ("leaked_bytes", "leak_undetermined_bytes", "op_max_block_bytes", "top_at_peak")),
    (Fact.TOTALS, ("peak_allocated_bytes", "peak_reserved_bytes", "fragmentation", "external_fragmentation")),
    (Fact.WINDOW_START, ("peak_allocated_bytes",)),
    (Fact.OPERATORS, ("op_max_block_bytes", "op_bytes_at_peak")),
]


@pytest.mark.parametrize(("fact", "keys"), _LACKS, ids=[fact.name for fact, _ in _LACKS])
def test_a_lacked_fact_makes_each_metric_that_needs_it_not_measurable(fact: Fact, keys: tuple[str, ...]) -> None:
    assert not_measurable({fact: "why"}) == dict.fromkeys(keys, "why")


def test_a_profile_without_any_memory_measures_nothing_and_the_first_reason_wins() -> None:
    # details follow their metric; an optional metric is absent, never said not measurable
    assert not_measurable({Fact.MEMORY: "none"}) == {
        key: "none" for key in metric_specs.METRIC_KEYS if key not in metric_specs.OPTIONAL_KEYS}
    both = not_measurable({Fact.PAIRING: "no Addr", Fact.OPERATORS: "no ops"})
    assert list(both.items())[-2:] == [("owner_bytes_at_peak", "no Addr"), ("op_max_block_bytes", "no ops")]
    assert both["op_bytes_at_peak"] == "no Addr"


def test_a_snapshot_without_history_names_the_metric_that_judges_the_pool_at_the_dump() -> None:
    why = not_measurable({Fact.HISTORY: "no history"}, stand_ins=True)
    assert why["fragmentation"] == why["external_fragmentation"] == (
        "no history; free_block_fragmentation judges the pool at the dump")
    assert why["peak_allocated_bytes"] == "no history"
    assert not_measurable({Fact.HISTORY: "no history"})["fragmentation"] == "no history"


def test_what_another_file_records_is_measurable_again() -> None:
    unmeasured = not_measurable({Fact.OPERATORS: "no ops", Fact.WINDOW_START: "carried"})
    assert regained(unmeasured, Fact.OPERATORS) == {"peak_allocated_bytes": "carried"}


def test_a_new_metric_is_not_measurable_wherever_a_fact_it_needs_is_lacked() -> None:
    toy = MetricSpec("toy_bytes", "bytes", "blocks", "a toy", needs=frozenset({Fact.OPERATORS}))
    assert not_measurable({Fact.OPERATORS: "no ops"}, specs=(*SPECS, toy)) == dict.fromkeys(
        ("op_max_block_bytes", "op_bytes_at_peak", "toy_bytes"), "no ops")


def test_loaders_name_facts_never_metric_keys() -> None:
    """A loader says what a profile lacks (Fact) and why; the table says which metrics that makes not measurable."""
    import ast

    allowed = {"Fact", "not_measurable", "regained"}
    for path in sorted((Path(metric_specs.__file__).parent / "loaders").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in metric_specs.SPEC_OF, f"{path}:{node.lineno} names the metric {node.value}"
            if isinstance(node, ast.ImportFrom) and node.module == "memgate.metric_specs":
                names = {alias.name for alias in node.names}
                assert names <= allowed, f"{path}:{node.lineno} imports {sorted(names - allowed)} from the table"
